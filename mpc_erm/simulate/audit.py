"""An empirical privacy audit of a linear job on its real path: m canary records, each in the
training data with probability ½, one run of the job's own run class (the daemons' round loop,
:class:`~mpc_erm.simulate.forecast.InProcessJob`), and a lower bound on ε from guessing which
canaries were in (:mod:`mpc_erm.privacy.audit_bound`, Steinke–Nasr–Jagielski 2023).

The canaries. The rows get m more feature columns, zero for every real row; canary i is the row
x = e_(d+i) (norm 1, inside every bound the job clips to) with label +1, appended to the first
party's rows. A canary left out is replaced by the row x = 0 with the same label (under
replace-one adjacency the counts stay what the plan published; under add/remove it is simply
absent), so the only difference between "in" and "out" is the canary itself: a neighbouring
data set. Only canary i's row touches coordinate d + i, so the released model's θ_(d+i) is its
score: pushed up when it was in, noise alone when it was out.

The guesses: the k highest scores "in", the k lowest "out", for k in a grid fixed in advance
(m/20, m/10, m/4, m/2); the grid is paid for by a union bound (each k tested at α/4), so the
reported bound keeps its confidence 1 − α.

Networks without an input column of their own for each canary (a CNN on images: its first layer
shares its weights across the pixels) are audited with *gradient* canaries instead
(:func:`audit_gradient_job`, the Dirac canaries of the paper's white-box audit of DP-SGD): m
coordinates past the model's p ride in every round's release, canary i's coordinate touched only by
canary i, which is in each round's Poisson batch with the job's rate q when it is in and adds the
release's stated sensitivity there. Every round's noisy sum is revealed to the parties, so summing
a canary's coordinate over the rounds is post-processing of what the job releases. This audits the
job's mechanism as it runs (its rounds, sampling rate, noise and accounting) beside the network's
real training; the per-example clipping of the rows is what the input canaries of an ``mlp`` audit.

What it can say: a bound above the stated ε proves the statement false (at confidence 1 − α); a
bound below it says no violation was seen. A one-run audit of the Gaussian mechanism has little
power at small ε, so a real job's bound sits near 0; the control — the same job with its noise
switched off (the plan's test-only zero-noise mode) — must exceed the stated ε, which shows the
audit can see a broken job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from mpc_erm.data import Dataset
from mpc_erm.privacy.audit_bound import epsilon_lower_bound
from mpc_erm.privacy.plan import PrivacyPlan, plan_job, public_sizes
from mpc_erm.protocols.aggregation import NoiseSpec, SecureAggregator
from mpc_erm.simulate.forecast import InProcessFederatedJob, InProcessJob, InProcessNetworkJob
from mpc_erm.spec import JobSpec

__all__ = ["AUDIT_FRACTIONS", "GradientCanaries", "PrivacyAudit", "audit_federated_job", "audit_gradient_job",
           "audit_job", "audit_network_job", "audit_scores", "canary_rows", "check_auditable", "draw_canaries",
           "has_input_columns", "linear_audit", "with_canaries"]

#: The guesses' k, as fractions of m, fixed before the run (a union bound pays for trying each).
AUDIT_FRACTIONS = (0.05, 0.1, 0.25, 0.5)
_AUDITED_LOSSES = ("logistic", "huber_svm")


@dataclass(frozen=True)
class PrivacyAudit:
    """One audit: the stated guarantee, the empirical lower bound and how it was reached."""

    stated_epsilon: float
    delta: float
    canaries: int
    included: int
    epsilon_lower_bound: float
    confidence: float
    guesses: int  # r of the best k
    correct: int  # v of the best k
    broken_control: bool  # the job's noise was switched off
    by_k: dict[int, float] = field(default_factory=dict)  # k -> the lower bound at that k
    canary_kind: Literal["rows", "gradients"] = "rows"  # records in the data, or gradient (Dirac) canaries

    @property
    def violated(self) -> bool:
        """The audit proves the stated ε false (at its confidence)."""
        return self.epsilon_lower_bound > self.stated_epsilon

    def describe(self) -> dict[str, object]:
        return {"stated_epsilon": self.stated_epsilon, "delta": self.delta, "canaries": self.canaries,
                "included": self.included, "epsilon_lower_bound": self.epsilon_lower_bound,
                "confidence": self.confidence, "guesses": self.guesses, "correct": self.correct,
                "broken_control": self.broken_control, "violated": self.violated, "canary_kind": self.canary_kind,
                "by_k": {str(k): v for k, v in self.by_k.items()}}


def draw_canaries(canaries: int, seed: int) -> np.ndarray:
    """Which of the ``canaries`` go in: each independently with probability ½ (bool, seeded)."""
    if canaries < 20:
        raise ValueError(f"canaries: at least 20, got {canaries}")
    return np.random.default_rng(seed).random(canaries) < 0.5


def canary_rows(d: int, included: np.ndarray, replace: bool) -> np.ndarray:
    """The canaries' rows over d + m columns: e_(d+i) for canary i when it is in; when it is out,
    the zero row (``replace``: every canary keeps its slot) or none."""
    m = included.size
    ins = np.flatnonzero(included)
    rows = np.zeros((m if replace else ins.size, d + m))
    rows[ins if replace else np.arange(ins.size), d + ins] = 1.0
    return rows


def _widened(p: Dataset, m: int, rows: np.ndarray | None = None) -> Dataset:
    """``p`` with m canary columns, zero in its own rows, and ``rows`` (label +1, or class 1) appended."""
    X, y = np.hstack([p.X, np.zeros((p.n, m))]), p.y
    if rows is not None:
        X, y = np.vstack([X, rows]), np.concatenate([y, np.ones(len(rows), dtype=y.dtype)])
    return Dataset(X, y, p.task, name=p.name, feature_names=(*p.feature_names, *(f"canary{i}" for i in range(m))),
                   n_classes=p.n_classes)


def with_canaries(parts: Sequence[Dataset], included: np.ndarray, replace: bool) -> list[Dataset]:
    """``parts`` with one feature column per canary (zero in every real row) and the canaries'
    rows (:func:`canary_rows`, label +1) appended to the first party's."""
    rows = canary_rows(parts[0].d, included, replace)
    return [_widened(p, included.size, rows if j == 0 else None) for j, p in enumerate(parts)]


