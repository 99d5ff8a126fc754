"""Plaintext samplers (mpc_erm.privacy.noise): fixed seeds, explicit tolerances.

Tolerances: with N samples the std estimate has relative s.e. ≈ √((κ−1)/(4N)) (κ: kurtosis),
so 1 % at N = 2·10⁵ is > 4 s.e. for the Gaussian (κ=3) and > 3 s.e. for the Laplace (κ=6).
KS tests use a fixed seed and require p > 1e-3 (the draws are deterministic given the seed).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from mpc_erm.privacy import (
    l2_laplace_coordinate_std,
    l2_laplace_norm_mean,
    laplace_coordinate_std,
    sample_gamma,
    sample_noise,
)

N = 200_000


def _gen(seed: int = 1234) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_gaussian_sampler() -> None:
    x = sample_noise("gaussian", 0.37, (N,), _gen())
    assert x.dtype == torch.float64 and x.shape == (N,)
    assert float(x.std()) == pytest.approx(0.37, rel=0.01)
    assert abs(float(x.mean())) < 4 * 0.37 / math.sqrt(N)
    assert stats.kstest(x.numpy(), stats.norm(scale=0.37).cdf).pvalue > 1e-3


def test_laplace_sampler() -> None:
    b = 2.5
    x = sample_noise("laplace", b, (N,), _gen())
    assert float(x.std()) == pytest.approx(laplace_coordinate_std(b), rel=0.01)
    assert abs(float(x.mean())) < 4 * laplace_coordinate_std(b) / math.sqrt(N)
    assert stats.kstest(x.numpy(), stats.laplace(scale=b).cdf).pvalue > 1e-3
    assert torch.isfinite(x).all()


@pytest.mark.parametrize("d", [1, 3, 50])
def test_l2_laplace_sampler(d: int) -> None:
    s = 0.2
    rows = 40_000
    x = sample_noise("l2_laplace", s, (rows, d), _gen(d))
    norms = x.norm(dim=-1)
    # norm ~ Gamma(d, s)
    assert stats.kstest(norms.numpy(), stats.gamma(d, scale=s).cdf).pvalue > 1e-3
    assert float(norms.mean()) == pytest.approx(l2_laplace_norm_mean(d, s), rel=0.01)
    # per-coordinate std √(d+1)·s (E‖b‖² = d(d+1)s²)
    coord_std = x.std(dim=0)
    assert torch.allclose(
        coord_std, torch.full((d,), l2_laplace_coordinate_std(d, s), dtype=x.dtype), rtol=0.03
    )
    # directions uniform on the sphere: mean ≈ 0, and (u₁+1)/2 ~ Beta((d−1)/2, (d−1)/2)
    u = x / norms.unsqueeze(-1)
    assert float(u.mean(dim=0).abs().max()) < 5 / math.sqrt(d * rows)
    if d >= 3:
        a = (d - 1) / 2
        assert stats.kstest(((u[:, 0] + 1) / 2).numpy(), stats.beta(a, a).cdf).pvalue > 1e-3
    else:  # d = 1: a random sign
        assert float((u.abs() - 1).abs().max()) < 1e-12


def test_l2_laplace_rows_over_leading_dims() -> None:
    x = sample_noise("l2_laplace", 1.0, (4, 5, 6), _gen())
    assert x.shape == (4, 5, 6)
    assert len(set(x.norm(dim=-1).flatten().tolist())) == 20  # independent vectors per row


@pytest.mark.parametrize("k", [1.0, 2.5, 30.0, 5000.0])
def test_gamma_sampler_ks(k: float) -> None:
    g = sample_gamma(k, (50_000,), _gen(7))
    assert stats.kstest(g.numpy(), stats.gamma(k).cdf).pvalue > 1e-3


def test_seeding_and_dtype() -> None:
    for mech in ("gaussian", "laplace", "l2_laplace"):
        a = sample_noise(mech, 1.0, (10, 4), _gen(5))
        b = sample_noise(mech, 1.0, (10, 4), _gen(5))
        c = sample_noise(mech, 1.0, (10, 4), _gen(6))
        f32 = sample_noise(mech, 1.0, (10, 4), _gen(5), dtype=torch.float32)
        assert torch.equal(a, b)
        assert not torch.equal(a, c)
        assert f32.dtype == torch.float32
        assert torch.equal(f32, a.to(torch.float32))  # same stream whatever the dtype
    z = sample_noise("none", 0.0, 7, _gen())
    assert torch.equal(z, torch.zeros(7, dtype=torch.float64))
    assert sample_noise("gaussian", 1.0, np.int64(3), _gen()).shape == (3,)


def test_validation_names_argument() -> None:
    with pytest.raises(ValueError, match="^mechanism "):
        sample_noise("cauchy", 1.0, 3, _gen())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^scale "):
        sample_noise("gaussian", -1.0, 3, _gen())
    with pytest.raises(ValueError, match="^scale "):
        sample_noise("gaussian", math.nan, 3, _gen())
    with pytest.raises(ValueError, match="^shape "):
        sample_noise("gaussian", 1.0, (3, -1), _gen())
    with pytest.raises(ValueError, match="^shape "):
        sample_noise("l2_laplace", 1.0, (), _gen())
    with pytest.raises(ValueError, match="^generator "):
        sample_noise("gaussian", 1.0, 3, 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^dtype "):
        sample_noise("gaussian", 1.0, 3, _gen(), dtype=torch.int64)
    with pytest.raises(ValueError, match="^shape_k "):
        sample_gamma(0.5, (3,), _gen())
