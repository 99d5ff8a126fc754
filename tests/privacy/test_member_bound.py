"""The public bound a member's contribution is checked against, for Poisson-subsampled rounds: a
member's clipped sum is projected into the ball of b̄·C, b̄ the 2^-40 upper tail of its batch, so
the check's bound is 150× tighter than "every row sampled" at MNIST's rate and fits the ring
(the MNIST CNN job through the daemons failed its first round with a bound of 4·10⁹ grid units)."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from mpc_erm.mpc.noise import realise
from mpc_erm.mpc.validation import CheckPlan, bound_units
from mpc_erm.privacy.plan import PublicSizes, plan_job
from mpc_erm.protocols.aggregation import NoiseSpec
from mpc_erm.protocols.dpsgd import DpSgd
from mpc_erm.spec import JobSpec


def _mnist(q: float = 256 / 60_000, n_hat: int = 60_000, rounds: int = 2344) -> JobSpec:
    return JobSpec.model_validate({
        "method": "gradient", "model": {"name": "mnist_cnn", "input_shape": [1, 28, 28], "n_classes": 10},
        "privacy": {"epsilon": 1.02, "delta": 1e-5, "clip": 1.0, "adjacency": "add_remove", "public_n": n_hat,
                    "accountant": "rdp"},
        "training": {"iterations": rounds, "learning_rate": 0.32, "sampling_rate": q}})


@pytest.mark.parametrize(("n_hat", "q"), [(60_000, 256 / 60_000), (1_000, 0.05), (100, 0.5), (50_000, 0.001)])
def test_the_batch_cap_is_the_binomials_2_to_the_minus_40_tail_and_not_much_more(n_hat: int, q: float) -> None:
    plan = plan_job(_mnist(q, n_hat, 10), sampler="mpc", sizes=PublicSizes(public_n=n_hat))
    cap = plan.batch_cap()
    assert stats.binom.sf(cap, n_hat, q) <= 2.0**-40  # an honest member's batch exceeds it that rarely
    exact = int(stats.binom.isf(2.0**-40, n_hat, q))
    assert cap <= max(1.35 * exact, exact + 12), (cap, exact)  # a Chernoff bound, close to the exact quantile


def test_the_mnist_jobs_check_fits_the_ring() -> None:
    plan = plan_job(_mnist(), sampler="mpc", sizes=PublicSizes(public_n=60_000))
    real = realise(plan, 3)
    g, dim = real.plan.grid_bits, int(plan.dim or 0)
    assert plan.batch_cap() == 390 and plan.member_bound(0) == pytest.approx(390 / 256)
    CheckPlan(dim, (bound_units(plan.member_bound(0), g, dim),) * 3)  # raised ValidationError with C/q = 234
    with pytest.raises(ValueError, match="no room"):
        CheckPlan(dim, (bound_units(plan.clip / plan.sampling_rate, g, dim),))


class _Capture:
    """A SecureAggregator that keeps what it was given (and reveals zeros)."""

    trust_model = "test"

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []

    def aggregate(self, contributions: torch.Tensor, weights: torch.Tensor, noise: NoiseSpec) -> torch.Tensor:
        self.rows.append(contributions.clone())
        return torch.zeros(contributions.shape[1], dtype=torch.float64)


def test_a_members_clipped_sum_is_projected_into_the_public_ball_before_it_is_shared() -> None:
    spec = _mnist(rounds=1)
    job = DpSgd(spec)
    radius = job.plan.contribution_radius()
    assert radius == job.plan.batch_cap() * spec.privacy.clip
    agg = _Capture()
    p = job.p
    big = torch.zeros(2, p, dtype=torch.float64)
    big[0, 0] = 10 * radius  # a batch far over the cap: projected onto the sphere of radius b̄·C
    big[1, 1] = 0.5 * radius  # inside: unchanged
    job.round(agg, big, NoiseSpec("none", 0.0))
    (seen,) = agg.rows
    assert float(seen[0].norm()) == pytest.approx(radius) and float(seen[1].norm()) == pytest.approx(0.5 * radius)
    assert math.isinf(plan_job(_mnist(q=1.0, rounds=1), sizes=PublicSizes(public_n=60_000),
                               n_features=None).contribution_radius())  # full batch: no projection
