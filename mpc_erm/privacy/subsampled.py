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
and integer shifts is exactly the continuous one's, ε(ℓ) = ℓ/(2z²) with z = σ/Δ₂ (docs/privacy.md
§4 has the two-line computation), so this theorem applies to it with that curve. At TF-Privacy's
MNIST setting (q = 256/60,000, z = 1.2, 2,344 rounds, δ = 10⁻⁵) it states ε = 1.02, against 0.93
for the continuous Gaussian.

Non-integer orders get +∞ (the theorem is for integers), so an accountant that sums this curve
with others on dp_accounting's orders uses the integer ones. :func:`discrete_gaussian_curve` is
that curve on those orders, the one form the ledger's composition and the plan's calibration use.
``tests/privacy/test_subsampled.py`` checks it against autodp's implementation of the same theorem
and against dp_accounting's exact curve of the subsampled continuous Gaussian, which it must bound
from above.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy.special import gammaln, logsumexp

__all__ = ["RDP_ORDERS", "discrete_gaussian_curve", "discrete_gaussian_rdp", "poisson_subsampled_rdp",
           "subsampled_discrete_gaussian_rdp"]


def discrete_gaussian_rdp(order: float, noise_multiplier: float) -> float:
    """RDP of one release of the discrete Gaussian with integer shifts at ℓ2 norm ≤ Δ₂ and
    σ = z·Δ₂: α/(2z²), exact at integer orders (and an upper bound at the others)."""
    return order / (2.0 * noise_multiplier**2)


def _log_binom(a: int, ls: np.ndarray) -> np.ndarray:
    return gammaln(a + 1.0) - gammaln(ls + 1.0) - gammaln(a - ls + 1.0)


def poisson_subsampled_rdp(orders: Sequence[float], q: float, base_rdp: Callable[[int], float]) -> np.ndarray:
    """ε'(α) at each of ``orders`` of the base mechanism (RDP curve ``base_rdp``) run on a Poisson
    sample at rate ``q`` (module docstring); +∞ at non-integer orders and where the base is."""
    if not 0.0 < q <= 1.0:
        raise ValueError(f"sampling rate must be in (0, 1], got {q!r}")
    out = np.full(len(orders), math.inf)
    for i, order in enumerate(orders):
        a = float(order)
        if not a.is_integer() or a < 2:
            continue
        n = int(a)
        if q == 1.0:
            out[i] = base_rdp(n)
            continue
        ls = np.arange(3, n + 1, dtype=np.float64)
        eps_l = np.array([base_rdp(int(k)) for k in ls])
        if not (math.isfinite(base_rdp(2)) and np.all(np.isfinite(eps_l))):
            continue
        lq, l1q = math.log(q), math.log1p(-q)
        terms = [(n - 1) * l1q + math.log1p((n - 1) * q),
                 float(_log_binom(n, np.array([2.0]))[0]) + 2 * lq + (n - 2) * l1q + base_rdp(2)]
        if n >= 3:
            terms.extend(math.log(3.0) + _log_binom(n, ls) + ls * lq + (n - ls) * l1q + (ls - 1.0) * eps_l)
        out[i] = float(logsumexp(terms)) / (n - 1)
    return out


def subsampled_discrete_gaussian_rdp(orders: Sequence[float], q: float, noise_multiplier: float) -> np.ndarray:
    """The RDP curve of one Poisson-subsampled release of the discrete Gaussian (z = σ/Δ₂)."""
    return poisson_subsampled_rdp(orders, q, lambda a: discrete_gaussian_rdp(a, noise_multiplier))


def _default_orders() -> tuple[float, ...]:
    from dp_accounting.rdp import RdpAccountant

    return tuple(RdpAccountant()._orders)  # dp_accounting keeps its default orders there


RDP_ORDERS: tuple[float, ...] = _default_orders()  # the orders every RdpAccountant of the product uses


@functools.lru_cache(maxsize=256)
def discrete_gaussian_curve(q: float, noise_multiplier: float) -> np.ndarray:
    """One subsampled discrete-Gaussian release's RDP on :data:`RDP_ORDERS` (cached: a job's
    progress and the ledger ask for the same curve often). Read-only: callers scale a copy."""
    curve = subsampled_discrete_gaussian_rdp(RDP_ORDERS, q, noise_multiplier)
    curve.flags.writeable = False
    return curve
