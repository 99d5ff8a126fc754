"""DP-Fed-LS on MNIST through the real daemons: paper 002's Table 2 settings (Poisson,
or with ``--sampling uniform`` the uniform half: 1,000 owners of 50 rows, exactly τN drawn a round
by the compute parties' secret shuffle), with the in-process simulator's run of the same setting
as the baseline in the same script.

Three compute-party daemons (``LocalConsortium``: separate processes, mutual TLS, 3-party
replicated sharing, no dealer, in-MPC discrete Gaussian noise) run a federated job
(``[federated]``) for N owners. Every owner is ``parties.owner.process.run_owner_job`` — what ``mpc-erm
owner join`` runs — with its own certificate (role ``owner``), config, ledger, audit log and data
file (100 MNIST rows as .npz); **the owners share this benchmark's process** (one thread each), or
``--owner-procs`` spawned processes, on the same cores as the daemons. Each round every owner
tosses its own private coin (τ = 0.05) and sends shares of its update, or of a zero update, so the
compute parties count all N owners in every round and never learn the sample.

Setting (paper 002 §B5, Table H.7): the first 50,000 training images split iid into N = 500 owners
of 100 rows (the simulator benchmark's split); T = 30, E = 5, b = 10, η_l = 0.1, γ = 0.99,
weight decay 4e-5, 𝓛 = 0.4, η_g = 1; δ = 1/N^1.1; multinomial logistic regression on pixels in
[0, 1] (``softmax``: ``nn.Linear(784, 10)``). Noise: the job's privacy plan (RDP of the
Poisson-subsampled *discrete* Gaussian at δ·0.99, client level); the simulator: the continuous
Gaussian at the same ε through the same accountant.

    .venv/bin/python -m benchmarks.dp_fed_ls_daemons --out benchmarks/results/dp_fed_ls_daemons.json
    # the uniform half, owners' local epochs on a GPU (a lent CUDA machine: benchmarks/gpu_checks.sh)
    python3 -m benchmarks.dp_fed_ls_daemons --sampling uniform --owner-device cuda --out …
    # more runs of the uniform half on the CPU, added to the rows already measured
    .venv/bin/python -m benchmarks.dp_fed_ls_daemons --sampling uniform --owner-procs 8 --round-deadline 120 \\
        --workdir /dev/shm --epsilons 6 --sigmas 0 --seeds 0,1,2,3,4 \\
        --append --out benchmarks/results/dp_fed_ls_daemons_uniform_cpu_procs8.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.aggregate import machine_info
from benchmarks.deep_mnist import mnist_tensors
from benchmarks.dp_fed_ls_mnist import SETTINGS
from benchmarks.dp_fed_ls_mnist import run as simulate
from benchmarks.owners_common import HOSTILE_ENV, HOSTILE_KIND_ENV, benchmark_process_setup, run_job
from parties.owner.shares import UNCHECKED_ENV

DEADLINE_S = 30.0  # a round waits this long for the owners (the first, 10×: for every owner to enrol); --round-deadline
DEFAULT_WORKDIR = "the system temp dir"  # a row's "workdir" without --workdir
JOB = """\
method = "gradient"

[job]
name = "fed-mnist"
dataset = "mnist-rows"
parties = ["alice", "bob", "carol"]
trust = "replicated"
features = 784
round_deadline_s = {deadline}
owners = [{owners}]

[model]
name = "softmax"
n_classes = 10
lam = 4e-5
init_seed = {seed}

[privacy]
epsilon = {epsilon}
delta = {delta!r}
clip = 0.4
adjacency = "add_remove"
public_n = {n}

[training]
iterations = {rounds}
sampling_rate = {rate}
learning_rate = 1.0
ls_sigma = {sigma}

