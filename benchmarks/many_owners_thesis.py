"""The thesis's MPC Grad P and MPC Out P with many data owners, through the real daemons.

KDD Cup 99 (50,000 training rows, 20,000 test rows, 122 features, rows in the unit ball),
logistic regression, λ = 1e-3, G = C = 1, ε = 0.5, δ = 1e-3 (thesis Figs. 6.1–6.4). The 50,000
rows are split equally and at random among m owners; each owner is ``run_owner_job`` (what
``mpc-erm owner join`` runs) with its own certificate, config, ledger, audit log and .npz file,
**all owners in this benchmark's process** (one thread each) on the same 2 cores as three
compute-party daemons (``LocalConsortium``: separate processes, mutual TLS, replicated sharing,
no dealer, in-MPC discrete Gaussian). Records are added or removed (add/remove, n̂ = 50,000 public).

- **Grad P**: T full-batch rounds, η = 1; each owner sends shares of its clipped gradient sum.
- **Out P**: one release; each owner sends shares of its certified local minimiser weighted
  n_j/n̂ (Gaussian mechanism: ℓ2-Laplace is not sampled inside the MPC).

Baseline in the same run, the same job (its spec, its privacy plan, the same σ) through the same
protocol code in process (``InProcessAggregator``: plaintext sum + continuous noise of the plan's
σ) on the same owners' rows; and, for context, the thesis simulator's "exact" MPC Grad P / Out P
(``run_experiment``: replace-one adjacency, weights n_j/n, the ideal Gaussian) at the same m.
The Out P baseline adds the plan's σ (RDP of the Gaussian at δ·0.99, ``PrivacyPlan.noise_scale``),
as ``OutputPerturbation`` does by default since the fix; the first run of this script used its older
default, the analytic Gaussian's, 12 % smaller at this setting. Reported:
optimality gap F(θ) − F(θ*) on the training rows and relative accuracy loss s* − s on the test
rows (the simulator's metrics), wall time and time per round.

    .venv/bin/python -m benchmarks.many_owners_thesis --grad-owners 1000 --grad-rounds 1500 \\
        --out-owners 1000 --out benchmarks/results/many_owners_thesis.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.aggregate import machine_info
from benchmarks.owners_common import benchmark_process_setup, run_job

N_TRAIN, N_TEST, LAM, EPS, DELTA = 50_000, 20_000, 1e-3, 0.5, 1e-3
JOB = """\
method = "{method}"

[job]
name = "kdd-{method}-{m}"
dataset = "{dataset}"
parties = ["alice", "bob", "carol"]
trust = "replicated"
features = {d}
round_deadline_s = {deadline!r}
owners = [{owners}]

[model]
name = "logistic"
lam = {lam!r}

