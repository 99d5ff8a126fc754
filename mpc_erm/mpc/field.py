"""Arithmetic in the prime field F_p, p = 2^61 − 1, on numpy ``uint64`` vectors: the field of the
contributors' validity proofs (:mod:`.flp`, :mod:`.norm_proof`).

Why a prime field, when the sums run in Z_2^64: a proof that a polynomial identity holds at a
random point needs a field (in Z_2^64 half the elements are zero divisors, so a random point
catches a wrong polynomial with probability ½, not 1 − deg/p). Why this prime: it is a Mersenne
prime, so reduction is two shifts and an add (2^61 ≡ 1), and an element fits a machine word with
three bits to spare, so sums of a few elements need no reduction. A product of two elements is
split into 32-bit halves, each partial product exact in 64 bits (:func:`mul`).

Why compiled kernels: the products and sums here are elementwise work on shares of many data
owners, and numpy spells one field product as about fifteen passes over memory with temporaries
(≈ 50 ns an element); the same arithmetic as a numba ufunc is one pass (≈ 1.5 ns). :func:`mul` is
a true ufunc (broadcasting as numpy's), :func:`sum_along` and :func:`rowdot` are gufuncs.

Elements are canonical: every function returns values in [0, p). Integers (the contributions'
grid units) enter by their residue (:func:`from_signed`) and leave by their centred
representative in (−p/2, p/2) (:func:`to_signed`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numba
import numpy as np

__all__ = ["P", "BITS", "add", "dot", "extension_matrix", "from_signed", "from_words", "inv", "lagrange_at",
           "extend", "matvec", "mul", "mul_pow2", "neg", "rowdot", "small_matvec", "sub", "sum_along", "to_signed"]

BITS = 61
P = (1 << BITS) - 1
_P = np.uint64(P)
_S61 = np.uint64(BITS)
_S32 = np.uint64(32)
_S29 = np.uint64(29)
_LO32 = np.uint64((1 << 32) - 1)
_LO29 = np.uint64((1 << 29) - 1)
_EIGHT = np.uint64(8)

Vec = np.ndarray  # uint64, canonical in [0, p)


def _fold(s: np.ndarray) -> np.ndarray:
    """s < 2^64 → its residue in [0, p), in place."""
    s = (s & _P) + (s >> _S61)  # < 2^61 + 8
    s -= _P * (s >= _P)
    return s


def add(a: Vec, b: Vec) -> Vec:
    s = np.add(a, b, dtype=np.uint64)  # < 2^62
    s -= _P * (s >= _P)
    return s


def sub(a: Vec, b: Vec) -> Vec:
    return add(a, neg(b))


def neg(a: Vec) -> Vec:
    a = np.asarray(a, dtype=np.uint64)
    return np.where(a == 0, a, _P - a)


@numba.njit(inline="always")
def _mulmod(a: np.uint64, b: np.uint64) -> np.uint64:  # pragma: no cover (compiled)
    a0, a1 = a & _LO32, a >> _S32
    b0, b1 = b & _LO32, b >> _S32
    low = a0 * b0
    mid = a1 * b0 + a0 * b1
    s = (a1 * b1) * _EIGHT + (mid >> _S29) + ((mid & _LO29) << _S32) + (low & _P) + (low >> _S61)
    s = (s & _P) + (s >> _S61)  # < 2^61 + 8
    return s - _P if s >= _P else s


@numba.vectorize(["uint64(uint64, uint64)"], cache=True)
def _mul(a: np.uint64, b: np.uint64) -> np.uint64:  # pragma: no cover (compiled)
    return _mulmod(a, b)


def mul(a: Vec, b: Vec) -> Vec:
    """a·b mod p, elementwise (broadcasting). With a = a₁2^32 + a₀ (a₁ < 2^29): a₀b₀ < 2^64,
    a₁b₀ + a₀b₁ < 2^62 and a₁b₁ < 2^58 are exact, and 2^64 ≡ 8, 2^61 ≡ 1 reduce them."""
    return _mul(np.asarray(a, dtype=np.uint64), np.asarray(b, dtype=np.uint64))


@numba.guvectorize(["void(uint64[:], uint64[:])"], "(n)->()", cache=True)
def _sum_last(a: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover (compiled)
    acc = np.uint64(0)
    for j in range(a.shape[0]):
        acc += a[j]  # a canonical element is < 2^61: seven of them fit 64 bits beside a folded sum
        if j & 3 == 3:
            acc = (acc & _P) + (acc >> _S61)
    acc = (acc & _P) + (acc >> _S61)
    out[0] = acc - _P if acc >= _P else acc


@numba.guvectorize(["void(uint64[:], uint64[:], uint64[:])"], "(n),(n)->()", cache=True)
def _rowdot(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover (compiled)
    acc = np.uint64(0)
    for j in range(a.shape[0]):
        acc += _mulmod(a[j], b[j])
        if j & 3 == 3:
            acc = (acc & _P) + (acc >> _S61)
    acc = (acc & _P) + (acc >> _S61)
    out[0] = acc - _P if acc >= _P else acc


def sum_along(products: np.ndarray, axis: int) -> Vec:
    """Σ along ``axis`` of canonical elements, exact: a running sum folded mod p every four terms."""
    a = np.asarray(products, dtype=np.uint64)
    if a.shape[axis] == 0:
        return np.zeros(np.delete(a.shape, axis), dtype=np.uint64)
    return _sum_last(np.moveaxis(a, axis, -1))


def rowdot(a: Vec, b: Vec) -> Vec:
    """Σ a·b over the last axis, in F_p, broadcasting the leading axes (a (n, d) with b (d,) or
    (n, d)): one compiled pass, no (n, d) product in memory."""
    return _rowdot(np.asarray(a, dtype=np.uint64), np.asarray(b, dtype=np.uint64))


def dot(coeffs: Vec, values: Vec) -> np.uint64:
    """Σ coeffs·values in F_p (1-D)."""
    return rowdot(coeffs, values)[()]


def mul_pow2(a: Vec, k: int) -> Vec:
    """a·2^k mod p (k ≥ 0): a rotation of the 61 bits, since 2^61 ≡ 1."""
    if k < 0:
        raise ValueError(f"mul_pow2: k >= 0, got {k}")
    k %= 61
    a = np.asarray(a, dtype=np.uint64)
    if k == 0:
        return a
    s = ((a << np.uint64(k)) & _P) + (a >> np.uint64(61 - k))
    s -= _P * (s >= _P)
    return s


_LIMB = 21
_LIMB_MASK = np.uint64((1 << _LIMB) - 1)
_EXACT_TERMS = 1 << (53 - 2 * _LIMB)  # 21-bit × 21-bit products: this many sum exactly in a float64


def _limbs(a: np.ndarray) -> list[np.ndarray]:
    """Three 21-bit limbs of canonical elements, as float64 (exact)."""
    return [((a >> np.uint64(_LIMB * i)) & _LIMB_MASK).astype(np.float64) for i in range(3)]


def matvec(matrix: Vec, values: Vec) -> Vec:
    """matrix (m × n) @ values (n,) or (n × k), in F_p. Both sides split into 21-bit limbs, so every
    limb product is below 2^42 and up to 2^11 of them sum exactly in float64: nine BLAS products
    per block of 2^11 terms, recombined mod p (a product mod p element by element costs ≈ 60 ns)."""
    vals = values if values.ndim == 2 else values[:, None]
    m, n = matrix.shape
    out = np.zeros((m, vals.shape[1]), dtype=np.uint64)
    for lo in range(0, n, _EXACT_TERMS):
        ml = _limbs(matrix[:, lo:lo + _EXACT_TERMS])
        vl = _limbs(vals[lo:lo + _EXACT_TERMS])
        for shift in range(5):
            # each limb product is an exact integer < 2^53; up to three of them, summed in uint64
            part = sum((ml[s] @ vl[shift - s]).astype(np.uint64) for s in range(max(0, shift - 2), min(2, shift) + 1))
            out = add(out, mul_pow2(_fold(part), _LIMB * shift))
    return out if values.ndim == 2 else out[:, 0]


def small_matvec(coeffs: np.ndarray, values: Vec, coeff_max: int | None = None) -> Vec:
    """coeffs (m × n, small signed integers, as float64 or float32) @ values (n,), in F_p: values
    split into limbs as wide as the coefficients' float type sums exactly (n·max|coeff|·2^limb
    below 2^53, or 2^24 in float32), the limbs side by side as one (n × limbs) matrix — the
    coefficients, often the larger operand, are read once, and float32 ones half as many bytes."""
    c = coeffs if coeffs.dtype in (np.float32, np.float64) else np.asarray(coeffs, dtype=np.float64)
    top = float(np.abs(c).max(initial=0.0)) if coeff_max is None else float(coeff_max)
    mantissa = 24 if c.dtype == np.float32 else 53
    width = mantissa - math.ceil(math.log2(c.shape[1] * max(1.0, top) + 1))
    if width < 1:
        raise ValueError("small_matvec: coefficients too large for an exact float sum")
    width = min(width, BITS)
    count = -(-BITS // width)
    v = np.asarray(values, dtype=np.uint64)
    mask = np.uint64((1 << width) - 1)
    limbs = np.stack([((v >> np.uint64(width * i)) & mask) for i in range(count)], axis=1).astype(c.dtype)
    sums = (c @ limbs).astype(np.int64)
    out = from_signed(sums[:, 0])
    for t in range(1, count):
        out = add(out, mul_pow2(from_signed(sums[:, t]), width * t))
    return out


def from_signed(x: np.ndarray | Sequence[int]) -> Vec:
    """Signed integers (|x| < 2^63) → their residues."""
    x = np.asarray(x, dtype=np.int64)
    out = np.abs(x).astype(np.uint64) % _P
    return np.where(x < 0, neg(out), out)


def to_signed(a: Vec) -> np.ndarray:
    """Residues → centred representatives in (−p/2, p/2), int64."""
    a = np.asarray(a, dtype=np.uint64)
    big = a > _P // np.uint64(2)
    return np.where(big, -(_P - a).astype(np.int64), a.astype(np.int64))


def from_words(words: np.ndarray) -> Vec:
    """Uniform 64-bit words → field elements: the low 61 bits, reduced (p itself maps to 0), so each
    element is within 2^-60 of uniform in statistical distance."""
    w = np.asarray(words).view(np.uint64) & _P
    w[w == _P] = 0
    return w


def inv(a: int) -> int:
    if a % P == 0:
        raise ZeroDivisionError("0 has no inverse in F_p")
    return pow(a % P, P - 2, P)


@functools.lru_cache(maxsize=64)
def _weights(n: int) -> tuple[int, ...]:
    """Barycentric weights of the nodes 0, 1, …, n−1: w_k = 1 / Π_{j≠k} (k − j)
    = (−1)^(n−1−k) / (k!·(n−1−k)!), from the inverse factorials (one exponentiation)."""
    fact = [1] * n
    for i in range(1, n):
        fact[i] = fact[i - 1] * i % P
    inv_fact = [1] * n
    inv_fact[n - 1] = inv(fact[n - 1])
    for i in range(n - 1, 0, -1):
        inv_fact[i - 1] = inv_fact[i] * i % P
    return tuple((P - 1 if (n - 1 - k) % 2 else 1) * inv_fact[k] % P * inv_fact[n - 1 - k] % P for k in range(n))


@functools.lru_cache(maxsize=256)
def lagrange_at(n: int, r: int) -> Vec:
    """λ_k(r), k < n: the value at r of the degree < n polynomial through (k, v_k) is Σ λ_k(r)·v_k.
    For r among the nodes this is the unit vector."""
    r %= P
    if r < n:
        unit = np.zeros(n, dtype=np.uint64)
        unit[r] = 1
        unit.flags.writeable = False
        return unit
    w = _weights(n)
    diffs = [(r - k) % P for k in range(n)]
    whole = 1
    for d in diffs:
        whole = whole * d % P
    # batch inversion of the differences: one modular exponentiation
    prefix = [1] * (n + 1)
    for k, d in enumerate(diffs):
        prefix[k + 1] = prefix[k] * d % P
    back = inv(prefix[n])
    invs = [0] * n
    for k in range(n - 1, -1, -1):
        invs[k] = back * prefix[k] % P
        back = back * diffs[k] % P
    out = np.array([whole * w[k] % P * invs[k] % P for k in range(n)], dtype=np.uint64)
    out.flags.writeable = False  # cached: shared by every caller with the same (n, r)
    return out


def _inverses(m: int) -> list[int]:
    """1/i mod p for i = 0..m (0 ↦ 0): inv[i] = −⌊p/i⌋·inv[p mod i]."""
    out = [0, 1] + [0] * max(0, m - 1)
    for i in range(2, m + 1):
        out[i] = (P - (P // i) * out[P % i] % P) % P
    return out[: m + 1]


@numba.njit(cache=True)
def _extend(values: np.ndarray, m: int) -> np.ndarray:  # pragma: no cover (compiled)
    n, cols = values.shape
    d = values.copy()
    for k in range(1, n):  # after stage k, d[i] = Δ^k f(i) for i ≤ n − 1 − k
        for i in range(n - k):
            for c in range(cols):
                a, b = d[i + 1, c], d[i, c]
                d[i, c] = a - b if a >= b else a + _P - b
    e = np.empty((n, cols), dtype=np.uint64)  # e[k] = ∇^k f at the last node known
    for k in range(n):
        e[k] = d[n - 1 - k]
    out = np.empty((m, cols), dtype=np.uint64)
    for s in range(m):  # one node on: ∇^k f(x + 1) = ∇^k f(x) + ∇^(k+1) f(x + 1); ∇^(n−1) f is constant
        for k in range(n - 2, -1, -1):
            for c in range(cols):
                v = e[k, c] + e[k + 1, c]
                e[k, c] = v - _P if v >= _P else v
        out[s] = e[0]
    return out


def extend(values: Vec, m: int) -> Vec:
    """(n, cols) values at the nodes 0, …, n−1 of polynomials of degree < n (one per column) →
    their (m, cols) values at n, …, n+m−1: what ``extension_matrix(n, n + m) @ values`` gives, by
    Newton's differences in additions only (n²/2 + m·n per column, no products: 4–6× faster than
    the float-limb product at a proof's sizes)."""
    v = np.ascontiguousarray(values, dtype=np.uint64)
    if v.ndim != 2 or v.shape[0] < 1:
        raise ValueError(f"extend: values at one node or more expected, got shape {v.shape}")
    return _extend(v, int(m))


@functools.lru_cache(maxsize=16)
def extension_matrix(n: int, m: int) -> Vec:
    """(m − n) × n: the values at the nodes n, …, m−1 of the degree < n polynomial through its values
    at 0, …, n−1 (a prover extends its wire polynomials to the product's degree with it).
    E[t, k] = w_k·ℓ(t)/(t − k), ℓ(t) = Π_j (t − j) = t!/(t − n)!, all in F_p."""
    if m <= n:
        return np.zeros((0, n), dtype=np.uint64)
    inv = _inverses(m)
    fact = [1] * (m + 1)
    for i in range(1, m + 1):
        fact[i] = fact[i - 1] * i % P
    ell = np.array([fact[t] * pow(fact[t - n], P - 2, P) % P for t in range(n, m)], dtype=np.uint64)
    w = np.array(_weights(n), dtype=np.uint64)
    t = np.arange(n, m)[:, None]
    k = np.arange(n)[None, :]
    inv_arr = np.array(inv, dtype=np.uint64)
    return mul(mul(ell[:, None], w[None, :]), inv_arr[t - k])