def linear_audit(spec: JobSpec, parts: Sequence[Dataset], canaries: int,
                  seed: int) -> tuple[np.ndarray, list[Dataset], PrivacyPlan]:
    """What a linear job's audit runs, in process or through the daemons: which canaries are in,
    the rows with them, and the plan whose guarantee is stated."""
    check_auditable(spec)
    included = draw_canaries(canaries, seed)
    replace = spec.privacy.adjacency == "replace"
    rows = with_canaries(parts, included, replace)
    sizes = public_sizes(spec, [p.n for p in rows] if replace else None)
    return included, rows, plan_job(spec, sampler="mpc", sizes=sizes, n_features=rows[0].d)


def audit_scores(scores: np.ndarray, included: np.ndarray, stated_epsilon: float, delta: float, *,
                 alpha: float = 0.05, broken_control: bool = False,
                 canary_kind: Literal["rows", "gradients"] = "rows") -> PrivacyAudit:
    """The bound from the canaries' scores (their own coordinates of the released model): the k
    highest guessed in, the k lowest out, for each k of :data:`AUDIT_FRACTIONS` at α/4."""
    canaries = included.size
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")  # the highest first: the likeliest in
    by_k: dict[int, tuple[float, int, int]] = {}
    for frac in AUDIT_FRACTIONS:
        k = max(1, int(frac * canaries))
        top, bottom = order[:k], order[canaries - k:]
        v = int(included[top].sum() + (~included[bottom]).sum())
        by_k[k] = (epsilon_lower_bound(canaries, 2 * k, v, delta, alpha / len(AUDIT_FRACTIONS)), 2 * k, v)
    best = max(by_k, key=lambda k: by_k[k][0])
    return PrivacyAudit(stated_epsilon=float(stated_epsilon), delta=float(delta), canaries=canaries,
                        included=int(included.sum()), epsilon_lower_bound=by_k[best][0], confidence=1.0 - alpha,
                        guesses=by_k[best][1], correct=by_k[best][2], broken_control=broken_control,
                        by_k={k: v[0] for k, v in by_k.items()}, canary_kind=canary_kind)


def check_auditable(spec: JobSpec) -> None:
    """The linear audit's scope: a linear binary job of parties holding their rows (ValueError naming
    the field; networks: :func:`audit_network_job`, federated jobs: :func:`audit_federated_job`)."""
    if spec.model.is_network or spec.federated is not None or spec.model.name not in _AUDITED_LOSSES:
        raise ValueError(f"model.name: the audit runs linear binary jobs ({', '.join(_AUDITED_LOSSES)}), an 'mlp' "
                         f"network or a two-class softmax federated job, not {spec.model.name!r} here")


