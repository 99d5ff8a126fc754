"""Thesis ch. 6 analytic noise scales (Table 6.1) reproduce the printed row."""

from __future__ import annotations

import pytest

from mpc_erm.privacy import (
    TABLE_6_1_METHODS,
    output_perturbation_sensitivity,
    table_6_1_scales,
    thesis_output_scale,
)

# Table 6.1, "Noise Generation Input" row (m=100, n₍₁₎=500, λ=0.01, ε=0.5, G=1, T=100),
# printed to three significant digits (0.57e-3 to two).
PRINTED = {
    "Pathak": ("laplace", 800e-3, 0.5e-3),
    "Local Out P": ("laplace", 80.0e-3, 0.05e-3),
    "Local Obj P": ("laplace", 8.00e-3, 0.005e-3),
    "Local Grad P": ("gaussian", 5.66e-3, 0.005e-3),
    "MPC Out P": ("laplace", 8.00e-3, 0.005e-3),
    "MPC Grad P": ("gaussian", 0.57e-3, 0.005e-3),
}


def test_table_6_1_row() -> None:
    got = table_6_1_scales(m=100, n_min=500, lam=0.01, eps=0.5, G=1.0, T=100)
    assert tuple(got) == TABLE_6_1_METHODS
    for method, (dist, value, tol) in PRINTED.items():
        assert got[method][0] == dist
        assert got[method][1] == pytest.approx(value, abs=tol), method


def test_mpc_out_p_is_thesis_sensitivity_over_eps() -> None:
    scale = thesis_output_scale(1.0, 100, 500, 0.01, 0.5)
    sens = output_perturbation_sensitivity(1.0, 0.01, [500] * 100, "thesis")
    assert scale == pytest.approx(sens / 0.5)
    assert scale == pytest.approx(table_6_1_scales(100, 500, 0.01, 0.5, 1.0, 100)["MPC Out P"][1])


def test_validation_names_argument() -> None:
    with pytest.raises(ValueError, match="^lam "):
        table_6_1_scales(100, 500, 0.0, 0.5, 1.0, 100)
    with pytest.raises(ValueError, match="^T "):
        table_6_1_scales(100, 500, 0.01, 0.5, 1.0, 0)
