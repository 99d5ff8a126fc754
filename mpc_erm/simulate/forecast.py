"""A job's forecast before any ε is spent: its noise next to its signal, ε per accountant, and the
same protocol run in process on rows the user supplies (``mpc-erm job plan``).

Why: a job whose noise drowns its signal still spends its whole ε. The forecast runs the very
round loop the daemons run (``GradientPerturbation.train`` / ``OutputPerturbation.release`` for
linear models, ``DpSgd.train`` for networks, ``DpFedLs.train`` for DP-Fed-LS with data owners),
with the plan a daemon would make for these row counts, on the user's stand-in rows (synthetic,
public, or their own, which never leave this process), so its accuracy band predicts the daemons'
result. For a job with data owners the stand-in rows are dealt to the job's owners.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch

from mpc_erm.data import Dataset
from mpc_erm.models import solve_erm
from mpc_erm.privacy.distributed import NoiseSplit
from mpc_erm.privacy.noise_floor import HOPELESS_NOISE_TO_SIGNAL, noise_std, noise_to_signal
from mpc_erm.privacy.plan import PrivacyPlan, plan_job, public_sizes
from mpc_erm.protocols.aggregation import NoiseSpec, SecureAggregator
from mpc_erm.protocols.common import network_rows
from mpc_erm.protocols.dpsgd import DpSgd
from mpc_erm.protocols.fedls import DpFedLs
from mpc_erm.protocols.row_draws import RowDraws, pooled_draws
from mpc_erm.runs import FederatedRun, NetworkRun, OutputRun, RevealGuard, linear_run_class
from mpc_erm.simulate.aggregator import InProcessAggregator
from mpc_erm.spec import JobSpec

__all__ = ["Forecast", "REFERENCE_WORDS", "InProcessFederatedJob", "InProcessJob", "InProcessNetworkJob", "pooled_rows",
           "Reference", "deal_to_owners", "forecast_job"]

#: What a forecast's ``nonprivate`` figure is: the objective's exact minimiser on the pooled rows
#: (linear jobs), or the job's own rounds run without noise (networks, federated jobs).
Reference = Literal["exact_minimiser", "noise_free_rounds"]
#: How ``job plan`` names each reference in its text.
REFERENCE_WORDS: dict[str, str] = {"exact_minimiser": "non-private",
                                   "noise_free_rounds": "the same rounds without noise"}

ACCOUNTANTS = ("rdp", "pld", "gdp", "zcdp")
#: A forecast is hopeless when its private runs' mean is within this (or two standard errors) of a
#: constant predictor's accuracy (or R² of 0).
HOPELESS_MARGIN = 0.01
#: ... and weak when it gets less than this fraction of the way from the constant to the same
#: rounds without noise.
WEAK_RECOVERED = 0.25


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
    # (networks: ‖the first round's noise-free mean of clipped gradients‖, its Poisson batch)
    epsilon: float
    delta: float
    epsilon_by_accountant: dict[str, float | None]
    metric: str | None = None  # "accuracy" or "r2"
    private: list[float] = field(default_factory=list)  # the metric of each simulated run
    nonprivate: float | None = None  # linear: the objective's exact minimiser on the pooled rows;
    # networks: the same clipped rounds without noise
    trivial: float | None = None  # majority class (accuracy) or the mean (R² = 0)
    reference: Reference = "exact_minimiser"  # what ``nonprivate`` is (REFERENCE_WORDS: how it is printed)
    noise_free: float | None = None  # the same rounds without noise (what the optimiser alone reaches)
    federated: bool = False  # DP-Fed-LS: the optimiser is the owners' local epochs and the global step
    sampling_rate: float = 1.0  # each round's Poisson (or owner) sampling rate
    noise_multiplier: float | None = None  # z = σ/Δ the plan chose (None: pure ε)

    @property
    def noise_to_signal(self) -> float:
        """:func:`noise_to_signal` of the noise-free release's norm."""
        return noise_to_signal(self.method, self.noise_std, self.dim, self.signal_norm, self.rounds)

    @property
    def hopeless(self) -> bool:
        """The forecast's own runs buy nothing: without noise the rounds do no better than a
        constant, or the simulated private models' mean does no better than one. Only a forecast
        with no simulated runs falls back on the noise/signal ratio: the runs are the job's own
        rounds, and DP-SGD's many noisy steps average out noise that one step's ratio counts in
        full (a ratio of 3.8 forecast 0.80 accuracy where a constant scores 0.10)."""
        if self.untrained:
            return True
        if self.private and self.trivial is not None:
            return bool(float(np.mean(self.private)) <= self.trivial + self.margin)
        return self.drowned

    @property
    def margin(self) -> float:
        """How far above a constant the runs' mean must be to count: :data:`HOPELESS_MARGIN`, or two
        standard errors of the mean where the runs spread more (random models of a drowned job
        score around a constant, some above it)."""
        n = len(self.private)
        spread = 2.0 * float(np.std(self.private, ddof=1)) / np.sqrt(n) if n > 1 else 0.0
        return max(HOPELESS_MARGIN, spread)

    @property
    def drowned(self) -> bool:
        """The noise norm is several times the first release's signal (a warning sign, which the
        simulated runs confirm or overrule)."""
        return bool(self.noise_to_signal > HOPELESS_NOISE_TO_SIGNAL)

    @property
    def recovered(self) -> float | None:
        """How far the simulated private models' mean gets from a constant predictor (0) to the
        reference without noise (1): the same rounds without noise where they were run, else the
        exact minimiser. None without runs or references."""
        ref = self.noise_free if self.noise_free is not None else self.nonprivate
        if not self.private or self.trivial is None or ref is None or ref <= self.trivial:
            return None
        return (float(np.mean(self.private)) - self.trivial) / (ref - self.trivial)

    @property
    def weak(self) -> bool:
        """Better than a constant, but less than a quarter of the way to the model without noise."""
        r = self.recovered
        return not self.hopeless and r is not None and r < WEAK_RECOVERED

    @property
    def untrained(self) -> bool:
        """Even without noise the rounds do no better than a constant: the learning rate or the
        number of rounds is at fault, not the privacy."""
        return self.noise_free is not None and self.trivial is not None and self.noise_free <= self.trivial + 0.01

    @property
    def short_of_optimum(self) -> bool:
        """Without noise the rounds stop well short of the exact minimiser (linear jobs)."""
        return (self.noise_free is not None and self.nonprivate is not None and self.reference == "exact_minimiser"
                and self.noise_free < self.nonprivate - 0.02)

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
    """A linear job's releases computed in one process: the job's run (:mod:`mpc_erm.runs`, the
    daemons' run classes) with every party's rows as its members — each contribution as its
    worker makes it (its local model, solved once; or its clipped gradient sum each round) with
    the plan's weight — summed by the in-process aggregator with the plan's noise."""

    def __init__(self, spec: JobSpec, plan: PrivacyPlan, parts: Sequence[Dataset]) -> None:
        self.spec, self.plan = spec, plan
        self.run = linear_run_class(spec).in_process(spec, plan, parts)
        if isinstance(self.run, OutputRun):
            self.run.solve_locally()

    def signal(self) -> float:
        """The norm of the noise-free release: the averaged model, or the first round's gradient."""
        run = self.run
        if isinstance(run, OutputRun):
            return float((run.weights @ run.solve_locally()).norm())
        return float((run.weights @ run.contributions(run.proto.initial_model())).norm())

    def release(self, generator: torch.Generator) -> torch.Tensor:
        """One run of the job: the released (output) or trained (gradient) model."""
        return self.run.run(InProcessAggregator(generator), RevealGuard.unrecorded(self.plan)).model


