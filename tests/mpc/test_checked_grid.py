"""The semi-honest in-MPC bound check on a grid where it fits (mpc_erm.mpc.aggregator.realise_checked).

Found by the privacy audit through the daemons: Adult with 1,000 audit columns (d = 1,104) put
each party's bound at 9.5·10^7 grid units on the default grid, where the check's exact squared
norms do not fit the int64 ring; the first aggregate raised, after the round had been marked, so
the job failed and was charged. Now the worker takes the finest coarser grid where the check fits
(rounding at most 5 % of the sensitivity), and refuses before anything is charged when none does.
Since the check sums its chunks up a tree (only M itself is limited, to ≈ 10^8 units), that job
fits its default grid; a job of 20,000 features (M ≈ 1.9·10^8 on its default grid) is the wide
one here, and one of 200,000 fits no allowed grid."""

from __future__ import annotations

import pytest

from mpc_erm.mpc.aggregator import realise_checked
from mpc_erm.mpc.noise import COARSE_GRID_SLACK, realise
from mpc_erm.mpc.validation import CheckPlan, ValidationError, bound_units
from mpc_erm.privacy.plan import PublicSizes, plan_job
from mpc_erm.spec import JobSpec

SPEC = JobSpec.model_validate({"method": "gradient", "model": {"name": "logistic", "lam": 1e-4},
                               "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0},
                               "training": {"iterations": 50, "learning_rate": 20.0}})


def _plan(d: int, counts: tuple[int, ...] = (10_054, 10_054, 11_054)):  # type: ignore[no-untyped-def]
    return plan_job(SPEC, sampler="mpc", sizes=PublicSizes(counts=counts), n_features=d)


def _fits(plan, g: int) -> bool:  # type: ignore[no-untyped-def]
    bounds = tuple(plan.member_bound(j) for j in range(3))
    try:
        CheckPlan(int(plan.dim), tuple(bound_units(b, g, int(plan.dim)) for b in bounds))
    except ValidationError:
        return False
    return True


def test_a_wide_job_takes_the_finest_grid_where_the_check_fits() -> None:
    plan = _plan(20_000)
    default = realise(plan, 3)
    assert not _fits(plan, default.plan.grid_bits)  # M ≈ 1.9·10^8 units: 4τ² over the ring
    bounds = tuple(plan.member_bound(j) for j in range(3))
    chosen = realise_checked(plan, 3, bounds)
    g = chosen.plan.grid_bits
    assert g < default.plan.grid_bits and _fits(plan, g) and not _fits(plan, g + 1)
    assert chosen.multiplier >= float(plan.noise_multiplier)  # the noise meets the plan on it, rounding counted
    assert (chosen.plan.slack or 0.0) <= COARSE_GRID_SLACK
    assert chosen.report_scale / default.report_scale <= 1.0 + COARSE_GRID_SLACK


def test_a_narrow_job_keeps_the_default_grid_and_unchecked_jobs_are_untouched() -> None:
    plan = _plan(104)
    bounds = tuple(plan.member_bound(j) for j in range(3))
    assert realise_checked(plan, 3, bounds).plan.grid_bits == realise(plan, 3).plan.grid_bits
    audit = _plan(1104)  # the audit's job: fits its default grid since the partial-sum tree
    assert _fits(audit, realise(audit, 3).plan.grid_bits)
    wide = _plan(20_000)
    assert realise_checked(wide, 3, None).plan.grid_bits == realise(wide, 3).plan.grid_bits


def test_a_job_no_allowed_grid_fits_is_refused_naming_the_fields() -> None:
    plan = _plan(200_000)  # fitting M needs a grid whose rounding of 200,000 coordinates is > 5 % of Δ
    bounds = tuple(plan.member_bound(j) for j in range(3))
    with pytest.raises(ValueError, match=r"privacy.clip / job.features: .* 200000 coordinates"):
        realise_checked(plan, 3, bounds)
