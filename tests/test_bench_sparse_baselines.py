"""The Fig. 2.1 baselines' privacy arithmetic (benchmarks.sparse_baselines), against independent
computations: the composition bound, the Gaussian calibration against dp-accounting directly, and
the Frank–Wolfe scores' sensitivity measured on neighbouring data sets."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from benchmarks import sparse_baselines as SB


def test_the_per_step_epsilon_composes_to_the_target_and_no_further() -> None:
    for eps, steps, delta in ((2.0, 10, 0.01), (10.0, 20, 0.01), (0.5, 5, 1e-5)):
        e0 = SB.per_step_epsilon(eps, steps, delta)
        assert SB.advanced_composition_epsilon(e0, steps, delta) <= eps + 1e-12
        assert SB.advanced_composition_epsilon(e0 * 1.001, steps, delta) > eps
        # the DRV bound itself, written out
        drv = math.sqrt(2 * steps * math.log(1 / delta)) * e0 + steps * e0 * (math.exp(e0) - 1)
        assert SB.advanced_composition_epsilon(e0, steps, delta) == min(steps * e0, drv)


@pytest.mark.long  # 20 s of PLD bisections for a benchmark's comparator: CI's long run keeps it
def test_the_statistics_noise_meets_its_target_by_dp_accounting() -> None:
    for eps, delta in ((1.0, 0.005), (5.0, 0.005)):
        z = SB.ssp_noise_multiplier(eps, delta)
        acc = dp_accounting.pld.PLDAccountant()
        acc.compose(dp_accounting.GaussianDpEvent(z), 2)
        assert acc.get_epsilon(delta) <= eps
        tighter = dp_accounting.pld.PLDAccountant()
        tighter.compose(dp_accounting.GaussianDpEvent(z * 0.98), 2)
        assert tighter.get_epsilon(delta) > eps


def test_one_replaced_row_moves_every_frank_wolfe_score_by_at_most_its_sensitivity() -> None:
    rng = np.random.default_rng(0)
    n, d, radius, clip = 200, 50, 3.0, 0.1
    x_max = 1.0 / math.sqrt(d)
    X = rng.uniform(-x_max, x_max, (n, d))
    y = rng.normal(0, 1, n)
    bound = 2.0 * radius * clip * x_max / n
    worst = 0.0
    for trial in range(50):
        theta = rng.uniform(-1, 1, d)
        theta *= radius / np.abs(theta).sum()  # a point of the ℓ1 ball, as every iterate is
        X2, y2 = X.copy(), y.copy()
        i = int(rng.integers(n))
        X2[i] = rng.choice([-x_max, x_max], d)  # the extreme replacement
        y2[i] = 1e6 * (-1) ** trial

        def scores(X: np.ndarray, y: np.ndarray, theta: np.ndarray = theta) -> np.ndarray:
            r = np.clip(X @ theta - y, -clip, clip)
            return radius * (X.T @ r) / n

        worst = max(worst, float(np.abs(scores(X, y) - scores(X2, y2)).max()))
    assert 0.5 * bound < worst <= bound + 1e-15


def test_the_logistic_residual_is_the_loss_derivative_and_bounded() -> None:
    rng = np.random.default_rng(1)
    X, theta = rng.normal(0, 3, (100, 5)), rng.normal(0, 2, 5)
    y = np.where(rng.random(100) < 0.5, 1.0, -1.0)
    r = SB.logistic_residual(X, y, theta)
    m, h = X @ theta, 1e-6
    numeric = (np.log1p(np.exp(-y * (m + h))) - np.log1p(np.exp(-y * (m - h)))) / (2 * h)
    assert np.allclose(r, numeric, atol=1e-6) and np.abs(r).max() <= 1.0


def test_one_replaced_row_moves_every_logistic_frank_wolfe_score_by_at_most_its_sensitivity() -> None:
    """The logistic residual is within [−1, 1], so the least-squares bound 2λR·x_max/n holds with R ≤ 1."""
    rng = np.random.default_rng(2)
    n, d, radius, clip = 200, 40, 4.0, 1.0
    x_max = 1.0 / math.sqrt(d)
    X = rng.uniform(-x_max, x_max, (n, d))
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    bound = 2.0 * radius * clip * x_max / n
    worst = 0.0
    for _ in range(50):
        theta = rng.uniform(-1, 1, d)
        theta *= radius / np.abs(theta).sum()
        X2, y2 = X.copy(), y.copy()
        i = int(rng.integers(n))
        X2[i] = rng.choice([-x_max, x_max], d)
        y2[i] = -y2[i]

        def scores(X: np.ndarray, y: np.ndarray, theta: np.ndarray = theta) -> np.ndarray:
            return radius * (X.T @ np.clip(SB.logistic_residual(X, y, theta), -clip, clip)) / n

        worst = max(worst, float(np.abs(scores(X, y) - scores(X2, y2)).max()))
    assert 0.2 * bound < worst <= bound + 1e-15


def test_the_logistic_two_stage_noise_meets_its_target_over_its_steps() -> None:
    """Stage 2's T noisy gradient sums, each of sensitivity 2C under replace-one, at (ε/2, δ/2)."""
    eps, delta, steps = 4.0, 0.01, 3  # the call below: the same (cached) multiplier
    z = SB.ssp_noise_multiplier(eps / 2, delta / 2, steps)
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z), steps)
    assert acc.get_epsilon(delta / 2) <= eps / 2
    rng = np.random.default_rng(3)
    d = 30
    X = rng.uniform(-1, 1, (300, d)) / math.sqrt(d)
    y = np.where(rng.random(300) < 0.5, 1.0, -1.0)
    theta = SB.two_stage_logistic(X, y, epsilon=eps, delta=delta, sparsity=5, clip=0.1, steps=steps, lr=10.0,
                                  x_max=1.0 / math.sqrt(d), rng=rng)
    assert np.count_nonzero(theta) == 5