[privacy]
epsilon = {eps!r}
delta = {delta!r}
adjacency = "add_remove"
public_n = {n}
{extra}"""
GRAD_EXTRA = 'clip = 1.0\n\n[training]\niterations = {rounds}\nlearning_rate = 1.0\n'
OUT_EXTRA = 'mechanism = "gaussian"\n'


def _data() -> tuple[Any, Any]:
    from mpc_erm.data import Dataset, clip_to_unit_ball, load_dataset

    train, test = load_dataset("kddcup99", n_train=N_TRAIN, n_test=N_TEST)
    clip = lambda ds: Dataset(clip_to_unit_ball(np.asarray(ds.X, dtype=np.float64)), np.asarray(ds.y), ds.task,
                              ds.name, ds.feature_names)
    return clip(train), clip(test)


def _owners(cons: Any, root: Path, train: Any, m: int, dataset: str, seed: int) -> tuple[list[Path], list[np.ndarray]]:
    """m owners, each with its equal random share of the training rows as its own .npz."""
    from mpc_erm.data import Dataset, partition_equal
    from mpc_erm.data.loaders import save_numpy

    parts = partition_equal(train.n, m, np.random.default_rng(seed))
    configs = []
    (root / "data").mkdir(parents=True, exist_ok=True)
    for o, idx in enumerate(parts):
        idx = np.sort(idx)
        p = save_numpy(Dataset(train.X[idx], train.y[idx], train.task, f"o{o}"), root / "data" / f"{dataset}-{o}.npz")
        configs.append(cons.add_owner(f"{dataset}-{o:05d}", {dataset: {"format": "npz", "path": p, "epsilon": 10.0,
                                                                         "delta": 0.01}},
                                      root=root / "owners"))
    return configs, parts


def _scores(train: Any, test: Any) -> Any:
    """metrics(θ) → (optimality gap, relative accuracy loss), as ``mpc_erm.simulate`` defines them."""
    from mpc_erm.models import get_loss, objective_value
    from mpc_erm.simulate.methods import nonprivate_optimum

    loss = get_loss("logistic")
    Xtr, ytr = torch.from_numpy(np.array(train.X)), torch.from_numpy(np.array(train.y))
    Xte, yte = torch.from_numpy(np.array(test.X)), torch.from_numpy(np.array(test.y))
    star = nonprivate_optimum(loss, Xtr, ytr, LAM)
    j_star, s_star = float(objective_value(loss, star, Xtr, ytr, LAM)), loss.score(star, Xte, yte)
    return lambda th: (float(objective_value(loss, th, Xtr, ytr, LAM)) - j_star, s_star - loss.score(th, Xte, yte))


class _SameJob:
    """The same job file through the same protocol code in process, with a plaintext aggregator:
    the baseline. An output job's local minimisers are solved once (every noise draw and the
    noise-free sum reuse them; their solve time is counted in every draw's seconds)."""

    def __init__(self, job_path: Path, train: Any, parts: list[np.ndarray]) -> None:
        from mpc_erm.jobs.jobfile import load_job_file
        from mpc_erm.privacy.plan import plan_job, public_sizes
        from mpc_erm.protocols import GradientPerturbation, OutputPerturbation

        job = load_job_file(job_path)
        self.spec, d = job.spec, int(job.job.features or 0)
        self.plan = plan = plan_job(self.spec, sampler="mpc", sizes=public_sizes(self.spec, None), n_features=d)
        self.X, self.y = torch.from_numpy(np.array(train.X)), torch.from_numpy(np.array(train.y))
        self.solve_s = 0.0
        if self.spec.method == "gradient":
            self.proto: Any = GradientPerturbation(self.spec, None, d, plan=plan)
            return
        self.proto = OutputPerturbation(self.spec, None, d, plan=plan)  # the plan's σ
        tic = time.perf_counter()
        self.local = torch.stack([self.proto.local_model(self.X[idx], self.y[idx]) for idx in map(np.sort, parts)])
        self.solve_s = time.perf_counter() - tic
        self.weights = torch.tensor([plan.weight(j, len(idx)) for j, idx in enumerate(parts)], dtype=torch.float64)

    def without_noise(self) -> torch.Tensor:
        """Σ_j (n_j/n̂)·θ̂_j: what an output job releases before its noise (the daemons' release
        minus this is the noise they added, to compare with the plan's σ)."""
        return self.weights @ self.local

    def draw(self, seed: int) -> tuple[torch.Tensor, float]:
        """One run with noise seeded by ``seed``: (θ, seconds)."""
        from mpc_erm.simulate.aggregator import InProcessAggregator

        agg = InProcessAggregator(torch.Generator().manual_seed(seed))
        tic = time.perf_counter()
        if self.spec.method == "gradient":
            w = torch.tensor([self.plan.weight(0, 1)], dtype=torch.float64)
            theta = self.proto.train(agg, lambda th: (self.proto.local_contribution(th, self.X, self.y), w))
        else:
            theta = self.proto.release(agg, self.local, self.weights)
        return theta, time.perf_counter() - tic + self.solve_s


