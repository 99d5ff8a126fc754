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


def _coefficients_by_byte() -> np.ndarray:
    """(256,) int32: the four int8 coefficients each keystream byte encodes (bit pairs 0–1, 2–3,
    4–5, 6–7, in memory order), packed in one word, so one gather decodes a byte."""
    b = np.arange(256)
    four = np.stack([((b >> (2 * t)) & 1) + ((b >> (2 * t + 1)) & 1) - 1 for t in range(4)], axis=1)
    return np.ascontiguousarray(four.astype(np.int8)).view(np.int32).ravel()


_BY_BYTE = _coefficients_by_byte()


def projection_signs(key: bytes, dim: int, rows: int, dtype: type = np.int8) -> np.ndarray:
    """The public projection matrix (dim × rows, in {−1, 0, +1}, P = ¼, ½, ¼) for ``key``, as
    ``dtype`` (int8, or float64 for the products): two bits of AES-256-CTR keystream per
    coefficient (bits 2t, 2t+1 of each little-endian 64-bit word), 00 → −1, 11 → +1, else 0.
    Each keystream byte is decoded whole (four coefficients) by one table lookup."""
    words = KeyedMasks().words(key, 0, -(-dim * rows // 32))
    signs = _BY_BYTE[words.numpy().view(np.uint8)].view(np.int8)[: dim * rows].reshape(dim, rows)
    return signs if np.dtype(dtype) == np.int8 else signs.astype(dtype)


def projection_rows(key: bytes, dim: int, rows: int) -> torch.Tensor:
    """:func:`projection_signs` as an int64 tensor (the compute parties' check)."""
    return torch.from_numpy(projection_signs(key, dim, rows).astype(np.int64))
