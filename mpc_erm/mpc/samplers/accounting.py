"""Privacy accounting for the PMF actually sampled (:mod:`.pmf`), not for the ideal Laplace.

Two guarantees, both for the implemented distribution P (truncation and k-bit rounding included):

1. **One coordinate, one shift s (grid units), exact.** The mechanism outputs a + D with D ~ P;
   neighbours shift a by s. Its tight (ε, δ) curve is the hockey-stick divergence
   δ(ε) = max over both orders of Σ_x [P(x) − e^ε P(x − s)]₊, computed exactly in numpy
   (:func:`exact_delta`), and also as Google ``dp_accounting``'s privacy-loss distribution
   built by ``from_two_probability_mass_functions`` (:func:`pld_for_shift`; pessimistic
   discretisation, so an upper bound within its 1e-4 loss grid), which composes with the rest
   of a job's DpEvents. Points one distribution reaches and the other does not (the truncation
   edge, holes from a zero threshold) are infinite privacy loss and land in δ automatically.

2. **ℓ1 sensitivity over d coordinates (and every shift |s| ≤ Δ in one coordinate).** The worst
   case over all integer vectors s with ‖s‖₁ ≤ Δ is not a single PLD, so we use the structure of
   the loss instead of a per-coordinate split of Δ. Write r(y) = ln P(y)/P(y+1). Telescoping,
   ln P(x)/P(x+s) = Σ_{u} r(·) over the |s| unit steps between x and x+s, so if every unit step
   in the window [x − Δ, x + Δ] has |r| ≤ ε₁ then |ln P(x)/P(x+s)| ≤ ε₁|s| for all |s| ≤ Δ.
   Call such x *good*, G the good set. For a d-dimensional output a + (D_1…D_d), the privacy
   loss is Σ_i ln P(D_i)/P(D_i + s_i) ≤ ε₁‖s‖₁ ≤ ε₁Δ whenever all D_i ∈ G; hence
   δ(ε₁Δ) ≤ P(L > ε₁Δ) ≤ P(∃i: D_i ∉ G) = 1 − P(G)^d, in both directions since the noise law
   is the same under either input (:func:`l1_guarantee`). For the ideal discrete Laplace
   r ≡ 1/t and G is everything: ε = Δ/t, δ = 0 — the classic ℓ1 Laplace guarantee.
   Requirement on the caller: a and a' are on the noise grid (CrypTen's ring integers are),
   and Δ bounds ‖a − a'‖₁ *in grid units after fixed-point encoding*, i.e. including the
   encoder's per-party rounding (:func:`grid_sensitivity`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .params import DiscreteLaplaceParams
from .pmf import ideal_discrete_laplace_log_pmf, log_pmf


class _HasLogPmf(Protocol):
    """Sampler parameters that know their exact PMF on −M … M (e.g. the discrete Gaussian)."""

    def log_pmf(self) -> np.ndarray: ...


Sampler = DiscreteLaplaceParams | _HasLogPmf | np.ndarray


def _log_pmf_of(sampler: Sampler) -> np.ndarray:
    """log PMF on the symmetric integer support −M … M (array length 2M + 1)."""
    if isinstance(sampler, np.ndarray):
        return sampler
    if isinstance(sampler, DiscreteLaplaceParams):
        return log_pmf(sampler)
    return sampler.log_pmf()

__all__ = [
    "L1Guarantee",
    "exact_delta",
    "exact_epsilon",
    "grid_sensitivity",
    "ideal_delta",
    "l1_guarantee",
    "pld_for_shift",
    "sampler_delta",
    "unit_log_ratios",
]


def grid_sensitivity(sensitivity: float, grid_bits: int, rounding_units: int = 0) -> int:
    """Sensitivity in grid units: ⌈Δ·2^grid_bits⌉ plus the encoder's rounding slack (each of m
    parties' inputs is truncated to the grid: pass ``rounding_units`` = m per coordinate
    touched, e.g. m·d for an ℓ1 bound over d coordinates)."""
    if sensitivity < 0 or rounding_units < 0:
        raise ValueError("sensitivity and rounding_units must be non-negative")
    return math.ceil(sensitivity * 2.0**grid_bits) + rounding_units


def _pair(lp: np.ndarray, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """log P and log P(· − shift) on the union of their supports."""
    s = abs(int(shift))
    pad = np.full(s, -np.inf)
    a = np.concatenate([lp, pad])
    b = np.concatenate([pad, lp])
    return (a, b) if shift >= 0 else (b, a)


def _hockey(lp: np.ndarray, lq: np.ndarray, eps: float) -> float:
    """Σ_x [P(x) − e^ε Q(x)]₊ = Σ_{P>0} P·[1 − e^{ε + ln Q − ln P}]₊ (stable in log space)."""
    m = np.isfinite(lp)
    lp, lq = lp[m], lq[m]
    with np.errstate(invalid="ignore"):
        expo = eps + lq - lp  # −inf where Q = 0: the whole of P(x) counts
    terms = np.exp(lp) * -np.expm1(np.minimum(expo, 0.0))
    return float(np.sum(terms, dtype=np.float64))


def _delta_pair(lp: np.ndarray, shift: int, eps: float) -> float:
    a, b = _pair(lp, shift)
    return max(_hockey(a, b, eps), _hockey(b, a, eps))


def exact_delta(params: Sampler, shift: int, epsilon: float) -> float:
    """Tight δ(ε) of one coordinate with shift ``shift`` grid units, for the implemented PMF."""
    return _delta_pair(_log_pmf_of(params), shift, epsilon)


def ideal_delta(t: float, shift: int, epsilon: float, support_max: int) -> float:
    """δ(ε) of the *ideal* discrete Laplace restricted to [−support_max, support_max] for the
    comparison only (its mass beyond is < 1e-19 for the default B)."""
    xs = np.arange(-support_max, support_max + 1)
    return _delta_pair(ideal_discrete_laplace_log_pmf(t, xs), shift, epsilon)


def sampler_delta(params: DiscreteLaplaceParams, shift: int, epsilon: float) -> float:
    """δ_impl(ε) − δ_ideal(ε) (≥ 0) for one coordinate: what to put in the report's
    ``delta_sampler`` when ε, δ were computed for the ideal discrete Laplace. Valid because
    the implemented mechanism is (ε, δ_impl(ε))-DP by definition of δ_impl. For several
    coordinates use :func:`l1_guarantee`, whose (ε, δ) is already for the implemented PMF."""
    ideal = ideal_delta(params.t, shift, epsilon, params.support_max + abs(int(shift)))
    return max(0.0, exact_delta(params, shift, epsilon) - ideal)


def exact_epsilon(
    params: Sampler, shift: int, delta: float, tol: float = 1e-7, lp: np.ndarray | None = None
) -> float:
    """Smallest ε (to ``tol``) with exact δ(ε) ≤ ``delta`` (δ(ε) is non-increasing in ε).
    Returns inf if even a huge ε does not reach ``delta`` (infinite-loss mass > δ)."""
    lp = _log_pmf_of(params) if lp is None else lp
    lo, hi = 0.0, 1.0
    while _delta_pair(lp, shift, hi) > delta:
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    if _delta_pair(lp, shift, lo) <= delta:
        return 0.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if _delta_pair(lp, shift, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def pld_for_shift(
    params: Sampler, shift: int, value_discretization_interval: float = 1e-4
):  # -> dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution
    """``dp_accounting`` PLD of (P, P shifted by ``shift``) from the exact PMFs (pessimistic).

    Builds Python dicts over the support: meant for supports up to ~10^6 points (B ≤ 19); for
    larger B use :func:`exact_delta` (same quantity, vectorised) — a test checks they agree.
    """
    from dp_accounting.pld import privacy_loss_distribution as pld_mod

    lp = _log_pmf_of(params)
    m = (lp.size - 1) // 2
    xs = np.arange(-m, m + 1, dtype=np.int64)
    a, b = _pair(lp, shift)
    s = abs(int(shift))
    grid = np.concatenate([xs, xs[-1] + 1 + np.arange(s)]) if shift >= 0 else np.concatenate(
        [xs[0] - s + np.arange(s), xs]
    )
    lower = {int(x): float(v) for x, v in zip(grid, a, strict=True) if np.isfinite(v)}
    upper = {int(x): float(v) for x, v in zip(grid, b, strict=True) if np.isfinite(v)}
    return pld_mod.from_two_probability_mass_functions(
        lower, upper, pessimistic_estimate=True,
        value_discretization_interval=value_discretization_interval, symmetric=False,
    )


def unit_log_ratios(params: Sampler, lp: np.ndarray | None = None) -> np.ndarray:
    """r(y) = ln P(y)/P(y+1) for consecutive support points (±inf/nan where a side is 0)."""
    lp = _log_pmf_of(params) if lp is None else lp
    with np.errstate(invalid="ignore"):
        return lp[:-1] - lp[1:]


@dataclass(frozen=True)
class L1Guarantee:
    """(ε, δ) for every shift vector with ‖s‖₁ ≤ ``l1_shift`` grid units over ``dim`` coordinates."""

    epsilon: float
    delta: float
    epsilon_per_unit: float
    ideal_epsilon: float
    bad_mass_per_coordinate: float


def _bad_mass(lp: np.ndarray, r: np.ndarray, eps1: float, window: int) -> float:
    """P(D ∉ G): some unit step within ``window`` of D has |r| > ε₁ (or leaves the support)."""
    n = lp.size
    bad_step = ~(np.abs(r) <= eps1)  # nan/inf count as bad
    # x is good iff the steps y = x−window … x+window−1 are all fine and x±window is in range.
    padded = np.concatenate([np.ones(window, bool), bad_step, np.ones(window, bool)])
    c = np.concatenate([[0], np.cumsum(padded, dtype=np.int64)])
    # steps for x (index i): padded indices i … i + 2·window − 1
    idx = np.arange(n)
    bad_x = (c[idx + 2 * window] - c[idx]) > 0
    p = np.exp(lp)
    return float(np.sum(p[bad_x], dtype=np.float64))


def l1_guarantee(
    params: DiscreteLaplaceParams, l1_shift: int, dim: int = 1, delta: float | None = None,
    epsilon_per_unit: float | None = None,
) -> L1Guarantee:
    """The ℓ1 guarantee of the module docstring (item 2).

    Give ``epsilon_per_unit`` (ε₁) directly, or a target ``delta``: then ε₁ is the smallest
    observed |r| value whose bad-set mass gives 1 − P(G)^d ≤ δ.
    """
    if l1_shift < 1 or dim < 1:
        raise ValueError("l1_shift and dim must be positive")
    lp = log_pmf(params)
    r = unit_log_ratios(params, lp)
    window = int(l1_shift)

    def total_delta(bad: float) -> float:
        return -math.expm1(dim * math.log1p(-min(bad, 1.0))) if bad < 1.0 else 1.0

    if epsilon_per_unit is None:
        if delta is None:
            raise ValueError("give delta or epsilon_per_unit")
        cands = np.unique(np.abs(r[np.isfinite(r)]))
        lo, hi = 0, cands.size - 1
        if total_delta(_bad_mass(lp, r, float(cands[hi]), window)) > delta:
            eps1 = math.inf
        else:
            while lo < hi:  # smallest candidate meeting δ (bad mass is monotone in ε₁)
                mid = (lo + hi) // 2
                if total_delta(_bad_mass(lp, r, float(cands[mid]), window)) <= delta:
                    hi = mid
                else:
                    lo = mid + 1
            eps1 = float(cands[lo])
    else:
        eps1 = float(epsilon_per_unit)
    bad = _bad_mass(lp, r, eps1, window) if math.isfinite(eps1) else 1.0
    return L1Guarantee(
        epsilon=eps1 * l1_shift, delta=total_delta(bad), epsilon_per_unit=eps1,
        ideal_epsilon=l1_shift / params.t, bad_mass_per_coordinate=bad,
    )
