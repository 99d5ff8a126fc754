"""The least noise/signal a job can have on any data, from its job file alone: what ``job submit``
checks a job never planned with, without torch (a linear job's plan needs none) and without data.
The dry run (:mod:`mpc_erm.simulate.forecast`) states the same ratio for the rows it is given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mpc_erm.spec import JobSpec

from .plan import PrivacyPlan, plan_job, public_sizes

__all__ = ["HOPELESS_NOISE_TO_SIGNAL", "NoiseFloor", "least_rows", "noise_floor", "noise_std", "noise_to_signal"]

#: Noise norm over signal norm above which a release carries next to nothing (``job submit`` asks).
HOPELESS_NOISE_TO_SIGNAL = 3.0


def noise_std(plan: PrivacyPlan) -> float:
    """The standard deviation per coordinate of one release's noise (a Laplace scale b is √2·b)."""
    return plan.noise_scale() * (math.sqrt(2.0) if plan.mechanism == "laplace" else 1.0)


def noise_to_signal(method: str, noise_std: float, dim: int, signal: float, rounds: int) -> float:
    """Expected noise norm (σ·√p) over a release's norm; for T gradient rounds, over √T times it
    (the model moves by the sum of T steps, whose noise grows as √T)."""
    if signal <= 0:
        return math.inf
    ratio = noise_std * math.sqrt(dim) / signal
    return ratio / math.sqrt(rounds) if method == "gradient" else ratio


@dataclass(frozen=True)
class NoiseFloor:
    """The least noise/signal a job can have on any data, from public facts alone (``job submit``
    checks a job never planned with this): the σ per coordinate of the plan a daemon would make,
    against the largest release the job's bounds allow.

    Why it bounds every forecast from below: a release is a weighted sum of clipped
    contributions. A gradient round sums at most ~q·n̂ per-example gradients of norm ≤ C (an
    owner's update ≤ 𝓛) and divides by q·n̂ (exactly s = τN owners under uniform sampling), so
    its norm is ≤ C; an output release averages local minimisers of a λ-strongly convex objective
    with a G-Lipschitz loss, each of norm ≤ G/λ. Both assume the true count is near the public n̂
    the job names (add/remove adjacency divides by it). The dimension is the model's when public
    (networks; ``job.features`` with owners), else the least a model of this kind can have."""

    method: str
    mechanism: str
    noise_std: float  # per coordinate of one release
    dim: int
    dim_known: bool  # False: ``dim`` is the least possible (the features are not public before the agreement)
    rounds: int
    signal_ceiling: float  # the largest norm a noise-free release can have

    @property
    def noise_to_signal(self) -> float:
        """At least this, whatever the data: :func:`noise_to_signal` of the largest release."""
        return noise_to_signal(self.method, self.noise_std, self.dim, self.signal_ceiling, self.rounds)

    @property
    def hopeless(self) -> bool:
        return self.noise_to_signal > HOPELESS_NOISE_TO_SIGNAL

    def describe(self) -> str:
        """One line: the figures and where each comes from."""
        what = "the largest clipped release" if self.method == "gradient" else "the largest model (G/λ)"
        dim = f"{self.dim} number{'s' if self.dim != 1 else ''}"
        dim = dim if self.dim_known else f"at least {dim}"
        per = f" over {self.rounds} rounds" if self.method == "gradient" else ""
        return (f"{self.mechanism} noise σ = {self.noise_std:.4g} per coordinate on {dim}, {what} has norm "
                f"≤ {self.signal_ceiling:.4g}: noise/signal ≥ {self.noise_to_signal:.3g}{per} on any data")


def noise_floor(spec: JobSpec, *, features: int | None = None,
                counts: Sequence[int] | None = None) -> NoiseFloor | None:
    """:class:`NoiseFloor` of ``spec`` before any data is seen; under replace-one adjacency, whose
    noise is scaled to the parties' exact counts, only given ``counts`` (else None: the agreement
    fixes them; :func:`least_rows` asks the question the other way round).
    ``features``: each row's public width (``job.features`` of a job with owners), if known."""
    if spec.privacy.adjacency != "add_remove" and counts is None:
        return None
    sizes = public_sizes(spec, counts)
    if spec.model.name == "softmax" and spec.model.n_classes is None:
        spec = spec.with_classes(2)  # left to the pinned schema: the least a softmax can have
    plan = plan_job(spec, sampler="mpc", sizes=sizes, n_features=features or 1)
    known = plan.dim is not None and (features is not None or spec.model.is_network)  # a plugin's: only at a party
    ceiling = plan.clip if spec.method == "gradient" else plan.clip / plan.lam
    return NoiseFloor(method=spec.method, mechanism=plan.mechanism, noise_std=noise_std(plan), dim=int(plan.dim or 1),
                      dim_known=known, rounds=plan.rounds, signal_ceiling=ceiling)


def least_rows(spec: JobSpec, *, parties: int, features: int | None = None) -> int | None:
    """A replace-one job's check from the job file alone: the least total row count (a multiple of
    ``parties``, split evenly over them) at which its :func:`noise_floor` is not hopeless. With fewer rows in all
    the job is hopeless on any data: its σ scales as 1/n (Δ = 2C/n for gradient rounds, 2G/(λn)
    for an output release), and an even split is the least noise a total can have (equal weights
    divide by m·min n_j ≤ n). None for add/remove jobs, whose floor needs no counts."""
    if spec.privacy.adjacency == "add_remove":
        return None

    def ratio(total: int) -> float:
        floor = noise_floor(spec, features=features, counts=[math.ceil(total / parties)] * parties)
        return math.inf if floor is None else floor.noise_to_signal

    total = 1000 * parties
    for _ in range(8):  # σ·n is constant up to the sampler's small term: a fixed point in a step or two
        wanted = max(parties, math.ceil(total * ratio(total) / HOPELESS_NOISE_TO_SIGNAL))
        if wanted == total:
            break
        total = wanted
    while ratio(total) > HOPELESS_NOISE_TO_SIGNAL:
        total += max(parties, total // 100)
    return parties * math.ceil(total / parties)