[federated]
local_epochs = 5
local_batch = 10
local_lr = 0.1
local_lr_decay = 0.99
sampling = "{sampling}"
"""


def _owner_files(root: Path, owners: int, rows: int) -> list[Path]:
    """Each owner's 100 rows as its own .npz, the simulator benchmark's iid split."""
    from mpc_erm.data import Dataset
    from mpc_erm.data.loaders import save_numpy

    X, y = mnist_tensors("train")
    X, y = X.reshape(len(X), -1)[: owners * rows].numpy(), y[: owners * rows].numpy()
    perm = torch.randperm(owners * rows, generator=torch.Generator().manual_seed(12345)).numpy()
    out = []
    for o in range(owners):
        idx = perm[o * rows : (o + 1) * rows]
        p = root / f"owner-{o:04d}.npz"
        save_numpy(Dataset(X[idx].astype(np.float64), y[idx], "multiclass", f"owner-{o}", n_classes=10), p)
        out.append(p)
    return out


def fresh_owners(cons: Any, root: Path, files: list[Path], device: str) -> list[Path]:
    """The owners of one run, each with a new identity, ledger and audit log for its rows.

    Every run of this script is one of the paper's independent repetitions. Owners kept across
    runs would compose every job on their rows in their ledgers; by the tenth ε = 7 job, the
    sampler's term alone, (1 + e^ε)·τ, passes any useful δ and each ledger rightly refuses."""
    return [cons.add_owner(f"owner-{o:04d}", {"mnist-rows": {"format": "npz", "path": f, "epsilon": 1000.0,
                                                             "delta": 0.5}}, root=root, device=device)
            for o, f in enumerate(files)]


def job_text(*, security: str = "semi-honest", noise: str = "mpc", **fields: Any) -> str:
    """The job file: JOB's fields, with ``job.security`` and ``privacy.noise`` when not the defaults
    (the malicious-secure mode needs distributed noise)."""
    text = JOB.format(**fields)
    if security != "semi-honest":
        text = text.replace('trust = "replicated"', f'trust = "replicated"\nsecurity = "{security}"')
    if noise != "mpc":
        text = text.replace('adjacency = "add_remove"', f'adjacency = "add_remove"\nnoise = "{noise}"')
    return text