def audit_job(spec: JobSpec, parts: Sequence[Dataset], *, canaries: int = 1000, seed: int = 0,
              alpha: float = 0.05, broken_control: bool = False) -> PrivacyAudit:
    """Audit ``spec`` (a linear binary job: logistic or Huber SVM, output or gradient perturbation)
    run on ``parts`` plus ``canaries`` canaries (module docstring). ``broken_control``: the same
    job with its noise switched off, which the audit must flag."""
    included, rows, stated = linear_audit(spec, parts, canaries, seed)
    plan = plan_job(spec, sampler="mpc", sizes=stated.sizes, n_features=rows[0].d, test_no_noise=True) \
        if broken_control else stated
    theta = InProcessJob(spec, plan, rows).release(torch.Generator().manual_seed(seed))
    g, d = stated.guarantee(), parts[0].d
    return audit_scores(theta.detach().cpu().numpy()[d: d + canaries], included, g.epsilon, g.delta, alpha=alpha,
                        broken_control=broken_control)


def audit_federated_job(spec: JobSpec, owners: Sequence[Dataset], *, canaries: int = 200, seed: int = 0,
                        alpha: float = 0.05, broken_control: bool = False) -> PrivacyAudit:
    """The audit of a federated job (DP-Fed or DP-Fed-LS, a softmax model; the owner is the unit):
    ``canaries`` canary *owners* join the real ``owners``, each holding one row — e_(d+i) with
    label +1 (class 1) when it is in, the zero row when it is out, so that one owner's data is
    replaced (the relation the job is accounted under). N, the public owner count, becomes
    len(owners) + canaries. The job's own rounds run in process (:class:`InProcessFederatedJob`,
    the run the compute parties and owners host); canary i's score is how much its class-1 weight
    gained over its class-0 weight on its own column since the agreed initial model.
    ``broken_control``: the same rounds without noise."""
    if spec.federated is None or spec.model.name != "softmax" or spec.model.n_classes != 2:
        raise ValueError("model.name: the federated audit runs a two-class softmax federated job")
    included = draw_canaries(canaries, seed)
    d, m = owners[0].d, canaries
    width = d + m
    pad = [_widened(o, m) for o in owners]
    label = np.ones(1, dtype=owners[0].y.dtype)  # +1 (binary) or class 1 (multiclass)
    pad += [Dataset(row[None], label, owners[0].task, name=f"canary-{i}", feature_names=pad[0].feature_names,
                    n_classes=owners[0].n_classes) for i, row in enumerate(canary_rows(d, included, replace=True))]
    audited = spec.model_copy(update={"privacy": spec.privacy.model_copy(update={"public_n": len(pad)})})
    plan = plan_job(audited, sampler="mpc", sizes=public_sizes(audited, None), n_features=width)
    job = InProcessFederatedJob(audited, plan, pad)
    start = job.job().w.numpy()  # the agreed initial weights (seeded, not zero): a score is a change
    w = job.train(torch.Generator().manual_seed(seed), noise=not broken_control).w.numpy() - start
    scores = w[width + d: width + d + m] - w[d: d + m]  # the (2 × width) weight matrix, row-major, then the bias
    g = plan.guarantee()
    return audit_scores(scores, included, g.epsilon, g.delta, alpha=alpha, broken_control=broken_control)


def has_input_columns(spec: JobSpec) -> bool:
    """Whether a network job's canaries can be rows with an input column of their own (an ``mlp``
    on flat inputs: its first layer is linear in them) rather than gradient canaries."""
    m_ = spec.model
    return m_.name == "mlp" and m_.input_shape is not None and len(m_.input_shape) == 1


def _require_add_remove(spec: JobSpec) -> None:
    """Both network audits' canaries are absent when out: the job must be stated under add/remove."""
    if spec.privacy.adjacency != "add_remove":
        raise ValueError("privacy.adjacency: the network audit runs add/remove jobs (an out canary is absent)")