def _thesis_simulator(method: str, m: int, rounds: int, seed: int) -> dict[str, Any]:
    from mpc_erm.simulate import ExperimentConfig, run_experiment

    cfg = ExperimentConfig(dataset="kddcup99", parties=m, iterations=rounds, eval_every=rounds, epsilon=EPS,
                           delta=DELTA, lam=LAM, G=1.0, learning_rate=1.0, conventions=["exact"], seeds=[seed],
                           methods=[method], n_train=N_TRAIN, n_test=N_TEST)
    tic = time.perf_counter()
    run = run_experiment(cfg)["runs"][0]
    return {"optimality_gap": run["final_optimality_gap"],
            "relative_accuracy_loss": run["final_relative_accuracy_loss"],
            "seconds": time.perf_counter() - tic, "privacy": _compact(run["privacy"]),
            "what": "mpc_erm.simulate.run_experiment, convention 'exact' (replace-one, weights n_j/n, ideal Gaussian)"}


def _compact(x: Any) -> Any:
    """``x`` with each long list (m = 50,000 parties' public counts) and long text cut to a sample
    and its length: the JSON stays readable."""
    if isinstance(x, dict):
        return {k: _compact(v) for k, v in x.items()}
    if isinstance(x, list) and len(x) > 20:
        return {"first": [_compact(v) for v in x[:5]], "length": len(x)}
    if isinstance(x, list):
        return [_compact(v) for v in x]
    if isinstance(x, str) and len(x) > 600:
        return f"{x[:600]}… ({len(x):,} characters)"
    return x


def _round_times(met: dict[str, Any]) -> dict[str, Any]:
    """The compute party's per-round split (``IntakeAggregator``): median seconds waiting for the
    owners' shares and in the MPC, and its worker's CPU seconds (intake threads included), over the
    rounds after the first (whose wait holds the enrolment)."""
    wait, mpc = met.get("round_wait_seconds") or [], met.get("round_mpc_seconds") or []
    if len(wait) < 2:
        return {"first_round_seconds": (wait[0] + mpc[0]) if wait and mpc else None}
    cpu = met.get("round_cpu_seconds") or []
    return {"first_round_seconds": wait[0] + mpc[0], "round_wait_s_p50_after_first": float(np.median(wait[1:])),
            "round_mpc_s_p50_after_first": float(np.median(mpc[1:])),
            "round_s_p50_after_first": float(np.median(np.add(wait[1:], mpc[1:]))),
            "compute_party_cpu_s_p50_after_first": float(np.median(cpu[1:])) if len(cpu) > 1 else None}


