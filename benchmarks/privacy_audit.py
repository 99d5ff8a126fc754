"""The one-run privacy audit on the demo's two jobs: an empirical lower bound on ε beside the
stated ε, and the same job with its noise switched off as the control the audit must flag.

    python -m benchmarks.privacy_audit --canaries 1000 --daemons --out benchmarks/results/privacy_audit.json

UCI Adult's training rows split over three parties, the demo's output (Gaussian, λ = 1e-3) and
gradient (50 rounds, RDP) jobs at ε = 1, δ = 1e-5, and a DP-Fed-LS job (client level, Adult dealt to
300 owners, the canaries joining as owners, ε = 2), and DP-SGD on MNIST's pixels with an mlp
(two epochs, ε = 1), run in process by the daemons' run code with
canaries added (:func:`mpc_erm.simulate.audit.audit_job`); the MNIST DP-SGD job itself (TF-Privacy's
CNN, ten epochs at q = 256/60,000, ε = 1) with gradient canaries
(:func:`mpc_erm.simulate.audit.audit_gradient_job`); with ``--daemons`` the gradient job also
through three party daemons (:func:`coordinator.audit_daemons.audit_through_daemons`: the canaries in
the parties' npz files, the noise sampled inside the MPC). Confidence 95 %.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.aggregate import jsonable, machine_info

JOBS: dict[str, dict[str, Any]] = {
    "adult-output": {"method": "output", "model": {"name": "logistic", "lam": 1e-3},
                     "privacy": {"epsilon": 1.0, "delta": 1e-5, "mechanism": "gaussian"}},
    "adult-gradient": {"method": "gradient", "model": {"name": "logistic", "lam": 1e-4},
                       "privacy": {"epsilon": 1.0, "delta": 1e-5, "accountant": "rdp", "clip": 1.0},
                       "training": {"iterations": 50, "learning_rate": 20.0}},
}


#: DP-Fed-LS at client level: Adult dealt to owners, the canaries joining them as owners (N public).
FEDERATED_OWNERS = 300
FEDERATED: dict[str, Any] = {
    "method": "gradient", "model": {"name": "softmax", "n_classes": 2, "lam": 4e-5},
    "privacy": {"epsilon": 2.0, "delta": 1e-6, "clip": 0.4, "adjacency": "add_remove", "public_n": 1000},
    "training": {"iterations": 30, "sampling_rate": 0.2, "learning_rate": 1.0, "ls_sigma": 1.0},
    "federated": {"local_epochs": 1, "local_batch": 32, "local_lr": 0.1}}


#: DP-SGD on MNIST's pixels (an mlp: its first layer is linear in the inputs, where the canary
#: columns go), batches of 256 expected of 60,000, two epochs.
MNIST_MLP: dict[str, Any] = {
    "method": "gradient", "model": {"name": "mlp", "input_shape": [784], "n_classes": 10, "hidden": [128]},
    "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0, "adjacency": "add_remove", "public_n": 60_000},
    "training": {"iterations": 468, "sampling_rate": 256 / 60_000, "learning_rate": 0.1}}


#: The MNIST DP-SGD job (benchmarks.deep_mnist's: TF-Privacy's CNN, clip 1, ten epochs of batches of
#: 256 expected, step 0.32) at ε = 1: a CNN has no input column of its own per canary, so its audit
#: uses gradient canaries.
MNIST_CNN: dict[str, Any] = {
    "method": "gradient", "model": {"name": "mnist_cnn", "input_shape": [1, 28, 28], "n_classes": 10},
    "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0, "adjacency": "add_remove", "public_n": 60_000},
    "training": {"iterations": 2344, "sampling_rate": 256 / 60_000, "learning_rate": 0.32}}

GROUPS = ("demo", "federated", "mlp", "cnn")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--canaries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--daemons", action="store_true",
                    help="also audit the demo's gradient job through three party daemons (and its control)")
    ap.add_argument("--jobs", default=",".join(GROUPS),
                    help=f"which audits, comma-separated, of {', '.join(GROUPS)} (default: all)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other rows of an existing --out file (each row carries its command)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    jobs = set(a.jobs.split(","))
    if not jobs <= set(GROUPS):
        ap.error(f"--jobs: choose from {', '.join(GROUPS)}")
    command = "python -m benchmarks.privacy_audit " + " ".join(sys.argv[1:] if argv is None else argv)
    from mpc_erm.data import Dataset, load_dataset
    from mpc_erm.data.partition import partition_equal
    from mpc_erm.simulate.audit import audit_job
    from mpc_erm.spec import JobSpec

    train, _ = load_dataset("adult")
    parts = [Dataset(train.X[i], train.y[i], train.task, name=f"party{j}", feature_names=train.feature_names)
             for j, i in enumerate(partition_equal(train.n, 3, a.seed))]
    results: dict[str, Any] = {}

    def pair(name: str, audit: Callable[[bool], Any]) -> None:
        """The job's audit and its noise-off control's, as two rows."""
        for control in (False, True):
            tic = time.perf_counter()
            row = audit(control).describe()
            results[f"{name}{' (noise off: control)' if control else ''}"] = {**row,
                                                                             "seconds": time.perf_counter() - tic}

    for name, job in JOBS.items() if "demo" in jobs else ():
        spec = JobSpec.model_validate(job)
        pair(name, lambda c, spec=spec: audit_job(spec, parts, canaries=a.canaries, seed=a.seed, broken_control=c))
    if "federated" in jobs:
        from mpc_erm.simulate.audit import audit_federated_job
        from mpc_erm.simulate.forecast import deal_to_owners

        owners = deal_to_owners(train, FEDERATED_OWNERS, a.seed)
        spec = JobSpec.model_validate(FEDERATED)
        pair(f"adult-dp-fed-ls, {FEDERATED_OWNERS} owners + canary owners",
             lambda c: audit_federated_job(spec, owners, canaries=a.canaries, seed=a.seed, broken_control=c))
    if "mlp" in jobs:
        mnist, _ = load_dataset("mnist")
        digits = [Dataset(mnist.X[i], mnist.y[i], mnist.task, name=f"party{j}", n_classes=mnist.n_classes)
                  for j, i in enumerate(partition_equal(mnist.n, 3, a.seed))]
        from mpc_erm.simulate.audit import audit_network_job

        mlp = JobSpec.model_validate(MNIST_MLP)
        pair("mnist-mlp dp-sgd",
             lambda c: audit_network_job(mlp, digits, canaries=a.canaries, seed=a.seed, broken_control=c))
    if "cnn" in jobs:
        from benchmarks.deep_mnist import mnist_tensors
        from mpc_erm.simulate.audit import audit_gradient_job

        X, y = mnist_tensors("train")
        flat, labels = X.reshape(X.shape[0], -1).numpy().astype("float64"), y.numpy()
        images = [Dataset(flat[i::3], labels[i::3], "multiclass", name=f"party{i}", n_classes=10) for i in range(3)]
        cnn = JobSpec.model_validate(MNIST_CNN)
        pair("mnist-cnn dp-sgd, gradient canaries",
             lambda c: audit_gradient_job(cnn, images, canaries=a.canaries, seed=a.seed, broken_control=c))
    if a.daemons and "demo" in jobs:
        from coordinator.audit_daemons import audit_through_daemons

        gradient = JobSpec.model_validate(JOBS["adult-gradient"])
        pair("adult-gradient through 3 daemons",
             lambda c: audit_through_daemons(gradient, parts, canaries=a.canaries, seed=a.seed, broken_control=c))
    for r in results.values():
        r["command"] = command
    if a.merge and a.out and a.out.exists():
        kept = json.loads(a.out.read_text())
        for r in kept["results"].values():  # rows of a file written before rows carried their command
            r.setdefault("command", kept.get("command"))
        results = {**kept["results"], **results}
    out = jsonable({"benchmark": "privacy_audit", "machine": machine_info(), "command": command,
                    "what": "one-run audit (Steinke–Nasr–Jagielski 2023): empirical ε lower bound at 95 % beside the "
                            "stated ε, for the demo's jobs on Adult over 3 parties, a DP-Fed-LS job, DP-SGD on MNIST "
                            "(an mlp with input canaries, the CNN with gradient canaries) and their noise-off controls",
                    "results": results,
                    "every_real_job_below_its_stated_epsilon": all(not r["violated"] for k, r in results.items()
                                                                   if "control" not in k),
                    "every_control_flagged": all(r["violated"] for k, r in results.items() if "control" in k)})
    print(json.dumps({k: {x: r[x] for x in ("stated_epsilon", "epsilon_lower_bound", "violated")}
                      for k, r in results.items()}, indent=1))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
