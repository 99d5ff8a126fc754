"""Public parameters of the bit-decomposed discrete Laplace sampler and its exact bit probabilities.

Why bits: a geometric variable G with P(G = g) ∝ q^g has independent binary digits,
P(bit_j = 1) = q^{2^j}/(1 + q^{2^j}) (a standard fact; used for MPC by Champion–shelat–Ullman,
CCS'19, and Keller et al., ePrint 2023/1594). Inside the MPC each biased bit is one secure
comparison ``U < c_j`` of a jointly random k-bit uniform U with the public integer
c_j = ⌊p_j·2^k⌋, so the *implemented* probability is exactly c_j/2^k. Keeping the integers c_j
(not the floats p_j) as the definition of the sampler is what lets :mod:`.pmf` compute the PMF
actually sampled, and :mod:`.accounting` account for it with no hand-waved "sampler δ".

Sign × magnitude (chosen over the difference of two geometrics because its PMF is a *product*,
computable exactly in log space without a 2^B × 2^B convolution):

    D = S · Z · (1 + G),   S a fair sign bit, Z ~ Bernoulli(c_Z/2^k), G = Σ_{j<B} bit_j 2^j,

with c_Z = ⌊2q/(1+q)·2^k⌋. For exact probabilities this is the discrete Laplace
P(D = x) = (1−q)/(1+q)·q^{|x|} (CKS 2020, Def. 4.1 with t = −1/ln q): P(D = 0) = (1−q)/(1+q) and,
given D ≠ 0, |D| − 1 is geometric(q) and the sign is fair. Truncation to B bits (G < 2^B) and the
rounding of each probability to k bits are *part of the sampled distribution*, not an error term.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DiscreteLaplaceParams", "default_bits", "full_support_bits", "FRAC_BITS", "MAX_GRID_BITS", "MAX_COIN_BITS",
           "MPC_MAX_COIN_BITS", "coin_threshold"]

FRAC_BITS = 16  # CrypTen's default FixedPointEncoder: ring integer = value · 2^16
#: Bits of a coin's uniform the circuits inside the MPC compare (one int64 bit plane each, and the
#: plaintext reference draws one int64); distributed noise, sampled in the clear by one party,
#: may use up to MAX_COIN_BITS (two keystream words a coin: :func:`.reference.coins_below`).
MPC_MAX_COIN_BITS = 62
MAX_COIN_BITS = 124
MAX_GRID_BITS = 40  # finer grids leave too little of the int64 ring for the values (mpc_erm.mpc.noise)


def default_bits(t: float, tail_log2: float = 64.0) -> int:
    """Smallest B with P(G ≥ 2^B) = q^{2^B} ≤ 2^-tail_log2 for the ideal geometric: the ideal
    mass beyond the truncation is then negligible; the exact PMF accounts for it anyway."""
    need = tail_log2 * math.log(2.0) * t  # 2^B / t ≥ tail·ln 2
    return max(1, math.ceil(math.log2(need)))


def full_support_bits(t: float, k: int) -> int:
    """Number of low bits j whose threshold ⌊p_j·2^k⌋ is ≥ 1 (p_j decreases in j). Bits above
    would be constant 0: choosing B ≤ this keeps the support hole-free."""
    j = 0
    while j < 60 and coin_threshold(lambda mp, j=j: mp.one / (1 + mp.exp(mp.mpf(2) ** j / mp.mpf(t))), k) >= 1:
        j += 1
    return j


@dataclass(frozen=True)
class DiscreteLaplaceParams:
    """Scale ``t`` in grid units (noise = D · 2^-grid_bits), ``bits`` = B magnitude bits, ``k`` =
    bits of each uniform compared with a threshold. ``thresholds`` are c_0..c_{B-1}, c_Z."""

    t: float
    bits: int
    k: int = 48
    grid_bits: int = FRAC_BITS
    thresholds: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not (self.t > 0 and math.isfinite(self.t)):
            raise ValueError("t must be a positive finite number of grid units")
        if not 1 <= self.bits <= 60:
            raise ValueError("bits must be in 1..60 (magnitude 1 + G must fit the 64-bit ring)")
        if not 2 <= self.k <= MAX_COIN_BITS:
            raise ValueError(f"k must be in 2..{MAX_COIN_BITS}")
        if not 0 <= self.grid_bits <= MAX_GRID_BITS:
            raise ValueError(f"grid_bits must be in 0..{MAX_GRID_BITS}")
        scale = 1 << self.k
        cs = []
        for j in range(self.bits):
            # p_j = q^{2^j}/(1+q^{2^j}) = 1/(1 + e^{2^j/t})
            cs.append(coin_threshold(lambda mp, j=j: mp.one / (1 + mp.exp(mp.mpf(2) ** j / mp.mpf(self.t))), self.k))
        # P(Z = 1) = 2q/(1+q) = 2/(1 + e^{1/t})
        cs.append(coin_threshold(lambda mp: 2 / (1 + mp.exp(mp.one / mp.mpf(self.t))), self.k))
        object.__setattr__(self, "thresholds", tuple(min(c, scale - 1) for c in cs))

    @classmethod
    def for_scale(
        cls, scale: float, grid_bits: int = FRAC_BITS, k: int = 48, bits: int | None = None
    ) -> DiscreteLaplaceParams:
        """Parameters for a Laplace scale ``scale`` in real units on the grid 2^-grid_bits."""
        t = scale * 2.0**grid_bits
        if bits is None:  # as many bits as the tail needs and k can represent
            bits = min(default_bits(t), full_support_bits(t, k))
        return cls(t=t, bits=bits, k=k, grid_bits=grid_bits)

    @property
    def q(self) -> float:
        return math.exp(-1.0 / self.t)

    @property
    def bit_thresholds(self) -> tuple[int, ...]:
        """c_0..c_{B-1}: thresholds of the magnitude bits."""
        return self.thresholds[: self.bits]

    @property
    def nonzero_threshold(self) -> int:
        """c_Z: threshold of the 'D ≠ 0' coin."""
        return self.thresholds[self.bits]

    @property
    def full_support(self) -> bool:
        """Every coin can take both values (0 < c < 2^k): the support is then all of
        [−2^B, 2^B]; otherwise the sampler has holes and the accountant sees δ > 0 at any ε."""
        return all(0 < c < (1 << self.k) for c in self.thresholds)

    @property
    def grid_step(self) -> float:
        return 2.0**-self.grid_bits

    @property
    def support_max(self) -> int:
        """Largest |D| in grid units: 2^B."""
        return 1 << self.bits


def coin_threshold(prob: Callable[[Any], Any], k: int) -> int:
    """c = ⌊p·2^k⌋ computed exactly: ``prob(mp)`` evaluates p with mpmath at 2k + 64 bits, so
    the implemented coin probability c/2^k is within 2^-k of p (below, never above), with no
    float64 error on top (coin_error in :mod:`.guarantee` relies on it)."""
    import mpmath

    ctx = mpmath.mp.clone()
    ctx.prec = 2 * k + 64
    return int(ctx.floor(prob(ctx) * ctx.mpf(2) ** k))
