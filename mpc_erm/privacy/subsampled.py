"""Rényi DP of a Poisson-subsampled mechanism from the base mechanism's RDP curve alone.

The general upper bound of Zhu & Wang ("Poisson Subsampled Rényi Differential Privacy", ICML
2019, the theorem for general mechanisms): if M is (ℓ, ε(ℓ))-RDP for every integer ℓ ≥ 2, then M
run on a Poisson sample (each record in w.p. γ, independently; add/remove neighbours) is
(α, ε'(α))-RDP for every integer α ≥ 2 with

    (α−1)·ε'(α) ≤ log[ (1−γ)^(α−1)·(αγ − γ + 1) + C(α,2)·γ²·(1−γ)^(α−2)·e^ε(2)
                        + 3·Σ_{ℓ=3..α} C(α,ℓ)·γ^ℓ·(1−γ)^(α−ℓ)·e^((ℓ−1)·ε(ℓ)) ].

It bounds both directions (the sample with the record against the one without, and back), for
any mechanism; its price against a mechanism-specific analysis is the factor 3 (at most
log 3/(α−1) in ε'(α)).

Why the product needs it: dp_accounting's ``PoissonSampledDpEvent`` of a Gaussian is derived for
the continuous Gaussian — its bound on the "addition" direction uses that distribution's own
properties. The in-MPC noise is the discrete Gaussian on the grid, whose RDP at integer orders
and integer shifts is exactly the continuous one's, ε(ℓ) = ℓ/(2z²) with z = σ/Δ₂ (docs/explanation/privacy.md
§4 has the two-line computation), so this theorem applies to it with that curve. At TF-Privacy's
MNIST setting (q = 256/60,000, z = 1.2, 2,344 rounds, δ = 10⁻⁵) it states ε = 1.02, against 0.93
for the continuous Gaussian.

Non-integer orders get +∞ (the theorem is for integers), so an accountant that sums this curve
with others on dp_accounting's orders uses the integer ones. :func:`discrete_gaussian_curve` is
that curve on those orders, the one form the ledger's composition and the plan's calibration use.
``tests/privacy/test_subsampled.py`` checks it against autodp's implementation of the same theorem
and against dp_accounting's exact curve of the subsampled continuous Gaussian, which it must bound
from above.

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
           "poisson_gaussian_curve", "poisson_subsampled_rdp", "subsampled_discrete_gaussian_rdp",
           "unsampled_large_orders", "wor_gaussian_curve"]


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
    """The RDP curve of one Poisson-subsampled release of the discrete Gaussian (z = σ/Δ₂)."""
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


@functools.lru_cache(maxsize=256)
def discrete_gaussian_curve(q: float, noise_multiplier: float) -> np.ndarray:
    """One subsampled discrete-Gaussian release's RDP on :data:`RDP_ORDERS` (cached: a job's
    progress and the ledger ask for the same curve often). Read-only: callers scale a copy."""
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
