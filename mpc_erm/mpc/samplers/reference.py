"""Plaintext reference of the MPC discrete Laplace sampler: the same coins, thresholds and
truncation, drawn with numpy, so statistical tests can run at ≥ 10^6 samples in a second.

The MPC sampler (:mod:`.discrete_laplace`) and this one share :class:`.params.DiscreteLaplaceParams`;
a test checks that MPC samples and reference samples come from the same distribution.
"""

from __future__ import annotations

import numpy as np

from .params import DiscreteLaplaceParams

__all__ = ["reference_samples"]


def reference_samples(params: DiscreteLaplaceParams, n: int, rng: np.random.Generator, fair_bits: int = 0,
                      nonzero_threshold: int | None = None) -> np.ndarray:
    """n draws of D = S·Z·(1+G) in grid units (int64), each coin ``U < c`` with U uniform on
    [0, 2^k) — exactly the comparisons the MPC performs. ``fair_bits`` F > 0: G's F low bits are
    exactly fair and ``params``' bits sit above them, with Z's threshold ``nonzero_threshold``
    (the discrete Gaussian's staircase candidates, :mod:`.gaussian`)."""
    top = 1 << params.k
    mag = rng.integers(0, 1 << fair_bits, size=n, dtype=np.int64) if fair_bits else np.zeros(n, dtype=np.int64)
    for j, c in enumerate(params.bit_thresholds):
        mag |= (rng.integers(0, top, size=n, dtype=np.int64) < c).astype(np.int64) << (j + fair_bits)
    c_z = params.nonzero_threshold if nonzero_threshold is None else nonzero_threshold
    z = rng.integers(0, top, size=n, dtype=np.int64) < c_z
    sign = rng.integers(0, 2, size=n, dtype=np.int64)
    return np.where(z, (1 + mag) * (1 - 2 * sign), 0).astype(np.int64)
