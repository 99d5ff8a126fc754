"""A compute party's own share of distributed noise (mpc_erm.mpc.local_noise): the in-MPC
sampler's algorithm in the clear on AES-CTR uniforms, so its samples follow the exact PMF the TV
bound is computed for; fresh keys make every party's share its own."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from mpc_erm.mpc.local_noise import DistributedNoise, KeystreamIntegers
from mpc_erm.mpc.noise import plan_noise
from mpc_erm.protocols.aggregation import NoiseSpec

SPEC = NoiseSpec("gaussian", 3.0 * 2.0**-10, sensitivity=1.0, grid_bits=10)  # σ = 3 grid units: a PMF to bin


def test_keystream_integers_are_in_range_and_uniform() -> None:
    rng = KeystreamIntegers(bytes(range(32)))
    for bits in (1, 3, 56, 62):
        x = rng.integers(0, 1 << bits, size=(4, 5000))
        assert x.shape == (4, 5000) and x.dtype == np.int64 and x.min() >= 0 and x.max() < 1 << bits
    small = rng.integers(0, 8, size=80_000)
    assert stats.chisquare(np.bincount(small, minlength=8)).pvalue > 1e-4
    with pytest.raises(ValueError, match="2\\^b"):
        rng.integers(0, 6, size=3)


def test_shares_follow_the_exact_pmf_of_the_realised_sampler() -> None:
    params = plan_noise(SPEC, 1, 1).params
    src = DistributedNoise()
    n = 200_000
    x = src.take(n, SPEC).numpy()
    support = np.arange(-params.support_max, params.support_max + 1)
    pmf = np.exp(params.log_pmf())
    assert pmf.size == support.size and abs(pmf.sum() - 1) < 1e-9
    keep = pmf * n >= 20  # bins with enough mass for the χ² approximation; the rest pooled
    observed = np.array([np.sum(x == v) for v in support[keep]] + [np.sum(~np.isin(x, support[keep]))])
    expected = np.concatenate([pmf[keep], [pmf[~keep].sum()]]) * n
    assert stats.chisquare(observed, expected).pvalue > 1e-4
    assert np.var(x) == pytest.approx(params.sigma**2, rel=0.02)
    assert src.stats()["samples"] == n and src.stats()["online_samples"] == n


def test_each_party_draws_its_own_share_and_top_up_samples_ahead() -> None:
    a, b = DistributedNoise(), DistributedNoise()
    a.prepare(SPEC, 1000, releases=3)
    assert a.stats()["samples"] == 1000  # one release ahead, not the whole job
    xa, xb = a.take(1000, SPEC), b.take(1000, SPEC)
    assert a.stats()["online_samples"] == 0 and b.stats()["online_samples"] == 1000
    assert not bool((xa == xb).all())  # fresh keys: the parties' shares are independent
    assert a.precision_bits(SPEC, 1000) == 10
    a.top_up(SPEC, 1000)
    a.top_up(SPEC, 1000)  # already there: nothing more sampled
    assert a.stats()["samples"] == 2000
    with pytest.raises(ValueError, match="realised Gaussian"):
        a.take(5, NoiseSpec("gaussian", 1.0))  # no grid: not a realised spec
    assert math.isfinite(a.stats()["samples_per_second"])


class _Draws:
    """An rng stub returning the given (high, low) words in turn, to pin coins_below's comparison."""

    def __init__(self, *arrays: np.ndarray) -> None:
        self.arrays = list(arrays)

    def integers(self, low: int, high: int, size: object = None, dtype: object = None) -> np.ndarray:
        return self.arrays.pop(0)


