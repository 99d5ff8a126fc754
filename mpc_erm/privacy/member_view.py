"""Rounds on a batch drawn without replacement from the pooled rows of several members, as one of
them sees them.

When the parties hold their own rows and a round's batch is b rows drawn uniformly without
replacement from all N pooled rows (hidden: no party learns which of another's rows were drawn),
each party still computes on its own drawn rows, so it knows how many of them were drawn, k, and
hence that the other members' rows supplied b − k. For a row held by another member, that
party's view of a round is therefore the Gaussian on b − k of the N − n rows it does not hold
(n its own count), with k hypergeometric(N, n, b) and independent of the data. Its Rényi moment
is the mixture

    exp((α−1)·R_view(α)) = Σ_k P(k)·exp((α−1)·R_WOR(α; b − k, N − n)),

exact for the pair (k, release), since k is public to that member and data independent. An
outside observer (n = 0) sees R_WOR(α; b, N), dp_accounting's ``SampledWithoutReplacementDpEvent``
curve. The mixture is a little above it (the members' extra knowledge), and the plan accounts
the largest of all views.

R_WOR is dp_accounting's bound (Wang–Balle–Kasiviswanathan 2019, Thm 27): at integer α,
log A_α(γ) = log(1 + Σ_{i≥2} γ^i·c_i(α, z)) with c_i depending on α and z only; fractional
orders interpolate the CGF between the neighbouring integers (its Cor. 10). This module computes
the c_i once per (z, α), with dp_accounting's own helpers, and evaluates every γ = (b − k)/(N − n)
of the mixture from them; ``tests/privacy/test_member_view.py`` checks each against dp_accounting.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy.special import logsumexp
from scipy.stats import hypergeom

from mpc_erm.privacy.subsampled import DP_ACCOUNTING_ORDERS, unsampled_large_orders, wor_gaussian_curve

__all__ = ["member_view_curve", "pooled_rows_curve", "wor_log_moments"]

#: dp_accounting's switch from the exact bound to its Stirling form (``max_alpha``)
_EXACT_UP_TO = 256


def _cgf(sigma: float) -> Callable[[float], float]:
    """dp_accounting's cgf of the Gaussian in ``_compute_rdp_sample_wor_gaussian_int``."""

    def cgf(x: float) -> float:
        return x * 1.0 * (x + 1) / (2.0 * sigma**2)

    return cgf


@functools.lru_cache(maxsize=64)
def _forward_diffs(noise_multiplier: float) -> np.ndarray:
    """dp_accounting's ``_get_forward_diffs(cgf, n)`` at n = 256, once per z: its i-th entry reads
    only the function's first i + 1 values, by the same float operations whatever n is, so every
    order's prefix is the array dp_accounting computes for that order alone, bit for bit (a test
    checks it) — where computing it per order cost O(α²) each, most of a member view's time."""
    from dp_accounting.rdp.rdp_privacy_accountant import _get_forward_diffs

    deltas, _ = _get_forward_diffs(_cgf(noise_multiplier), _EXACT_UP_TO)
    deltas.flags.writeable = False
    return deltas


#: Enough for every integer order a curve needs (about 160) at a dozen noise multipliers: the views
#: of one calibration step share their coefficients (up to 1,025 floats each, ≤ 16 MB in all).
@functools.lru_cache(maxsize=2048)
def _coefficients(noise_multiplier: float, alpha: int) -> np.ndarray:
    """(α + 1,) log c_i for i = 0..α (−inf at i = 1; 0 at i = 0): dp_accounting's
    ``_compute_rdp_sample_wor_gaussian_int`` term by term, without the γ^i factor."""
    from dp_accounting.rdp.rdp_privacy_accountant import _log_comb

    sigma = noise_multiplier
    cgf = _cgf(sigma)

    def func(x: float) -> float:
        return 1.0 * x / (2.0 * sigma**2)

    out = np.full(alpha + 1, -np.inf)
    out[0] = 0.0
    log_f2m1 = func(2.0) + math.log1p(-np.exp(-func(2.0)))
    out[2] = _log_comb(alpha, 2) + min(np.log(4) + log_f2m1, func(2.0) + np.log(2))
    if alpha <= _EXACT_UP_TO:
        deltas = _forward_diffs(noise_multiplier)
        for i in range(3, alpha + 1):
            delta_lo = deltas[int(2 * np.floor(i / 2.0)) - 1]
            delta_hi = deltas[int(2 * np.ceil(i / 2.0)) - 1]
            s = min(np.log(4) + 0.5 * (delta_lo + delta_hi), np.log(2) + cgf(i - 1))
            out[i] = s + _log_comb(alpha, i)
    else:
        for i in range(3, alpha + 1):
            out[i] = np.log(2) + cgf(i - 1) + _log_comb(alpha, i)
    out.flags.writeable = False
    return out


