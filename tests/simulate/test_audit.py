"""The one-run privacy audit in the simulator (mpc_erm.simulate.audit): a federated DP-Fed and
DP-Fed-LS job with canary owners (the owner is the unit), an mlp with canary rows, a CNN with
gradient canaries, and the canaries' construction itself. Each job as planned shows no violation;
the same rounds without noise are flagged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpc_erm.data import Dataset, load_dataset
from mpc_erm.data.partition import partition_equal
from mpc_erm.privacy.plan import plan_job, public_sizes
from mpc_erm.simulate.audit import (
    GradientCanaries,
    audit_federated_job,
    audit_gradient_job,
    audit_job,
    audit_network_job,
    draw_canaries,
    with_canaries,
)
from mpc_erm.simulate.forecast import InProcessNetworkJob, deal_to_owners
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


def _cnn(n: int = 300) -> tuple[JobSpec, list[Dataset]]:
    """TF-Privacy's MNIST CNN on n random 28×28 images (the audit is of the job's rounds, not of
    what the images show), Poisson rate ½, ten rounds, ε = 1."""
    rng = np.random.default_rng(5)
    parts = [Dataset(rng.random((n // 2, 784)), rng.integers(0, 10, n // 2), "multiclass", n_classes=10)
             for _ in range(2)]
    spec = JobSpec.model_validate({
        "method": "gradient", "model": {"name": "mnist_cnn", "input_shape": [1, 28, 28], "n_classes": 10},
        "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0, "adjacency": "add_remove", "public_n": n},
        "training": {"iterations": 10, "sampling_rate": 0.5, "learning_rate": 0.3}})
    return spec, parts


def test_a_cnn_job_with_gradient_canaries_and_its_noiseless_control() -> None:
    """The MNIST CNN has no input column per canary: Dirac canaries ride in coordinates past its
    parameters, each sampled at the job's rate with the stated sensitivity."""
    spec, parts = _cnn()
    real = audit_gradient_job(spec, parts, canaries=200, seed=1)
    assert real.canary_kind == "gradients" and not real.violated, real
    assert real.epsilon_lower_bound < real.stated_epsilon, real
    control = audit_gradient_job(spec, parts, canaries=200, seed=1, broken_control=True)
    assert control.violated and control.correct == control.guesses, control


def test_gradient_canaries_release_the_stated_sensitivity_and_leave_the_model_alone() -> None:
    """Without noise: a canary's released coordinate is the stated sensitivity times the rounds it was
    drawn into (0 when out), and the model is the one the same rounds give without canaries."""
    spec, parts = _cnn()
    plan = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, None))
    job = InProcessNetworkJob(spec, plan, parts)
    included = draw_canaries(40, 3)
    dirac = GradientCanaries(included, plan.sampling_rate, plan.sensitivity_l2(), torch.Generator().manual_seed(9))
    with_dirac = job.train(torch.Generator().manual_seed(4), noise=False, around=dirac.around).master.detach()
    alone = job.train(torch.Generator().manual_seed(4), noise=False).master.detach()
    assert torch.equal(with_dirac, alone)
    counts = dirac.scores / plan.sensitivity_l2()
    assert np.allclose(counts, np.round(counts), atol=1e-9) and (counts[~included] == 0).all()
    assert counts[included].max() <= spec.training.iterations and counts[included].mean() > 2  # q·T = 5
    with pytest.raises(ValueError, match="privacy.adjacency"):
        audit_gradient_job(spec.model_copy(update={"privacy": spec.privacy.model_copy(
            update={"adjacency": "replace"})}), parts, canaries=50)


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
    with pytest.raises(ValueError, match="model.name: gradient canaries audit a network"):
        audit_gradient_job(logistic, parts, canaries=50)
