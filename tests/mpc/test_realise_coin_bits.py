"""A job's Gaussian noise gets the cheapest coins whose sampler TV fits the plan's budget
(mpc_erm.mpc.noise.realise, GAUSSIAN_COIN_BITS): a small job gets coarser coins than 56 bits, a 10⁵-parameter
1,000-round job (issue 15's workload, refused before) gets finer ones, and a job beyond 62 bits
is still refused naming what to change."""

from __future__ import annotations

import pytest

from mpc_erm.mpc.noise import GAUSSIAN_COIN_BITS, Realisation, realise
from mpc_erm.mpc.samplers.guarantee import gaussian_tv_bound
from mpc_erm.privacy.plan import PrivacyPlan, PublicSizes, plan_job
from mpc_erm.spec import JobSpec


def _plan(n_features: int, iterations: int):
    spec = JobSpec.model_validate({
        "method": "gradient", "model": {"name": "logistic", "lam": 1e-4},
        "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0}, "training": {"iterations": iterations}})
    return plan_job(spec, sampler="mpc", sizes=PublicSizes(counts=(10000, 10000, 10000)), n_features=n_features)


def test_a_small_job_gets_the_cheapest_coins_that_fit() -> None:
    """5,200 samples at ε = 1, δ = 1e-5: 44-bit coins fit (40 do not), 12 AND gates a coin fewer than 56."""
    plan = _plan(104, 50)
    real = realise(plan, 3)
    assert real.plan.params.k == 44 and real.describe()["coin_bits"] == 44
    assert real.tv_per_release <= plan.sampler_tv_per_release
    _no_cheaper_coins_fit(real, plan)


def test_a_large_job_gets_the_cheapest_coins_that_fit() -> None:
    plan = _plan(99_999, 1000)  # d = 10^5 coordinates, 10^8 samples
    real = realise(plan, 3)
    k = real.plan.params.k
    assert k > 56 and real.tv_per_release <= plan.sampler_tv_per_release
    assert real.multiplier >= plan.noise_multiplier  # the noise still meets the plan
    _no_cheaper_coins_fit(real, plan)


def _no_cheaper_coins_fit(real: Realisation, plan: PrivacyPlan) -> None:
    from mpc_erm.mpc.samplers.gaussian import DiscreteGaussianParams

    assert real.plan.params.k in GAUSSIAN_COIN_BITS
    for fewer in (b for b in GAUSSIAN_COIN_BITS if b < real.plan.params.k):
        p = DiscreteGaussianParams.for_sigma(real.spec.scale, grid_bits=real.plan.grid_bits, k=fewer)
        assert real.plan.dim * gaussian_tv_bound(p) > plan.sampler_tv_per_release


def test_a_job_beyond_the_finest_coins_is_refused() -> None:
    with pytest.raises(ValueError, match="total-variation bound .* exceeds the plan's budget"):
        realise(_plan(999_999, 2000), 3)  # 2·10^9 samples


def test_the_realisation_of_a_plan_is_computed_once_per_process() -> None:
    """Owners sharing a process (benchmarks) each realised the same plan with mpmath: at 10,000
    owners that was a large share of their CPU. A plan is frozen, the realisation a pure function."""
    plan = _plan(104, 50)
    assert realise(plan, 3) is realise(_plan(104, 50), 3)
    assert realise(plan, 3) is not realise(plan, 4)
