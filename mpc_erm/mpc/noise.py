"""Noise for the secure aggregate, sampled inside the MPC and pooled ahead of the online rounds.

:class:`InMpcNoise` is the production :class:`~mpc_erm.mpc.aggregator.NoiseSource`. For a
:class:`~mpc_erm.protocols.aggregation.NoiseSpec` it fixes a plan (:func:`plan_noise`): the
fixed-point grid 2^-g on which the aggregate is encoded *and* the noise lives (they must match:
noise on a coarser grid than the data would give neighbouring outputs disjoint supports), and the
sampler's public parameters. Then it hands out this party's shares of samples:

* ``gaussian`` → discrete Gaussian N_Z(0, σ²) on the grid (CKS rejection from the discrete
  Laplace, :mod:`.samplers.discrete_gaussian`);
* ``laplace`` → discrete Laplace per coordinate (:mod:`.samplers.discrete_laplace`);
* ``l2_laplace`` (Gamma-norm, uniform direction) is **not** sampled inside the MPC. Jobs that
  want pure ε in MPC use per-coordinate ``laplace`` with Δ₁ = √d·Δ₂ (exact on the grid); its RMS
  noise norm is √(2d/(d+1)) ≤ √2 times ℓ2-Laplace's at the same ε
  (``tests/privacy/test_laplace.py``). The job file refuses ``l2_laplace`` and says so.

  Why not: its guarantee would have to hold for what is sampled. The discrete ℓ2-Laplace
  P(z) ∝ exp(−‖z‖₂/t) on the grid is ε-DP (triangle inequality), and so is the continuous one
  rounded to the grid (rounding commutes with integer shifts); an error in the norm alone that
  is independent of the direction only rescales ε. But the direction needs a secure
  normalisation g/‖g‖ of a Gaussian vector, which on shares is a discrete g on a ring. Coupling
  the sampled output with the rounded ideal one fails as soon as a coordinate's error moves it
  across a rounding boundary, with probability ≈ 2·d·(coordinate error); for that to be a
  negligible δ (≤ 10⁻¹⁰) at d = 10⁶ and noise ≈ 2¹⁴·√d units, the direction would need ≈ 78
  bits of relative precision, beyond the 64-bit ring (CrypTen's encoder and our samplers); the
  exact routes (scale mixture of discrete Gaussians with a *secret* variance; rejection from a
  product proposal, whose acceptance falls exponentially in d) are not practical either.

The grid: g is the smallest number of fractional bits for which the parties' rounding adds at
most :data:`GRID_SLACK` to the sensitivity (all m parties' inputs may round differently: m·√d
units in ℓ2, m·d in ℓ1), and at least enough that the noise scale is ≈ 2^14 grid units; capped
so that σ ≤ 2^20 units (the sampler's analysis and 64-bit squares) and g ≤ 40 (room for values).
:func:`guarantee` then gives the (ε, δ) of a job with this plan (:mod:`.samplers.guarantee`).

Streamed: ``prepare(spec, dim, releases)`` samples the first release's values (all parties, same
order), ``top_up`` samples ahead for the next while the parties compute their local gradients,
and ``take`` during a round only slices the pool (:class:`InMpcNoise`). If a round needs more
than was sampled, the rest is sampled online and counted.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from mpc_erm.privacy.distributed import MAX_KLS_OFFSET, NoiseSplit, kls_tau
from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.protocols.aggregation import NoiseSpec

from .samplers.gaussian import DiscreteGaussianParams
from .samplers.guarantee import (
    GaussianAccountant,
    NoiseGuarantee,
    discrete_gaussian_guarantee,
    discrete_laplace_guarantee,
)
from .samplers.params import MAX_GRID_BITS, DiscreteLaplaceParams
from .samplers.pool import NoisePool, batch_for

if TYPE_CHECKING:  # a type only: CrypTen is imported when a sampler starts (after the compat shim)
    from crypten.communicator.communicator import Communicator

__all__ = [
    "GRID_SLACK", "InMpcNoise", "NoisePlan", "Realisation", "guarantee", "plan_noise", "realise",
]

GRID_SLACK = 0.01  # rounding may add at most 1 % to the sensitivity (when the caps allow)
TARGET_SCALE_LOG2 = 14  # noise scale ≈ 2^14 grid units at least
MAX_SCALE_LOG2 = 20  # ... and at most 2^20
LAPLACE_K = 56  # bits per coin: TV to the ideal Laplace ≈ 23·2^-56 per sample
# Bits per coin of the in-MPC Gaussian, cheapest first: realise() takes the first whose TV bound
# fits the plan's sampler budget. Each bit fewer costs a coin one AND gate fewer (k − 1 a coin) and
# doubles the TV (coins' error 2^-k and the uncoined low bits of N, 2^-(k−4)); 4 bits cut or add
# ≈ 7 % of the gates. At ε = 1, δ = 1e-5, k = 44 covers ≈ 10^4 samples per job, 56 ≈ 2·10^7,
# 62 ≈ 1.5·10^9 (docs/explanation/privacy.md §5).
GAUSSIAN_COIN_BITS = (40, 44, 48, 52, 56, 58, 60, 62)
# Distributed noise is sampled in the clear by each party, where a coin wider than 62 bits costs a
# second keystream word, not a circuit: past 62 bits its TV halves a bit (samplers.reference.coins_below).
DISTRIBUTED_COIN_BITS = (*GAUSSIAN_COIN_BITS, 72, 88, 124)


@dataclass(frozen=True)
class NoisePlan:
    """Everything all parties must agree on to sample and account one kind of noise."""

    mechanism: str  # "gaussian" | "laplace"
    scale: float  # real units, as requested
    grid_bits: int
    params: DiscreteGaussianParams | DiscreteLaplaceParams
    dim: int
    parties: int
    sensitivity: float | None

    @property
    def slack(self) -> float | None:
        """Relative growth of the sensitivity caused by rounding to the grid (None: unknown Δ)."""
        if self.sensitivity is None:
            return None
        per = math.sqrt(self.dim) if self.mechanism == "gaussian" else float(self.dim)
        return self.parties * per * 2.0**-self.grid_bits / self.sensitivity


def _grid_bits(scale: float, sensitivity: float | None, dim: int, parties: int, norm: str) -> int:
    """See the module docstring: finest needed for the slack, coarsest allowed by the caps."""
    log_scale = math.log2(scale)
    g = TARGET_SCALE_LOG2 - math.floor(log_scale)
    if sensitivity is not None:
        per = math.sqrt(dim) if norm == "l2" else float(dim)
        g = max(g, math.ceil(math.log2(parties * per / (GRID_SLACK * sensitivity))))
    g = min(g, MAX_SCALE_LOG2 - math.ceil(log_scale), MAX_GRID_BITS)
    if g < 0:
        raise ValueError(f"noise scale {scale:g} is too large for the int64 ring encoding")
    return g


def plan_noise(spec: NoiseSpec, dim: int, parties: int) -> NoisePlan:
    """The plan for ``spec`` on a ``dim``-coordinate aggregate among ``parties`` parties."""
    if dim < 1 or parties < 1:
        raise ValueError("dim and parties must be positive")
    if spec.mechanism == "gaussian":
        g = spec.grid_bits if spec.grid_bits is not None else _grid_bits(spec.scale, spec.sensitivity, dim, parties,
                                                                         "l2")
        params: Any = DiscreteGaussianParams.for_sigma(spec.scale, grid_bits=g,
                                                       **({} if spec.coin_bits is None else {"k": spec.coin_bits}))
    elif spec.mechanism == "laplace":
        g = spec.grid_bits if spec.grid_bits is not None else _grid_bits(spec.scale, spec.sensitivity, dim, parties,
                                                                         "l1")
        params = DiscreteLaplaceParams.for_scale(spec.scale, grid_bits=g, k=LAPLACE_K)
    elif spec.mechanism == "l2_laplace":
        raise ValueError(
            "noise.mechanism 'l2_laplace' is not sampled inside the MPC (it needs a secure norm and division); "
            "use 'laplace' per coordinate (pure ε with Δ₁ = √d·Δ₂) or 'gaussian'"
        )
    else:
        raise ValueError(f"noise.mechanism {spec.mechanism!r} has no in-MPC sampler")
    return NoisePlan(spec.mechanism, spec.scale, g, params, dim, parties, spec.sensitivity)


def guarantee(
    plan: NoisePlan, releases: int, delta: float | None = None, accountant: GaussianAccountant = "rdp"
) -> NoiseGuarantee:
    """(ε, δ) of ``releases`` aggregates with this plan (``delta``: the job's total δ, Gaussian)."""
    if plan.sensitivity is None:
        raise ValueError("the plan's NoiseSpec has no sensitivity: no guarantee can be stated")
    if isinstance(plan.params, DiscreteGaussianParams):
        if delta is None:
            raise ValueError("delta is required for Gaussian noise")
        return discrete_gaussian_guarantee(
            plan.params, plan.sensitivity, plan.dim, releases, delta, plan.parties, accountant
        )
    return discrete_laplace_guarantee(plan.params, plan.sensitivity, plan.dim, plan.parties, releases)


@dataclass
class _Stream:
    """One plan's pool and how many of its samples the job will still take but are not yet made."""

    plan: NoisePlan
    pool: NoisePool
    owed: int = 0

    def ahead(self) -> int:
        """What to sample now so the next release (``plan.dim`` samples) is covered: nothing if it
        is, else whole batches covering the shortfall, capped by what the job still needs (never
        below the shortfall)."""
        short = self.plan.dim - self.pool.available
        if short <= 0:
            return 0
        whole = -(-short // self.pool.batch) * self.pool.batch
        return max(short, min(self.owed, whole))


class InMpcNoise:
    """``NoiseSource`` with streamed pools, one per plan (SPMD: same calls in every party).

    Streamed, not all before round 1: ``prepare(spec, dim, releases)`` records what the job will
    need and samples only the first release; ``top_up(spec, dim)``, called by every party at the
    same point of each round (the worker calls it while its local gradient is computed in another
    thread), samples ahead so the next release is covered — in whole batches of
    :func:`~.samplers.pool.batch_for` (a batch costs ≈ 100 message rounds whatever its size, so
    small releases share one), never beyond what the job still needs. The pool then holds at most
    one release plus one batch: 8 bytes a sample, ≈ 8.5 MB at d = 10⁶ beside the batch's
    working memory, at any number of rounds (it held dim × rounds before: 800 MB for 10⁵ × 1,000).
    ``prepare(..., stream=False)`` samples everything at once (benchmarks of the offline cost).
    """

    test_only = False

    def __init__(self, device: torch.device | str | None = None, batch: int = 1 << 15,
                 comm: Communicator | None = None) -> None:
        from .crypten_compat import import_crypten

        crypten = import_crypten()
        self._comm = comm if comm is not None else crypten.communicator.get()
        if self._comm is None:
            raise RuntimeError("InMpcNoise: CrypTen is not initialised (call init_crypten first)")
        self.parties = int(self._comm.get_world_size())
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.batch = batch
        self._streams: dict[tuple[NoiseSpec, int], _Stream] = {}
        self.online_samples = 0
        self.online_seconds = 0.0
        self.peak_pool_samples = 0

    @property
    def description(self) -> str:
        return "discrete Gaussian / discrete Laplace sampled inside the MPC (streamed pool)"

    def _entry(self, spec: NoiseSpec, dim: int) -> _Stream:
        key = (spec, dim)  # the whole (frozen) spec: grid and coin bits included
        if key not in self._streams:
            plan = plan_noise(spec, dim, self.parties)
            batch = batch_for(plan.params, self.batch)  # memory like a Laplace batch of self.batch
            self._streams[key] = _Stream(plan, NoisePool(plan.params, device=self.device, batch=batch))
        return self._streams[key]

    def plan(self, spec: NoiseSpec, dim: int) -> NoisePlan:
        return self._entry(spec, dim).plan

    def precision_bits(self, spec: NoiseSpec, dim: int) -> int:
        return self._entry(spec, dim).plan.grid_bits

    def _produce(self, stream: _Stream, n: int) -> None:
        if n > 0:
            stream.pool.produce(n)
            stream.owed = max(0, stream.owed - n)
            self.peak_pool_samples = max(self.peak_pool_samples, stream.pool.available)

    def prepare(self, spec: NoiseSpec, dim: int, releases: int = 1, stream: bool = True) -> None:
        """The job will take ``releases`` aggregates of ``dim`` coordinates: sample the first now
        (``stream``) or all of them (``stream=False``)."""
        if releases < 0:
            raise ValueError("releases must be non-negative")
        entry = self._entry(spec, dim)
        entry.owed = max(0, dim * releases - entry.pool.available)
        self._produce(entry, entry.ahead() if stream else entry.owed)

    def top_up(self, spec: NoiseSpec, dim: int) -> None:
        """Sample ahead for the next release (every party, same point of the round)."""
        entry = self._entry(spec, dim)
        self._produce(entry, entry.ahead())

    def take(self, p: int, spec: NoiseSpec) -> torch.Tensor:
        """This party's int64 shares of p samples, in units of 2^-grid_bits (see ``precision_bits``).
        What the pool lacks is sampled now and counted as online."""
        entry = self._entry(spec, p)
        short = p - entry.pool.available
        if short > 0:
            tic = time.perf_counter()
            self._produce(entry, short)
            self.online_samples += short
            self.online_seconds += time.perf_counter() - tic
        return entry.pool.take_integers(p)

    def stats(self) -> dict[str, Any]:
        """Cost per plan, what had to be sampled online, and the pool's high-water mark."""
        plans = []
        for entry in self._streams.values():
            plan, pool = entry.plan, entry.pool
            st = pool.stats()
            plans.append({
                "mechanism": plan.mechanism, "scale": plan.scale, "grid_bits": plan.grid_bits, "dim": plan.dim,
                "produced": st.produced, "taken": st.taken, "seconds": st.seconds, "rounds": st.rounds,
                "bytes": st.bytes, "samples_per_second": st.samples_per_second, "batch": pool.batch,
            })
        return {"plans": plans, "online_samples": self.online_samples, "online_seconds": self.online_seconds,
                "peak_pool_samples": self.peak_pool_samples, "peak_pool_bytes": 8 * self.peak_pool_samples}


@dataclass(frozen=True)
class Realisation:
    """How the engine realises a :class:`~mpc_erm.privacy.plan.PrivacyPlan`'s noise on its grid,
    with the checks that make the plan's event true for what is sampled."""

    spec: NoiseSpec  # what InMpcNoise samples (grid fixed)
    plan: NoisePlan
    sensitivity_grid: float  # ‖s‖ bound in grid units, every party's rounding included
    noise_scale_grid: float  # σ or t actually sampled, grid units
    multiplier: float  # Gaussian: σ_grid / s_grid (≥ the plan's z); Laplace: s_grid / t (≤ the plan's ε)
    tv_per_release: float  # dim × the sampler's TV bound per sample (≤ the plan's budget)
    # distributed noise: ``spec`` is one party's share; the honest shares' sum has σ = noise_scale_grid
    split: NoiseSplit | None = None
    kls_tau: float = 0.0  # Kairouz–Liu–Steinke's τ for the honest shares' sum (mpc_erm.privacy.distributed)

    @property
    def report_scale(self) -> float:
        """The σ (or b) the guarantee rests on, real units: what the sampler samples (√(tμ), at or
        above the request), or the honest shares' sum for distributed noise."""
        return self.noise_scale_grid * 2.0**-self.plan.grid_bits

    def describe(self) -> dict[str, Any]:
        out = {"grid_bits": self.plan.grid_bits, "coin_bits": self.plan.params.k,
               "sensitivity_grid": self.sensitivity_grid,
               "noise_scale_grid": self.noise_scale_grid, "realised_multiplier": self.multiplier,
               "sampler_tv_per_release": self.tv_per_release, "noise_scale": self.report_scale,
               "noise": "mpc" if self.split is None else "distributed", "sampler": self.sampler_parameters()}
        if self.split is not None:
            out.update(party_noise_scale_grid=self.plan.params.sigma, noise_parties=self.split.parties,
                       noise_honest=self.split.honest, kls_tau=self.kls_tau,
                       release_noise_scale_grid=self.plan.params.sigma * self.split.parties**0.5)
        return out

    def sampler_parameters(self) -> dict[str, Any]:
        """The in-MPC sampler's parameters, from which a verifier recomputes its total-variation
        bound per sample (:mod:`mpc_erm.privacy.sampler_tv`) without this code."""
        p = self.plan.params
        if isinstance(p, DiscreteGaussianParams):
            return {"kind": "discrete_gaussian", "t": p.t, "mu": p.mu, "revealed": p.revealed, "rounds": p.rounds,
                    "k": p.k, "laplace_bits": p.magnitude_bits, "fair_bits": p.fair_bits, "low_bit": p.low_bit,
                    "test_coins": len(p.coin_thresholds)}
        return {"kind": "discrete_laplace", "t": p.t, "bits": p.bits, "k": p.k}


#: The coarsest a grid may be taken to fit an exact check or proof (the semi-honest in-MPC bound
#: check's int64 ring, the malicious-secure mode's statements): rounding may add at most 5 % to
#: the sensitivity, where the default grid's rule allows 1 %, so the noise grows by at most 4 %.
COARSE_GRID_SLACK = 0.05


def coarsenings(plan: PrivacyPlan, parties: int) -> Iterator[Realisation]:
    """The plan's realisation on the default grid, then on each coarser one while rounding adds at
    most :data:`COARSE_GRID_SLACK` to the sensitivity (finest first): where an exact check or
    proof looks for the finest grid it fits on."""
    real = realise(plan, parties)
    yield real
    g = real.plan.grid_bits
    while g > 0 and (real.plan.slack or 0.0) * 2.0 <= COARSE_GRID_SLACK:
        g -= 1
        real = realise(plan, parties, grid_bits=g)
        yield real


@functools.lru_cache(maxsize=32)  # a pure function of a frozen plan; owners sharing a process (benchmarks) ask once
def realise(plan: PrivacyPlan, parties: int, grid_bits: int | None = None) -> Realisation:
    """Realise ``plan`` (a bound :class:`~mpc_erm.privacy.plan.PrivacyPlan`) among ``parties``
    parties: pick the grid, set σ_grid = z·s_grid (Gaussian) or t = s_grid/ε (Laplace) with s_grid
    the grid sensitivity including every party's rounding, and check the sampler's total-variation
    bound against the plan's budget. Distributed noise (``plan.noise_split``, Gaussian only): each
    party's share σ_p with h·σ_p² ≥ (z·s_grid)², h the honest shares, the TV counted over the h·d
    honest samples of a release, and the Kairouz–Liu–Steinke τ·d term checked to vanish over the
    job (mpc_erm.privacy.distributed). ``grid_bits``: a grid chosen by the caller (the
    malicious-secure mode's coarser grid, whose statements fit its proofs) in place of the default
    rule; the noise still meets the plan on it, rounding counted. Raises ValueError (before anything
    is sampled or revealed) if the realisation cannot meet the plan."""
    from .samplers.guarantee import gaussian_tv_bound, grid_sensitivity_units, laplace_tv_bound

    if plan.sampler != "mpc" or plan.dim is None or plan.sizes is None:
        raise ValueError("realise: needs an in-MPC plan bound with the agreed sizes and the dimension")
    dim, delta_s = int(plan.dim), plan.sensitivity()
    if grid_bits is not None and not 0 <= grid_bits <= MAX_GRID_BITS:
        raise ValueError(f"realise: grid_bits must be in [0, {MAX_GRID_BITS}], got {grid_bits}")
    split = plan.noise_split  # distributed noise: each party samples a share, h of them carry the guarantee
    if split is not None and split.parties != parties:
        raise ValueError(f"realise: the plan splits the noise among {split.parties} parties, the session has {parties}")
    if plan.mechanism == "gaussian":
        h = 1 if split is None else split.honest  # the samples whose sum must carry σ = z·s_grid
        z = float(plan.noise_multiplier)
        g = _grid_bits(z * delta_s / math.sqrt(h), delta_s, dim, parties, "l2") if grid_bits is None else grid_bits
        s_grid = grid_sensitivity_units(delta_s, g, dim, parties, "l2")
        need = z * s_grid
        sigma = need / math.sqrt(h) * 2.0**-g
        widths = GAUSSIAN_COIN_BITS if split is None else DISTRIBUTED_COIN_BITS
        for coin_bits in widths:  # the cheapest coins whose TV fits the plan's budget
            for _ in range(64):  # for_sigma never samples below the request; guard the float round trip
                spec = NoiseSpec("gaussian", sigma, sensitivity=delta_s, grid_bits=g, coin_bits=coin_bits)
                noise_plan = plan_noise(spec, dim, parties)
                if math.sqrt(h) * noise_plan.params.sigma >= need:
                    break
                sigma = math.nextafter(sigma, math.inf)
            tv = h * dim * gaussian_tv_bound(noise_plan.params)
            if tv <= plan.sampler_tv_per_release:
                break
        scale_grid = math.sqrt(h) * noise_plan.params.sigma
        mult = scale_grid / s_grid
        ok = mult >= z
    elif plan.mechanism == "laplace":
        eps = float(plan.epsilon_per_release)
        g = _grid_bits(delta_s / eps, delta_s, dim, parties, "l1") if grid_bits is None else grid_bits
        s_grid = grid_sensitivity_units(delta_s, g, dim, parties, "l1")
        b = s_grid / eps * 2.0**-g * (1.0 + 1e-12)
        spec = NoiseSpec("laplace", b, sensitivity=delta_s, grid_bits=g)
        noise_plan = plan_noise(spec, dim, parties)
        scale_grid = noise_plan.params.t
        mult = s_grid / scale_grid
        tv = dim * laplace_tv_bound(noise_plan.params)
        ok = mult <= eps
    else:
        raise ValueError(f"realise: no in-MPC sampler for mechanism {plan.mechanism!r}")
    if not ok:  # pragma: no cover - guarded above
        raise ValueError("realise: the sampled noise does not meet the plan's multiplier")
    if tv > plan.sampler_tv_per_release:
        what = (f"the in-MPC sampler's total-variation bound {tv:.3g} per release ({dim} coordinates)" if split is None
                else f"the noise sampler's total-variation bound {tv:.3g} per release ({split.honest} honest shares of "
                     f"{dim} coordinates)")
        raise ValueError(f"{what} exceeds the plan's budget {plan.sampler_tv_per_release:.3g}: raise privacy.delta or "
                         "shorten the job")
    if split is None:
        return Realisation(spec, noise_plan, s_grid, scale_grid, mult, tv)
    tau = kls_tau(noise_plan.params.sigma, split.honest)
    if plan.rounds * tau * dim > MAX_KLS_OFFSET:
        raise ValueError(f"distributed noise: σ per party {noise_plan.params.sigma:.3g} grid units is too small for "
                         "the sum of discrete Gaussians to be accounted as one (Kairouz–Liu–Steinke τ·d)")
    return Realisation(spec, noise_plan, s_grid, scale_grid, mult, tv, split, tau)