class InProcessNetworkJob:
    """A network job's DP-SGD / DP-Adam rounds in one process (:class:`~mpc_erm.runs.NetworkRun`,
    the worker's run): each party's Poisson batch from its own generator, its clipped sum, all
    summed by the in-process aggregator with the plan's noise."""

    def __init__(self, spec: JobSpec, plan: PrivacyPlan, parts: Sequence[Dataset]) -> None:
        self.spec, self.plan, self.first = spec, plan, parts[0]
        self.tensors = [network_rows(p, spec, "cpu") for p in parts]

    def _run(self, generator: torch.Generator, noise: NoiseSpec | None = None) -> NetworkRun:
        seeds = torch.randint(0, 2**62, (len(self.tensors),), generator=generator).tolist()
        gens: list[torch.Generator | RowDraws] = [torch.Generator().manual_seed(int(s)) for s in seeds]
        b = self.spec.training.batch_size
        if b is not None:  # one joint draw of b pooled rows a round, split by party (the daemons' law)
            counts = [int(X.shape[0]) for X, _ in self.tensors]
            gens = list(pooled_draws(counts, int(b), int(self.spec.training.iterations), gens[0]))
        return NetworkRun.in_process(self.spec, self.plan, self.first, self.tensors, gens, noise=noise)

    def initial(self) -> torch.Tensor:
        """The network's agreed initial parameters (from ``model.init_seed``), flat, before any round."""
        return self._run(torch.Generator().manual_seed(0)).job.master

    def signal(self) -> float:
        """‖the first round's release without noise‖: the weighted clipped sums of one Poisson batch."""
        run = self._run(torch.Generator().manual_seed(0))
        return float((run.job.weight * run.contributions().sum(dim=0)).norm())

    def train(self, generator: torch.Generator, *, noise: bool = True,
              around: Callable[[SecureAggregator], SecureAggregator] | None = None) -> DpSgd:
        """One run of the job's T rounds; ``noise=False``: the same clipped rounds without noise;
        ``around``: wraps the aggregator (the audit's gradient canaries ride in extra coordinates)."""
        run = self._run(generator, None if noise else NoiseSpec("none", 0.0))
        inner: SecureAggregator = InProcessAggregator(generator)
        run.run(inner if around is None else around(inner), RevealGuard.unrecorded(self.plan))
        return run.job


