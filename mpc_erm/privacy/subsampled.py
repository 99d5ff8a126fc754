"""Rényi DP of the Poisson-subsampled Gaussian — continuous or the in-MPC discrete one — on the
product's orders.

**The in-MPC discrete Gaussian, exactly** (:func:`discrete_gaussian_curve`). With
Q = N_Z(0, σ²)^d, P = N_Z(μ, σ²)^d, μ an integer shift (‖μ‖₂ ≤ Δ₂, z = σ/Δ₂) and M = (1−q)Q + qP
the sample with the record:

1. *removal* (M against Q), integer α: by the binomial theorem
   E_Q[(M/Q)^α] = Σ_k C(α,k)(1−q)^(α−k) q^k E_Q[(P/Q)^k], and at an integer shift
   E_Q[(P/Q)^k] = exp(k(k−1)‖μ‖²/(2σ²)) exactly (the lattice sum of the Gaussian shifted by kμ is
   the unshifted one). So it *is* the continuous Gaussian's binomial sum (Mironov–Talwar–Zhang
   2019), increasing in ‖μ‖: at most its value for z.
2. *addition* (Q against M), every real α > 1: at most the removal direction, for any pair that an
   involution T swaps (Q(Tx) = P(x), P(Tx) = Q(x); here Tx = μ − x). On the orbit {x, Tx}, with
   r = P/Q(x), X = 1−q+qr and Y = 1−q+q/r, the two directions contribute Q(x)(X^α + rY^α) and
   Q(x)(X^(1−α) + rY^(1−α)); the first is the larger because, with Z = 1/Y and φ_α(u) = u^α −
   u^(1−α), φ_α(X)/φ_α(Z) = √(X/Z)·sinh(γ ln X)/sinh(γ ln Z) (γ = α − ½) grows with α (u ↦ u
   coth(γu) increases and X ≥ Z because XY ≥ 1), and equals rY at α = 1.
3. *fractional orders*: log E_Q[(M/Q)^α] is convex in α (Hölder) and 0 at α = 1, so the line
   between the neighbouring integer orders bounds it.

So the discrete Gaussian's subsampled RDP equals the continuous Gaussian's at integer orders and is
bounded by their interpolation between them: the plan needs no more noise for the MPC's noise than
for the simulator's under RDP (docs/explanation/privacy.md §4 has the proof in full;
``tests/privacy/test_subsampled.py`` checks both directions against 60-digit sums over the lattice in
one and two dimensions, and the lemma of step 2 on random swapped pairs).

**The general bound** (:func:`general_discrete_gaussian_curve`): Zhu & Wang ("Poisson Subsampled
Rényi Differential Privacy", ICML 2019), for any mechanism with RDP ε(ℓ) at integer ℓ ≥ 2:

    (α−1)·ε'(α) ≤ log[ (1−γ)^(α−1)·(αγ − γ + 1) + C(α,2)·γ²·(1−γ)^(α−2)·e^ε(2)
                        + 3·Σ_{ℓ=3..α} C(α,ℓ)·γ^ℓ·(1−γ)^(α−ℓ)·e^((ℓ−1)·ε(ℓ)) ].

Earlier versions accounted the in-MPC noise by it (ε 1.02 where the continuous Gaussian has 0.93 at
TF-Privacy's MNIST setting; 3.2× the noise at q = 0.25); a ledger row or report written then says
so (``subsampled_rdp = "general"`` on its event) and is recomputed by it.

The other curves every accountant of the product sums live here too, on the same orders:
:func:`poisson_gaussian_curve` (the continuous Gaussian, Poisson-subsampled) and
:func:`wor_gaussian_curve` (a fixed number of public slots drawn without replacement, for either
noise). :mod:`.events` composes them and :mod:`.accountants` states ε from them; neither needs
the other.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy.special import gammaln, logsumexp

__all__ = ["DP_ACCOUNTING_ORDERS", "LARGE_ORDERS", "RDP_ORDERS", "discrete_gaussian_curve", "discrete_gaussian_rdp",
           "general_discrete_gaussian_curve", "poisson_gaussian_curve", "poisson_subsampled_rdp",
           "subsampled_discrete_gaussian_rdp", "unsampled_large_orders", "wor_gaussian_curve"]


def discrete_gaussian_rdp(order: float, noise_multiplier: float) -> float:
    """RDP of one release of the discrete Gaussian with integer shifts at ℓ2 norm ≤ Δ₂ and
    σ = z·Δ₂: α/(2z²), exact at integer orders (and an upper bound at the others)."""
    return order / (2.0 * noise_multiplier**2)


def _log_binom(a: int, ls: np.ndarray) -> np.ndarray:
    return gammaln(a + 1.0) - gammaln(ls + 1.0) - gammaln(a - ls + 1.0)


def poisson_subsampled_rdp(orders: Sequence[float], q: float,
                           base_rdp: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """ε'(α) at each of ``orders`` of the base mechanism run on a Poisson sample at rate ``q``
    (module docstring); +∞ at non-integer orders and where the base is. ``base_rdp`` is the base
    mechanism's RDP curve, vectorised: it takes an array of integer orders (the sum at order α has
    α terms, and :data:`LARGE_ORDERS` reach 131,072)."""
    if not 0.0 < q <= 1.0:
        raise ValueError(f"sampling rate must be in (0, 1], got {q!r}")
    out = np.full(len(orders), math.inf)
    whole = [int(a) for a in map(float, orders) if a.is_integer() and a >= 2]
    if not whole:
        return out
    ks = np.arange(2, max(whole) + 1, dtype=np.float64)
    base = np.asarray(base_rdp(ks), dtype=np.float64)  # base[k - 2] = ε(k)
    lq, l1q = (math.log(q), math.log1p(-q)) if q < 1.0 else (0.0, -math.inf)
    for i, order in enumerate(orders):
        a = float(order)
        if not a.is_integer() or a < 2:
            continue
        n = int(a)
        if q == 1.0:
            out[i] = base[n - 2]
            continue
        eps_l = base[: n - 1]  # ε(2) … ε(n)
        if not np.all(np.isfinite(eps_l)):
            continue
        ls = ks[1 : n - 1]  # 3 … n
        terms = [np.array([(n - 1) * l1q + math.log1p((n - 1) * q),
                           float(_log_binom(n, np.array([2.0]))[0]) + 2 * lq + (n - 2) * l1q + eps_l[0]])]
        if n >= 3:
            terms.append(math.log(3.0) + _log_binom(n, ls) + ls * lq + (n - ls) * l1q + (ls - 1.0) * eps_l[1:])
        out[i] = float(logsumexp(np.concatenate(terms))) / (n - 1)
    return out


def subsampled_discrete_gaussian_rdp(orders: Sequence[float], q: float, noise_multiplier: float) -> np.ndarray:
    """Zhu–Wang's general bound on one Poisson-subsampled release of the discrete Gaussian
    (z = σ/Δ₂): the analysis of events written before the exact one."""
    return poisson_subsampled_rdp(orders, q, lambda a: discrete_gaussian_rdp(a, noise_multiplier))


def _dp_accounting_orders() -> tuple[float, ...]:
    from dp_accounting.rdp import RdpAccountant

    return tuple(float(a) for a in RdpAccountant()._orders)  # dp_accounting keeps its default orders there


DP_ACCOUNTING_ORDERS: tuple[float, ...] = _dp_accounting_orders()  # 1.1 … 1,024
LARGE_ORDERS: tuple[float, ...] = tuple(float(2**k) for k in range(11, 18))  # 2,048 … 131,072
# The orders every RDP curve of the product is computed on (plan, ledger, reports). An RDP → (ε, δ)
# conversion at order α costs about log(1/δ)/(α − 1), so dp_accounting's orders alone cannot state
# ε below ≈ log(1/δ)/1,023 (0.0135 at δ = 1e-6) except through its KL fallback, and calibrating a
# smaller ε there asked for ~1,000× the noise needed (z = 4.06e6 where the PLD accountant needs
# 3,158 at ε = 0.005, δ = 1e-6, T = 30). The larger orders reach ε ≈ 1e-4 at δ = 1e-6.
RDP_ORDERS: tuple[float, ...] = DP_ACCOUNTING_ORDERS + LARGE_ORDERS


def _log_moment_poisson_gaussian(q: float, noise_multiplier: float, order: int) -> float:
    """log A_α of the Poisson-subsampled Gaussian at integer α (Mironov, Talwar & Zhang 2019,
    §3.3): A_α = Σ_{i=0..α} C(α, i)·q^i·(1−q)^(α−i)·exp((i² − i)/(2z²)), the sum dp_accounting's
    ``_compute_log_a_int`` evaluates one term at a time (20 s a curve at these orders), here as
    one array."""
    i = np.arange(order + 1, dtype=np.float64)
    terms = (_log_binom(order, i) + i * math.log(q) + (order - i) * math.log1p(-q)
             + (i * i - i) / (2.0 * noise_multiplier**2))
    return float(logsumexp(terms))


def unsampled_large_orders(noise_multiplier: float) -> np.ndarray:
    """The unsampled Gaussian's α/(2z²) on :data:`LARGE_ORDERS`: exact at q = 1, and an upper
    bound on any sampled version of it (sampling never increases a Rényi divergence)."""
    return np.asarray(LARGE_ORDERS) / (2.0 * noise_multiplier**2)


@functools.lru_cache(maxsize=256)
def poisson_gaussian_curve(q: float, noise_multiplier: float) -> np.ndarray:
    """One release of the (continuous) Gaussian, Poisson-subsampled at rate ``q`` under add/remove
    (z = σ/Δ₂; q = 1: no sampling), on :data:`RDP_ORDERS`: dp_accounting's
    ``PoissonSampledDpEvent`` curve on its own orders, the same exact sum on :data:`LARGE_ORDERS`
    (:func:`_log_moment_poisson_gaussian`). Cached; read-only: callers scale a copy."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    event = dp_accounting.GaussianDpEvent(noise_multiplier)
    acc = RdpAccountant(orders=DP_ACCOUNTING_ORDERS)
    acc.compose(event if q == 1.0 else dp_accounting.PoissonSampledDpEvent(q, event))
    large = (unsampled_large_orders(noise_multiplier) if q == 1.0 else
             [_log_moment_poisson_gaussian(q, noise_multiplier, int(a)) / (a - 1) for a in LARGE_ORDERS])
    curve = np.concatenate([np.asarray(acc._rdp, dtype=np.float64), large])
    curve.flags.writeable = False
    return curve