def _log_a(noise_multiplier: float, alpha: int, log_gamma: np.ndarray) -> np.ndarray:
    """log A_α at each sampling ratio (as log γ, γ < 1): logsumexp over i of c_i + i·log γ."""
    if alpha == 1:
        return np.zeros_like(log_gamma)
    c = _coefficients(noise_multiplier, alpha)
    i = np.arange(alpha + 1, dtype=np.float64)
    return logsumexp(c[None, :] + i[None, :] * log_gamma[:, None], axis=1)


def wor_log_moments(noise_multiplier: float, gammas: Sequence[float] | np.ndarray,
                    orders: Sequence[float] = DP_ACCOUNTING_ORDERS) -> np.ndarray:
    """(len(orders), len(gammas)): (α − 1)·R_WOR(α; γ) of the Gaussian (z relative to the
    replace-one shift) on a γ share of slots drawn without replacement — dp_accounting's value at
    each order and ratio (γ = 0: 0; γ = 1: the unsampled Gaussian's α(α − 1)/(2z²))."""
    g = np.asarray(gammas, dtype=np.float64)
    if np.any((g < 0) | (g > 1)):
        raise ValueError("gammas: sampling ratios in [0, 1]")
    out = np.zeros((len(orders), g.size))
    mid = (g > 0) & (g < 1)
    lg = np.log(g[mid])
    z2 = 2.0 * noise_multiplier**2
    for row, a in enumerate(orders):
        out[row, g == 1.0] = (a - 1) * a / z2
        if not mid.any():
            continue
        if float(a).is_integer():
            out[row, mid] = _log_a(noise_multiplier, int(a), lg)
        else:
            lo, hi = math.floor(a), math.ceil(a)
            t = a - lo
            out[row, mid] = (1 - t) * _log_a(noise_multiplier, lo, lg) + t * _log_a(noise_multiplier, hi, lg)
    return out


def _check(population: int, sample_size: int, member_rows: int) -> None:
    if not 1 <= sample_size < population:
        raise ValueError(f"sample_size: 1 to population − 1 rows a round, got {sample_size} of {population}")
    if not 0 <= member_rows < population:
        raise ValueError(f"member_rows: 0 to population − 1, got {member_rows} of {population}")


@functools.lru_cache(maxsize=256)
def member_view_curve(noise_multiplier: float, population: int, sample_size: int, member_rows: int) -> np.ndarray:
    """One round's RDP on :data:`~.subsampled.RDP_ORDERS`, for a row of another member, as seen by
    a member holding ``member_rows`` of the ``population`` pooled rows and knowing which of them were
    drawn (module doc); ``member_rows = 0``: an outside observer, dp_accounting's WOR curve. On the
    large orders, the unsampled Gaussian's (an upper bound on every view). Cached; read-only."""
    _check(population, sample_size, member_rows)
    others = population - member_rows
    dist = hypergeom(population, member_rows, sample_size)
    k = np.arange(max(0, sample_size - others), min(sample_size, member_rows) + 1)
    log_p = dist.logpmf(k)
    moments = wor_log_moments(noise_multiplier, (sample_size - k) / others)  # (orders, k)
    orders = np.asarray(DP_ACCOUNTING_ORDERS)
    rdp = logsumexp(moments + log_p[None, :], axis=1) / (orders - 1)
    curve = np.concatenate([np.maximum(rdp, 0.0), unsampled_large_orders(noise_multiplier)])
    curve.flags.writeable = False
    return curve


def pooled_rows_curve(noise_multiplier: float, population: int, sample_size: int,
                      member_rows: Sequence[int]) -> np.ndarray:
    """The largest, order by order, of the outside observer's curve and every member's view: one
    round's RDP that holds against each of them (every ε computed from it bounds each view's).
    No member rows: the observer's alone, dp_accounting's curve as events written before the
    views were accounted state it (:func:`~.subsampled.wor_gaussian_curve`)."""
    if not member_rows:
        return wor_gaussian_curve(noise_multiplier, population, sample_size)
    views = {0, *(int(n) for n in member_rows)}
    return np.max(np.stack([member_view_curve(noise_multiplier, population, sample_size, n)
                            for n in sorted(views)]), axis=0)
