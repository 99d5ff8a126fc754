"""Independent (ε, δ) references for the ledger and daemon tests.

dp_accounting's ``RdpAccountant`` called directly, job by job (no grouping of identical events), the
conversions between relations and the samplers' term written out here — nothing from
``mpc_erm.privacy.events`` (the code under test). dp_accounting is imported inside the functions:
spawned ledger workers import the test modules and must start fast.

Events are tuples ``("gaussian", z, rounds)`` (rounds Gaussian releases, noise multiplier z) or
``("pure", ε, rounds)`` (rounds ε-DP releases, accounted as binary randomized response with ε, the
worst case of every ε-DP mechanism).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable


def rdp_curve(events: Iterable[tuple[str, float, int]]) -> Callable[[float], float]:
    """δ ↦ RDP ε at δ of the composition of ``events`` (REPLACE_ONE: what dp_accounting needs for
    randomized response; the Gaussian's RDP is the same under either relation). The RDP curve is
    computed once (randomized response costs dp_accounting ~0.1 s an event)."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    for kind, x, rounds in events:
        if kind == "gaussian":
            acc.compose(dp_accounting.GaussianDpEvent(x), rounds)
        else:  # binary RR keeping the true bucket w.p. e^ε/(1+e^ε): noise parameter p = 2/(1+e^ε)
            acc.compose(dp_accounting.RandomizedResponseDpEvent(2.0 / (1.0 + math.exp(x)), 2), rounds)
    return lambda delta: float(acc.get_epsilon(delta))


def rdp_epsilon(events: Iterable[tuple[str, float, int]], delta: float) -> float:
    """RDP ε at ``delta`` of the composition of ``events``."""
    return rdp_curve(events)(delta)


def gaussian_under_replace(z: float, adjacency: str) -> float:
    """An add/remove Gaussian's noise multiplier under replace-one: a replacement is a removal and an
    addition, so the shift doubles and z halves."""
    return z / 2.0 if adjacency == "add_remove" else z


def with_sampler(eps_at: Callable[[float], float], tau: float, delta: float) -> tuple[float, float]:
    """Smallest ε with ε ≥ eps_at(δ − (1 + e^ε)·τ), by bisection: a mechanism within total variation τ
    of an (ε, δ_m)-DP one is (ε, δ_m + (1 + e^ε)·τ)-DP. Returns (ε, (1 + e^ε)·τ), or (inf, 1) when no
    ε leaves the mechanism any δ."""
    if tau == 0.0:
        return eps_at(delta), 0.0

    def gap(e: float) -> float:  # < 0: e is below the ε the mechanism needs at what δ is left
        left = delta - (1.0 + math.exp(e)) * tau
        return -math.inf if left <= 0 else e - eps_at(left)

    lo = eps_at(delta)  # gap(lo) < 0: the sampler term takes some δ
    step, hi = max(lo, 1e-6) * 1e-3, lo
    while gap(hi) < 0:
        hi, step = hi + step, 2 * step
        if not math.isfinite(gap(hi)) or hi > 1e3:
            return math.inf, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if gap(mid) >= 0:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-14 * hi:
            break
    return hi, (1.0 + math.exp(hi)) * tau
