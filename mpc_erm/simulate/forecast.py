"""A job's forecast before any ε is spent: its noise next to its signal, ε per accountant, and the
same protocol run in process on rows the user supplies (``mpc-erm job plan``).

Why: a job whose noise drowns its signal still spends its whole ε. The forecast runs the very
round loop the daemons run (``GradientPerturbation.train`` / ``OutputPerturbation.release``), with
the plan a daemon would make for these row counts, on the user's stand-in rows (synthetic, public,
or their own, which never leave this process), so its accuracy band predicts the daemons' result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from mpc_erm.data import Dataset
from mpc_erm.models import solve_erm
from mpc_erm.protocols import GradientPerturbation, OutputPerturbation
from mpc_erm.protocols.common import PartySizes, plan_job, public_sizes
from mpc_erm.protocols.spec import JobSpec
from mpc_erm.simulate.aggregator import InProcessAggregator

__all__ = ["Forecast", "HOPELESS_NOISE_TO_SIGNAL", "InProcessJob", "forecast_job"]

#: Noise norm over signal norm above which a release carries next to nothing (``job submit`` asks).
HOPELESS_NOISE_TO_SIGNAL = 3.0
ACCOUNTANTS = ("rdp", "pld", "gdp", "zcdp")


@dataclass(frozen=True)
class Forecast:
    """What ``job plan`` prints; every figure recomputable from the job file and the row counts."""

    method: str
    mechanism: str
    rounds: int
    dim: int
    sensitivity: float  # ℓ2 (Gaussian) or ℓ1 (Laplace) sensitivity of one release
    noise_std: float  # per coordinate of one release
    signal_norm: float  # gradient: ‖first released gradient‖ without noise; output: ‖non-private model‖
    epsilon: float
    delta: float
    epsilon_by_accountant: dict[str, float | None]
    metric: str | None = None  # "accuracy" or "r2"
    private: list[float] = field(default_factory=list)  # the metric of each simulated run
    nonprivate: float | None = None  # the same objective solved without noise on the pooled rows
    trivial: float | None = None  # majority class (accuracy) or the mean (R² = 0)

    @property
    def noise_to_signal(self) -> float:
        """Expected noise norm (σ·√p) over the noise-free release's norm; for T gradient rounds,
        over √T times it (the model moves by the sum of T steps, whose noise grows as √T)."""
        if self.signal_norm <= 0:
            return math.inf
        ratio = self.noise_std * math.sqrt(self.dim) / self.signal_norm
        return ratio / math.sqrt(self.rounds) if self.method == "gradient" else ratio

    @property
    def hopeless(self) -> bool:
        """The noise is several times the signal, or the runs do no better than a constant."""
        if self.noise_to_signal > HOPELESS_NOISE_TO_SIGNAL:
            return True
        if self.private and self.trivial is not None:
            return float(np.mean(self.private)) <= self.trivial + 0.01
        return False

    def band(self) -> tuple[float, float, float] | None:
        """(mean, 10 % quantile, 90 % quantile) of the simulated runs' metric."""
        if not self.private:
            return None
        a = np.asarray(self.private)
        return float(a.mean()), float(np.quantile(a, 0.1)), float(np.quantile(a, 0.9))