def _rounds_forecast(spec: JobSpec, plan: Any, job: Any, target: Dataset, runs: int, seed: int, *,
                     federated: bool = False) -> Forecast:
    """A network's or a federated job's forecast: ``job`` (an in-process job with ``train`` and
    ``signal``) run ``runs`` times with noise and once without, each scored on ``target``."""
    X, y = network_rows(target, spec, "cpu")  # once: every run is scored on the same rows

    def accuracy(trained: Any) -> float:
        return float((trained.predict(X) == y).double().mean())

    scores = [accuracy(job.train(torch.Generator().manual_seed(seed + r))) for r in range(runs)]
    quiet = accuracy(job.train(torch.Generator().manual_seed(seed), noise=False))
    g = plan.guarantee()
    return Forecast(method=spec.method, mechanism=plan.mechanism, rounds=plan.rounds, dim=int(plan.dim),
                    sensitivity=plan.sensitivity(), noise_std=noise_std(plan), signal_norm=job.signal(),
                    epsilon=g.epsilon, delta=g.delta, epsilon_by_accountant=_accountants(plan), metric="accuracy",
                    private=scores, nonprivate=quiet, trivial=_trivial(target),
                    reference="noise_free_rounds", noise_free=quiet, federated=federated,
                    sampling_rate=plan.sampling_rate, noise_multiplier=plan.noise_multiplier)


class InProcessFederatedJob:
    """A DP-Fed-LS job's rounds in one process (:class:`~mpc_erm.runs.FederatedRun`, the run the
    compute parties and owners host): each round's owners drawn as the plan says (each by its own
    coin, or τN by a uniform draw), every drawn owner's E local epochs on its own rows, the updates
    summed with the plan's noise and smoothed at the public step."""

    def __init__(self, spec: JobSpec, plan: PrivacyPlan, owners: Sequence[Dataset]) -> None:
        self.spec, self.plan, self.features = spec, plan, owners[0].d
        self.data = [network_rows(o, spec, "cpu") for o in owners]

    def job(self, *, noise: bool = True) -> DpFedLs:
        """The job's rounds as the run holds them, before any round (its initial public model)."""
        return self._run(torch.Generator().manual_seed(0), noise=noise).fed

    def _run(self, generator: torch.Generator, *, noise: bool) -> FederatedRun:
        return FederatedRun.in_process(self.spec, self.plan, self.data, self.features, generator,
                                       noise=None if noise else NoiseSpec("none", 0.0))

    def signal(self) -> float:
        """‖the first round's release without noise‖: Σ Δ/(τN) over one draw of owners."""
        run = self._run(torch.Generator().manual_seed(0), noise=False)
        assert run.draw is not None
        owners = run.draw(0)
        if not owners:
            return 0.0
        return float((run.fed.weight * run.updates(0, owners).sum(dim=0)).norm())

    def train(self, generator: torch.Generator, *, noise: bool = True) -> DpFedLs:
        """One run of the job's T rounds; ``noise=False``: the same rounds and draws without noise."""
        run = self._run(generator, noise=noise)
        run.run(InProcessAggregator(generator), RevealGuard.unrecorded(self.plan))
        return run.fed


def deal_to_owners(rows: Dataset, owners: int, seed: int = 0) -> list[Dataset]:
    """Stand-in rows dealt to ``owners`` data owners: shuffled once (fixed seed), then as equal
    shares as the count allows (the first n mod N owners hold one row more)."""
    if rows.n < owners:
        raise ValueError(f"data: {owners} owners need at least {owners} stand-in rows (one each), got {rows.n}")
    order = np.random.default_rng(seed).permutation(rows.n)
    return [Dataset(rows.X[idx], rows.y[idx], rows.task, f"owner-{o}", rows.feature_names, rows.n_classes)
            for o, idx in enumerate(np.array_split(order, owners))]


