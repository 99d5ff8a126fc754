"""m = 50,000 one-row parties (the thesis's extreme) run through every method, in CI time."""

from __future__ import annotations

import time

import numpy as np
import pytest

from mpc_erm.data import Dataset
from mpc_erm.simulate import ExperimentConfig, SimulatedParties
from mpc_erm.simulate.methods import METHODS, Setting, run_method


def _unit_ball_data(n: int, d: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1.0) * 1.0001
    w = rng.normal(size=d)
    y = np.where(X @ w + 0.1 * rng.normal(size=n) >= 0, 1.0, -1.0)
    return Dataset(X=X, y=y, task="binary", name="synthetic")


@pytest.mark.parametrize("m", [5_000, pytest.param(50_000, marks=pytest.mark.slow)])  # 61 s at 50,000 on 2 cores
def test_one_row_parties_run_every_method(m: int) -> None:
    import torch

    data = _unit_ball_data(m, 122, seed=0)
    parts = [np.array([i]) for i in range(data.n)]
    parties = SimulatedParties.from_partition(data, parts)
    assert parties.m == m and parties.sizes.n_min == 1
    setting = Setting(iterations=5, lam=1e-3, epsilon=0.5, delta=1e-3)
    for method in METHODS:
        t0 = time.perf_counter()
        run = run_method(method, setting, parties, torch.Generator().manual_seed(0))
        assert torch.isfinite(run.theta).all(), method
        assert time.perf_counter() - t0 < 60, method


@pytest.mark.slow
def test_full_kdd_simulation_at_fifty_thousand_parties() -> None:
    """The thesis's m = 50,000 setting end to end (all methods, T = 1500): `make test-all`."""
    from mpc_erm.simulate import run_experiment

    cfg = ExperimentConfig(dataset="kddcup99", parties=50_000, iterations=1500, eval_every=50,
                           conventions=["exact"], seeds=[0])
    t0 = time.perf_counter()
    res = run_experiment(cfg)
    assert time.perf_counter() - t0 < 600
    s = {x["method"]: x for x in res["summary"]}
    assert s["mpc_grad_p"]["optimality_gap_mean"] < 1e-2
    assert s["mpc_grad_p"]["optimality_gap_mean"] < s["local_grad_p"]["optimality_gap_mean"] / 10
