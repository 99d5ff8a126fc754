"""A small search over a gradient job's sampling rate, rounds and learning rate at its own (ε, δ),
on the dry run's stand-in rows: what ``mpc-erm job plan --search`` proposes.

Why: at a fixed ε the noise multiplier the plan needs grows with the sampling rate q and the
rounds T, so the lever that matters is often a smaller q or fewer rounds, with a learning rate to
match — not more rows or a larger ε. Every setting is planned at the job's own (ε, δ) and run
through the same forecast as the job (:func:`~mpc_erm.simulate.forecast.forecast_job`: the job's
own rounds, in process).

The search spends no privacy only because the stand-in rows are public (synthetic, public, or
last year's): tuning on the parties' private rows would leak through the choice itself, which
no plan accounts. ``job plan`` says so beside the proposal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np

from mpc_erm.data import Dataset
from mpc_erm.privacy.distributed import NoiseSplit
from mpc_erm.spec import JobSpec

from .forecast import Forecast, forecast_job

__all__ = ["SearchPoint", "candidates", "search"]

#: Multipliers tried around the job's own setting (the job's own is always among them).
RATE_FACTORS = (1.0, 0.5, 0.25)
ROUND_FACTORS = (0.5, 1.0, 2.0)
STEP_FACTORS = (0.5, 1.0, 2.0)


@dataclass(frozen=True)
class SearchPoint:
    """One setting tried: its training overrides and the forecast it got."""

    sampling_rate: float
    iterations: int
    learning_rate: float
    forecast: Forecast

    @property
    def mean(self) -> float:
        return float(np.mean(self.forecast.private)) if self.forecast.private else float("-inf")

    def overrides(self) -> dict[str, float | int]:
        """The ``[training]`` keys to set for this setting."""
        out: dict[str, float | int] = {"iterations": self.iterations, "learning_rate": self.learning_rate}
        if self.sampling_rate < 1.0:
            out["sampling_rate"] = self.sampling_rate
        return out


def candidates(spec: JobSpec) -> list[JobSpec]:
    """The job's own setting first, then the grid around it: q × (1, ½, ¼) for subsampled rounds
    (kept to at least one expected record of the public n̂ a round), T × (½, 1, 2), η × (½, 1, 2).
    Only gradient jobs (linear, networks, federated) have rounds to search; others get [spec]."""
    if spec.method != "gradient":
        return [spec]
    t = spec.training
    n_hat = spec.privacy.public_n
    rates = [1.0]
    if t.sampling_rate < 1.0:
        rates = sorted({t.sampling_rate * f for f in RATE_FACTORS
                        if n_hat is None or t.sampling_rate * f * n_hat >= 1.0} | {t.sampling_rate}, reverse=True)
    rounds = sorted({max(1, round(t.iterations * f)) for f in ROUND_FACTORS})
    steps = sorted({t.learning_rate * f for f in STEP_FACTORS})
    base = spec.model_dump(mode="json", exclude_none=True)
    out = [spec]
    for q, T, lr in product(rates, rounds, steps):
        if (q, T, lr) == (t.sampling_rate, t.iterations, t.learning_rate):
            continue
        training = {**base["training"], "iterations": T, "learning_rate": lr}
        if q < 1.0:
            training["sampling_rate"] = q
        out.append(JobSpec.model_validate({**base, "training": training}))
    return out


def search(spec: JobSpec, parts: Sequence[Dataset], *, evaluate: Dataset | None = None, runs: int = 2,
           owners: int | None = None, noise_split: NoiseSplit | None = None) -> list[SearchPoint]:
    """Every candidate's forecast, best simulated mean first (the job's own setting is the point
    whose overrides equal the job file's)."""
    points = []
    for i, cand in enumerate(candidates(spec)):
        try:
            fc = forecast_job(cand, parts, evaluate=evaluate, runs=runs, owners=owners, noise_split=noise_split)
        except ValueError:
            if i == 0:
                raise  # the job as written: its own error, as `job plan` reports it
            continue  # a setting the plan refuses (say, τ·N not whole for uniform owner sampling)
        t = cand.training
        points.append(SearchPoint(t.sampling_rate, t.iterations, t.learning_rate, fc))
    return sorted(points, key=lambda p: (p.forecast.hopeless, -p.mean))
