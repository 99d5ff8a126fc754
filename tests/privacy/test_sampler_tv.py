"""The verifier's total-variation bound (mpc_erm.privacy.sampler_tv), written apart from the
samplers' code, against the samplers' own (mpc_erm.mpc.samplers.guarantee) over the parameters
a job realises: revealed and oblivious rejection, small and large σ, coarse and fine coins."""

from __future__ import annotations

import pytest

from mpc_erm.mpc.samplers.gaussian import DiscreteGaussianParams
from mpc_erm.mpc.samplers.guarantee import gaussian_tv_bound, laplace_tv_bound
from mpc_erm.mpc.samplers.params import DiscreteLaplaceParams
from mpc_erm.privacy.sampler_tv import acceptance_lower_bound, sampler_sigma, tv_per_release


def _described(p: DiscreteGaussianParams) -> dict:
    return {"kind": "discrete_gaussian", "t": p.t, "mu": p.mu, "revealed": p.revealed, "rounds": p.rounds, "k": p.k,
            "laplace_bits": p.magnitude_bits, "fair_bits": p.fair_bits, "low_bit": p.low_bit,
            "test_coins": len(p.coin_thresholds)}


@pytest.mark.parametrize("sigma, grid, k, rounds", [(0.3, 10, 56, None), (2.5, 16, 40, None), (1e-3, 24, 56, None),
                                                   (0.05, 20, 48, 12), (4.0, 12, 56, 30), (1.7, 18, 32, None)])
def test_the_gaussian_bound_is_the_samplers(sigma: float, grid: int, k: int, rounds: int | None) -> None:
    p = DiscreteGaussianParams.for_sigma(sigma, grid_bits=grid, k=k, rounds=rounds)
    assert p.fair_bits > 0 or rounds is not None or p.t < 64  # revealed rejection's staircase candidates
    described = _described(p)
    assert sampler_sigma(described) == pytest.approx(p.sigma, rel=1e-15)
    assert tv_per_release(described, 1) == pytest.approx(gaussian_tv_bound(p), rel=1e-9)
    assert tv_per_release(described, 250, honest=2) == pytest.approx(500 * gaussian_tv_bound(p), rel=1e-9)


@pytest.mark.parametrize("t, bits, k", [(3.0, 12, 48), (44628.6, 26, 56), (1e6, 30, 40), (0.7, 6, 20)])
def test_the_laplace_bound_is_the_samplers(t: float, bits: int, k: int) -> None:
    p = DiscreteLaplaceParams(t=t, bits=bits, k=k)
    described = {"kind": "discrete_laplace", "t": p.t, "bits": p.bits, "k": p.k}
    assert sampler_sigma(described) == t
    assert tv_per_release(described, 104) == pytest.approx(104 * laplace_tv_bound(p), rel=1e-12)


def test_the_acceptance_rate_is_a_lower_bound_near_the_exact_one() -> None:
    """A short exact sum at small scale: ρ from the Laplace PMF and the acceptance probabilities."""
    import math

    t, mu = 4, 9
    q = math.exp(-1 / t)
    exact = sum((1 - q) / (1 + q) * q ** abs(y) * math.exp(-((abs(y) - mu) ** 2) / (2 * t * mu))
                for y in range(-2000, 2001))
    rho = acceptance_lower_bound(t, mu)
    assert rho <= exact and rho == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("fair", [1, 2, 3])
def test_the_staircase_acceptance_rate_is_the_proposal_summed_by_hand(fair: int) -> None:
    """Staircase candidates written out the long way: Z ~ Bernoulli(p_Z), G = R + 2^F·G' with R uniform
    and G' geometric of ratio q^(2^F), sign fair; acceptance exp(−N/D), N = (|y| − μ)² + 2μR."""
    import math

    t, mu = 12, 10
    q = math.exp(-1 / t)
    big_q = q ** (2**fair)
    p_z = 2 ** (fair + 1) * q / (2 ** (fair + 1) * q + 1 - big_q)
    exact = 1 - p_z  # y = 0: N = μ², and exp(−μ²/D) below
    exact *= math.exp(-(mu**2) / (2 * t * mu))
    for g in range(0, 4000):
        r, h = g % 2**fair, g // 2**fair
        m = 1 + g
        pm = p_z * (1 - big_q) * big_q**h / 2**fair  # both signs together
        exact += pm * math.exp(-((m - mu) ** 2 + 2 * mu * r) / (2 * t * mu))
    rho = acceptance_lower_bound(t, mu, fair_bits=fair)
    assert rho <= exact and rho == pytest.approx(exact, rel=1e-9)


def test_unknown_samplers_and_missing_parameters_are_errors_not_zeros() -> None:
    with pytest.raises(ValueError, match="realisation.sampler.kind"):
        tv_per_release({"kind": "uniform"}, 10)
    with pytest.raises(KeyError):
        tv_per_release({"kind": "discrete_laplace", "t": 3.0, "k": 48}, 10)