def one_setting(cons: Any, root: Path, train: Any, test: Any, metrics: Any, *, method: str, m: int, rounds: int,
                seed: int, baseline_seeds: int, owner_procs: int = 1, leave: bool = False,
                concurrency: int | None = None, deadline: float = 120.0) -> dict[str, Any]:
    from mpc_erm.jobs.jobfile import load_job_file

    dataset = f"{method[:4]}{m}s{seed}"
    tic = time.perf_counter()
    configs, parts = _owners(cons, root / dataset, train, m, dataset, seed)
    setup_s = time.perf_counter() - tic
    job_path = root / f"{dataset}.toml"
    extra = GRAD_EXTRA.format(rounds=rounds) if method == "gradient" else OUT_EXTRA
    job_path.write_text(JOB.format(method=method, m=m, dataset=dataset, d=train.d, lam=LAM, eps=EPS, delta=DELTA,
                                   n=train.n, owners=", ".join(f'"{dataset}-{o:05d}"' for o in range(m)), extra=extra,
                                   deadline=deadline))
    leave = leave and method == "output"
    run = run_job(cons, configs, job_path, root, owner_procs=owner_procs, leave=leave, concurrency=concurrency,
                  wait_s=max(900.0, 12 * deadline))
    from safetensors.torch import load_file

    theta = load_file(str(run["dir"] / "model.safetensors"))["theta"].double()
    gap, acc = metrics(theta)
    releases = rounds if method == "gradient" else 1
    rep, met = run["report"], run["metrics"]
    daemons = {"optimality_gap": gap, "relative_accuracy_loss": acc, "wall_seconds": run["wall_seconds"],
               "mpc_wall_seconds": met["wall_seconds"], "seconds_per_round": met["wall_seconds"] / releases,
               **_round_times(met),
               "owners_per_round_min": min(met["owners_per_round"]), "owners_failed": run["owners_failed"],
               "epsilon": rep["epsilon"], "delta_total": rep["delta"] + rep["delta_sampler"],
               "accountant": rep["accountant"], "noise_scale": rep.get("noise_scale"),
               "sensitivity_l2": rep["plan"]["sensitivity_l2"], "owner_setup_seconds": setup_s,
               "owner_processes": owner_procs, "machine_memory_gib": run["machine_memory_gib"],
               "owner_mode": ("owner join --leave, then owner fetch after the job" if leave else "owner join"),
               "owners_at_once": concurrency and concurrency * owner_procs, "round_deadline_s": deadline,
               "send_seconds": run["send_seconds"], "fetch_seconds": run["fetch_seconds"],
               "owners_fetched": run["owners_fetched"] if leave else None,
               "owners_fetch_failed": run["owners_fetch_failed"]}
    # the daemons' figures before the baseline's draws (a T = 1,500 baseline takes minutes a draw):
    # a run stopped during the baseline still leaves them in its log
    print(f"{method} m = {m} seed {seed} daemons: " + json.dumps(daemons, default=float), flush=True)
    same = _SameJob(job_path, train, parts)
    base = [(metrics(th), sec) for th, sec in (same.draw(1000 * seed + k) for k in range(baseline_seeds))]
    gaps, accs = np.array([g for (g, _), _ in base]), np.array([a for (_, a), _ in base])
    b_gap, b_acc, base_s = float(gaps.mean()), float(accs.mean()), float(np.mean([sec for _, sec in base]))
    if method == "output":  # the noise the daemons added, against the plan's σ
        z = theta - same.without_noise()
        realised = {"noise_std_per_coordinate": float(z.std()), "noise_norm": float(z.norm()),
                    "plan_sigma": run["report"].get("noise_scale"),
                    "std_over_sigma": float(z.std()) / float(run["report"].get("noise_scale") or float("nan"))}
    else:
        realised = None
    sim = _thesis_simulator("mpc_grad_p" if method == "gradient" else "mpc_out_p", m, rounds, seed)
    row = {
        "method": method, "owners": m, "rows_per_owner": [int(min(map(len, parts))), int(max(map(len, parts)))],
        "rounds": releases, "seed": seed, "job_digest": load_job_file(job_path).spec_digest(),
        "daemons": {**daemons, "realised_noise": realised},
        "same_job_in_process": {"noise_draws": baseline_seeds, "optimality_gap_mean": b_gap,
                                "optimality_gap_std": float(gaps.std()), "relative_accuracy_loss_mean": b_acc,
                                "relative_accuracy_loss_std": float(accs.std()), "seconds": base_s,
                                "seconds_per_round": base_s / releases,
                                "daemons_gap_z": (gap - b_gap) / max(float(gaps.std()), 1e-300),
                                "daemons_gap_quantile": float((gaps <= gap).mean())},
        "thesis_simulator": sim,
        "wall_ratio_daemons_to_in_process": run["wall_seconds"] / base_s,
    }
    print(f"{method} m = {m}: daemons gap {gap:.3e}, acc loss {acc:+.2e} ({run['wall_seconds']:.0f} s, "
          f"{row['daemons']['seconds_per_round']:.3f} s/round; "
          f"after the first: {row['daemons'].get('round_s_p50_after_first') or float('nan'):.3f} s median); "
          f"same job in process ({baseline_seeds} draws) gap "
          f"{b_gap:.3e} ± {gaps.std():.1e}, acc loss {b_acc:+.2e} ({base_s:.1f} s each); thesis simulator gap "
          f"{sim['optimality_gap']:.3e}", flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grad-owners", default="1000", help="comma list of m for Grad P ('' for none)")
    ap.add_argument("--grad-rounds", type=int, default=1500)
    ap.add_argument("--out-owners", default="1000", help="comma list of m for Out P ('' for none)")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--owner-procs", type=int, default=1,
                    help="spread the owners over this many processes (threads in each); 1: all in this process")
    ap.add_argument("--leave", action="store_true",
                    help="Out P owners send their shares and leave (owner join --leave), each fetching its model "
                         "after the job (owner fetch)")
    ap.add_argument("--owner-concurrency", type=int, default=None,
                    help="at most this many owners at a time in each owner process (default: all at once)")
    ap.add_argument("--round-deadline", type=float, default=120.0,
                    help="the job's round_deadline_s (the first round waits 10× as long for every owner)")
    ap.add_argument("--baseline-seeds", type=int, default=20, help="noise draws of the in-process baseline")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the daemons' and owners' state go (default: the system's temp dir)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    from coordinator.consortium import LocalConsortium

    benchmark_process_setup()
    train, test = _data()
    metrics = _scores(train, test)
    settings = [("output", int(m)) for m in a.out_owners.split(",") if m] + \
               [("gradient", int(m)) for m in a.grad_owners.split(",") if m]
    rows: list[dict[str, Any]] = []
    tic = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="thesis-owners-", dir=a.workdir) as tmp:
        root = Path(tmp)
        with LocalConsortium(root / "cons", parties=3, dealer=False, max_epsilon_per_job=1.0, peer_timeout_s=600.0,
                             max_iterations=max(2000, a.grad_rounds)) as cons:
            for method, m in settings:
                for seed in (int(s) for s in a.seeds.split(",")):
                    rows.append(one_setting(cons, root, train, test, metrics, method=method, m=m,
                                            rounds=a.grad_rounds, seed=seed, baseline_seeds=a.baseline_seeds,
                                            owner_procs=a.owner_procs, leave=a.leave,
                                            concurrency=a.owner_concurrency, deadline=a.round_deadline))
                    if a.out:
                        _write(a, rows, tic)


