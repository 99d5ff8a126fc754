"""Discrete Gaussian by rejection from the discrete Laplace (Canonne–Kamath–Steinke 2020,
Algorithm 3), with an acceptance coin that is *exact* inside the MPC, and its exact PMF.

CKS: draw Y ~ discrete Laplace(t); accept with probability exp(−(|Y| − σ²/t)²/(2σ²)); the
accepted Y is N_Z(0, σ²) for *any* t > 0 (t = ⌊σ⌋ + 1 makes acceptance likely). We pick
integers t and μ with σ² = t·μ (t = ⌊σ⌋ + 1, μ = round(σ²/t): the sampled σ is √(tμ), within
1/(2σ) relative of the request), so the acceptance exponent is a ratio of integers:

    γ(m) = N(m)/D,   N(m) = (m − μ)²  (secret integer, one secure square),  D = 2tμ (public).

Why this is exact in MPC although γ depends on the secret Y: with n_i the bits of N,
exp(−N/D) = Π_i exp(−2^i/D)^{n_i}, so the coin is

    accept = ⋀_i (¬n_i ∨ C_i),   C_i ~ Bernoulli(a_i),  a_i = ⌊exp(−2^i/D)·2^k⌋ / 2^k,

with C_i one comparison of a jointly random k-bit uniform with the *public* constant
⌊exp(−2^i/D)·2^k⌋ — the same bit-sliced comparison as the Laplace coins — and the bits of N
from CrypTen's A2B. No secure exp, no fixed-point approximation: the implemented acceptance
probability is acc(m) = Π_{i: n_i(m)=1} a_i, an exactly known function of m.

Two ways to turn candidates into outputs. With ρ = Σ_y L(y)·acc(|y|) the acceptance rate of
the implemented sampler and L its discrete Laplace PMF:

* **Revealed rejection** (``revealed=True``; what :meth:`DiscreteGaussianParams.for_sigma`
  gives, and what jobs use): candidates are drawn in batches, every candidate's acceptance bit
  is opened, and the accepted candidates, in order, are the outputs (their values stay secret).
  Opening the bits is safe: for i.i.d. candidates Y_j and bits A_j ~ Bernoulli(acc(Y_j)),
  P(A = α, (Y_j)_{α_j=1} = y) = Π_{j: α_j=1} ρ·P_out(y_j) · Π_{j: α_j=0} (1 − ρ), so the
  accepted values are i.i.d. with P_out(y) = L(y)·acc(|y|)/ρ *and independent of the opened
  pattern*, which is a function of the noise's randomness alone (no data). No fallback, and
  ≈ 1/ρ candidates per output (ρ ≈ 0.8 at the product's σ) instead of R.
* **Oblivious rounds** (``revealed=False``, R = ``rounds``): R candidates per output; the output
  is the first accepted among the first R − 1, else candidate R unconditionally, selected
  without revealing which, so

      P_out(y) = L(y)·[ (1 − (1 − ρ)^{R−1})/ρ · acc(|y|) + (1 − ρ)^{R−1} ]

  (the second term is the Laplace fallback; R ≈ 26 for a fallback ≤ 2^-50).

:meth:`DiscreteGaussianParams.log_pmf` is the exact PMF of either, the k-bit coins included.

**Fair low bits** (``fair_bits`` = F > 0; what :meth:`DiscreteGaussianParams.for_sigma` gives
with revealed rejection). The candidate's F lowest magnitude bits are exactly fair coins (free
jointly random bits: no comparison) instead of the geometric's biased ones, so the proposal is a
staircase: with |Y| = Z·(1 + R + 2^F·G'), R uniform on [0, 2^F), G' geometric of ratio
Q = q^{2^F} (the geometric's bits ≥ F), P(Y = y) ∝ q^{M(y)}, M(y) = Z·(1 + 2^F·G') (|y| with its
F low bits of |y| − 1 cleared). The exponent follows it: with σ² = tμ,

    N(y) = y² − 2μ·M(y) + μ² = (|y| − μ)² + 2μ·Z·R ≥ 0,

and L(y)·exp(−N/D) ∝ exp(−y²/(2σ²)) again, exactly, for the "non-zero" coin
P(Z = 1) = 2^{F+1}q/(2^{F+1}q + 1 − Q) (which makes P(0) continue the staircase: F = 0 gives
CKS's 2q/(1 + q) and N = (|y| − μ)²). Still one secure square a candidate; F coins fewer; the
acceptance rate falls by the ratio of the two P(0)s, (1 − Q)(1 + q)/((2^{F+1}q + 1 − Q)(1 − q))
≥ 1 − 2^F/(2t), so by ≤ 1.6 % at the rule 2^F ≤ t/32. The ideal output is N_Z(0, tμ) for every F.

Two cost cuts, both part of the defined (and exactly analysed) distribution: the low bits
i < ``low_bit`` of N get no coin (a_i := 1; they change exp(−N/D) by a factor in
[exp(−2^low_bit/D), 1], ≥ 1 − 2^-``coarse_log2``), and bits whose threshold is 0 need no
comparison (the coin is constant 0, so fail_i = n_i).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .params import FRAC_BITS, DiscreteLaplaceParams, coin_threshold, default_bits, full_support_bits
from .pmf import geometric_log_pmf, signed_log_pmf
from .pmf import log_pmf as laplace_log_pmf
from .reference import coins_below, reference_samples

__all__ = [
    "DiscreteGaussianParams",
    "gaussian_reference_samples",
    "ideal_acceptance_lower_bound",
    "ideal_discrete_gaussian_log_pmf",
    "candidates_for",
    "rounds_for_fallback",
]

FALLBACK_LOG2 = 50  # (1 − ρ)^{R−1} ≤ 2^-50: the fallback's total-variation share (see .guarantee)
COARSE_LOG2 = 52  # low bits of N without a coin change exp(−N/D) by a factor ≥ 1 − 2^-52 (at k = 56; k − 4 at k)


def coarse_for(k: int) -> int:
    """The uncoined low bits' error 2^-coarse that for_sigma pairs with k-bit coins: 4 bits
    coarser than the coins (2^-52 at k = 56), so both terms of the TV bound shrink together."""
    return COARSE_LOG2 + k - 56


@functools.lru_cache(maxsize=64)
def ideal_acceptance_lower_bound(t: int, mu: int, width: float = 12.0, fair_bits: int = 0) -> float:
    """A lower bound on ρ, the acceptance rate of the ideal rejection step (ideal coins, untruncated
    geometric): ρ = P(0)·e^{−μ/(2t)}·Σ_y exp(−y²/(2tμ)) (module docstring: the proposal times
    exp(−N/D) is P(0)·e^{−μ/(2t)}·exp(−y²/(2σ²)) at every y), with P(0) = (1 − Q)/(2^{F+1}q + 1 − Q),
    q = e^{−1/t}, Q = q^{2^F}; for F = 0, P(0) = (1 − q)/(1 + q) (CKS). The sum runs over
    |y| ≤ width·σ (float64; the omitted tail only makes it smaller, i.e. the bound safer).

    Summed in chunks of 2^20 terms and cached: at σ ≈ 7·10^5 grid units the range holds 8·10^6
    terms, whose temporaries (≈ 300 MB) every noise batch used to allocate again."""
    sigma = math.sqrt(t * mu)
    log_q = -1.0 / t
    one_minus_big_q = -math.expm1(log_q * 2.0**fair_bits)
    log_p0 = math.log(one_minus_big_q) - math.log(2.0 ** (fair_bits + 1) * math.exp(log_q) + one_minus_big_q)
    end = int(width * sigma) + 2
    total = 0.0
    for lo in range(0, end, _CHUNK):
        y = np.arange(lo, min(end, lo + _CHUNK), dtype=np.float64)
        terms = np.exp(log_p0 - mu / (2.0 * t) - y * y / (2.0 * t * mu))
        terms[y > 0] *= 2.0  # ±y
        total += float(np.sum(terms))
    return total * (1.0 - 1e-12)  # float64 summation error margin


_CHUNK = 1 << 20


def rounds_for_fallback(t: int, mu: int, fallback_log2: int = FALLBACK_LOG2) -> int:
    """Smallest R with (1 − ρ)^{R−1} ≤ 2^-fallback_log2, using the lower bound on ρ."""
    rho = ideal_acceptance_lower_bound(t, mu)
    if not 0.0 < rho < 1.0:
        raise ValueError(f"acceptance rate bound {rho} out of (0, 1)")
    return 1 + math.ceil(fallback_log2 * math.log(2.0) / -math.log1p(-rho))


@dataclass(frozen=True)
class DiscreteGaussianParams:
    """σ² = t·μ in grid units; ``laplace`` draws the candidates' compared bits (the geometric G'
    of scale t/2^F with B − F bits: F = ``fair_bits`` low bits are fair, module docstring);
    ``revealed``: revealed rejection, else ``rounds`` = R oblivious rounds (module docstring)."""

    t: int
    mu: int
    rounds: int = 16
    revealed: bool = False
    k: int = 48
    grid_bits: int = FRAC_BITS
    laplace_bits: int | None = None
    coarse_log2: int = 20  # for_sigma uses coarse_for(k) (the product's setting)
    fair_bits: int = 0
    laplace: DiscreteLaplaceParams = field(init=False)
    nonzero_threshold: int = field(init=False)
    low_bit: int = field(init=False)
    coin_thresholds: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.t < 1 or self.mu < 1 or self.rounds < 1:
            raise ValueError("t, mu and rounds must be positive integers")
        bits = self.laplace_bits
        if bits is None:
            bits = min(default_bits(float(self.t)), full_support_bits(float(self.t), self.k))
        f = self.fair_bits
        if not 0 <= f < bits:
            raise ValueError(f"fair_bits must be in [0, {bits}) (the candidates' magnitude bits), got {f}")
        if f and not self.revealed:
            raise ValueError("fair_bits needs revealed rejection (the oblivious rounds select candidates by |D| alone)")
        lap = DiscreteLaplaceParams(t=float(self.t) / 2.0**f, bits=bits - f, k=self.k, grid_bits=self.grid_bits)
        object.__setattr__(self, "laplace", lap)
        object.__setattr__(self, "nonzero_threshold", lap.nonzero_threshold if f == 0 else min(
            (1 << self.k) - 1, coin_threshold(lambda mp: _p_nonzero(mp, self.t, f), self.k)))
        m_max = 1 << bits
        n_max = max((m_max - self.mu) ** 2, self.mu**2) + 2 * self.mu * ((1 << f) - 1)  # N = (|y| − μ)² + 2μ·Z·R
        n_bits = n_max.bit_length()
        if n_bits > 62:
            raise ValueError("(m − μ)² does not fit the 64-bit ring: lower laplace_bits")
        d = 2 * self.t * self.mu
        low = max(0, min(n_bits, d.bit_length() - 1 - self.coarse_log2))  # 2^low ≤ D·2^-coarse
        scale = 1 << self.k
        cs = tuple(
            min(scale - 1, coin_threshold(lambda mp, i=i: mp.exp(-(mp.mpf(2) ** i) / d), self.k))
            for i in range(low, n_bits)
        )
        object.__setattr__(self, "low_bit", low)
        object.__setattr__(self, "coin_thresholds", cs)

    @property
    def magnitude_bits(self) -> int:
        """B: bits of the candidates' magnitude |Y| − 1 (F fair, B − F compared)."""
        return self.laplace.bits + self.fair_bits

    @property
    def proposal_thresholds(self) -> tuple[int, ...]:
        """The candidates' compared coins: G''s B − F bits, then Z."""
        return (*self.laplace.bit_thresholds, self.nonzero_threshold)

    @property
    def n_bits(self) -> int:
        """Bits of N = (m − μ)² that can be set (m ≤ 2^B)."""
        return self.low_bit + len(self.coin_thresholds)

    @property
    def compared_coins(self) -> int:
        """Coins that need a secure comparison (threshold > 0); the rest are constant 0."""
        return sum(1 for c in self.coin_thresholds if c > 0)

    @classmethod
    def for_sigma(
        cls, sigma: float, grid_bits: int = FRAC_BITS, rounds: int | None = None, k: int = 56,
        fallback_log2: int | None = None,
    ) -> DiscreteGaussianParams:
        """σ in real units on the grid 2^-grid_bits: t = ⌊σ⌋ + 1, μ = ⌈σ²/t⌉ (grid units, so the
        sampled σ = √(tμ) is never below the request). By default revealed rejection with
        staircase candidates (F = :func:`fair_bits_for` fair low bits); ``rounds``
        = R oblivious rounds instead, or ``fallback_log2``: the smallest R whose fallback
        probability (1 − ρ)^{R−1} is ≤ 2^-fallback_log2 (ρ: ideal acceptance rate)."""
        s = sigma * 2.0**grid_bits
        t = math.floor(s) + 1
        mu = max(1, math.ceil(s * s / t))
        if rounds is None and fallback_log2 is None:
            return cls(t=t, mu=mu, rounds=1, revealed=True, k=k, grid_bits=grid_bits, coarse_log2=coarse_for(k),
                       fair_bits=fair_bits_for(t))
        if rounds is None:
            rounds = rounds_for_fallback(t, mu, fallback_log2 or FALLBACK_LOG2)
        return cls(t=t, mu=mu, rounds=rounds, k=k, grid_bits=grid_bits, coarse_log2=coarse_for(k))

    @property
    def sigma(self) -> float:
        """σ of the discrete Gaussian in grid units: √(tμ)."""
        return math.sqrt(self.t * self.mu)

    @property
    def support_max(self) -> int:
        """Largest |Y|: 2^B."""
        return 1 << self.magnitude_bits

    def ideal_acceptance(self) -> float:
        """A lower bound on the ideal acceptance rate ρ (:func:`ideal_acceptance_lower_bound`)."""
        return ideal_acceptance_lower_bound(self.t, self.mu, fair_bits=self.fair_bits)

    def proposal_log_pmf(self) -> np.ndarray:
        """Exact log P(Y = y), y = −2^B … 2^B, of the candidates: the discrete Laplace of
        :mod:`.pmf` for F = 0, else its staircase (G = R + 2^F·G', R uniform; module docstring)."""
        if not self.fair_bits:
            return laplace_log_pmf(self.laplace)
        f = self.fair_bits
        lg = np.repeat(geometric_log_pmf(self.laplace), 1 << f) - f * _LN2  # P(G = r + 2^F h) = P(G' = h)/2^F
        return signed_log_pmf(lg, self.nonzero_threshold, self.k)

    def exponent(self, m: np.ndarray) -> np.ndarray:
        """N(m) = (m − μ)² + 2μ·R(m) for magnitudes m = |y| (int64), R(m) = (m − 1) mod 2^F
        (0 at m = 0): the integer numerator of the acceptance exponent N/D."""
        n = (m - self.mu) ** 2
        if self.fair_bits:
            n = n + 2 * self.mu * np.where(m > 0, (m - 1) & ((1 << self.fair_bits) - 1), 0)
        return n

    def log_acceptance(self) -> np.ndarray:
        """log acc(m), m = 0 … 2^B: Σ over set bits i of N(m) of log a_i."""
        n = self.exponent(np.arange(self.support_max + 1, dtype=np.int64))
        out = np.zeros(n.size)
        for i, c in enumerate(self.coin_thresholds, start=self.low_bit):
            la = math.log(c) - self.k * _LN2 if c > 0 else -math.inf
            out = np.where((n >> i) & 1 == 1, out + la, out)
        return out

    def acceptance_rate(self) -> float:
        """ρ: probability one candidate is accepted (implemented coins)."""
        lp = self.proposal_log_pmf()
        la = self.log_acceptance()
        full = np.concatenate([la[::-1], la[1:]])
        return float(np.exp(lp + full).sum())

    def failure_probability(self) -> float:
        """(1 − ρ)^{R−1}: no candidate among the first R − 1 accepted (output = Laplace fallback);
        0 with revealed rejection, which has no fallback."""
        if self.revealed:
            return 0.0
        return (1.0 - self.acceptance_rate()) ** (self.rounds - 1)

    def candidates_per_output(self) -> float:
        """Discrete Laplace candidates drawn per output: 1/ρ on average (revealed), else R."""
        return 1.0 / self.acceptance_rate() if self.revealed else float(self.rounds)

    def log_pmf(self) -> np.ndarray:
        """Exact log P_out(y), y = −2^B … 2^B (module docstring)."""
        lp = self.proposal_log_pmf()
        la = self.log_acceptance()
        full = np.concatenate([la[::-1], la[1:]])
        rho = float(np.exp(lp + full).sum())
        if self.revealed:
            return lp + full - math.log(rho)
        log_fail = (self.rounds - 1) * math.log1p(-rho)
        log_w = math.log(-math.expm1(log_fail)) - math.log(rho) if self.rounds > 1 else -math.inf
        return lp + np.logaddexp(log_w + full, log_fail)


