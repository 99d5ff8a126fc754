"""A lower bound on ε from one training run: Steinke, Nasr and Jagielski, "Privacy auditing with one
(1) training run" (NeurIPS 2023), Theorem 3.3 / Proposition 5.2.

The game: m canaries, each included in the training data independently with probability ½. After
one run the auditor guesses "in" or "out" for r of them (abstaining on the rest) and is right on v.
If the run is (ε, δ)-DP, then for every v

    P[W ≥ v] ≤ P[Bin(r, q) ≥ v] + 2m·δ·max_{1≤i≤v} P[v > Bin(r, q) ≥ v − i] / i,   q = e^ε/(1 + e^ε),

W the number of correct guesses. So an observed v whose bound at ε falls below α rejects "(ε, δ)-DP"
at level α, and the largest such ε is a lower bound on the run's ε with confidence 1 − α. With
δ = 0 the bound is the binomial tail of ε-DP randomized response, tight for that mechanism.

Why a one-run audit: it audits the released model of the job as configured (its data, its noise,
its rounds) at the cost of one run; the price is power (a Gaussian mechanism's one-run bound sits
well below its ε unless m is large), so a bound near 0 says only "no violation seen", while a
bound above the stated ε proves the statement false at level α.
"""

from __future__ import annotations

import math

from scipy import stats

__all__ = ["epsilon_lower_bound", "p_value"]


def _checked(m: int, r: int, v: int, delta: float) -> None:
    if not (isinstance(m, int) and isinstance(r, int) and isinstance(v, int) and 0 <= v <= r <= m):
        raise ValueError(f"audit: need integers 0 ≤ correct ≤ guesses ≤ canaries, got {v}, {r}, {m}")
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"audit: δ must be in [0, 1], got {delta!r}")


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The bound on P[W ≥ v] for an (ε, δ)-DP run (module docstring); 1 at most."""
    _checked(m, r, v, delta)
    if epsilon < 0:
        raise ValueError(f"audit: ε must be ≥ 0, got {epsilon!r}")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(stats.binom.sf(v - 1, r, q))  # P[Bin(r, q) ≥ v]
    if delta == 0.0 or v == 0:
        return min(1.0, tail)
    worst, below = 0.0, 0.0  # below: P[v > Bin(r, q) ≥ v − i]
    for i in range(1, v + 1):
        below += float(stats.binom.pmf(v - i, r, q))
        worst = max(worst, below / i)
    return min(1.0, tail + 2.0 * m * delta * worst)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, alpha: float = 0.05, tol: float = 1e-6) -> float:
    """The largest ε that ``v`` correct of ``r`` guesses rejects at level ``alpha``: a lower bound on
    the run's ε with confidence 1 − alpha (0 when even ε = 0 is not rejected)."""
    _checked(m, r, v, delta)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"audit: the level α must be in (0, 1), got {alpha!r}")
    if p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < alpha:  # p_value grows with ε; every guess right stays finite
        lo, hi = hi, 2.0 * hi
        if hi > 1e3:
            return lo
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) < alpha:
            lo = mid
        else:
            hi = mid
    return lo
