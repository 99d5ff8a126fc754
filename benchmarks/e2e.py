"""End to end across real daemons: private models on UCI Adult, accuracy and time per round.

Runs the demo's jobs (:func:`coordinator.end_to_end.default_jobs`) with
:func:`coordinator.end_to_end.run_jobs` (3 party daemons + dealer as separate processes, mTLS on
loopback, in-MPC noise) and, in the same script as the baseline, the same gradient-perturbation
job in the in-process simulator (plaintext aggregator, same protocol code, same σ): what the MPC
costs per round is reported as a ratio to it. ``python -m benchmarks e2e --out FILE`` writes the JSON.
"""

from __future__ import annotations

import json
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["run"]


def _simulated_gradient(job: Any, parties: int, dataset: str) -> dict[str, Any]:
    """The same gradient job in-process (plaintext aggregator, same σ); accuracy and s/round."""
    import numpy as np
    import torch

    from mpc_erm.data import load_dataset
    from mpc_erm.data.partition import partition_equal
    from mpc_erm.models import get_loss
    from mpc_erm.mpc.noise import realise
    from mpc_erm.privacy.plan import plan_job, public_sizes
    from mpc_erm.protocols import GradientPerturbation
    from mpc_erm.protocols.aggregation import NoiseSpec
    from mpc_erm.protocols.common import PartySizes
    from mpc_erm.simulate.aggregator import InProcessAggregator
    from mpc_erm.spec import JobSpec

    train, test = load_dataset(dataset)
    parts = [np.sort(p) for p in partition_equal(train.n, parties, rng=0)]
    X = torch.tensor(np.concatenate([train.X[p] for p in parts]), dtype=torch.float64)
    y = torch.tensor(np.concatenate([train.y[p] for p in parts]))
    sizes = PartySizes.of([len(p) for p in parts])
    spec = JobSpec.model_validate({
        "method": "gradient", "model": {"name": "logistic", "lam": job.lam},
        "privacy": {"epsilon": job.epsilon, "delta": job.delta, "accountant": "rdp", "clip": 1.0},
        "training": {"iterations": job.iterations, "learning_rate": job.learning_rate}})
    # the daemons' plan and their σ exactly: the in-MPC realisation of the plan's noise multiplier
    plan = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, sizes.sizes), n_features=X.shape[1])
    proto = GradientPerturbation(spec, sizes, X.shape[1], plan=plan, noise=realise(plan, parties).spec)
    noise = proto.noise
    agg = InProcessAggregator(torch.Generator().manual_seed(0))
    theta = proto.initial_model()
    w = torch.full((X.shape[0],), 1.0 / X.shape[0], dtype=torch.float64)
    norms = X.norm(dim=1)
    tic = time.perf_counter()
    for _ in range(job.iterations):
        total = proto.weighted_clipped_sum(theta, X, y, w, norms)
        noisy = agg.aggregate(total[None, :], torch.ones(1, dtype=total.dtype), NoiseSpec("gaussian", noise.scale))
        theta = proto.public_step(theta, noisy)
    seconds = time.perf_counter() - tic
    Xt, yt = torch.tensor(test.X, dtype=torch.float64), torch.tensor(test.y)
    return {"accuracy": float(get_loss("logistic").score(theta, Xt, yt)), "seconds": seconds,
            "seconds_per_round": seconds / job.iterations, "sigma": noise.scale}


def _job_block(r: dict[str, Any]) -> dict[str, Any]:
    block = {k: r[k] for k in ("job", "method", "status", "accuracy", "nonprivate_accuracy", "epsilon", "delta",
                               "ledger_epsilon", "wall_s", "trust_model", "reason")}
    if r["status"] != "succeeded":
        return block
    m = json.loads((Path(r["result_dir"]) / "metrics.json").read_text())
    mpc, noise = m["mpc"], m["noise"]
    plans = noise.get("plans") or [{}]
    block.update(
        accuracy_gap_points=100.0 * (r["nonprivate_accuracy"] - r["accuracy"]),
        worker_seconds=m["wall_seconds"],
        online={"aggregates": mpc["aggregates"], "seconds": mpc["seconds"],
                "seconds_per_round": mpc["seconds"] / max(1, mpc["aggregates"]), "bytes": mpc["bytes"]},
        offline_noise={"samples": plans[0].get("produced"), "seconds": plans[0].get("seconds"),
                       "samples_per_second": plans[0].get("samples_per_second"), "bytes": plans[0].get("bytes")},
    )
    return block


def run(*, trust: str = "dealer", iterations: int = 50, parties: int = 3,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    from coordinator.end_to_end import default_jobs, run_jobs

    say = progress or (lambda _m: None)
    jobs = default_jobs(iterations)
    with tempfile.TemporaryDirectory(prefix="mpc-erm-bench-e2e-") as tmp:
        say(f"running the demo's jobs across real daemons ({trust})")
        summary = run_jobs(Path(tmp), jobs=jobs, parties=parties, trust=trust,
                           on_status=lambda m: say(f"  {m}"))
        blocks = [_job_block(r) for r in summary["jobs"]]
    say("baseline: the same gradient job in the in-process simulator")
    grad = next(j for j in jobs if j.method == "gradient")
    sim = _simulated_gradient(grad, parties, "adult")
    g = next((b for b in blocks if b["method"] == "gradient"), None)
    ratios = {}
    if g and g["status"] == "succeeded":
        ratios = {"mpc_online_over_plaintext_per_round": g["online"]["seconds_per_round"] / sim["seconds_per_round"],
                  "mpc_job_over_plaintext_job": g["wall_s"] / sim["seconds"]}
    return {
        "benchmark": "e2e_adult",
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version()},
        "parameters": {"dataset": "adult", "parties": parties, "trust": trust,
                       "jobs": [j.__dict__ for j in jobs]},
        "jobs": blocks,
        "baseline_plaintext_gradient": sim,
        "ratios": ratios,
        "targets": [{"target": "gradient, ε = 1, δ = 1e-5: test accuracy within 2 points of the non-private model",
                     "applies": bool(g), "met": bool(g and g["status"] == "succeeded"
                                                     and g["accuracy_gap_points"] <= 2.0)}],
        "total_seconds": summary["wall_s"],
    }