_LN2 = math.log(2.0)


def fair_bits_for(t: int) -> int:
    """F for revealed rejection: the most fair low bits with 2^F ≤ t/32, so the acceptance rate
    falls by at most 2^F/(2t) ≤ 1.6 % (module docstring) while F coins a candidate are saved."""
    return max(0, math.floor(math.log2(t / 32.0))) if t >= 64 else 0


def _p_nonzero(mp: Any, t: int, f: int) -> Any:
    """P(Z = 1) = 2^{F+1}q/(2^{F+1}q + 1 − q^{2^F}), q = e^{−1/t}: P(0) continues the staircase."""
    q = mp.exp(-mp.one / t)
    two = mp.mpf(2) ** (f + 1)
    return two * q / (two * q + 1 - q ** (mp.mpf(2) ** f))


def ideal_discrete_gaussian_log_pmf(sigma: float, xs: np.ndarray, terms: int | None = None) -> np.ndarray:
    """log of N_Z(0, σ²) (CKS 2020, Def. 1.1), normalised over ±(20σ + 20) (mass beyond < e^{-200})."""
    m = int(terms if terms is not None else 20 * sigma + 20)
    grid = np.arange(-m, m + 1, dtype=np.float64)
    log_z = np.logaddexp.reduce(-(grid**2) / (2 * sigma * sigma))
    return -(xs.astype(np.float64) ** 2) / (2 * sigma * sigma) - log_z


