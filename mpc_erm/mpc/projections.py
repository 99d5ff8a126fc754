"""Public random projections that bound every coordinate of a vector whose shares nobody can read:
shared by the compute parties' check (:mod:`.validation`) and the contributors' proofs
(:mod:`.norm_proof`).

A row r ∈ {−1, 0, +1}^p (P = ¼, ½, ¼) drawn after the vector is fixed passes |⟨r, x⟩| ≤ τ with
probability ≤ ½ when some |x_i| > 2τ, in Z_2^64 and in F_p alike (the cyclic distance obeys the
triangle inequality): λ rows bound ‖x‖_∞ ≤ 2τ except with probability 2^-λ. An honest x with
‖x‖₂ ≤ M passes each row with τ = min(⌊√(nnz·M²)⌋, ⌈T·M⌉), T = √(2 ln 2^81) (Cauchy–Schwarz;
Hoeffding: 2^-80 per row). The full argument is in :mod:`.validation`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .keystream import KeyedMasks

__all__ = ["HOEFFDING_T", "projection_rows", "projection_signs", "projection_threshold"]

#: T of the probabilistic projection threshold: an honest projection exceeds T·M with probability ≤ 2^-80.
HOEFFDING_T = math.sqrt(2.0 * 81.0 * math.log(2.0))


def projection_threshold(m: int, nnz: int) -> int:
    """τ for a row with ``nnz`` non-zero coefficients and an ℓ2 bound of ``m`` units."""
    return min(math.isqrt(nnz * m * m), math.ceil(HOEFFDING_T * m))


def projection_signs(key: bytes, dim: int, rows: int) -> np.ndarray:
    """The public projection matrix (dim × rows, int8 in {−1, 0, +1}, P = ¼, ½, ¼) for ``key``:
    two bits of AES-256-CTR keystream per coefficient (bits 2t, 2t+1 of each little-endian
    64-bit word), 00 → −1, 11 → +1, else 0."""
    words = KeyedMasks().words(key, 0, -(-dim * rows // 32))
    bits = np.unpackbits(words.numpy().view(np.uint8), bitorder="little")[: 2 * dim * rows]
    pairs = bits[0::2] + bits[1::2]  # 0 (00), 1 (01 or 10), 2 (11)
    return (pairs.astype(np.int8) - 1).reshape(dim, rows)


def projection_rows(key: bytes, dim: int, rows: int) -> torch.Tensor:
    """:func:`projection_signs` as an int64 tensor (the compute parties' check)."""
    return torch.from_numpy(projection_signs(key, dim, rows).astype(np.int64))
