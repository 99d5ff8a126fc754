"""The malicious-secure mode's grid (mpc_erm.mpc.verified_aggregator.realise_verified): the finest
grid at which every party's norm statement fits F_p within its bit allowance. The MNIST CNN's
DP-SGD job (d = 26,010, Poisson q = 256/60,000), whose statement does not fit cheaply on the
default grid, is taken one or two bits coarser; the noise still meets the plan on it with the
extra rounding counted; a small job keeps the default grid; a job no grid fits is refused naming
``job.security``."""

from __future__ import annotations

import math

import pytest

from mpc_erm.mpc.local_noise import DistributedNoise
from mpc_erm.mpc.noise import realise
from mpc_erm.mpc.samplers.guarantee import grid_sensitivity_units
from mpc_erm.mpc.verified_aggregator import MALICIOUS_GRID_SLACK, realise_verified, statements
from mpc_erm.privacy.distributed import NoiseSplit
from mpc_erm.privacy.plan import PrivacyPlan, PublicSizes, plan_job
from mpc_erm.spec import JobSpec

SPLIT = NoiseSplit(3, 2)


def _cnn_plan() -> PrivacyPlan:
    spec = JobSpec.model_validate({
        "method": "gradient", "model": {"name": "mnist_cnn", "input_shape": [1, 28, 28], "n_classes": 10},
        "privacy": {"epsilon": 0.6138, "delta": 1e-5, "clip": 1.0, "accountant": "rdp", "noise": "distributed",
                    "adjacency": "add_remove", "public_n": 60_000},
        "training": {"iterations": 234, "sampling_rate": 256 / 60_000}})
    return plan_job(spec, sampler="mpc", n_features=784, noise_split=SPLIT)


def _linear_plan(n_features: int, clip: float = 1.0) -> PrivacyPlan:
    spec = JobSpec.model_validate({
        "method": "gradient", "model": {"name": "logistic", "lam": 1e-4},
        "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": clip, "noise": "distributed"},
        "training": {"iterations": 20}})
    return plan_job(spec, sampler="mpc", sizes=PublicSizes(counts=(10_000, 10_000, 10_000)), n_features=n_features,
                    noise_split=SPLIT)


def _bounds(plan: PrivacyPlan) -> tuple[float, ...]:
    return tuple(plan.member_bound(j) for j in range(3))


def _bits(plan: PrivacyPlan, g: int) -> int | None:
    """The costliest party's range-checked bits on the grid 2^-g, None when it does not fit."""
    real = realise(plan, 3, grid_bits=g)
    try:
        return max(s.shape.bit_count for s in statements(DistributedNoise(), _bounds(plan), int(plan.dim), g,
                                                          real.spec))
    except ValueError:
        return None


@pytest.fixture(scope="module")
def cnn() -> PrivacyPlan:
    return _cnn_plan()


def test_the_cnn_job_takes_the_finest_grid_whose_statement_fits_cheaply(cnn: PrivacyPlan) -> None:
    default = realise(cnn, 3)
    chosen = realise_verified(cnn, DistributedNoise(), _bounds(cnn))
    g, dim = chosen.plan.grid_bits, int(cnn.dim)
    assert g < default.plan.grid_bits  # the default grid's statement is too costly (or does not fit)
    bits = _bits(cnn, g)
    assert bits is not None and bits <= dim
    finer = _bits(cnn, g + 1)
    assert finer is None or finer > dim  # and no finer grid would have done
    assert chosen.plan.slack is not None and chosen.plan.slack <= MALICIOUS_GRID_SLACK


def test_on_the_coarser_grid_the_noise_still_meets_the_plan_with_the_rounding_counted(cnn: PrivacyPlan) -> None:
    chosen = realise_verified(cnn, DistributedNoise(), _bounds(cnn))
    g, dim = chosen.plan.grid_bits, int(cnn.dim)
    s_grid = grid_sensitivity_units(cnn.sensitivity(), g, dim, 3, "l2")  # Δ·2^g + m·√d, recomputed here
    assert math.isclose(chosen.sensitivity_grid, s_grid, rel_tol=1e-12)
    assert chosen.noise_scale_grid >= float(cnn.noise_multiplier) * s_grid
    # What the mode costs in noise: the release's σ (real units) grows only by the extra rounding.
    default = realise(cnn, 3)
    growth = chosen.report_scale / default.report_scale
    assert 1.0 < growth <= 1.0 + MALICIOUS_GRID_SLACK


def test_a_small_job_keeps_the_default_grid() -> None:
    plan = _linear_plan(121)
    assert realise_verified(plan, DistributedNoise(), _bounds(plan)).plan.grid_bits == realise(plan, 3).plan.grid_bits


def test_a_job_no_grid_fits_is_refused_naming_the_field() -> None:
    plan = _linear_plan(99_999)
    huge = (1e9, 1e9, 1e9)  # contribution bounds 10^9 times the sensitivity's scale: no grid within 5 % fits
    with pytest.raises(ValueError, match=r'^job\.security: "malicious"') as err:
        realise_verified(plan, DistributedNoise(), huge)
    assert 'security = "semi-honest"' in str(err.value)
