"""The Fig. 2.1 baselines' privacy arithmetic (benchmarks.sparse_baselines), against independent
computations: the composition bound, the Gaussian calibration against dp-accounting directly, and
the Frank–Wolfe scores' sensitivity measured on neighbouring data sets."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np

from benchmarks import sparse_baselines as SB


def test_the_per_step_epsilon_composes_to_the_target_and_no_further() -> None:
    for eps, steps, delta in ((2.0, 10, 0.01), (10.0, 20, 0.01), (0.5, 5, 1e-5)):
        e0 = SB.per_step_epsilon(eps, steps, delta)
        assert SB.advanced_composition_epsilon(e0, steps, delta) <= eps + 1e-12
        assert SB.advanced_composition_epsilon(e0 * 1.001, steps, delta) > eps
        # the DRV bound itself, written out
        drv = math.sqrt(2 * steps * math.log(1 / delta)) * e0 + steps * e0 * (math.exp(e0) - 1)
        assert SB.advanced_composition_epsilon(e0, steps, delta) == min(steps * e0, drv)


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
