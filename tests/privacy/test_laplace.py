"""Laplace-type mechanisms (mpc_erm.privacy.laplace): moments of the ℓ2-Laplace mechanism by
numerical integration of its polar density, the ε of per-coordinate Laplace, and the 1-D
Laplace hockey-stick divergence against quadrature."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats
from scipy.special import gammaln

from mpc_erm.privacy import (
    l2_laplace_coordinate_std,
    l2_laplace_epsilon,
    l2_laplace_norm_mean,
    l2_laplace_norm_second_moment,
    l2_laplace_scale,
    laplace_coordinate_std,
    laplace_hockey_stick,
    laplace_scale,
    per_coordinate_laplace_epsilon,
)


@pytest.mark.parametrize("d", [1, 2, 5, 40])
def test_l2_laplace_norm_moments_from_density(d: int) -> None:
    """Density ∝ exp(−‖b‖/s) on ℝ^d; radial density ∝ r^{d−1}e^{−r/s}. Integrate it directly."""
    s = 0.7

    def radial(r: float, k: int) -> float:  # r^k × unnormalised radial density, in log form
        return (
            math.exp((d - 1 + k) * math.log(r) - r / s - gammaln(d) - d * math.log(s))
            if r > 0
            else 0.0
        )

    top = 50 * s * (d + 10)
    z0 = integrate.quad(radial, 0, top, args=(0,), limit=200, points=[(d - 1) * s])[0]
    m1 = integrate.quad(radial, 0, top, args=(1,), limit=200, points=[d * s])[0] / z0
    m2 = integrate.quad(radial, 0, top, args=(2,), limit=200, points=[(d + 1) * s])[0] / z0
    assert z0 == pytest.approx(1.0, rel=1e-8)  # it is the Gamma(d, s) density
    assert l2_laplace_norm_mean(d, s) == pytest.approx(m1, rel=1e-8)
    assert l2_laplace_norm_second_moment(d, s) == pytest.approx(m2, rel=1e-8)
    assert l2_laplace_coordinate_std(d, s) == pytest.approx(math.sqrt(m2 / d), rel=1e-8)


def test_l2_laplace_privacy_loss_bounded_by_eps() -> None:
    """log p(x−f)/p(x−f') = ε(‖x−f'‖ − ‖x−f‖)/Δ₂ ≤ ε for ‖f−f'‖ ≤ Δ₂ (random check)."""
    rng = np.random.default_rng(0)
    d, delta2, eps = 7, 0.3, 0.9
    s = l2_laplace_scale(delta2, eps)
    assert l2_laplace_epsilon(s, delta2) == pytest.approx(eps)
    x = rng.normal(size=(5000, d))
    f = rng.normal(size=d)
    u = rng.normal(size=(5000, d))
    fp = f + delta2 * u / np.linalg.norm(u, axis=1, keepdims=True)
    loss = (np.linalg.norm(x - fp, axis=1) - np.linalg.norm(x - f, axis=1)) / s
    assert loss.max() <= eps + 1e-12
    assert loss.max() > 0.95 * eps  # and it is nearly attained


def test_per_coordinate_laplace() -> None:
    assert laplace_scale(3.0, 0.5) == pytest.approx(6.0)
    assert laplace_coordinate_std(2.0) == pytest.approx(2.0 * math.sqrt(2))
    # the thesis's literal Lap(Δ₂/ε) per coordinate is √d·ε-DP: attained at a (1,…,1)/√d shift
    d, delta2, eps = 100, 0.01, 0.5
    assert per_coordinate_laplace_epsilon(delta2 / eps, delta2, d) == pytest.approx(10 * eps)
    shift = np.full(d, delta2 / math.sqrt(d))
    worst_loss = np.abs(shift).sum() / (delta2 / eps)  # ℓ1 privacy loss of i.i.d. Laplace
    assert worst_loss == pytest.approx(math.sqrt(d) * eps)
    # at equal ε, ℓ2-Laplace has ~√2 less per-coordinate noise than Laplace with Δ₁ = √d·Δ₂
    per_coord = laplace_coordinate_std(laplace_scale(math.sqrt(d) * delta2, eps))
    l2 = l2_laplace_coordinate_std(d, l2_laplace_scale(delta2, eps))
    assert per_coord / l2 == pytest.approx(math.sqrt(2 * d / (d + 1)))


@pytest.mark.parametrize(
    ("eps", "shift", "scale"), [(0.0, 1.0, 1.0), (0.5, 2.0, 1.0), (1.0, 0.5, 0.2), (3.0, 1.0, 1.0)]
)
def test_laplace_hockey_stick_matches_quadrature(eps: float, shift: float, scale: float) -> None:
    gamma = math.exp(eps)
    p = stats.laplace(loc=shift, scale=scale)
    q = stats.laplace(loc=0.0, scale=scale)
    val = integrate.quad(
        lambda x: max(0.0, p.pdf(x) - gamma * q.pdf(x)),
        -40 * scale,
        40 * scale + shift,
        points=[0.0, shift],
        limit=400,
        epsabs=1e-13,
    )[0]
    assert laplace_hockey_stick(eps, shift, scale) == pytest.approx(val, abs=1e-10)


def test_validation_names_argument() -> None:
    with pytest.raises(ValueError, match="^l1_sensitivity "):
        laplace_scale(0.0, 1.0)
    with pytest.raises(ValueError, match="^epsilon "):
        l2_laplace_scale(1.0, -1.0)
    with pytest.raises(ValueError, match="^dim "):
        l2_laplace_coordinate_std(0, 1.0)
    with pytest.raises(ValueError, match="^scale "):
        laplace_hockey_stick(1.0, 1.0, 0.0)


@pytest.mark.parametrize("d", [1, 10, 122, 2000])
def test_pure_epsilon_in_mpc_costs_at_most_sqrt2_in_noise_norm(d: int) -> None:
    """What refusing ℓ2-Laplace inside the MPC costs (mpc_erm.mpc.noise): the pure-ε mechanism
    that is sampled there, per-coordinate Laplace with Δ₁ = √d·Δ₂, has an RMS noise norm
    √(2d/(d+1)) ≤ √2 times that of ℓ2-Laplace at the same ε. Calibrations from the product,
    norms from sampling both ideal laws (Gamma × uniform direction; iid Laplace)."""
    import torch

    from mpc_erm.privacy import calibrate_output_perturbation
    from mpc_erm.privacy.noise import sample_noise

    d2, eps, n = 0.3, 0.8, 4000
    l2 = calibrate_output_perturbation(d2, d, eps, mechanism="l2_laplace")
    coord = calibrate_output_perturbation(d2, d, eps, mechanism="laplace_thesis")
    assert coord.scale == pytest.approx(math.sqrt(d) * d2 / eps, rel=1e-12)
    ratio = math.sqrt(2 * d * coord.scale**2 / l2_laplace_norm_second_moment(d, l2.scale))
    assert ratio == pytest.approx(math.sqrt(2 * d / (d + 1)), rel=1e-12) and ratio < math.sqrt(2)
    gen = torch.Generator().manual_seed(d)
    rms = [float(sample_noise(mech, cal.scale, (n, d), gen).pow(2).sum(1).mean().sqrt())
           for mech, cal in (("l2_laplace", l2), ("laplace", coord))]
    assert rms[1] / rms[0] == pytest.approx(ratio, rel=0.1 if d == 1 else 0.03)