def audit_network_job(spec: JobSpec, parts: Sequence[Dataset], *, canaries: int = 1000, seed: int = 0,
                      alpha: float = 0.05, broken_control: bool = False) -> PrivacyAudit:
    """The audit of a DP-SGD / DP-Adam job on an ``mlp`` (its first layer linear in the inputs):
    the canary columns widen its input to d + m (``model.input_shape``), the canary rows go to the
    first party under add/remove (an out canary is absent), and canary i's score is how far its
    own column of the first layer's weights moved from the agreed initial model — a column no
    other row touches, so without noise only the canaries that were in move. The job's own rounds
    run in process (:class:`InProcessNetworkJob`, the worker's run)."""
    m_ = spec.model
    if not has_input_columns(spec):
        raise ValueError("model.name: the input-canary audit runs an 'mlp' on flat inputs (its first layer is linear "
                         "in them); other networks: audit_gradient_job")
    _require_add_remove(spec)
    d = parts[0].d
    if int(m_.input_shape[0]) != d:
        raise ValueError(f"model.input_shape: the rows have {d} features, the job's input is {m_.input_shape}")
    included = draw_canaries(canaries, seed)
    rows = with_canaries(parts, included, replace=False)
    width = d + canaries
    audited = spec.model_copy(update={"model": m_.model_copy(update={"input_shape": [width]})})
    plan = plan_job(audited, sampler="mpc", sizes=public_sizes(audited, None))
    job = InProcessNetworkJob(audited, plan, rows)
    start = job.initial().detach().clone()  # the agreed initial weights (seeded, not zero)
    trained = job.train(torch.Generator().manual_seed(seed), noise=not broken_control).master.detach()
    hidden = int(m_.hidden[0]) if m_.hidden else int(m_.n_classes or 2)
    moved = (trained - start)[: hidden * width].reshape(hidden, width)[:, d:].numpy()
    g = plan.guarantee()
    return audit_scores(np.linalg.norm(moved, axis=0), included, g.epsilon, g.delta, alpha=alpha,
                        broken_control=broken_control)


class GradientCanaries:
    """The gradient canaries around a job's aggregator (module docstring): each round, the m canary
    coordinates are appended to the first member's contribution — canary i's set to the release's
    sensitivity (before the public weight) when it is in and drawn into the round's batch — the
    aggregate of all p + m coordinates is taken with the job's noise, and the model gets its p.
    ``scores`` sums the released canary coordinates over the rounds."""

    def __init__(self, included: np.ndarray, rate: float, size: float, generator: torch.Generator) -> None:
        if not 0.0 < rate <= 1.0 or not size > 0.0:
            raise ValueError(f"gradient canaries: a rate in (0, 1] and a positive size, got {rate!r} and {size!r}")
        self.included = torch.from_numpy(np.asarray(included, dtype=bool))
        self.rate, self.size, self.generator = float(rate), float(size), generator
        self.scores = np.zeros(self.included.numel())
        self.inner: SecureAggregator | None = None

    def around(self, inner: SecureAggregator) -> GradientCanaries:
        self.inner = inner
        return self

    @property
    def trust_model(self) -> str:
        return "" if self.inner is None else self.inner.trust_model

    def aggregate(self, contributions: torch.Tensor, weights: torch.Tensor, noise: NoiseSpec) -> torch.Tensor:
        if self.inner is None:
            raise RuntimeError("gradient canaries: around() an aggregator first")
        k, p = contributions.shape
        w0 = float(weights[0])
        if not w0 > 0.0:
            raise ValueError(f"gradient canaries: the first member's public weight must be positive, got {w0!r}")
        m = self.included.numel()
        drawn = self.included & (torch.rand(m, generator=self.generator, dtype=torch.float64) < self.rate)
        extra = torch.zeros(k, m, dtype=contributions.dtype, device=contributions.device)
        extra[0] = drawn.to(contributions.dtype).to(contributions.device) * (self.size / w0)
        released = self.inner.aggregate(torch.cat([contributions, extra], dim=1), weights, noise)
        self.scores += released[p:].detach().to("cpu", torch.float64).numpy()
        return released[:p]


def audit_gradient_job(spec: JobSpec, parts: Sequence[Dataset], *, canaries: int = 1000, seed: int = 0,
                       alpha: float = 0.05, broken_control: bool = False) -> PrivacyAudit:
    """The audit of any network's DP-SGD / DP-Adam / DP-SRM job (the MNIST CNN included) with
    gradient canaries (module docstring): the job's own rounds on ``parts`` in process
    (:class:`InProcessNetworkJob`, the worker's run), ``canaries`` Dirac canaries in coordinates no
    parameter uses, each of the stated per-record sensitivity and sampled at the job's rate."""
    if not spec.model.is_network or spec.federated is not None:
        raise ValueError(f"model.name: gradient canaries audit a network's DP-SGD / DP-Adam job, not "
                         f"{spec.model.name!r}{' (federated)' if spec.federated is not None else ''}")
    _require_add_remove(spec)
    included = draw_canaries(canaries, seed)
    plan = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, None))
    dirac = GradientCanaries(included, plan.sampling_rate, plan.sensitivity_l2(),
                             torch.Generator().manual_seed(seed + 1))
    InProcessNetworkJob(spec, plan, parts).train(torch.Generator().manual_seed(seed), noise=not broken_control,
                                                 around=dirac.around)
    g = plan.guarantee()
    return audit_scores(dirac.scores, included, g.epsilon, g.delta, alpha=alpha, broken_control=broken_control,
                        canary_kind="gradients")