def daemons_run(cons: Any, configs: list[Path], root: Path, *, epsilon: float, sigma: float, seed: int, owners: int,
                rate: float, rounds: int, Xte: torch.Tensor, yte: torch.Tensor, sampling: str = "poisson",
                owner_procs: int = 1, deadline_s: float = DEADLINE_S, security: str = "semi-honest",
                noise: str = "mpc") -> dict[str, Any]:
    import mpc_erm

    delta = 1.0 / owners**1.1
    names = ", ".join(f'"owner-{o:04d}"' for o in range(owners))
    job_path = root / f"job-{epsilon:g}-{sigma:g}-{seed}-{security}.toml"
    job_path.write_text(job_text(owners=names, seed=seed, epsilon=epsilon, delta=delta, n=owners, rounds=rounds,
                                 rate=rate, sigma=sigma, deadline=deadline_s, sampling=sampling, security=security,
                                 noise=noise))
    run = run_job(cons, configs, job_path, root, owner_procs=owner_procs)
    out, box, wall, failed = run["dir"], run["owners"], run["wall_seconds"], run["owners_failed"]
    model = mpc_erm.load_model(out)
    acc = float((model.predict(Xte.numpy()) == yte.numpy()).mean())
    metrics, report = run["metrics"], run["report"]
    joined = [s["rounds_joined"] for s in box.values() if isinstance(s, dict)]
    return {"test_accuracy": acc, "epsilon": report["epsilon"], "delta": report["delta"] + report["delta_sampler"],
            "noise_multiplier": report["plan"]["noise_multiplier"], "accountant": report["accountant"],
            "wall_seconds": wall, "mpc_wall_seconds": metrics["wall_seconds"],
            "owners_per_round": metrics["owners_per_round"], "owners_failed": failed,
            "owner_rounds_joined_total": sum(joined), "owner_rounds_joined_expected": rate * owners * rounds,
            "missed_rounds_total": sum(len(s["missed_rounds"]) for s in box.values() if isinstance(s, dict)),
            "per_round_seconds": metrics["wall_seconds"] / rounds, "machine_memory_gib": run["machine_memory_gib"],
            "round_deadline_s": deadline_s, "security": security, "noise": noise,
            "owners_refused_total": sum(len(v) for v in (metrics.get("owners_refused") or {}).values()),
            # where a round's time goes at the compute party: waiting for the owners' shares, then the MPC
            "round_wait_seconds_p50": _median(metrics.get("round_wait_seconds") or [0.0]),
            "round_mpc_seconds_p50": _median(metrics.get("round_mpc_seconds") or [0.0]),
            "mpc_phase_seconds": (metrics.get("mpc") or {}).get("phase_seconds")}


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sampling", choices=("poisson", "uniform"), default="poisson",
                    help="each owner's own coin (paper 002's N = 500 × 100 rows), or exactly τN owners a round "
                         "(N = 1,000 × 50 rows)")
    ap.add_argument("--owners", type=int, help="default: the sampling's setting")
    ap.add_argument("--rows", type=int, help="default: the sampling's setting")
    ap.add_argument("--owner-device", choices=("cpu", "cuda", "auto"), default="cpu",
                    help="where each owner's local epochs run")
    ap.add_argument("--owner-procs", type=int, default=1, help="OS processes the owners' threads are spread over")
    ap.add_argument("--rate", type=float, default=0.05)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--round-deadline", type=float, default=DEADLINE_S,
                    help="the job's round_deadline_s: an owner later than this is left out of the round; on a "
                         "machine loaded by every owner at once, a longer one keeps the owners in")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the daemons' and owners' state go (default: the system's temp dir); on one "
                         "machine all the owners' ledgers and audit logs sync to one disk every round, so "
                         "/dev/shm takes the disk's sync latency out of the round time")
    ap.add_argument("--epsilons", default="7")
    ap.add_argument("--sigmas", default="0,1")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--hostile", type=float, default=0.0,
                    help="fraction of the owners (every 1/f-th) that send garbage (contribution × 10⁶ + 1): the "
                         "compute parties' bound check leaves them out")
    ap.add_argument("--hostile-kind", choices=("garbage", "zero"), default="garbage",
                    help="what the --hostile owners send: garbage, or zeros (the honest-only comparator: the sum "
                         "is the other owners' alone, divided by the public count, as the check makes it)")
    ap.add_argument("--unchecked", action="store_true",
                    help="daemons with the contribution check switched off (a test build's switch), for the "
                         "check's wall-time ratio")
    ap.add_argument("--security", default="semi-honest",
                    help="semi-honest, malicious, or a comma list: each cell in each mode, one after the other "
                         "(malicious needs --noise distributed and Poisson sampling)")
    ap.add_argument("--noise", choices=("mpc", "distributed"), default="mpc")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--append", action="store_true",
                    help="keep the rows already in --out (the same setting) and add this run's after them")
    ap.add_argument("--table", type=Path, metavar="JSON",
                    help="print the docs' markdown tables of the rows in JSON (a file this script wrote): one "
                         "line per run, then, where a cell has several runs, their mean and spread; and exit")
    a = ap.parse_args(argv)
    if a.table is not None:
        rows = json.loads(a.table.read_text())["rows"]
        print(markdown_table(rows))
        if cells := cell_table(rows):
            print("\n" + cells)
        return
    a.command = "python -m benchmarks.dp_fed_ls_daemons " + " ".join(sys.argv[1:] if argv is None else argv)
    a.owners, a.rows = a.owners or SETTINGS[a.sampling][0], a.rows or SETTINGS[a.sampling][1]
    a.kept = _kept_rows(a.out, _what(a)) if a.append and a.out is not None and a.out.exists() else []
    if a.owner_device != "cpu":
        # Hundreds of owner threads share each process here (one owner per process in a deployment):
        # torch gives every thread its own cuBLAS handle with a 32 MiB workspace by default, which
        # filled an 80 GiB H100 at 1,000 owners (14 owners failed with CUDA OOM); 128 KiB each is ample
        # for a 784 × 10 linear model.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    from coordinator.consortium import LocalConsortium

    benchmark_process_setup()
    Xte, yte = mnist_tensors("t10k")
    Xte = Xte.reshape(len(Xte), -1)
    rows: list[dict[str, Any]] = []
    tic = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedls-", dir=a.workdir) as tmp:
        root = Path(tmp)
        (root / "data").mkdir()
        files = _owner_files(root / "data", a.owners, a.rows)
        if a.hostile > 0:  # read by every process hosting owners (benchmarks.owners_common.make_hostile)
            step = max(1, round(1 / a.hostile))
            os.environ[HOSTILE_ENV] = ",".join(f"owner-{o:04d}" for o in range(0, a.owners, step))
            os.environ[HOSTILE_KIND_ENV] = a.hostile_kind
        if a.unchecked:  # the daemons and their workers inherit it
            os.environ[UNCHECKED_ENV] = "1"
        with LocalConsortium(root / "cons", parties=3, dealer=False, max_epsilon_per_job=10.0,
                             peer_timeout_s=600.0) as cons:
            cells = [(float(e), float(s)) for e in a.epsilons.split(",") for s in a.sigmas.split(",")]
            paper_setting = (a.owners, a.rows, a.rate, a.rounds) == (*SETTINGS[a.sampling][:2], 0.05, 30)
            table = SETTINGS[a.sampling][2] if paper_setting else {}
            runs = [(e, s, int(x), sec) for e, s in cells for x in a.seeds.split(",") for sec in a.security.split(",")]
            for run, (eps, sig, seed, security) in enumerate(runs):
                configs = fresh_owners(cons, root / f"owners-{run}", files, a.owner_device)
                d = daemons_run(cons, configs, root, epsilon=eps, sigma=sig, seed=seed, owners=a.owners,
                                rate=a.rate, rounds=a.rounds, Xte=Xte, yte=yte, sampling=a.sampling,
                                owner_procs=a.owner_procs, deadline_s=a.round_deadline, security=security,
                                noise=a.noise)
                s = simulate(epsilon=eps, ls_sigma=sig, seed=seed, sampling=a.sampling, owners=a.owners,
                             rows=a.rows, rate=a.rate, rounds=a.rounds)
                paper = table.get(sig, {}).get(int(eps))
                row = {"epsilon_target": eps, "ls_sigma": sig, "seed": seed, "daemons": d,
                       "contributions_checked": not a.unchecked, "hostile_fraction": a.hostile,
                       "hostile_kind": a.hostile_kind if a.hostile > 0 else None,
                       "simulator": {k: s[k] for k in ("test_accuracy", "epsilon", "noise_multiplier", "seconds")},
                       "paper": None if paper is None else {"mean": paper[0] / 100, "std": paper[1] / 100},
                       "daemons_within_1.5_points_of_paper_or_above": None if paper is None else
                       bool(d["test_accuracy"] * 100 >= paper[0] - 1.5),
                       "wall_ratio_daemons_to_simulator": d["wall_seconds"] / s["seconds"],
                       "workdir": str(a.workdir or DEFAULT_WORKDIR), "command": a.command}
                rows.append(row)
                print(f"ε = {eps:g}, σ_LS = {sig:g}, seed {seed}: daemons {100 * d['test_accuracy']:.2f} % "
                      f"(ε {d['epsilon']:.3f}, z {d['noise_multiplier']:.3f}, {d['wall_seconds']:.0f} s), "
                      f"simulator {100 * s['test_accuracy']:.2f} % ({s['seconds']:.0f} s), paper {paper}",
                      flush=True)
                if a.out:  # after every run: a long campaign keeps what it measured
                    _write(a, rows, tic)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The table of daemon runs (docs/how-to/benchmarks.md): one line per row, test accuracy in %, the owner-rounds
    the compute parties left out (owners late for a round's deadline: the compute parties' own
    count, which includes owners that failed later) and the owners that failed. A run whose state
    was not in the system's temp dir (``--workdir``) names its workdir after the round time."""
    out = ["| ε | σ_LS | seed | round deadline | daemons | simulator | paper (5 runs) | z daemons / simulator | "
           "wall daemons / simulator | per round | owner-rounds left out | owners failed |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (_deadline(r), r["epsilon_target"], r["ls_sigma"], r["seed"])):
        d, s, p = r["daemons"], r["simulator"], r["paper"]
        full = max(d["owners_per_round"])
        short = [full - n for n in d["owners_per_round"] if n < full]
        left = f"{sum(short):,} ({len(short)} round{'s' if len(short) != 1 else ''})" if short else "0"
        where = f" ({r['workdir']})" if r.get("workdir", DEFAULT_WORKDIR) != DEFAULT_WORKDIR else ""
        out.append(f"| {r['epsilon_target']:g} | {r['ls_sigma']:g} | {r['seed']} | {_deadline(r):g} s | "
                   f"{100 * d['test_accuracy']:.2f} | {100 * s['test_accuracy']:.2f} | {100 * p['mean']:.2f} ± "
                   f"{100 * p['std']:.2f} | {d['noise_multiplier']:.3f} / {s['noise_multiplier']:.3f} | "
                   f"{d['wall_seconds']:.0f} s / {s['seconds']:.0f} s | {d['per_round_seconds']:.1f} s{where} | "
                   f"{left} | {len(d['owners_failed'])} |")
    return "\n".join(out)


def cell_table(rows: list[dict[str, Any]]) -> str:
    """The cells with several runs (seeds) under one setting (ε, σ_LS and the round deadline):
    test accuracy in %, mean ± sample standard deviation of the daemons' and the simulator's runs
    beside the paper's five; "" when every cell has one run."""
    import statistics

    out = ["| ε | σ_LS | round deadline | runs | daemons | simulator | paper (5 runs) | daemons − paper |",
           "|---|---|---|---|---|---|---|---|"]
    for (deadline, eps, sig), rs in cells(rows).items():
        if len(rs) < 2:
            continue
        d = [100 * r["daemons"]["test_accuracy"] for r in rs]
        s = [100 * r["simulator"]["test_accuracy"] for r in rs]
        p = rs[0]["paper"]
        out.append(f"| {eps:g} | {sig:g} | {deadline:g} s | {len(rs)} | {statistics.mean(d):.2f} ± "
                   f"{statistics.stdev(d):.2f} | {statistics.mean(s):.2f} ± {statistics.stdev(s):.2f} | "
                   f"{100 * p['mean']:.2f} ± {100 * p['std']:.2f} | {statistics.mean(d) - 100 * p['mean']:+.2f} |")
    return "\n".join(out) if len(out) > 2 else ""


def cells(rows: list[dict[str, Any]]) -> dict[tuple[float, float, float], list[dict[str, Any]]]:
    """The rows by cell — (round deadline, ε, σ_LS): one setting, several seeds — in ε, σ_LS,
    deadline order."""
    out: dict[tuple[float, float, float], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((_deadline(r), r["epsilon_target"], r["ls_sigma"]), []).append(r)
    return dict(sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])))


