"""Calibration entry points and reports (mpc_erm.privacy.calibration / .report)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from mpc_erm.privacy import (
    Calibration,
    PrivacyReport,
    analytic_gaussian_sigma,
    calibrate_gradient_perturbation,
    calibrate_output_perturbation,
    epsilon_for,
    gaussian_epsilon_for_rounds,
    gdp_delta,
    gradient_sensitivity,
    l1_from_l2,
    no_noise_calibration,
    output_perturbation_sensitivity,
    zcdp_epsilon_for_rounds,
)


def test_output_l2_laplace() -> None:
    sens = output_perturbation_sensitivity(1.0, 0.01, [500] * 4)
    c = calibrate_output_perturbation(sens, dim=20, epsilon=0.5)
    assert (c.mechanism, c.accountant, c.delta, c.rounds) == ("l2_laplace", "pure", 0.0, 1)
    assert c.scale == pytest.approx(sens / 0.5)
    c2 = calibrate_output_perturbation(sens, 20, 0.5, delta=1e-5)
    assert c2.delta == 0.0 and any("reported delta=0" in n for n in c2.notes)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.scale = 1.0  # type: ignore[misc]


def test_output_gaussian_is_analytic() -> None:
    c = calibrate_output_perturbation(0.02, 20, 1.0, delta=1e-6, mechanism="gaussian")
    assert c.mechanism == "gaussian" and c.delta == 1e-6
    assert c.scale == pytest.approx(analytic_gaussian_sigma(0.02, 1.0, 1e-6))
    assert gdp_delta(0.02 / c.scale, 1.0) <= 1e-6
    with pytest.raises(ValueError, match="^delta "):
        calibrate_output_perturbation(0.02, 20, 1.0, mechanism="gaussian")


def test_output_laplace_thesis_uses_l1() -> None:
    c = calibrate_output_perturbation(0.004, 100, 0.5, mechanism="laplace_thesis")
    assert c.mechanism == "laplace"
    assert c.sensitivity_l1 == pytest.approx(l1_from_l2(0.004, 100)) == pytest.approx(0.04)
    assert c.scale == pytest.approx(0.04 / 0.5)  # = √d × the thesis's literal Δ₂/ε
    rep = c.report()
    assert rep.norm == "l1" and rep.sensitivity_l1 == pytest.approx(0.04)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"sensitivity_l2": 0.0}, "sensitivity_l2"),
        ({"dim": 0}, "dim"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"mechanism": "laplace"}, "mechanism"),
        ({"adjacency": "x"}, "adjacency"),
    ],
)
def test_output_validation_names_argument(kwargs: dict, name: str) -> None:
    args = {"sensitivity_l2": 0.1, "dim": 5, "epsilon": 1.0} | kwargs
    with pytest.raises(ValueError, match=f"^{name} "):
        calibrate_output_perturbation(**args)


def test_gradient_gdp_thesis_setting() -> None:
    sens = gradient_sensitivity(1.0, [500] * 100)  # 2G/n
    c = calibrate_gradient_perturbation(sens, 1500, 0.5, 1e-3)
    assert (c.mechanism, c.accountant, c.rounds, c.sampling_rate) == ("gaussian", "gdp", 1500, 1.0)
    assert c.noise_multiplier == pytest.approx(178.55, abs=0.01)
    assert gaussian_epsilon_for_rounds(sens, c.scale, 1500, 1e-3) <= 0.5
    z = calibrate_gradient_perturbation(sens, 1500, 0.5, 1e-3, accountant="zcdp")
    assert zcdp_epsilon_for_rounds(sens, z.scale, 1500, 1e-3) == pytest.approx(0.5, rel=1e-12)
    assert c.scale < z.scale


def test_gradient_numerical_accountants() -> None:
    sens = gradient_sensitivity(1.0, [1000] * 10, adjacency="add_remove")
    pld = calibrate_gradient_perturbation(
        sens, 100, 1.0, 1e-5, "pld", 1.0, "add_remove", pld_discretization=1e-3
    )
    gdp = calibrate_gradient_perturbation(sens, 100, 1.0, 1e-5, "gdp", 1.0, "add_remove")
    assert pld.scale == pytest.approx(gdp.scale, rel=2e-4)  # PLD ≈ exact at full batch
    rdp = calibrate_gradient_perturbation(sens, 500, 1.0, 1e-5, "rdp", 0.02, "add_remove")
    assert epsilon_for("rdp", rdp.noise_multiplier, 500, 1e-5, 0.02, "add_remove") <= 1.0
    assert any("Poisson" in n for n in rdp.notes)
    with pytest.raises(ValueError, match="^sampling_rate "):
        calibrate_gradient_perturbation(sens, 100, 1.0, 1e-5, "gdp", 0.1)
    with pytest.raises(ValueError, match="^accountant "):
        calibrate_gradient_perturbation(sens, 100, 1.0, 1e-5, "moments")
    with pytest.raises(ValueError, match="^delta "):
        calibrate_gradient_perturbation(sens, 100, 1.0, 0.0)


@settings(max_examples=100, deadline=None)
@given(
    eps=st.floats(0.05, 10.0),
    log10_delta=st.floats(-10.0, -2.0),
    rounds=st.integers(1, 3000),
    sens=st.floats(1e-6, 1.0),
    accountant=st.sampled_from(["gdp", "zcdp"]),
)
def test_calibration_roundtrip_sigma_eps_sigma(
    eps: float, log10_delta: float, rounds: int, sens: float, accountant: str
) -> None:
    delta = 10.0**log10_delta
    c = calibrate_gradient_perturbation(sens, rounds, eps, delta, accountant)
    eps_back = epsilon_for(accountant, c.noise_multiplier, rounds, delta)
    assert eps_back <= eps * (1 + 1e-12)
    assert eps_back == pytest.approx(eps, rel=1e-8)
    c2 = calibrate_gradient_perturbation(sens, rounds, eps_back, delta, accountant)
    assert c2.scale == pytest.approx(c.scale, rel=1e-8)


def test_report_roundtrip_and_fields() -> None:
    c = calibrate_gradient_perturbation(2e-4, 50, 1.0, 1e-5)
    r = c.report(parties=3, n=10_000, parameters={"lam": 1e-3, "T": 50})
    assert isinstance(r, PrivacyReport)
    assert r.trust_model == "simulation (in-process, trusted)" and r.delta_sampler == 0.0
    assert any("delta_sampler = 0" in n for n in r.notes)
    text = r.to_json()
    assert json.loads(text)["schema"] == "mpc_erm.privacy_report/1"
    assert PrivacyReport.from_json(text) == r
    assert r.delta_total == 1e-5
    mpc = c.report(trust_model="3-party RSS (honest majority)", delta_sampler=1e-9, parties=3, n=10)
    assert mpc.delta_total == pytest.approx(1e-5 + 1e-9)
    assert not any("delta_sampler = 0" in n for n in mpc.notes)
    with pytest.raises(ValidationError, match="parties"):
        c.report(parties=0)
    with pytest.raises(ValidationError, match="unknown"):
        c.report(unknown=1)


def test_no_noise_report_says_infinite_epsilon() -> None:
    r = no_noise_calibration(rounds=3).report()
    assert r.mechanism == "none" and math.isinf(r.epsilon)
    assert "Infinity" in r.to_json()
    assert PrivacyReport.from_json(r.to_json()) == r


def test_calibration_is_plain_frozen_dataclass() -> None:
    c = Calibration("gaussian", 2.0, 1.0, None, 1.0, 1e-5, "gdp", "replace")
    assert c.noise_multiplier == 2.0 and c.notes == ()
    with pytest.raises(ValueError, match="^mechanism"):
        _ = Calibration("laplace", 2.0, 1.0, 1.0, 1.0, 0.0, "pure", "replace").noise_multiplier