def _exact_log_moments(q: float, noise_multiplier: float, orders: Sequence[float]) -> np.ndarray:
    """log E_Q[(M/Q)^α] of the Poisson-subsampled discrete Gaussian at each of ``orders`` > 1: the
    binomial sum at integer α, the line between the neighbouring integers elsewhere (0 at α = 1;
    module docstring, steps 1 and 3)."""
    cache: dict[int, float] = {1: 0.0}

    def at(n: int) -> float:
        if n not in cache:
            cache[n] = _log_moment_poisson_gaussian(q, noise_multiplier, n)
        return cache[n]

    out = np.empty(len(orders))
    for i, order in enumerate(map(float, orders)):
        lo = math.floor(order)
        out[i] = at(lo) if order == lo else (lo + 1 - order) * at(lo) + (order - lo) * at(lo + 1)
    return out


@functools.lru_cache(maxsize=256)
def discrete_gaussian_curve(q: float, noise_multiplier: float) -> np.ndarray:
    """One Poisson-subsampled release of the in-MPC discrete Gaussian (z = σ/Δ₂, integer shifts;
    q = 1: no sampling) on :data:`RDP_ORDERS`, both directions: the continuous Gaussian's exact sum
    at integer orders, interpolated between them (module docstring). Cached (a job's progress and
    the ledger ask for the same curve often). Read-only: callers scale a copy."""
    orders = np.asarray(RDP_ORDERS)
    if q == 1.0:
        curve = orders / (2.0 * noise_multiplier**2)
    else:
        curve = _exact_log_moments(q, noise_multiplier, RDP_ORDERS) / (orders - 1.0)
    curve.flags.writeable = False
    return curve


