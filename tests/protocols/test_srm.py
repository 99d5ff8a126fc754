"""DP-SRM (the thesis's ch. 4: stochastic recursive momentum) as a DP-SGD optimiser, in plaintext
with the simulator's aggregator: the spec's checks, each example's increment against the stated
clip, the released sum against the stated sensitivity on neighbouring data (a record removed, in
a round with a previous model), the public recursion, the γ = 1 case equal to DP-SGD, and
learning."""

from __future__ import annotations

import pytest
import torch

from mpc_erm.protocols.aggregation import NoiseSpec
from mpc_erm.protocols.dpsgd import DpSgd
from mpc_erm.simulate.aggregator import InProcessAggregator
from mpc_erm.spec import JobSpec
from tests.protocols.test_dpsgd import removal_shift

SRM = {"optimizer": "srm", "srm_momentum": 0.2, "clip_difference": 0.5}


def _spec(training: dict[str, object] | None = None, clip: float = 1.0) -> JobSpec:
    return JobSpec.model_validate({
        "method": "gradient",
        "model": {"name": "mlp", "input_shape": [6], "n_classes": 2, "hidden": [8], "init_seed": 3},
        "privacy": {"epsilon": 2.0, "delta": 1e-5, "clip": clip, "adjacency": "add_remove", "public_n": 1000},
        "training": {"iterations": 20, "learning_rate": 0.5, "sampling_rate": 0.5, **(training or SRM)},
    })


def _rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 6, generator=g)
    return X * 4.0, (X[:, 0] > 0).long()  # large inputs: unclipped gradients exceed the clips


def test_the_spec_asks_for_gamma_and_the_difference_clip_and_leaves_room_for_the_gradient_clip() -> None:
    spec = _spec()
    assert spec.training.srm_momentum == 0.2 and spec.training.clip_difference == 0.5
    with pytest.raises(ValueError, match="both required for optimizer = 'srm'"):
        _spec({"optimizer": "srm", "srm_momentum": 0.2})
    with pytest.raises(ValueError, match=r"leaves no room under privacy.clip = 1"):
        _spec({**SRM, "clip_difference": 1.25})  # (1 − 0.2)·1.25 = 1
    with pytest.raises(ValueError, match="DP-SRM's fields"):
        _spec({"optimizer": "sgd", "clip_difference": 0.5})
    with pytest.raises(ValueError, match="DP-SRM's momentum is training.srm_momentum"):
        _spec({**SRM, "momentum": 0.9})
    plain = _spec({"optimizer": "sgd"})
    assert "srm_momentum" not in plain.canonical_json()  # jobs without DP-SRM keep their digests
    assert "srm_momentum" in spec.canonical_json() and spec.digest() != plain.digest()


def test_each_increment_is_within_the_stated_clip_and_the_first_round_has_no_difference() -> None:
    job = DpSgd(_spec(), noise=NoiseSpec("none", 0.0))
    assert job.clip_gradient == pytest.approx((1.0 - 0.8 * 0.5) / 0.2)  # C₁ = (C − (1−γ)C₂)/γ = 3
    X, y = _rows(64, 1)
    dev = torch.device("cpu")
    grads = job._per_example(job.model, X, y, dev)
    first = job._increments(grads, X, y, dev)
    assert torch.allclose(first, 0.2 * torch.nn.functional.normalize(grads, dim=1) * grads.norm(dim=1, keepdim=True)
                          .clamp(max=3.0), atol=1e-12)
    job.public_step(torch.randn(job.p, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    later = job._increments(job._per_example(job.model, X, y, dev), X, y, dev)
    assert float(later.norm(dim=1).max()) <= 1.0 + 1e-12
    assert float(later.norm(dim=1).max()) > 0.5  # the clips bind: the bound is reached, not vacuous


def test_removing_a_record_moves_a_later_rounds_release_by_at_most_the_stated_sensitivity() -> None:
    """Round 2, after a common first step (the previous model is public): D and D minus its last
    record, the same Poisson draws for the others, no noise — the revealed sums differ by at most
    C/(q·n̂), the plan's sensitivity."""
    X, y = _rows(400, 0)
    worst, stated = removal_shift(_spec(), X, y,  # the same public θ_1 for both: a common first step
                                  before=lambda job: job.public_step(torch.full((job.p,), 0.05, dtype=torch.float64)))
    assert stated == pytest.approx(1.0 / (0.5 * 1000))
    assert 0.2 * stated < worst <= stated * (1 + 1e-12)


def test_the_public_step_keeps_the_recursion_and_the_step_cap() -> None:
    job = DpSgd(_spec({**SRM, "max_step": 0.01}), noise=NoiseSpec("none", 0.0))
    g = torch.Generator().manual_seed(5)
    v = torch.zeros(job.p, dtype=torch.float64)
    for _ in range(4):
        noisy = torch.randn(job.p, generator=g, dtype=torch.float64)
        before = job.public_parameters()
        job.public_step(noisy)
        v = noisy + 0.8 * v
        step = before - job.public_parameters()
        assert torch.allclose(job.velocity, v, atol=1e-12)
        assert float(step.norm()) == pytest.approx(min(0.5 * float(v.norm()), 0.01), rel=1e-9)
        assert torch.allclose(step / float(step.norm()), v / float(v.norm()), atol=1e-9)
        assert torch.equal(job.previous, before)


def test_with_gamma_one_it_is_dp_sgd() -> None:
    """γ = 1: no difference term, v_t = ṽ_t, C₁ = C: the same rounds as SGD with the same draws."""
    srm = DpSgd(_spec({"optimizer": "srm", "srm_momentum": 1.0, "clip_difference": 0.5}), noise=NoiseSpec("none", 0.0))
    sgd = DpSgd(_spec({"optimizer": "sgd"}), noise=NoiseSpec("none", 0.0))
    X, y = _rows(300, 3)
    for t in range(3):
        rows = [job.local_contribution(X, y, torch.Generator().manual_seed(t))[0] for job in (srm, sgd)]
        assert torch.allclose(rows[0], rows[1], atol=1e-12)
        for job, r in zip((srm, sgd), rows, strict=True):
            job.public_step(r[0] * job.weight)
        assert torch.allclose(srm.public_parameters(), sgd.public_parameters(), atol=1e-12)


def test_dp_srm_learns_a_separable_task_with_noise() -> None:
    spec = _spec({**SRM, "max_step": 0.5})
    job = DpSgd(spec)
    X, y = _rows(2000, 7)
    gens = [torch.Generator().manual_seed(11)]
    agg = InProcessAggregator(torch.Generator().manual_seed(12))
    job.train(agg, lambda _m: (job.local_contribution(X, y, gens[0])[0], None))
    accuracy = float((job.predict(X) == y).double().mean())
    assert accuracy > 0.9, accuracy
