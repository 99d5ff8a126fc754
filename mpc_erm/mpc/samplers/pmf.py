"""The exact PMF of the implemented discrete Laplace sampler (log space, float64).

Why exact: DP holds for the distribution actually sampled (docs/explanation/privacy.md §5). The sampler's output
D = S·Z·(1+G) is a deterministic function of independent coins whose probabilities are the
rationals c/2^k of :class:`.params.DiscreteLaplaceParams`, so its PMF is a product of those
rationals — no approximation besides float64 rounding of the logs (relative 1e-16, far below
the accountant's discretisation of 1e-4 in the privacy loss).
"""

from __future__ import annotations

import math

import numpy as np

from .params import DiscreteLaplaceParams

__all__ = [
    "geometric_log_pmf",
    "log_coin",
    "ideal_discrete_laplace_log_pmf",
    "log_pmf",
    "signed_log_pmf",
    "support",
]

_LN2 = math.log(2.0)


def log_coin(c: int, k: int) -> tuple[float, float]:
    """(log P(coin = 0), log P(coin = 1)) for P(coin = 1) = c/2^k, from the integers."""
    lo = math.log((1 << k) - c) - k * _LN2 if c < (1 << k) else -math.inf
    hi = math.log(c) - k * _LN2 if c > 0 else -math.inf
    return lo, hi


def geometric_log_pmf(params: DiscreteLaplaceParams) -> np.ndarray:
    """log P(G = g), g = 0 … 2^B − 1, for G = Σ_j bit_j 2^j with independent implemented bits.

    Built by doubling: after bits 0…j−1 the array is indexed by the low bits; bit j appends the
    same array shifted by 2^j with its own log-probability.
    """
    out = np.zeros(1)
    for c in params.bit_thresholds:
        l0, l1 = log_coin(c, params.k)
        out = np.concatenate([out + l0, out + l1])
    return out


def support(params: DiscreteLaplaceParams) -> np.ndarray:
    """The integers −2^B … 2^B (grid units) on which :func:`log_pmf` is defined."""
    m = params.support_max
    return np.arange(-m, m + 1, dtype=np.int64)


def log_pmf(params: DiscreteLaplaceParams) -> np.ndarray:
    """log P(D = x) for x in :func:`support` (−inf where the sampler never lands)."""
    return signed_log_pmf(geometric_log_pmf(params), params.nonzero_threshold, params.k)


def signed_log_pmf(lg: np.ndarray, nonzero_threshold: int, k: int) -> np.ndarray:
    """log P(D = x), x = −len(lg) … len(lg), of D = S·Z·(1 + G) from log P(G = g) and Z's threshold."""
    l_zero, l_nonzero = log_coin(nonzero_threshold, k)
    half = l_nonzero - _LN2 + lg  # P(D = ±(1+g)) = P(Z=1)/2 · P(G=g): the sign is an exact fair bit
    return np.concatenate([half[::-1], [l_zero], half])


def ideal_discrete_laplace_log_pmf(t: float, xs: np.ndarray) -> np.ndarray:
    """log of the ideal discrete Laplace P(x) = (1−q)/(1+q)·q^{|x|}, q = e^{−1/t} (CKS 2020)."""
    log_norm = math.log(-math.expm1(-1.0 / t)) - math.log1p(math.exp(-1.0 / t))
    return log_norm - np.abs(xs).astype(np.float64) / t
