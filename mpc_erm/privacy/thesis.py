"""The thesis's analytic noise scales (thesis ch. 6, Table 6.1; docs/explanation/papers.md §T6), for reproduction.

These are the formulas *as printed*, so the simulator can reproduce Table 6.1 and its baselines.
They are not all valid calibrations: "L(·)" is per-coordinate Laplace with an ℓ2 sensitivity
(ε√d-DP, see :mod:`.laplace`), and the two Gaussian entries omit √log(1/δ)
(:func:`.zcdp.thesis_table_6_1_grad_scale`). Use :mod:`.calibration` for guarantees.
"""

from __future__ import annotations

import math

from . import _checks

__all__ = ["TABLE_6_1_METHODS", "table_6_1_scales", "thesis_output_scale"]

TABLE_6_1_METHODS = (
    "Pathak",
    "Local Out P",
    "Local Obj P",
    "Local Grad P",
    "MPC Out P",
    "MPC Grad P",
)


def thesis_output_scale(G: float, m: int, n_min: int, lam: float, eps: float) -> float:
    """MPC Out P Laplace scale 2G/(m·n₍₁₎·λ·ε) of thesis Thm 6.3.1."""
    g = _checks.positive("G", G)
    mm = _checks.positive_int("m", m)
    n1 = _checks.positive_int("n_min", n_min)
    lm = _checks.positive("lam", lam)
    e = _checks.positive("eps", eps)
    return 2.0 * g / (mm * n1 * lm * e)


def table_6_1_scales(
    m: int, n_min: int, lam: float, eps: float, G: float, T: int
) -> dict[str, tuple[str, float]]:
    """{method: (distribution, scale)} of Table 6.1 ("laplace" scale b, "gaussian" std σ).

    Pathak       L(2G/(n₍₁₎λε))
    Local Out P  L(2G/(√m·n₍₁₎λε))     (the extracted text "√(m n₍₁₎)" is √m·n₍₁₎: only that
                                        reading reproduces the printed 80.0e-3)
    Local Obj P  L(2G/(n₍₁₎ε))
    Local Grad P N(√(2T)·G/(√m·n₍₁₎ε))
    MPC Out P    L(2G/(m·n₍₁₎λε))
    MPC Grad P   N(√(2T)·G/(m·n₍₁₎ε))
    At m=100, n₍₁₎=500, λ=0.01, ε=0.5, G=1, T=100 the printed row is 800e-3, 80.0e-3, 8.00e-3,
    5.66e-3, 8.00e-3, 0.57e-3.
    """
    mm = _checks.positive_int("m", m)
    n1 = _checks.positive_int("n_min", n_min)
    lm = _checks.positive("lam", lam)
    e = _checks.positive("eps", eps)
    g = _checks.positive("G", G)
    t = _checks.positive_int("T", T)
    rm = math.sqrt(mm)
    grad = math.sqrt(2.0 * t) * g
    return {
        "Pathak": ("laplace", 2.0 * g / (n1 * lm * e)),
        "Local Out P": ("laplace", 2.0 * g / (rm * n1 * lm * e)),
        "Local Obj P": ("laplace", 2.0 * g / (n1 * e)),
        "Local Grad P": ("gaussian", grad / (rm * n1 * e)),
        "MPC Out P": ("laplace", 2.0 * g / (mm * n1 * lm * e)),
        "MPC Grad P": ("gaussian", grad / (mm * n1 * e)),
    }
