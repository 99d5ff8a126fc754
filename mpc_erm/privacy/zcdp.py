"""Zero-concentrated DP: the thesis's accounting route for MPC Grad P (thesis ch. 6, §6.2–6.3).

Kept as the "thesis" accountant for reproduction. The product's default is the exact GDP route
(:mod:`.gaussian`), which needs less noise for the same guarantee, because the zCDP→(ε,δ)
conversion ε = ρ + 2√(ρ·log(1/δ)) (Bun–Steinke 2016, Prop. 1.3; thesis Lemma 6.2.6) is loose.

Facts used (thesis Lemmas 6.2.4–6.2.6, docs/explanation/papers.md §T1.2 and §T6):
- a Gaussian mechanism with ℓ2-sensitivity Δ and std σ is Δ²/(2σ²)-zCDP;
- zCDP composes additively (adaptively);
- ρ-zCDP ⇒ (ρ + 2√(ρ log(1/δ)), δ)-DP, whose exact inverse is
  √ρ = √(log(1/δ) + ε) − √(log(1/δ)).
"""

from __future__ import annotations

import math

from . import _checks

__all__ = [
    "thesis_grad_sigma",
    "thesis_table_6_1_grad_scale",
    "zcdp_compose",
    "zcdp_epsilon",
    "zcdp_epsilon_for_rounds",
    "zcdp_rho_for",
    "zcdp_rho_gaussian",
    "zcdp_sigma",
]


def zcdp_rho_gaussian(sensitivity: float, sigma: float) -> float:
    """ρ = Δ²/(2σ²) of one Gaussian step (thesis Lemma 6.2.4)."""
    d = _checks.positive("sensitivity", sensitivity)
    s = _checks.positive("sigma", sigma)
    return d * d / (2.0 * s * s)


def zcdp_compose(*rhos: float) -> float:
    """ρ of an adaptive composition: the sum (thesis Lemma 6.2.5)."""
    return math.fsum(_checks.nonnegative(f"rhos[{k}]", r) for k, r in enumerate(rhos))


def zcdp_epsilon(rho: float, delta: float) -> float:
    """ε = ρ + 2√(ρ·log(1/δ)) (thesis Lemma 6.2.6)."""
    r = _checks.nonnegative("rho", rho)
    dl = _checks.probability_open("delta", delta)
    return r + 2.0 * math.sqrt(r * math.log(1.0 / dl))


def zcdp_rho_for(epsilon: float, delta: float) -> float:
    """Largest ρ with :func:`zcdp_epsilon` (ρ, δ) ≤ ε: ρ = (√(log(1/δ)+ε) − √(log(1/δ)))².

    Exact inverse of the quadratic in √ρ (not the thesis's ρ ≈ ε²/(4 log(1/δ)), which is its
    first-order expansion and slightly too large: it gives ε' = ε + ε²/(4 log(1/δ)) > ε).
    Written as ε/(√(L+ε) + √L) to avoid cancellation when ε ≪ L = log(1/δ).
    """
    eps = _checks.positive("epsilon", epsilon)
    dl = _checks.probability_open("delta", delta)
    big_l = math.log(1.0 / dl)
    sqrt_rho = eps / (math.sqrt(big_l + eps) + math.sqrt(big_l))
    return sqrt_rho * sqrt_rho


def zcdp_sigma(sensitivity: float, rounds: int, epsilon: float, delta: float) -> float:
    """σ = √(T·Δ²/(2ρ)) with the exact ρ of :func:`zcdp_rho_for`: T Gaussian steps, (ε,δ)-DP
    through zCDP. docs/explanation/papers.md §T5.3 / §T7.1: calibrate with an explicit Δ, not the thesis's
    TG²/(n²ρ) of ch. 2 (which drops a factor 2)."""
    d = _checks.positive("sensitivity", sensitivity)
    t = _checks.positive_int("rounds", rounds)
    rho = zcdp_rho_for(epsilon, delta)
    return math.sqrt(t * d * d / (2.0 * rho))


def zcdp_epsilon_for_rounds(sensitivity: float, sigma: float, rounds: int, delta: float) -> float:
    """ε at δ of T Gaussian steps (sensitivity Δ, std σ) through zCDP: ρ = TΔ²/(2σ²)."""
    t = _checks.positive_int("rounds", rounds)
    return zcdp_epsilon(t * zcdp_rho_gaussian(sensitivity, sigma), delta)


def thesis_grad_sigma(G: float, T: int, eps: float, delta: float, m: int, n_min: int) -> float:
    """Thesis eq. (6.3.1): σ = √(8 G² T log(1/δ)) / (m·n₍₁₎·ε). Kept for reproduction only.

    It plugs the approximation ρ ≈ ε²/(4T log(1/δ)) into the zCDP route with Δ = 2G/(m·n₍₁₎),
    so under the thesis's own Lemma 6.2.6 it certifies ε + ε²/(4 log(1/δ)), slightly *more* than
    ε (docs/explanation/papers.md §T6, §003.3); :func:`zcdp_sigma` is the exact zCDP value. Under exact GDP
    accounting the formula does hold with slack (see ``tests/privacy``).
    """
    g = _checks.positive("G", G)
    t = _checks.positive_int("T", T)
    e = _checks.positive("eps", eps)
    dl = _checks.probability_open("delta", delta)
    mm = _checks.positive_int("m", m)
    n1 = _checks.positive_int("n_min", n_min)
    return math.sqrt(8.0 * g * g * t * math.log(1.0 / dl)) / (mm * n1 * e)


def thesis_table_6_1_grad_scale(G: float, T: int, eps: float, m: int, n_min: int) -> float:
    """Table 6.1 "MPC Grad P" scale N(√(2T)·G/(m·n₍₁₎·ε)), as printed (0.57e-3 at the table's
    parameters).

    This is NOT eq. (6.3.1): the table drops the √log(1/δ) factor and uses √2 where (6.3.1) has
    √8 (i.e. it equals (6.3.1) divided by 2√log(1/δ)); docs/explanation/papers.md §T6 marks it UNCLEAR. It is
    reproduced for comparison with the printed table only: it carries no (ε, δ) guarantee.
    """
    g = _checks.positive("G", G)
    t = _checks.positive_int("T", T)
    e = _checks.positive("eps", eps)
    mm = _checks.positive_int("m", m)
    n1 = _checks.positive_int("n_min", n_min)
    return math.sqrt(2.0 * t) * g / (mm * n1 * e)