def pooled_rows(parts: Sequence[Dataset]) -> Dataset:
    """Every part's rows as one data set (the stand-ins a job's owners are dealt from)."""
    return Dataset(np.vstack([p.X for p in parts]), np.concatenate([p.y for p in parts]), parts[0].task,
                   "pooled", parts[0].feature_names, parts[0].n_classes)


def forecast_job(spec: JobSpec, parts: Sequence[Dataset], *, evaluate: Dataset | None = None, runs: int = 5,
                 seed: int = 0, owners: int | None = None, noise_split: NoiseSplit | None = None) -> Forecast:
    """Plan ``spec`` for parties holding ``parts`` (their row counts are what the daemons would
    agree), then run the job's protocol ``runs`` times in process and score each model on
    ``evaluate`` (default: the pooled rows). Linear output and gradient jobs, and networks.

    ``owners``: the job has that many data owners (its ``parties`` compute); ``parts`` are then
    pooled and dealt to them (:func:`deal_to_owners`), and the plan uses the public n̂. A
    federated job (DP-Fed-LS) needs them; a gradient job's rounds sum the owners' clipped
    gradients, so they run on the pooled rows, which is the same sum. ``noise_split``: how the
    job's trust model splits distributed noise (``JobFile.noise_split``; the runs add the whole
    release's noise, every party's share)."""
    if not parts:
        raise ValueError("data: at least one party's rows are needed")
    d = parts[0].d
    if any(p.d != d for p in parts):
        raise ValueError(f"data: the parties' rows have different widths {[p.d for p in parts]}")
    pooled = pooled_rows(parts)
    target = evaluate if evaluate is not None else pooled
    if spec.federated is not None:
        if owners is None:
            raise ValueError("federated: a federated job runs with data owners: give their number (job.owners)")
        plan = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, None), n_features=d, noise_split=noise_split)
        fed = InProcessFederatedJob(spec, plan, deal_to_owners(pooled, owners, seed))
        return _rounds_forecast(spec, plan, fed, target, runs, seed, federated=True)
    if owners is not None:
        parts = [pooled] if spec.method == "gradient" else deal_to_owners(pooled, owners, seed)
    if spec.model.is_network:
        if spec.model.name == "plugin":
            raise ValueError("model.name: a plugin network is built only where it is installed (a party); "
                             "forecast it with a built-in network of the same shape")
        plan = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, [p.n for p in parts]), noise_split=noise_split)
        return _rounds_forecast(spec, plan, InProcessNetworkJob(spec, plan, parts), target, runs, seed)
    sizes = public_sizes(spec, None if owners is not None else [p.n for p in parts])
    public = None
    if spec.transfer is not None and spec.transfer.public == "public_test":  # the public test file: --eval
        if evaluate is None:
            raise ValueError("transfer.public: 'public_test' scores the data set's public test file: give it as the "
                             "evaluation rows (job plan --eval)")
        public = np.asarray(evaluate.X)
    plan = plan_job(spec, sampler="mpc", sizes=sizes, n_features=d, noise_split=noise_split, public_rows=public)
    job = InProcessJob(spec, plan, parts)
    loss = job.run.proto.loss
    Xp, yp = _tensors(pooled)
    optimum = solve_erm(loss, Xp, yp, spec.model.lam, tol=1e-10).theta
    metric, nonprivate = _metric(loss, optimum, target)
    scores = [_metric(loss, job.release(torch.Generator().manual_seed(seed + r)), target)[1] for r in range(runs)]
    noise_free = None
    # without noise: the optimiser's (or the transfer's student's) share of the gap
    if spec.method == "gradient" or spec.transfer is not None:
        quiet = plan_job(spec, sampler="mpc", test_no_noise=True, sizes=sizes, n_features=d, public_rows=public)
        noise_free = _metric(loss, InProcessJob(spec, quiet, parts).release(torch.Generator().manual_seed(seed)),
                             target)[1]
    g = plan.guarantee()
    return Forecast(method=spec.method, mechanism=plan.mechanism, rounds=plan.rounds, dim=int(plan.dim or d),
                    sensitivity=plan.sensitivity(), noise_std=noise_std(plan), signal_norm=job.signal(),
                    epsilon=g.epsilon, delta=g.delta, epsilon_by_accountant=_accountants(plan), metric=metric,
                    private=scores, nonprivate=nonprivate, trivial=_trivial(target), noise_free=noise_free,
                    sampling_rate=plan.sampling_rate, noise_multiplier=plan.noise_multiplier)



