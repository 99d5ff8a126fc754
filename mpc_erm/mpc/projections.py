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

import numba
import numpy as np
import torch

from .keystream import KeyedMasks

__all__ = ["HOEFFDING_T", "project", "project_transposed", "projection_rows", "projection_signs",
           "projection_threshold"]

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
    signs = _BY_BYTE[_stream(key, dim, rows)].view(np.int8)[: dim * rows].reshape(dim, rows)
    return signs if np.dtype(dtype) == np.int8 else signs.astype(dtype)


def projection_rows(key: bytes, dim: int, rows: int) -> torch.Tensor:
    """:func:`projection_signs` as an int64 tensor (the compute parties' check)."""
    return torch.from_numpy(projection_signs(key, dim, rows).astype(np.int64))


def _stream(key: bytes, dim: int, rows: int) -> np.ndarray:
    """The keystream bytes that encode the (dim × rows) signs, four coefficients a byte."""
    return KeyedMasks().words(key, 0, -(-dim * rows // 32)).numpy().view(np.uint8)


_P = np.uint64((1 << 61) - 1)
_S61 = np.uint64(61)
_COEFFS = np.ascontiguousarray(_BY_BYTE.view(np.int8).reshape(256, 4))  # a byte's four coefficients


@numba.njit(cache=True)
def _transposed(stream: np.ndarray, dim: int, rows: int, v: np.ndarray, coeffs: np.ndarray
                ) -> np.ndarray:  # pragma: no cover (compiled)
    out = np.empty(dim, dtype=np.uint64)
    neg = np.empty(rows, dtype=np.uint64)
    for j in range(rows):
        neg[j] = _P - v[j] if v[j] != 0 else np.uint64(0)
    if rows % 4 == 0:  # each coordinate's coefficients start on a byte: one table entry per byte
        groups = rows // 4
        table = np.zeros((groups, 256), dtype=np.uint64)
        for g in range(groups):
            for b in range(256):
                acc = np.uint64(0)
                for t in range(4):
                    c = coeffs[b, t]
                    if c > 0:
                        acc += v[4 * g + t]
                    elif c < 0:
                        acc += neg[4 * g + t]
                acc = (acc & _P) + (acc >> _S61)
                table[g, b] = acc - _P if acc >= _P else acc
        for i in range(dim):
            acc = np.uint64(0)
            base = i * groups
            for g in range(groups):
                acc += table[g, stream[base + g]]
                if g & 3 == 3:
                    acc = (acc & _P) + (acc >> _S61)
            acc = (acc & _P) + (acc >> _S61)
            out[i] = acc - _P if acc >= _P else acc
        return out
    for i in range(dim):
        acc = np.uint64(0)
        for j in range(rows):
            k = i * rows + j
            c = coeffs[stream[k >> 2], k & 3]
            if c > 0:
                acc += v[j]
            elif c < 0:
                acc += neg[j]
            if j & 3 == 3:
                acc = (acc & _P) + (acc >> _S61)
        acc = (acc & _P) + (acc >> _S61)
        out[i] = acc - _P if acc >= _P else acc
    return out


@numba.njit(cache=True)
def _project(stream: np.ndarray, dim: int, rows: int, x: np.ndarray, coeffs: np.ndarray
             ) -> np.ndarray:  # pragma: no cover (compiled)
    out = np.zeros(rows, dtype=np.int64)
    if rows % 4 == 0:  # each coordinate's coefficients start on a byte: four signed terms a byte
        groups = rows // 4
        for i in range(dim):
            xi = x[i]
            if xi == 0:
                continue
            base = i * groups
            for g in range(groups):
                b = stream[base + g]
                for t in range(4):
                    out[4 * g + t] += coeffs[b, t] * xi
        return out
    for i in range(dim):
        xi = x[i]
        if xi == 0:
            continue
        for j in range(rows):
            k = i * rows + j
            out[j] += coeffs[stream[k >> 2], k & 3] * xi
    return out


def project_transposed(key: bytes, dim: int, rows: int, v: np.ndarray) -> np.ndarray:
    """Rᵀ·v in F_p (p = 2^61 − 1) for the signs R (dim × rows) of ``key`` and field elements v
    (rows,): what a verifier folds its check weights through, read from the keystream bytes (a
    table of each byte's four signed terms, one lookup per byte), never materialising R."""
    v = np.ascontiguousarray(v, dtype=np.uint64)
    if v.shape != (rows,):
        raise ValueError(f"project_transposed: {rows} field elements expected, got shape {v.shape}")
    return _transposed(_stream(key, dim, rows), dim, rows, v, _COEFFS)


def project(key: bytes, dim: int, rows: int, x: np.ndarray) -> np.ndarray:
    """R·x over the integers for the signs of ``key`` and int64 x (dim,) with dim·max|x| < 2^63:
    a prover's projections, read from the keystream bytes."""
    x = np.ascontiguousarray(x, dtype=np.int64)
    if x.shape != (dim,):
        raise ValueError(f"project: {dim} integers expected, got shape {x.shape}")
    return _project(_stream(key, dim, rows), dim, rows, x, _COEFFS)
