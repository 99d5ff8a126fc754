"""The in-MPC samplers' total-variation bound, recomputed from the parameters a report states: what
``report verify`` charges as ``delta_sampler``, written out here apart from the samplers' code.

A report's realisation states its sampler (``realisation.sampler``): for the discrete Laplace its
scale t (grid units), its B magnitude bits and k coin bits; for the discrete Gaussian N_Z(0, tμ)
(Canonne–Kamath–Steinke 2020's rejection sampler) t and μ, its candidates' Laplace bits, k, the
low bits of the acceptance test left to a coarse coin (``low_bit``), the test's exact coins
(``test_coins``), and revealed rejection or R oblivious rounds. The bound per sample, by coupling
the implemented sampler with the ideal one coin by coin:

* **discrete Laplace:** each of the B + 1 coins (B magnitude bits, the zero test) is a threshold
  ⌊p·2^k⌋/2^k, off by < 2^-k; the ideal geometric's bits ≥ B carry mass ≤ 2·q^(2^B), q = e^(−1/t):
  ``tv = (B + 1)·2^-k + 2·exp(−2^B/t)``;
* **discrete Gaussian:** per candidate the Laplace's tv, less its F = ``fair_bits`` low magnitude
  bits, which are exactly fair (absent: 0; the candidates are then CKS's discrete Laplace, else
  its staircase, whose acceptance exponent adds 2μ·((|y| − 1) mod 2^F)); per acceptance test ``test_coins``·2^-k
  plus (2^low − 1)/D, D = 2tμ (the low bits decided together); ρ a lower bound on the ideal
  acceptance rate Σ_y L_t(y)·exp(−(|y| − μ)²/(2tμ)) (a finite sum of positive terms);
  revealed rejection: ``tv = (per candidate + per test)/ρ``; R oblivious rounds:
  ``tv = (1 − ρ)^(R−1) + R·per candidate + (R − 1)·per test``.

A release of d coordinates counts h·d samples (h: the honest shares of distributed noise, else 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["acceptance_lower_bound", "gaussian_tv", "laplace_tv", "sampler_sigma", "tv_per_release"]

_CHUNK = 1 << 20


def laplace_tv(t: float, bits: int, k: int) -> float:
    """Per sample, the discrete Laplace of scale t with B = ``bits`` magnitude bits and k-bit coins."""
    return (bits + 1) * 2.0**-k + 2.0 * math.exp(-(2.0**bits) / t)


def acceptance_lower_bound(t: int, mu: int, width: float = 12.0, fair_bits: int = 0) -> float:
    """ρ ≥ Σ_{|y| ≤ width·σ} L(y)·exp(−N(y)/(2tμ)) for the ideal candidates L: the staircase
    L(y) = P(0)·q^M(y), M(y) = 1 + 2^F·⌊(|y| − 1)/2^F⌋ (0 at y = 0), P(0) = (1 − Q)/(2^(F+1)·q + 1 − Q),
    Q = q^(2^F), with N(y) = (|y| − μ)² + 2μ·(|y| − M(y)); F = 0 is CKS's discrete Laplace
    (1 − q)/(1 + q)·q^|y| with N = (|y| − μ)². The terms left out are positive, so the partial sum
    (less a float64 margin) is a lower bound."""
    sigma = math.sqrt(t * mu)
    log_q = -1.0 / t
    one_minus_big_q = -math.expm1(log_q * 2.0**fair_bits)
    log_p0 = math.log(one_minus_big_q) - math.log(2.0 ** (fair_bits + 1) * math.exp(log_q) + one_minus_big_q)
    end = int(width * sigma) + 2
    total = 0.0
    for lo in range(0, end, _CHUNK):
        y = np.arange(lo, min(end, lo + _CHUNK), dtype=np.int64)
        m = np.where(y > 0, 1 + (((y - 1) >> fair_bits) << fair_bits), 0)
        n = (y - mu) ** 2 + 2 * mu * (y - m)
        both_signs = np.where(y > 0, math.log(2.0), 0.0)
        total += float(np.sum(np.exp(log_p0 + m * log_q + both_signs - n / (2.0 * t * mu))))
    return total * (1.0 - 1e-12)


def gaussian_tv(*, t: int, mu: int, revealed: bool, rounds: int, k: int, laplace_bits: int, low_bit: int,
                test_coins: int, fair_bits: int = 0) -> float:
    """Per sample, the discrete Gaussian N_Z(0, tμ) of the stated parameters (module docstring)."""
    per_candidate = laplace_tv(t / 2.0**fair_bits, laplace_bits - fair_bits, k)  # the compared bits ≥ F
    per_test = test_coins * 2.0**-k + (2.0**low_bit - 1.0) / (2.0 * t * mu)
    rho = acceptance_lower_bound(t, mu, fair_bits=fair_bits)
    if revealed:
        return (per_candidate + per_test) / rho
    fallback = math.exp((rounds - 1) * math.log1p(-rho)) if rounds > 1 else 1.0
    return fallback + rounds * per_candidate + (rounds - 1) * per_test


def sampler_sigma(sampler: Mapping[str, Any]) -> float:
    """The noise scale the stated parameters sample, grid units: √(tμ), or the Laplace's t."""
    if sampler["kind"] == "discrete_gaussian":
        return math.sqrt(int(sampler["t"]) * int(sampler["mu"]))
    return float(sampler["t"])


def tv_per_release(sampler: Mapping[str, Any], dim: int, honest: int = 1) -> float:
    """The bound over one release: h·d samples of the stated sampler. Raises KeyError or
    ValueError for parameters that are missing or of the wrong kind."""
    kind = sampler["kind"]
    if kind == "discrete_laplace":
        per = laplace_tv(float(sampler["t"]), int(sampler["bits"]), int(sampler["k"]))
    elif kind == "discrete_gaussian":
        per = gaussian_tv(t=int(sampler["t"]), mu=int(sampler["mu"]), revealed=bool(sampler["revealed"]),
                          rounds=int(sampler["rounds"]), k=int(sampler["k"]), laplace_bits=int(sampler["laplace_bits"]),
                          low_bit=int(sampler["low_bit"]), test_coins=int(sampler["test_coins"]),
                          fair_bits=int(sampler.get("fair_bits", 0)))
    else:
        raise ValueError(f"realisation.sampler.kind: {kind!r} is not a sampler this version runs")
    return honest * dim * per
