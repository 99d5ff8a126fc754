"""The one-run privacy audit through real daemons (coordinator.audit_daemons): the canaries in the
parties' own npz files, three party daemons with mTLS and the noise sampled inside the MPC, the
bound from the model the coordinator fetched. The job as planned shows no violation; the same job
with its noise switched off (the daemons' test-only mode) is flagged. Breast-cancer rows, 200
canaries, 20 gradient rounds at ε = 1."""

from __future__ import annotations

import pytest

from mpc_erm.data import Dataset, load_dataset
from mpc_erm.data.partition import partition_equal
from mpc_erm.spec import JobSpec

pytestmark = [pytest.mark.long, pytest.mark.e2e]


def test_the_daemons_job_shows_no_violation_and_its_noiseless_control_does() -> None:
    from coordinator.audit_daemons import audit_through_daemons

    train, _ = load_dataset("breast_cancer")
    parts = [Dataset(train.X[i], train.y[i], train.task, name=f"party{j}", feature_names=train.feature_names)
             for j, i in enumerate(partition_equal(train.n, 3, 0))]
    spec = JobSpec.model_validate({"method": "gradient", "model": {"name": "logistic", "lam": 1e-3},
                                   "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0},
                                   "training": {"iterations": 20, "learning_rate": 5.0}})
    real = audit_through_daemons(spec, parts, canaries=200, seed=3)
    assert not real.violated and real.epsilon_lower_bound < real.stated_epsilon, real
    control = audit_through_daemons(spec, parts, canaries=200, seed=3, broken_control=True)
    assert control.violated and control.correct == control.guesses, control
    assert control.stated_epsilon == real.stated_epsilon and control.included == real.included
