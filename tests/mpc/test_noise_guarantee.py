"""The job-level guarantee of the in-MPC noise (mpc_erm.mpc.samplers.guarantee) and the grid plan
(mpc_erm.mpc.noise.plan_noise), checked against exact PMFs and independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mpc_erm.mpc.noise import GRID_SLACK, plan_noise
from mpc_erm.mpc.samplers import DiscreteGaussianParams, DiscreteLaplaceParams
from mpc_erm.mpc.samplers.gaussian import ideal_acceptance_lower_bound, ideal_discrete_gaussian_log_pmf
from mpc_erm.mpc.samplers.guarantee import (
    discrete_gaussian_guarantee,
    discrete_laplace_guarantee,
    gaussian_tv_bound,
    grid_sensitivity_units,
    laplace_tv_bound,
)
from mpc_erm.mpc.samplers.pmf import ideal_discrete_laplace_log_pmf, log_pmf
from mpc_erm.protocols.aggregation import NoiseSpec


def _tv(lp_impl: np.ndarray, m_impl: int, lp_ideal: np.ndarray, m_ideal: int) -> float:
    """TV between two PMFs on −m…m (log space), the smaller support padded with zeros."""
    m = max(m_impl, m_ideal)
    a = np.zeros(2 * m + 1)
    b = np.zeros(2 * m + 1)
    a[m - m_impl : m + m_impl + 1] = np.exp(lp_impl)
    b[m - m_ideal : m + m_ideal + 1] = np.exp(lp_ideal)
    return 0.5 * float(np.abs(a - b).sum())


@pytest.mark.parametrize("k", [10, 14, 20])
def test_laplace_tv_bound_covers_the_exact_tv(k: int) -> None:
    params = DiscreteLaplaceParams(t=50.0, bits=9, k=k)  # truncation at 512 = 10 t: visible
    xs = np.arange(-5000, 5001)
    exact = _tv(log_pmf(params), params.support_max, ideal_discrete_laplace_log_pmf(50.0, xs), 5000)
    bound = laplace_tv_bound(params)
    assert exact <= bound
    assert bound < 50 * exact + 1e-12  # and not vacuous


@pytest.mark.parametrize("k,rounds", [(12, 4), (16, 6), (20, 10)])
def test_gaussian_tv_bound_covers_the_exact_tv(k: int, rounds: int) -> None:
    params = DiscreteGaussianParams(t=6, mu=4, rounds=rounds, k=k)
    m_ideal = 400
    ideal = ideal_discrete_gaussian_log_pmf(params.sigma, np.arange(-m_ideal, m_ideal + 1))
    exact = _tv(params.log_pmf(), params.support_max, ideal, m_ideal)
    bound = gaussian_tv_bound(params)
    assert exact <= bound
    assert bound < 1e3 * exact + 1e-12


@pytest.mark.parametrize("k", [12, 16, 20])
def test_gaussian_tv_bound_covers_the_exact_tv_with_revealed_rejection(k: int) -> None:
    params = DiscreteGaussianParams(t=6, mu=4, revealed=True, k=k)
    m_ideal = 400
    ideal = ideal_discrete_gaussian_log_pmf(params.sigma, np.arange(-m_ideal, m_ideal + 1))
    exact = _tv(params.log_pmf(), params.support_max, ideal, m_ideal)
    bound = gaussian_tv_bound(params)
    assert exact <= bound < 1e3 * exact + 1e-12
    oblivious = DiscreteGaussianParams(t=6, mu=4, rounds=26, k=k)
    assert bound < gaussian_tv_bound(oblivious) / 10  # ≈ 1/ρ candidates per output instead of R


def test_acceptance_lower_bound_is_below_the_exact_rate_and_tight() -> None:
    params = DiscreteGaussianParams(t=6, mu=4, rounds=2, k=60)  # k = 60: coins ≈ exact
    rho_impl = params.acceptance_rate()
    lower = ideal_acceptance_lower_bound(6, 4)
    assert lower <= rho_impl + 1e-12
    assert lower > rho_impl - 1e-9


def test_discrete_gaussian_renyi_divergence_is_at_most_the_continuous_one() -> None:
    """CKS 2020 Prop. 5, checked numerically: for integer shifts s, D_α(N_Z(0,σ²) ‖ N_Z(s,σ²)) ≤ αs²/(2σ²)."""
    for sigma in (0.7, 2.0, 5.0):
        xs = np.arange(-400, 401)
        lp = ideal_discrete_gaussian_log_pmf(sigma, xs)
        for s in (1, 2, 3):
            lq = np.concatenate([np.full(s, -np.inf), lp[:-s]])  # N_Z(s, σ²) on the same grid
            m = np.isfinite(lq) & (lp > -600)
            for alpha in (1.5, 2.0, 8.0, 32.0):
                d = np.logaddexp.reduce(alpha * lp[m] + (1 - alpha) * lq[m]) / (alpha - 1)
                assert d <= alpha * s * s / (2 * sigma * sigma) + 1e-9


def test_gaussian_guarantee_matches_an_independent_rdp_conversion() -> None:
    params = DiscreteGaussianParams.for_sigma(1e-3, grid_bits=24)
    g = discrete_gaussian_guarantee(params, 4e-5, dim=122, releases=500, delta=1e-5, parties=3)
    s_grid = 4e-5 * 2**24 + 3 * math.sqrt(122)
    assert g.sensitivity_grid == pytest.approx(s_grid)
    z = params.sigma / s_grid
    # classic RDP → (ε, δ) conversion (Mironov 2017, Prop. 3), an upper bound on dp_accounting's
    classic = min(500 * a / (2 * z * z) + math.log(1 / (1e-5 - g.delta_sampler)) / (a - 1)
                  for a in np.linspace(1.01, 200, 20000))
    assert g.epsilon <= classic
    assert g.epsilon >= 0.85 * classic  # dp_accounting's conversion is tighter, not different in kind
    assert 0 < g.delta_sampler < 1e-3 * 1e-5 * 100  # TV term: a small share of δ
    assert g.delta == 1e-5
    assert "discrete Gaussian" in g.accountant
    with pytest.raises(ValueError, match="rdp"):
        discrete_gaussian_guarantee(params, 4e-5, 122, 500, 1e-5, 3, accountant="gdp")  # type: ignore[arg-type]


def test_laplace_guarantee_is_the_ideal_ratio_bound() -> None:
    params = DiscreteLaplaceParams.for_scale(0.5, grid_bits=15, k=56)
    g = discrete_laplace_guarantee(params, l1_sensitivity=0.25, dim=10, parties=3)
    s_grid = grid_sensitivity_units(0.25, 15, 10, 3, "l1")
    assert g.epsilon == pytest.approx(s_grid / params.t)
    # independent: the worst log-ratio of the ideal discrete Laplace over an integer shift
    xs = np.arange(-200000, 200001)
    lp = ideal_discrete_laplace_log_pmf(params.t, xs)
    s = math.ceil(s_grid)
    assert float(np.max(lp[:-s] - lp[s:])) <= s / params.t + 1e-9
    assert g.delta == g.delta_sampler < 1e-12


@pytest.mark.parametrize("sigma,sens,dim", [(1.0, 0.1, 122), (1e-3, 4e-5, 122), (0.05, 0.01, 10**6), (200.0, 30.0, 5)])
def test_gaussian_plan_keeps_rounding_slack_small_within_the_caps(sigma: float, sens: float, dim: int) -> None:
    plan = plan_noise(NoiseSpec("gaussian", sigma, sensitivity=sens), dim=dim, parties=3)
    sigma_grid = plan.params.sigma
    assert 2**14 <= sigma_grid < 2**21
    assert plan.params.sigma * 2.0**-plan.grid_bits >= sigma  # never less noise than asked
    assert plan.params.sigma * 2.0**-plan.grid_bits <= sigma * (1 + 1e-3)
    capped = plan.grid_bits == min(20 - math.ceil(math.log2(sigma)), 40)  # σ ≤ 2^20 grid units, g ≤ 40
    assert plan.slack <= GRID_SLACK or capped


def test_laplace_plan_and_refusals() -> None:
    plan = plan_noise(NoiseSpec("laplace", 0.3, sensitivity=0.05), dim=30, parties=3)
    assert plan.slack <= GRID_SLACK
    assert plan.params.k == 56
    with pytest.raises(ValueError, match="l2_laplace.*not sampled inside the MPC"):
        plan_noise(NoiseSpec("l2_laplace", 1.0), dim=3, parties=3)
    with pytest.raises(ValueError, match="too large"):
        plan_noise(NoiseSpec("gaussian", 2.0**30), dim=3, parties=3)