def _deadline(row: dict[str, Any]) -> float:
    """A row's round deadline (the first rows, before it was recorded, ran at the default)."""
    return row["daemons"].get("round_deadline_s") or DEADLINE_S


def _kept_rows(path: Path, what: str) -> list[dict[str, Any]]:
    """The rows of an earlier result file, each with the command that measured it; refused (exit)
    if that file describes another setting than ``what``: its rows would be mislabelled."""
    old = json.loads(path.read_text())
    if old.get("what") != what:
        raise SystemExit(f"--append: {path} holds another setting:\n  {old.get('what')}\nthis run:\n  {what}")
    return [{**r, "command": r.get("command", old.get("command"))} for r in old.get("rows", [])]


def _what(a: Any) -> str:
    """The setting every row of one result file shares (``--append`` keeps rows only under it)."""
    return (f"DP-Fed-LS, MNIST multinomial logistic regression, {a.owners} owners × {a.rows} rows, "
            f"{a.sampling} τ = {a.rate}, T = {a.rounds}, E = 5, b = 10, η_l = 0.1, γ = 0.99, η_g = 1, "
            "𝓛 = 0.4, weight decay 4e-5, δ = 1/N^1.1; through 3 compute-party daemons (replicated, "
            "in-MPC discrete Gaussian); the owners are real gRPC clients with their own certificates, "
            "ledgers and files, "
            f"in {a.owner_procs} OS process(es) (one thread each), on the same cores as the daemons; the "
            f"owners' local epochs on device {a.owner_device!r}")


def _write(a: Any, rows: list[dict[str, Any]], tic: float) -> None:
    res = {"benchmark": "dp_fed_ls_daemons", "machine": machine_info(),
           "command": a.command if not a.kept else "several: each row's command",
           "what": _what(a),
           "sampling": ("each owner's own private coin" if a.sampling == "poisson" else
                        "exactly τN owners a round, drawn by the compute parties' 3-party secret shuffle; each owner "
                        "learns only its own bits") +
                       "; an owner not sampled sends shares of a zero update, so the compute parties count every "
                       "owner in every round (owners_per_round)",
           "baseline": "benchmarks.dp_fed_ls_mnist.run: the same setting in the in-process simulator (plaintext "
                       "aggregator, continuous Gaussian at the RDP accountant's z), same seed",
           "rows": a.kept + rows, "wall_seconds_this_command": time.perf_counter() - tic}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
