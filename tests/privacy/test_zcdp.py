"""zCDP route (mpc_erm.privacy.zcdp): exact inverse, thesis eq. (6.3.1) and Table 6.1 forms."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpc_erm.privacy import (
    gaussian_epsilon_for_rounds,
    thesis_grad_sigma,
    thesis_table_6_1_grad_scale,
    zcdp_compose,
    zcdp_epsilon,
    zcdp_epsilon_for_rounds,
    zcdp_rho_for,
    zcdp_rho_gaussian,
    zcdp_sigma,
)


def test_rho_of_gaussian_and_composition() -> None:
    assert zcdp_rho_gaussian(2.0, 4.0) == pytest.approx(4.0 / 32.0)
    assert zcdp_compose(0.1, 0.2, 0.3) == pytest.approx(0.6)
    assert zcdp_epsilon(0.01, 1e-5) == pytest.approx(0.01 + 2 * math.sqrt(0.01 * math.log(1e5)))


@settings(max_examples=200, deadline=None)
@given(eps=st.floats(1e-4, 50.0), log10_delta=st.floats(-15.0, -0.5))
def test_inverse_is_exact(eps: float, log10_delta: float) -> None:
    delta = 10.0**log10_delta
    rho = zcdp_rho_for(eps, delta)
    assert zcdp_epsilon(rho, delta) == pytest.approx(eps, rel=1e-12)
    # closed form of docs/explanation/papers.md §T1.2: √ρ = √(log(1/δ)+ε) − √(log(1/δ))
    ll = math.log(1 / delta)
    assert math.sqrt(rho) == pytest.approx(math.sqrt(ll + eps) - math.sqrt(ll), rel=1e-6)


def test_zcdp_sigma_roundtrip_and_formula() -> None:
    sigma = zcdp_sigma(2e-5, 1500, 0.5, 1e-3)
    assert sigma == pytest.approx(math.sqrt(1500 * 4e-10 / (2 * zcdp_rho_for(0.5, 1e-3))))
    assert zcdp_epsilon_for_rounds(2e-5, sigma, 1500, 1e-3) == pytest.approx(0.5, rel=1e-12)


def test_thesis_eq_6_3_1() -> None:
    """σ² = 8G²T log(1/δ)/(m² n₍₁₎² ε²); under the thesis's own zCDP conversion it certifies
    ε + ε²/(4 log 1/δ) (docs/explanation/papers.md §003.3, §T6), i.e. slightly more than ε; exact GDP
    certifies far less."""
    G, T, eps, delta, m, n1 = 1.0, 1500, 0.5, 1e-3, 100, 500
    sigma = thesis_grad_sigma(G, T, eps, delta, m, n1)
    assert sigma**2 == pytest.approx(8 * G**2 * T * math.log(1 / delta) / (m**2 * n1**2 * eps**2))
    sens = 2 * G / (m * n1)
    eps_zcdp = zcdp_epsilon_for_rounds(sens, sigma, T, delta)
    assert eps_zcdp == pytest.approx(eps + eps**2 / (4 * math.log(1 / delta)), rel=1e-12)
    assert eps_zcdp > eps
    assert gaussian_epsilon_for_rounds(sens, sigma, T, delta) == pytest.approx(
        0.2825, abs=1e-4
    )  # exact GDP


def test_table_6_1_grad_scale_omits_log_delta() -> None:
    scale = thesis_table_6_1_grad_scale(1.0, 100, 0.5, 100, 500)
    assert scale == pytest.approx(0.57e-3, abs=0.005e-3)
    # it equals (6.3.1) divided by 2√log(1/δ), for every δ
    for delta in (1e-3, 1e-6):
        ratio = thesis_grad_sigma(1.0, 100, 0.5, delta, 100, 500) / scale
        assert ratio == pytest.approx(2 * math.sqrt(math.log(1 / delta)))


def test_validation_names_argument() -> None:
    with pytest.raises(ValueError, match="^rho "):
        zcdp_epsilon(-0.1, 1e-5)
    with pytest.raises(ValueError, match="^delta "):
        zcdp_rho_for(1.0, 1.5)
    with pytest.raises(ValueError, match="^epsilon "):
        zcdp_sigma(1.0, 10, 0.0, 1e-5)
    with pytest.raises(ValueError, match="^n_min "):
        thesis_grad_sigma(1.0, 10, 0.5, 1e-3, 10, 0)
    with pytest.raises(ValueError, match=r"^rhos\[1\] "):
        zcdp_compose(0.1, -0.2)
