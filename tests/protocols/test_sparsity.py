"""DP-IGHT (thesis ch. 2, Alg. 1) as ``training.sparsity`` on a linear gradient job: hard
thresholding after each public step. It is post-processing of what every round reveals, so the
plan (σ, the event, the report's ε) is the job's without it; the released model has at most s
non-zeros; without noise it is IGHT, which recovers a sparse θ* on the thesis's synthetic design;
and the spec refuses it where it does not apply."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.dp_ight import relative_error, spec_for, synthetic
from mpc_erm.privacy.plan import plan_job, public_sizes
from mpc_erm.protocols.gradient_perturbation import hard_threshold
from mpc_erm.simulate.forecast import InProcessJob
from mpc_erm.spec import JobSpec


def test_hard_threshold_keeps_the_s_largest_and_breaks_ties_by_index() -> None:
    theta = torch.tensor([0.1, -3.0, 2.0, 2.0, 0.0, -2.0])
    assert hard_threshold(theta, 2).tolist() == [0.0, -3.0, 2.0, 0.0, 0.0, 0.0]
    assert hard_threshold(theta, 4).tolist() == [0.0, -3.0, 2.0, 2.0, 0.0, -2.0]
    assert hard_threshold(theta, 6) is theta and hard_threshold(theta, 60) is theta


def test_thresholding_is_post_processing_the_plan_is_the_jobs_own() -> None:
    """Same σ, same event, same ε with and without s; every released model has ≤ s non-zeros."""
    parts, _ = synthetic(300, 60, 5, 0)
    sizes = public_sizes(spec_for(4.0, 10, None, 60.0, 0.02), [p.n for p in parts])
    plain, sparse = (plan_job(spec_for(4.0, 10, s, 60.0, 0.02), sampler="mpc", sizes=sizes, n_features=60)
                     for s in (None, 8))
    assert sparse.event == plain.event and sparse.noise_multiplier == plain.noise_multiplier
    assert sparse.guarantee().epsilon == plain.guarantee().epsilon
    for seed in range(3):
        theta = InProcessJob(spec_for(4.0, 10, 8, 60.0, 0.02), sparse, parts).release(
            torch.Generator().manual_seed(seed))
        assert int((theta != 0).sum()) <= 8


def test_without_noise_it_is_ight_and_recovers_the_sparse_model() -> None:
    """The thesis's design (n = d = 300, s* = 5, rows into the unit ball): noise-free IGHT with
    s = 2s* recovers θ* to a few percent, and with noise at ε = 10 DP-IGHT beats the same noisy
    rounds without thresholding (what thresholding is for in high dimension)."""
    parts, theta = synthetic(300, 300, 5, 1)
    assert relative_error(spec_for(10.0, 40, 10, 300.0, 0.05), parts, theta, 0, noise=False) < 0.1
    sparse = np.mean([relative_error(spec_for(10.0, 20, 5, 300.0, 0.01), parts, theta, k, True) for k in range(5)])
    dense = np.mean([relative_error(spec_for(10.0, 20, None, 300.0, 0.01), parts, theta, k, True) for k in range(5)])
    assert sparse < dense, (sparse, dense)


@pytest.mark.parametrize(("change", "field"), [
    ({"model": {"name": "mlp", "input_shape": [4], "n_classes": 2}, "privacy": {"epsilon": 1.0, "delta": 1e-5,
      "clip": 1.0, "adjacency": "add_remove", "public_n": 100}}, "training.sparsity"),
    ({"method": "output"}, "training.sparsity"),
])
def test_sparsity_is_refused_where_it_does_not_apply(change: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"method": "gradient", "model": {"name": "ridge", "lam": 1e-3},
                               "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0},
                               "training": {"iterations": 5, "sparsity": 3}}
    with pytest.raises(ValueError, match=field):
        JobSpec.model_validate({**base, **change})


def test_a_job_without_sparsity_keeps_its_digest() -> None:
    spec = spec_for(1.0, 5, None, 1.0, 1.0)
    assert "sparsity" not in spec.canonical_json()
    assert '"sparsity":4' in spec_for(1.0, 5, 4, 1.0, 1.0).canonical_json()