@functools.lru_cache(maxsize=256)
def general_discrete_gaussian_curve(q: float, noise_multiplier: float) -> np.ndarray:
    """Zhu–Wang's general bound on the same release (+∞ at non-integer orders): how events marked
    ``subsampled_rdp = "general"`` (written before the exact analysis) are recomputed. Read-only."""
    curve = subsampled_discrete_gaussian_rdp(RDP_ORDERS, q, noise_multiplier)
    curve.flags.writeable = False
    return curve


@functools.lru_cache(maxsize=256)
def wor_gaussian_curve(noise_multiplier: float, population: int, sample_size: int) -> np.ndarray:
    """One release's RDP on :data:`RDP_ORDERS`: the Gaussian (z relative to the replace-one
    shift) on ``sample_size`` of ``population`` slots drawn without replacement — dp_accounting's
    ``SampledWithoutReplacementDpEvent`` under ``REPLACE_ONE``. Cached (each costs ~0.15 s;
    calibration and the ledger ask often). Read-only: callers scale a copy.

    Valid for the in-MPC discrete Gaussian too: the bound (WBK 2019 Thm 27) reads the base
    mechanism through its RDP curve α/(2z²) and, in its sharper terms, its ternary
    |χ|^j-divergences at integer j, both made of the moments E_q[(p/q)^a·(r/q)^b] at integer
    a, b; at integer shifts the discrete Gaussian's moments equal the continuous one's (the
    shifted lattice sum is the unshifted one; CKS 2020 Prop. 5 is the case b = 0). Fractional
    orders interpolate the CGF, which is convex for any mechanism (WBK Cor. 10).

    On :data:`LARGE_ORDERS` (dp_accounting's sum costs ~26 s a curve there) the curve is the
    unsampled Gaussian's α/(2z²): sampling never increases a Rényi divergence (each side is a
    mixture over the same draws, and Rényi divergence is jointly quasi-convex: van Erven &
    Harremoës 2014, Thm 13), so it bounds the sampled one, crediting no amplification at orders
    that matter only for ε ≲ log(1/δ)/1,000."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant(orders=DP_ACCOUNTING_ORDERS, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(
        population, sample_size, dp_accounting.GaussianDpEvent(noise_multiplier)))
    ours = np.asarray(acc._rdp, dtype=np.float64)  # dp_accounting keeps the curve in _rdp
    curve = np.concatenate([ours, unsampled_large_orders(noise_multiplier)])
    curve.flags.writeable = False
    return curve
