"""The DP-LSSGD paper's CIFAR-10 experiment (its §4.3, Fig. 6), shortened to what this 2-core
machine can run, with the full run's cost projected from the measured seconds per round.

Setting (the paper: "the same set of parameters as ... for MNIST except the noise multiplier 2.0
and clip 3"): TensorFlow's CIFAR-10 tutorial network (``tf_cifar_cnn``, 1,068,298 parameters, on
the central 24×24 crop), Poisson batches of expected size 256 of the 50,000 training images
(q = 256/50,000), per-example clip C = 3, noise multiplier 2.0, δ = 1e-5; DP-SGD at learning
rate 0.15 and DP-Adam at 0.001, each ÷ 10 at round 10,000; each with and without Laplacian
smoothing (σ = 1, per parameter tensor). Three parties hold a third of the training images each.
The paper states no epoch count for this figure; the projection is per epoch (195 rounds) and for
60 epochs (the length of its MNIST study).

Two runs. **The simulator** (default): the four optimizers for ``--rounds`` rounds in the
in-process simulator (the daemon worker's own ``DpSgd`` round loop, plaintext aggregator), test
accuracy on the 10,000 test images every ``--every`` rounds. **Through the daemons**
(``--daemons``): one optimizer's jobs through three replicated party daemons (real processes,
gRPC with mutual TLS; each party its own IDX files), in-MPC or distributed noise — one job per
length in ``--rounds``, the points of an accuracy curve — beside the simulator's run of the
longest in the same invocation, evaluated at the same rounds (machines are noisy: the ratio is
measured in one run).

    .venv/bin/python -m benchmarks.cifar10 --rounds 60 --every 20 --out benchmarks/results/cifar10.json
    .venv/bin/python -m benchmarks.cifar10 --daemons --rounds 20,40,60 --noise-kind distributed \\
        --out benchmarks/results/cifar10_daemons_curve.json

The data: :mod:`benchmarks.cifar10_data` (the registry's copy of CIFAR-10, checked).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.aggregate import machine_info
from benchmarks.cifar10_data import fetch, load
from mpc_erm.privacy import epsilon_for
from mpc_erm.protocols.dpsgd import DpSgd
from mpc_erm.simulate.aggregator import InProcessAggregator
from mpc_erm.spec import JobSpec

N_TRAIN = 50_000
BATCH = 256
CLIP = 3.0
NOISE = 2.0
DELTA = 1e-5
DECAY_ROUND = 10_000
FULL_EPOCHS = 60
LR = {"sgd": 0.15, "adam": 0.001}
LS_SIGMA = 1.0
PARTIES = 3
#: the four optimizers of the paper's Fig. 6: (name, optimizer, Laplacian smoothing σ)
OPTIMIZERS = (("DP-SGD", "sgd", 0.0), ("DP-LSSGD", "sgd", LS_SIGMA), ("DP-Adam", "adam", 0.0),
              ("DP-LSAdam", "adam", LS_SIGMA))


@functools.lru_cache(maxsize=2)
def _tensors(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A split as float32 images in [0, 1] and int64 labels, read, checked and converted once a
    process (every simulated optimizer and the daemons' evaluation read the same; callers do not
    write to them)."""
    img, lab = load(split)
    return torch.from_numpy(img.astype(np.float32) / 255.0), torch.from_numpy(lab.astype(np.int64))


def _training(optimizer: str, ls_sigma: float, rounds: int) -> dict[str, Any]:
    return {"iterations": rounds, "learning_rate": LR[optimizer], "sampling_rate": BATCH / N_TRAIN,
            "optimizer": optimizer, "ls_sigma": ls_sigma, "schedule": "step", "schedule_step": DECAY_ROUND,
            "schedule_gamma": 0.1}


def _model(seed: int) -> dict[str, Any]:
    return {"name": "tf_cifar_cnn", "input_shape": [3, 32, 32], "n_classes": 10, "init_seed": seed}


