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
