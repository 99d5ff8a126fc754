"""Plaintext reference of the MPC discrete Laplace sampler: the same coins, thresholds and
truncation, drawn with numpy, so statistical tests can run at ≥ 10^6 samples in a second.

The MPC sampler (:mod:`.discrete_laplace`) and this one share :class:`.params.DiscreteLaplaceParams`;
a test checks that MPC samples and reference samples come from the same distribution.
"""

from __future__ import annotations

import numpy as np

from .params import MAX_COIN_BITS, MPC_MAX_COIN_BITS, DiscreteLaplaceParams

__all__ = ["coins_below", "reference_samples"]


def coins_below(rng: np.random.Generator, k: int, c: int, size: int | tuple[int, ...]) -> np.ndarray:
    """[U < c] for U uniform on [0, 2^k), exactly: one int64 draw for k ≤ 62 (the draws the MPC's
    plaintext reference always made), else U = H·2^(k−62) + L with H a 62-bit and L a (k − 62)-bit
    uniform, compared with c = C_H·2^(k−62) + C_L lexicographically: H < C_H, or H = C_H and
    L < C_L. L is independent of H and matters only on a tie (probability 2^-62), so it is drawn
    for the tied coins alone: the same law at the cost of one word a coin."""
    if k <= MPC_MAX_COIN_BITS:
        return rng.integers(0, 1 << k, size=size, dtype=np.int64) < c
    if k > MAX_COIN_BITS or not 0 <= c <= 1 << k:
        raise ValueError(f"coins_below: k must be at most {MAX_COIN_BITS} and 0 ≤ c ≤ 2^k, got k = {k}, c = {c}")
    low = k - MPC_MAX_COIN_BITS
    c_hi, c_lo = c >> low, c & ((1 << low) - 1)
    if c_hi >= 1 << MPC_MAX_COIN_BITS:  # c = 2^k: every coin is 1
        return np.ones(size, dtype=bool)
    hi = rng.integers(0, 1 << MPC_MAX_COIN_BITS, size=size, dtype=np.int64)
    out = hi < c_hi
    tie = hi == c_hi
    ties = int(tie.sum())
    if ties:
        out[tie] = rng.integers(0, 1 << low, size=ties, dtype=np.int64) < c_lo
    return out


def reference_samples(params: DiscreteLaplaceParams, n: int, rng: np.random.Generator, fair_bits: int = 0,
                      nonzero_threshold: int | None = None) -> np.ndarray:
    """n draws of D = S·Z·(1+G) in grid units (int64), each coin ``U < c`` with U uniform on
    [0, 2^k) — exactly the comparisons the MPC performs. ``fair_bits`` F > 0: G's F low bits are
    exactly fair and ``params``' bits sit above them, with Z's threshold ``nonzero_threshold``
    (the discrete Gaussian's staircase candidates, :mod:`.gaussian`)."""
    k = params.k
    mag = rng.integers(0, 1 << fair_bits, size=n, dtype=np.int64) if fair_bits else np.zeros(n, dtype=np.int64)
    for j, c in enumerate(params.bit_thresholds):
        mag |= coins_below(rng, k, c, n).astype(np.int64) << (j + fair_bits)
    c_z = params.nonzero_threshold if nonzero_threshold is None else nonzero_threshold
    z = coins_below(rng, k, c_z, n)
    sign = rng.integers(0, 2, size=n, dtype=np.int64)
    return np.where(z, (1 + mag) * (1 - 2 * sign), 0).astype(np.int64)
