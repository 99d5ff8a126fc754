"""The one-run privacy audit in the simulator (mpc_erm.simulate.audit): a federated DP-Fed and
DP-Fed-LS job with canary owners (the owner is the unit), and the canaries' construction itself.
Each job as planned shows no violation; the same rounds without noise are flagged."""

from __future__ import annotations

import numpy as np
import pytest

from mpc_erm.data import Dataset, load_dataset
from mpc_erm.data.partition import partition_equal
from mpc_erm.simulate.audit import audit_federated_job, audit_job, audit_network_job, with_canaries
from mpc_erm.simulate.forecast import deal_to_owners
from mpc_erm.spec import JobSpec


def _federated(ls_sigma: float) -> JobSpec:
    return JobSpec.model_validate({
        "method": "gradient", "model": {"name": "softmax", "n_classes": 2, "lam": 1e-4},
        "privacy": {"epsilon": 2.0, "delta": 1e-5, "clip": 0.5, "adjacency": "add_remove", "public_n": 240},
        "training": {"iterations": 20, "sampling_rate": 0.5, "learning_rate": 1.0, "ls_sigma": ls_sigma},
        "federated": {"local_epochs": 1, "local_batch": 10, "local_lr": 0.5}})


@pytest.mark.parametrize("ls_sigma", [0.0, 1.0], ids=["DP-Fed", "DP-Fed-LS"])
def test_a_federated_job_with_canary_owners_and_its_noiseless_control(ls_sigma: float) -> None:
    train, _ = load_dataset("breast_cancer")
    owners = deal_to_owners(train, 40, 0)
    real = audit_federated_job(_federated(ls_sigma), owners, canaries=200, seed=2)
    assert not real.violated and real.epsilon_lower_bound < real.stated_epsilon, real
    control = audit_federated_job(_federated(ls_sigma), owners, canaries=200, seed=2, broken_control=True)
    assert control.violated and control.correct == control.guesses, control


def test_a_dp_adam_mlp_job_and_its_noiseless_control() -> None:
    """DP-Adam with Poisson sampling on an mlp: the canaries' own input columns of the first layer."""
    train, _ = load_dataset("breast_cancer")
    parts = [Dataset(train.X[i], train.y[i], train.task, feature_names=train.feature_names)
             for i in partition_equal(train.n, 3, 0)]
    spec = JobSpec.model_validate({
        "method": "gradient", "model": {"name": "mlp", "input_shape": [30], "n_classes": 2, "hidden": [16]},
        "privacy": {"epsilon": 2.0, "delta": 1e-5, "clip": 1.0, "adjacency": "add_remove", "public_n": 700},
        "training": {"iterations": 60, "sampling_rate": 0.2, "learning_rate": 0.05, "optimizer": "adam"}})
    real = audit_network_job(spec, parts, canaries=200, seed=1)
    assert not real.violated and real.epsilon_lower_bound < real.stated_epsilon, real
    control = audit_network_job(spec, parts, canaries=200, seed=1, broken_control=True)
    assert control.violated and control.correct == control.guesses, control
    with pytest.raises(ValueError, match="model.input_shape"):
        audit_network_job(spec.model_copy(update={"model": spec.model.model_copy(update={"input_shape": [31]})}),
                          parts, canaries=50)


def test_the_canaries_make_neighbouring_data_sets() -> None:
    """Under replace-one the counts are the same whatever goes in (an out canary is the zero row);
    under add/remove an out canary is absent. Only canary i's row touches column d + i."""
    parts = [Dataset(np.full((4, 3), 0.1), np.array([1.0, -1.0, 1.0, -1.0]), "binary") for _ in range(2)]
    included = np.array([True, False, True, False, False, True] + [False] * 14)
    for replace in (True, False):
        rows = with_canaries(parts, included, replace)
        assert [r.n for r in rows] == ([4 + 20, 4] if replace else [4 + 3, 4]) and rows[0].d == 3 + 20
        block = rows[0].X[4:, 3:]
        assert np.array_equal(np.flatnonzero(block.sum(axis=0)), np.flatnonzero(included))
        assert (np.count_nonzero(block, axis=1) <= 1).all() and not rows[1].X[:, 3:].any()


def test_jobs_the_audit_does_not_cover_are_refused_naming_the_field() -> None:
    parts = [Dataset(np.zeros((5, 2)), np.ones(5), "binary")] * 3
    ridge = JobSpec.model_validate({"method": "output", "model": {"name": "ridge", "lam": 1e-2},
                                    "privacy": {"epsilon": 1.0, "delta": 1e-5, "mechanism": "gaussian"}})
    with pytest.raises(ValueError, match="model.name"):
        audit_job(ridge, parts, canaries=50)
    logistic = JobSpec.model_validate({"method": "output", "model": {"name": "logistic", "lam": 1e-2},
                                       "privacy": {"epsilon": 1.0, "delta": 1e-5, "mechanism": "gaussian"}})
    with pytest.raises(ValueError, match="canaries: at least 20"):
        audit_job(logistic, parts, canaries=5)
    with pytest.raises(ValueError, match="two-class softmax federated"):
        audit_federated_job(ridge, parts, canaries=50)