def _tensors(ds: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    X = torch.as_tensor(np.array(ds.X), dtype=torch.float64)
    y = torch.as_tensor(np.array(ds.y))
    return X, (y.to(torch.int64) if ds.task == "multiclass" else y.to(torch.float64))


def _metric(loss: Any, theta: torch.Tensor, ds: Dataset) -> tuple[str, float]:
    X, y = _tensors(ds)
    pred = loss.predict(theta, X)
    if ds.task == "regression":
        resid = ((pred - y) ** 2).sum()
        total = ((y - y.mean()) ** 2).sum()
        return "r2", float(1.0 - resid / total) if float(total) > 0 else 0.0
    return "accuracy", float((pred == y).double().mean())


def _trivial(ds: Dataset) -> float:
    if ds.task == "regression":
        return 0.0
    _, counts = np.unique(np.asarray(ds.y), return_counts=True)
    return float(counts.max() / counts.sum())


def _accountants(plan: Any) -> dict[str, float | None]:
    """ε of this job had it named each accountant: the plan's own :meth:`guarantee` with that
    accountant (the sampler's term included); None where it does not cover the event."""
    if plan.mechanism != "gaussian" or plan.noise_multiplier is None:
        return {plan.accountant: plan.guarantee().epsilon}
    out: dict[str, float | None] = {}
    for acc in (*ACCOUNTANTS, plan.accountant):
        try:
            out[acc] = replace(plan, accountant=acc).guarantee().epsilon
        except ValueError:
            out[acc] = None  # this accountant does not cover the event (say, the discrete Gaussian's PLD)
    return out


class InProcessJob:
    """A linear job's releases computed in one process: each party's contribution as its worker
    makes it (its local model, solved once; or its clipped gradient sum each round) with the
    plan's weight, summed by the in-process aggregator with the plan's noise — the daemons'
    protocol code and round loop, without the MPC."""

    def __init__(self, spec: JobSpec, plan: Any, parts: Sequence[Dataset]) -> None:
        d = parts[0].d
        self.spec, self.tensors = spec, [_tensors(p) for p in parts]
        self.weights = torch.tensor([plan.weight(j, p.n) for j, p in enumerate(parts)], dtype=torch.float64)
        if spec.method == "output":
            self.proto: Any = OutputPerturbation(spec, None, d, plan=plan)
            self.local = torch.stack([self.proto.local_model(X, y) for X, y in self.tensors])
        else:
            self.proto = GradientPerturbation(spec, None, d, plan=plan)

    def _sums(self, theta: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.proto.local_contribution(theta, X, y) for X, y in self.tensors])

    def signal(self) -> float:
        """The norm of the noise-free release: the averaged model, or the first round's gradient."""
        if self.spec.method == "output":
            return float((self.weights @ self.local).norm())
        return float((self.weights @ self._sums(self.proto.initial_model())).norm())

    def release(self, generator: torch.Generator) -> torch.Tensor:
        """One run of the job: the released (output) or trained (gradient) model."""
        agg = InProcessAggregator(generator)
        if self.spec.method == "output":
            return self.proto.release(agg, self.local, self.weights)
        return self.proto.train(agg, lambda th: (self._sums(th), self.weights))


def forecast_job(spec: JobSpec, parts: Sequence[Dataset], *, evaluate: Dataset | None = None, runs: int = 5,
                 seed: int = 0) -> Forecast:
    """Plan ``spec`` for parties holding ``parts`` (their row counts are what the daemons would
    agree), then run the job's protocol ``runs`` times in process and score each model on
    ``evaluate`` (default: the pooled rows). Linear output and gradient jobs."""
    if spec.model.is_network or spec.federated is not None:
        raise ValueError("model.name: a forecast runs linear output and gradient jobs (networks: mpc-erm simulate)")
    if not parts:
        raise ValueError("data: at least one party's rows are needed")
    d = parts[0].d
    if any(p.d != d for p in parts):
        raise ValueError(f"data: the parties' rows have different widths {[p.d for p in parts]}")
    sizes = PartySizes.of([p.n for p in parts])
    plan = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, sizes), n_features=d)
    job = InProcessJob(spec, plan, parts)
    pooled = Dataset(np.vstack([p.X for p in parts]), np.concatenate([p.y for p in parts]), parts[0].task,
                     "pooled", parts[0].feature_names, parts[0].n_classes)
    target = evaluate if evaluate is not None else pooled
    loss = job.proto.loss
    Xp, yp = _tensors(pooled)
    optimum = solve_erm(loss, Xp, yp, spec.model.lam, tol=1e-10).theta
    metric, nonprivate = _metric(loss, optimum, target)
    scores = [_metric(loss, job.release(torch.Generator().manual_seed(seed + r)), target)[1] for r in range(runs)]
    noise_std = plan.noise_scale() * (math.sqrt(2.0) if plan.mechanism == "laplace" else 1.0)
    g = plan.guarantee()
    return Forecast(method=spec.method, mechanism=plan.mechanism, rounds=plan.rounds, dim=int(plan.dim or d),
                    sensitivity=plan.sensitivity(), noise_std=noise_std, signal_norm=job.signal(), epsilon=g.epsilon,
                    delta=g.delta, epsilon_by_accountant=_accountants(plan), metric=metric, private=scores,
                    nonprivate=nonprivate, trivial=_trivial(target))