def gaussian_reference_samples(params: DiscreteGaussianParams, n: int, rng: np.random.Generator) -> np.ndarray:
    """Plaintext reference of the MPC discrete Gaussian: same candidates, coins and selection."""
    if params.revealed:
        out: list[np.ndarray] = []
        need = n
        while need > 0:
            cand = _reference_candidates(params, candidates_for(need, params), rng)
            out.append(cand[_reference_accept(params, cand, rng)][:need])
            need -= out[-1].size
        return np.concatenate(out)
    r = params.rounds
    cand = reference_samples(params.laplace, n * r, rng).reshape(r, n)
    acc = _reference_accept(params, cand, rng)
    acc[-1] = True  # the last candidate is the fallback
    first = np.argmax(acc, axis=0)
    return cand[first, np.arange(n)]


def _reference_candidates(params: DiscreteGaussianParams, n: int, rng: np.random.Generator) -> np.ndarray:
    """n candidates Y = S·Z·(1 + R + 2^F·G') with the MPC's coins (F = 0: the discrete Laplace)."""
    return reference_samples(params.laplace, n, rng, fair_bits=params.fair_bits,
                             nonzero_threshold=params.nonzero_threshold)


def _reference_accept(params: DiscreteGaussianParams, cand: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The acceptance bits of the candidates ``cand`` with fresh k-bit coins (plaintext)."""
    nn = params.exponent(np.abs(cand))
    acc = np.ones(cand.shape, dtype=bool)
    for i, c in enumerate(params.coin_thresholds, start=params.low_bit):
        coin = coins_below(rng, params.k, c, cand.shape)
        acc &= ~(((nn >> i) & 1 == 1) & ~coin)
    return acc


def candidates_for(need: int, params: DiscreteGaussianParams, lanes: int = 64) -> int:
    """Candidates to draw in one batch of revealed rejection for ``need`` more outputs: 5 % and
    3 standard deviations above need/ρ (ρ: the ideal rate's lower bound), in whole 64-lane words,
    so that one batch almost always suffices; a short batch only means one more, smaller one."""
    rho = params.ideal_acceptance()
    mean = need / rho
    m = math.ceil(1.05 * mean + 3.0 * math.sqrt(mean * (1.0 - rho)) / rho + 1)
    return -(-m // lanes) * lanes