def _write(a: Any, rows: list[dict[str, Any]], tic: float) -> None:
    where = a.workdir or "the system temp dir"
    res = {"benchmark": "many_owners_thesis", "machine": machine_info(),
           "what": "thesis MPC Grad P / Out P on KDD Cup 99 (50,000 train / 20,000 test rows, 122 features), logistic, "
                   "λ = 1e-3, G = C = 1, ε = 0.5, δ = 1e-3, add/remove with public n̂ = 50,000, through 3 compute-party "
                   "daemons (replicated, in-MPC discrete Gaussian); m owners with equal random shares of the rows, "
                   "real gRPC clients with their own certificates, ledgers and files, one thread each, in the "
                   f"benchmark's process or spread over {a.owner_procs} spawned processes (owner_processes per row), "
                   "on the same cores as the daemons",
           "baseline": "the same job file through the same protocol code in process (plaintext aggregator, continuous "
                       "noise of the plan's σ), same rows and seed; thesis_simulator: mpc_erm.simulate's 'exact' "
                       "convention at the same m (replace-one), for context",
           "command": "python -m benchmarks.many_owners_thesis " + " ".join(
               f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in vars(a).items()
               if k != "out" and v is not None and v is not False),
           "storage": f"daemons' and owners' state (ledgers, audit logs: one fsync per record) under {where}; with "
                      "every owner in one process on one machine, /dev/shm keeps 1,000 owners' fsyncs per round from "
                      "measuring this machine's disk instead of the protocol",
           "rows": rows, "wall_seconds": time.perf_counter() - tic}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
