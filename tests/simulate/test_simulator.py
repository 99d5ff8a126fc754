"""The simulator: vectorised parties equal per-party protocol code; every method runs; the
thesis's ordering of methods shows on real data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpc_erm.data import load_dataset, partition_equal
from mpc_erm.protocols import OutputPerturbation
from mpc_erm.simulate import ExperimentConfig, SimulatedParties, run_experiment
from mpc_erm.simulate.methods import METHODS, Setting, _local_models


@pytest.fixture(scope="module")
def parties():
    train, _ = load_dataset("breast_cancer")
    return SimulatedParties.from_partition(train, partition_equal(train.n, 7, np.random.default_rng(0)))


def test_batched_local_models_equal_the_protocols_per_party_solve(parties) -> None:
    setting = Setting(lam=1e-2)
    proto = OutputPerturbation(setting.spec("output", 0), parties.sizes, parties.X.shape[1])
    batched = _local_models(proto.loss, parties, setting.lam)
    for j in range(parties.m):
        rows = parties.party_ids == j
        one = proto.local_model(parties.X[rows], parties.y[rows])
        assert torch.allclose(batched[j], one, atol=1e-8)


def test_every_method_runs_and_mpc_beats_local_baselines() -> None:
    cfg = ExperimentConfig(dataset="breast_cancer", parties=20, iterations=200, eval_every=50,
                           epsilon=1.0, delta=1e-5, lam=1e-2, seeds=[0, 1], conventions=["exact", "thesis"])
    res = run_experiment(cfg)
    assert {r["method"] for r in res["runs"]} == set(METHODS)
    assert len(res["runs"]) == 2 * 2 * len(METHODS)
    s = {(x["convention"], x["method"]): x for x in res["summary"]}
    for conv in ("exact", "thesis"):
        mpc_out = s[(conv, "mpc_out_p")]["optimality_gap_mean"]
        assert mpc_out < s[(conv, "pathak")]["optimality_gap_mean"]
        assert mpc_out < s[(conv, "local_out_p")]["optimality_gap_mean"]
        assert s[(conv, "mpc_grad_p")]["optimality_gap_mean"] < s[(conv, "local_grad_p")]["optimality_gap_mean"]
    for r in res["runs"]:
        assert len(r["optimality_gap"]) == len(res["iterations"]) == 4
        assert np.isfinite(r["optimality_gap"]).all()
        assert r["final_optimality_gap"] >= -1e-9  # θ* is the optimum of the same objective


def test_same_seed_same_result() -> None:
    cfg = ExperimentConfig(dataset="breast_cancer", parties=5, iterations=30, eval_every=10,
                           methods=["mpc_grad_p", "local_out_p"], seeds=[3])
    a, b = run_experiment(cfg), run_experiment(cfg)
    assert [r["optimality_gap"] for r in a["runs"]] == [r["optimality_gap"] for r in b["runs"]]


def test_every_run_states_mechanism_scale_accountant_adjacency_epsilon_delta_and_trust() -> None:
    cfg = ExperimentConfig(dataset="breast_cancer", parties=4, iterations=5, eval_every=5,
                           conventions=["exact", "thesis"], seeds=[0])
    for r in run_experiment(cfg)["runs"]:
        p = r["privacy"]
        for key in ("mechanism", "noise_scale", "accountant", "adjacency", "epsilon", "delta", "trust_model"):
            assert p.get(key) is not None, (r["convention"], r["method"], key)


def test_regression_runs_with_the_ridge_constant_and_refuses_objective_perturbation() -> None:
    cfg = ExperimentConfig(dataset="diabetes", model="ridge", parties=3, iterations=20, eval_every=10, lam=0.1,
                           methods=["mpc_out_p", "pathak", "local_out_p", "mpc_grad_p"], seeds=[0])
    res = run_experiment(cfg)
    assert res["nonprivate"]["score"] == "mse"
    out = next(r for r in res["runs"] if r["method"] == "mpc_out_p")
    assert out["privacy"]["parameters"]["lipschitz_G"] == pytest.approx(1 + 1 / 0.1 ** 0.5)
    with pytest.raises(ValueError, match="local_obj_p"):
        run_experiment(cfg.model_copy(update={"methods": ["local_obj_p"]}))