def simulate(optimizer: str, ls_sigma: float, rounds: int, every: int, *, noise: float = NOISE, seed: int = 0,
             progress: Any = print) -> dict[str, Any]:
    """One optimizer for ``rounds`` rounds in the simulator: its test accuracy every ``every``
    rounds and its seconds per round (accuracy evaluations excluded)."""
    Xtr, ytr = _tensors("train")
    Xte, yte = _tensors("test")
    q = BATCH / N_TRAIN
    eps = epsilon_for("rdp", noise, rounds, DELTA, q, "add_remove") * (1 + 1e-6)
    spec = JobSpec.model_validate({
        "method": "gradient", "seed": seed, "model": _model(seed),
        "privacy": {"epsilon": eps, "delta": DELTA, "clip": CLIP, "adjacency": "add_remove", "public_n": N_TRAIN,
                    "accountant": "rdp"},
        "training": _training(optimizer, ls_sigma, rounds),
    })
    torch.set_num_threads(2)
    job = DpSgd(spec)
    parts = [(Xtr[i::PARTIES], ytr[i::PARTIES]) for i in range(PARTIES)]
    gens = [torch.Generator().manual_seed(1000 * seed + i) for i in range(PARTIES)]
    curve: list[dict[str, float]] = []
    training = 0.0
    tic = time.perf_counter()

    def local_sum(_model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [job.local_contribution(X, y, g) for (X, y), g in zip(parts, gens, strict=True)]
        return torch.cat([r for r, _ in rows]), torch.tensor([n for _, n in rows])

    def after(t: int, _noisy: torch.Tensor) -> None:
        nonlocal training, tic
        training += time.perf_counter() - tic
        if t % every == 0 or t == rounds:
            acc = float((job.predict(Xte) == yte).double().mean())
            curve.append({"round": t, "epoch": t * q, "test_accuracy": acc, "training_seconds": training})
            progress(f"{optimizer} σ_LS = {ls_sigma:g}: round {t}/{rounds}, test accuracy {acc:.4f}, "
                     f"{training:.0f} s training")
        tic = time.perf_counter()

    job.train(InProcessAggregator(torch.Generator().manual_seed(seed)), local_sum, after_round=after)
    return {"noise_multiplier": job.plan.noise_multiplier, "epsilon": job.plan.guarantee().epsilon,
            "seconds_per_round": training / rounds, "test_accuracy": curve[-1]["test_accuracy"], "curve": curve}


def _projection(seconds_per_round: float) -> dict[str, float]:
    per_epoch = N_TRAIN / BATCH
    return {"rounds_per_epoch": per_epoch, "seconds_per_epoch": seconds_per_round * per_epoch,
            f"hours_for_{FULL_EPOCHS}_epochs": seconds_per_round * per_epoch * FULL_EPOCHS / 3600.0}


def full_run_epsilon(noise: float = NOISE) -> float:
    """ε at δ = 1e-5 of the projected full run (60 epochs at q = 256/50,000), by the plan's RDP."""
    q = BATCH / N_TRAIN
    return epsilon_for("rdp", noise, int(round(FULL_EPOCHS / q)), DELTA, q, "add_remove")


def run_simulator(rounds: int, every: int, seed: int = 0, progress: Any = print) -> dict[str, Any]:
    runs = {}
    for name, optimizer, ls in OPTIMIZERS:
        r = simulate(optimizer, ls, rounds, every, seed=seed, progress=progress)
        r["projection"] = _projection(r["seconds_per_round"])
        runs[name] = {"optimizer": optimizer, "ls_sigma": ls, "learning_rate": LR[optimizer], **r}
    return {
        "benchmark": "cifar10", "machine": machine_info(),
        "what": "the DP-LSSGD paper's CIFAR-10 experiment (Fig. 6) shortened: TensorFlow's tutorial CNN "
                "(tf_cifar_cnn, 1,068,298 parameters) with DP-SGD, DP-LSSGD, DP-Adam and DP-LSAdam, noise "
                "multiplier 2.0, clip 3, Poisson batches of 256 of 50,000, in the in-process simulator (3 parties)",
        "parameters": {"rounds": rounds, "every": every, "sampling_rate": BATCH / N_TRAIN, "clip": CLIP,
                       "noise_multiplier": NOISE, "delta": DELTA, "learning_rates": LR, "decay": f"÷10 at round "
                       f"{DECAY_ROUND}", "ls_sigma": LS_SIGMA, "seed": seed, "parties": PARTIES},
        "full_run": {"epochs": FULL_EPOCHS, "rounds": int(round(FULL_EPOCHS * N_TRAIN / BATCH)),
                     "epsilon": full_run_epsilon(),
                     "note": "the paper states no epoch count for Fig. 6 and gives no accuracy values (a plot only)"},
        "runs": runs,
        "paper": "DP-LSSGD (Wang et al.), §4.3, Fig. 6: LS improves the validation accuracy of DP-SGD and DP-Adam; "
                 "no numbers given",
    }


def _daemons_job(path: Path, rounds: int, optimizer: str, ls_sigma: float, noise_kind: str, seed: int) -> Path:
    """The job file for ``rounds`` rounds at noise multiplier 2.0 (its ε is what the plan states)."""
    eps = epsilon_for("rdp", NOISE, rounds, DELTA * 0.99, BATCH / N_TRAIN, "add_remove", discrete=True) * (1 + 1e-6)
    path.write_text("\n".join([
        'method = "gradient"', "", "[job]", f'name = "cifar10-{rounds}"', 'dataset = "cifar10"',
        'parties = ["alice", "bob", "carol"]', 'trust = "replicated"', "",
        "[model]", *(f"{k} = {json.dumps(v)}" for k, v in _model(seed).items()), "",
        "[privacy]", f"epsilon = {eps!r}", f"delta = {DELTA!r}", f"clip = {CLIP!r}", 'adjacency = "add_remove"',
        f"public_n = {N_TRAIN}", 'accountant = "rdp"', f'noise = "{noise_kind}"', "",
        "[training]", *(f"{k} = {json.dumps(v)}" for k, v in _training(optimizer, ls_sigma, rounds).items()), ""]))
    return path


def _seconds_per_round(audit: Path, job_id: str) -> tuple[float, int]:
    """From the first release of the job to its last (alice's audit log stamps each): start-up, the
    noise sampled before round 1 and the result's writing are not rounds."""
    rows = [json.loads(line) for line in audit.open()]
    released = {int(r["round"]): float(r["time"]) for r in rows
                if r["event"] == "release" and r.get("round") and r.get("job_id") == job_id}
    first, last = min(released), max(released)
    return (released[last] - released[first]) / max(1, last - first), last - first


def run_daemons(out: Path, lengths: list[int], *, optimizer: str = "sgd", ls_sigma: float = 0.0,
                noise_kind: str = "mpc", seed: int = 0, progress: Any = print) -> dict[str, Any]:
    """One job of each length in ``lengths`` (rounds) of one optimizer through the same three
    replicated party daemons — the points of an accuracy curve, each its own job at the same noise
    multiplier — then the simulator's run of the longest, evaluated at the same rounds; seconds per
    round of each, the ratio, and the full run's projected cost. The top-level figures are the
    longest job's."""
    from benchmarks.daemon_job import submit_and_fetch
    from coordinator.consortium import LocalConsortium
    from mpc_erm import load_model
    from mpc_erm.data.images import write_idx_file

    lengths = sorted(set(lengths))
    img, lab = load("train")
    Xte, yte = _tensors("test")
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    data.mkdir(exist_ok=True)
    own = {name: {"format": "idx", "path": write_idx_file(data / f"{name}-images.idx", img[i::PARTIES]),
                  "labels": write_idx_file(data / f"{name}-labels.idx", lab[i::PARTIES]), "adjacency": "add_remove"}
           for i, name in enumerate(("alice", "bob", "carol"))}
    jobs: list[dict[str, Any]] = []
    with LocalConsortium(out / "consortium", parties=PARTIES, dataset="cifar10", dealer=False, budget_epsilon=10.0,
                         max_epsilon_per_job=5.0, party_data=own, max_iterations=max(lengths),
                         peer_timeout_s=600.0) as cons:
        for rounds in lengths:
            tic = time.perf_counter()
            job = _daemons_job(out / f"cifar10_job_{rounds}.toml", rounds, optimizer, ls_sigma, noise_kind, seed)
            ended, result = submit_and_fetch(cons, job, out / f"result-{rounds}")
            per_round, timed = _seconds_per_round(out / "consortium" / "alice" / "state" / "audit.jsonl",
                                                  str(result["job_id"]))
            model = load_model(out / f"result-{rounds}")
            acc = float(np.mean(np.asarray(model.predict(Xte.reshape(Xte.shape[0], -1).numpy())).astype(np.int64)
                                == yte.numpy()))
            report = json.loads((out / f"result-{rounds}" / "privacy_report.json").read_text())
            jobs.append({"rounds": rounds, "test_accuracy": acc, "wall_seconds": ended - tic,
                         "seconds_per_round": per_round, "rounds_timed": timed, "report": report})
            progress(f"daemons: {rounds} rounds, test accuracy {acc:.4f}, {per_round:.2f} s a round")
    report = jobs[-1]["report"]
    split = report["realisation"].get("noise_parties"), report["realisation"].get("noise_honest")
    inflation = math.sqrt(split[0] / split[1]) if noise_kind == "distributed" else 1.0
    every = math.gcd(*lengths)
    sim = simulate(optimizer, ls_sigma, lengths[-1], every, noise=NOISE * inflation, seed=seed, progress=progress)
    sim_at = {int(c["round"]): c["test_accuracy"] for c in sim["curve"]}
    last = jobs[-1]
    return {
        "benchmark": "cifar10_daemons", "machine": machine_info(),
        "what": f"DP-{'Adam' if optimizer == 'adam' else 'SGD'}{' with Laplacian smoothing' if ls_sigma else ''} of "
                "TensorFlow's CIFAR-10 tutorial CNN (tf_cifar_cnn, 1,068,298 parameters) through 3 replicated party "
                f"daemons (real processes, gRPC with mutual TLS), {noise_kind} noise, each party its own third of "
                "the training images; one job per curve point; beside the simulator's run, same invocation",
        "parameters": {"rounds": last["rounds"], "lengths": lengths, "optimizer": optimizer, "ls_sigma": ls_sigma,
                       "learning_rate": LR[optimizer], "noise": noise_kind,
                       "noise_multiplier": report["plan"]["noise_multiplier"], "inflation": inflation, "clip": CLIP,
                       "sampling_rate": BATCH / N_TRAIN, "seed": seed},
        "epsilon": report["epsilon"], "delta": report["delta"], "accountant": report["accountant"],
        "wall_seconds": last["wall_seconds"], "daemons_seconds_per_round": last["seconds_per_round"],
        "rounds_timed": last["rounds_timed"], "test_accuracy": last["test_accuracy"],
        "curve": [{"rounds": j["rounds"], "daemons_test_accuracy": j["test_accuracy"],
                   "simulator_test_accuracy": sim_at.get(j["rounds"]),
                   "daemons_seconds_per_round": j["seconds_per_round"],
                   "epsilon": j["report"]["epsilon"]} for j in jobs],
        "simulator": {"seconds_per_round": sim["seconds_per_round"], "test_accuracy": sim["test_accuracy"],
                      "noise_multiplier": sim["noise_multiplier"], "curve": sim["curve"]},
        "daemons_over_simulator_per_round": last["seconds_per_round"] / sim["seconds_per_round"],
        "projection": {"daemons": _projection(last["seconds_per_round"]),
                       "simulator": _projection(sim["seconds_per_round"]),
                       "full_run_epsilon": full_run_epsilon(NOISE * inflation if noise_kind == "distributed"
                                                            else NOISE)},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", default="30", help="rounds; with --daemons a comma-separated list: one job each, "
                                                   "the points of a curve")
    ap.add_argument("--every", type=int, default=10, help="simulator: rounds between test-accuracy evaluations")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--daemons", action="store_true", help="one optimizer through three replicated daemons")
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd", help="with --daemons")
    ap.add_argument("--ls-sigma", type=float, default=0.0, help="with --daemons")
    ap.add_argument("--noise-kind", choices=["mpc", "distributed"], default="mpc", help="with --daemons")
    ap.add_argument("--work", type=lambda s: Path(s).resolve(), default=Path("cifar10_run").resolve())
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    fetch()
    lengths = [int(r) for r in str(a.rounds).split(",")]
    if a.daemons:
        res = run_daemons(a.work, lengths, optimizer=a.optimizer, ls_sigma=a.ls_sigma, noise_kind=a.noise_kind,
                          seed=a.seed)
        cmd = (f"python -m benchmarks.cifar10 --daemons --rounds {a.rounds} --optimizer {a.optimizer} "
               f"--ls-sigma {a.ls_sigma:g} --noise-kind {a.noise_kind}")
    else:
        if len(lengths) != 1:
            ap.error("--rounds: one number without --daemons")
        res = run_simulator(lengths[0], a.every, a.seed)
        cmd = f"python -m benchmarks.cifar10 --rounds {a.rounds} --every {a.every}"
    res["command"] = cmd + (f" --out {a.out}" if a.out else "")
    text = json.dumps(res, indent=2)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