def test_wide_coins_compare_two_words_exactly_and_narrow_ones_draw_as_before() -> None:
    """Coins wider than 62 bits (distributed noise only): U = H·2^(k−62) + L against c, exactly at
    every boundary (L drawn for the ties alone); frequencies match c/2^k, also when the threshold's
    high word is hit (c_hi small); k ≤ 62 makes the same single draw as always."""
    from mpc_erm.mpc.samplers.reference import coins_below

    a, b = np.random.default_rng(7), np.random.default_rng(7)
    c = (1 << 61) + 12345
    assert np.array_equal(coins_below(a, 62, c, 1000), b.integers(0, 1 << 62, size=1000, dtype=np.int64) < c)
    k, low = 90, 28
    c = (987654321 << low) + 4242
    hi = np.array([987654320, 987654321, 987654321, 987654321, 987654322], dtype=np.int64)
    lo = np.array([4241, 4242, 4243], dtype=np.int64)  # drawn for the three ties with C_H only
    assert coins_below(_Draws(hi, lo), k, c, 5).tolist() == [True, True, False, False, False]  # U < c
    rng = np.random.default_rng(3)
    for k in (70, 100, 124):
        p = 0.3
        c = int(p * 2**53) << (k - 53)
        got = coins_below(rng, k, c, 400_000).mean()
        assert abs(got - c / 2**k) < 5 * math.sqrt(p * (1 - p) / 400_000), (k, got)
        assert not coins_below(rng, k, 0, 100).any() and coins_below(rng, k, 1 << k, 100).all()
    # ties on the high word happen (C_H = 1: a tie has probability 2^-62 in general, here forced by
    # a stub returning H = C_H everywhere): the low word decides, at the rate C_L/2^low
    low = 20
    stub = _Draws(np.ones(100_000, dtype=np.int64), np.random.default_rng(9).integers(0, 1 << low, 100_000))
    tied = coins_below(stub, 62 + low, (1 << low) + (1 << (low - 2)), 100_000).mean()
    assert abs(tied - 0.25) < 0.01
    with pytest.raises(ValueError, match="at most 124"):
        coins_below(rng, 125, 1, 3)


def test_wide_coin_shares_follow_their_exact_pmf_and_the_mpc_refuses_them() -> None:
    """An 88-bit-coin realisation: the shares' χ² against the PMF its TV bound is computed for; the
    MPC's samplers refuse coins past 62 bits before drawing anything."""
    from mpc_erm.mpc.samplers.discrete_gaussian import sample_discrete_gaussian_integers
    from mpc_erm.mpc.samplers.discrete_laplace import laplace_parts

    spec = NoiseSpec("gaussian", 3.0 * 2.0**-10, sensitivity=1.0, grid_bits=10, coin_bits=88)
    params = plan_noise(spec, 1, 1).params
    assert params.k == 88
    n = 200_000
    x = DistributedNoise().take(n, spec).numpy()
    support = np.arange(-params.support_max, params.support_max + 1)
    pmf = np.exp(params.log_pmf())
    keep = pmf * n >= 20
    observed = np.array([np.sum(x == v) for v in support[keep]] + [np.sum(~np.isin(x, support[keep]))])
    expected = np.concatenate([pmf[keep], [pmf[~keep].sum()]]) * n
    assert stats.chisquare(observed, expected).pvalue > 1e-4
    with pytest.raises(ValueError, match="at most 62-bit coins"):
        sample_discrete_gaussian_integers(params, 10)
    with pytest.raises(ValueError, match="at most 62-bit coins"):
        laplace_parts(params.laplace, 10)


def test_a_long_distributed_job_at_a_million_coordinates_realises_with_wide_coins() -> None:
    """A 1,000-round gradient job at D = 10⁶, δ = 10⁻⁵: with distributed noise its two honest shares
    need TV ≤ 2.7·10⁻¹¹ a release, past what 62-bit coins give (3.7·10⁻¹¹); the realisation takes the
    narrowest wider coins that fit, while the in-MPC sampler stays at ≤ 62 bits."""
    from benchmarks.aggregate import job_noise

    spec, real = job_noise(1_000_000, 1000, 3, "distributed")
    assert spec.coin_bits is not None and 62 < spec.coin_bits <= 124 and real["coin_bits"] == spec.coin_bits
    budget = 0.01 * 1e-5 / ((1 + math.e) * 1000)  # the plan's sampler share of δ, per release (events module)
    assert real["sampler_tv_per_release"] <= budget * (1 + 1e-9), (real["sampler_tv_per_release"], budget)
    mpc, _ = job_noise(1_000_000, 1000, 3)
    assert mpc.coin_bits is not None and mpc.coin_bits <= 62
    # and `report verify` recomputes the wide coins' TV from the report alone
    from mpc_erm.mpc.noise import realise
    from mpc_erm.privacy.distributed import NoiseSplit
    from mpc_erm.privacy.plan import PublicSizes, plan_job
    from mpc_erm.privacy.verify import verify_report
    from mpc_erm.spec import JobSpec

    job = JobSpec.model_validate({"method": "gradient", "model": {"name": "logistic", "lam": 1e-4},
                                  "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0, "noise": "distributed"},
                                  "training": {"iterations": 1000}})
    plan = plan_job(job, sampler="mpc", sizes=PublicSizes(counts=(10_000,) * 3), n_features=999_999,
                    noise_split=NoiseSplit(3, 2))
    r = realise(plan, 3)
    rep = plan.report(noise_scale=r.report_scale, realisation=r.describe(),
                      trust_model="MPC: CrypTen 3-party replicated sharing (test)", parties=3)
    v = verify_report(rep)
    assert v.ok, [c for c in v.checks if not c.ok]
