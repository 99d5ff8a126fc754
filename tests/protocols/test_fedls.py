"""DP-Fed-LS (paper 002, Algorithm 1; mpc_erm.protocols.fedls), tested on what it releases.

* An owner's update stays in the 𝓛-ball whatever its data and learning rate (the projection after
  every local step), so the released noise-free sum moves by at most 𝓛 when one owner is added
  or removed — measured on the sum itself, against the sensitivity the event states.
* Poisson owner sampling has rate τ and independent rounds.
* The public step divides by the public τN and smooths per tensor; σ_LS = 0 is DP-Fed exactly.
* The client-level ε is the RDP accountant's for T Poisson-sampled Gaussian rounds, recomputed here
  independently with dp_accounting.
* A small federated problem is learnt with the noise on.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from mpc_erm.protocols.aggregation import NoiseSpec
from mpc_erm.protocols.fedls import DpFedLs, FedLsConfig, owner_updates, poisson_owners, uniform_owners
from mpc_erm.simulate.aggregator import InProcessAggregator
from mpc_erm.smoothing import smooth_parameters


def _problem(owners: int = 40, rows: int = 20, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two Gaussian blobs in 5 dimensions, split over owners."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(owners):
        y = torch.randint(0, 2, (rows,), generator=g)
        X = torch.randn(rows, 5, generator=g) + (2 * y[:, None] - 1) * torch.tensor([1.5, -1.0, 0.5, 0.0, 0.0])
        out.append((X.float(), y))
    return out


def _job(**kw: object) -> DpFedLs:
    cfg = dict(rounds=5, owners=40, sampling_rate=0.25, noise_multiplier=1.0, clip=0.5, local_epochs=2,
               local_batch=5, local_lr=0.5)
    cfg.update(kw)  # type: ignore[arg-type]
    torch.manual_seed(0)
    return DpFedLs(FedLsConfig(**cfg), lambda: torch.nn.Linear(5, 2))  # type: ignore[arg-type]


def test_an_owners_update_stays_in_the_clip_ball_and_the_sum_moves_by_at_most_clip() -> None:
    job = _job(local_lr=50.0, clip=0.3)  # a huge step: the projection must act every time
    data = _problem()
    data[7] = (data[7][0] * 1e4, data[7][1])  # an extreme owner
    gens = [torch.Generator().manual_seed(o) for o in range(len(data))]
    deltas = [job.local_update(X, y, 0, gens[o]) for o, (X, y) in enumerate(data)]
    norms = torch.stack([d.norm() for d in deltas])
    assert float(norms.max()) <= 0.3 * (1 + 1e-6) and float(norms.max()) > 0.29  # the bound is reached
    full = torch.stack(deltas).sum(0)
    for removed in range(len(data)):  # remove one owner: the released (noise-free) sum moves by ≤ 𝓛
        assert float((full - (full - deltas[removed])).norm()) <= job.config.clip * (1 + 1e-6)
    # σ on the revealed mean = z·𝓛/(τN): z·𝓛 on the sum, each update weighted by the public 1/(τN)
    assert job.noise is not None and job.noise.scale == pytest.approx(
        job.config.event().noise_multiplier * job.config.clip / (0.25 * 40), rel=1e-15)
    assert job.weight == 1 / (0.25 * 40)


def test_poisson_owner_sampling_has_rate_tau_and_independent_rounds() -> None:
    g = torch.Generator().manual_seed(3)  # fixed seed: the statistics below are the same every run
    n, rate, rounds = 400, 0.05, 300
    picks = [set(poisson_owners(n, rate, g)) for _ in range(rounds)]
    counts = [len(p) for p in picks]
    mean = sum(counts) / rounds
    assert abs(mean - n * rate) < 5 * math.sqrt(n * rate * (1 - rate) / rounds)
    # owner 0 and owner 1 join independently: a 2×2 table over rounds
    both = sum(1 for p in picks if 0 in p and 1 in p)
    first = sum(1 for p in picks if 0 in p)
    second = sum(1 for p in picks if 1 in p)
    table = [[both, first - both], [second - both, rounds - first - second + both]]
    assert stats.fisher_exact(table).pvalue > 1e-3


def test_the_released_mean_is_divided_by_the_public_count_and_smoothed_per_tensor() -> None:
    job = _job(ls_sigma=0.0)
    w0 = job.w.clone()
    rows = torch.randn(3, job.p, dtype=torch.float64)
    weights = torch.full((3,), job.weight, dtype=torch.float64)
    released = InProcessAggregator(torch.Generator()).aggregate(rows, weights, NoiseSpec("none", 0.0))
    s = rows.sum(0)
    assert torch.allclose(released, s / (0.25 * 40), rtol=1e-12, atol=1e-15)  # τN = 10, public
    job.public_step(released)
    assert torch.equal(job.w, w0 + released)  # σ_LS = 0, η_g = 1: DP-Fed exactly
    ls = _job(ls_sigma=2.0)
    ls.public_step(s / 10)
    shapes = [p.shape for p in ls.model.parameters()]
    parts = torch.split(s / 10, [math.prod(x) for x in shapes])
    want = torch.cat([t.reshape(-1) for t in smooth_parameters([t.reshape(x) for t, x in zip(parts, shapes)], 2.0)])
    assert torch.allclose(ls.w, w0 + want, atol=1e-12, rtol=0)


def test_the_client_level_epsilon_is_the_poisson_subsampled_gaussians() -> None:
    import dp_accounting

    job = _job(rounds=30, sampling_rate=0.05, noise_multiplier=0.8, owners=500)
    delta = 1 / 500**1.1
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(0.8)), 30))
    assert job.guarantee(delta).epsilon == pytest.approx(acc.get_epsilon(delta), rel=1e-9)
    assert job.guarantee(delta, rounds=10).epsilon < job.guarantee(delta).epsilon


def test_a_federated_problem_is_learnt_with_the_noise_on() -> None:
    data = _problem(owners=60, rows=30, seed=1)
    job = _job(rounds=15, owners=60, sampling_rate=0.3, noise_multiplier=0.8, clip=1.0, local_lr=0.2, ls_sigma=1.0)
    gens = [torch.Generator().manual_seed(o) for o in range(60)]
    sampler = torch.Generator().manual_seed(9)
    seen: list[int] = []
    job.train(InProcessAggregator(torch.Generator().manual_seed(2)), owner_updates(job, data, gens),
              lambda _t: poisson_owners(60, 0.3, sampler), lambda _t, o: seen.append(len(o)))
    test = _problem(owners=1, rows=2000, seed=99)[0]
    acc = float((job.predict(test[0]) == test[1]).double().mean())
    assert len(seen) == 15 and acc > 0.85, acc


def test_uniform_owner_sampling_draws_exactly_s_of_n_uniformly() -> None:
    g = torch.Generator().manual_seed(4)  # fixed seed: the p-value below is the same every run
    draws = [tuple(uniform_owners(6, 2, g)) for _ in range(3000)]
    assert all(len(set(d)) == 2 and all(0 <= o < 6 for o in d) for d in draws)
    counts = [draws.count(c) for c in sorted(set(draws))]
    assert len(counts) == 15 and stats.chisquare(counts).pvalue > 1e-3
    with pytest.raises(ValueError, match="sampling"):
        FedLsConfig(rounds=3, owners=40, sampling_rate=0.33, noise_multiplier=1.0, clip=0.5, sampling="uniform")
    with pytest.raises(ValueError, match="sampling"):
        FedLsConfig(rounds=3, owners=40, sampling_rate=1.0, noise_multiplier=1.0, clip=0.5, sampling="uniform")


def test_uniform_sampling_replaces_one_owner_moves_the_sum_by_at_most_2clip_and_the_noise_is_sized_for_it() -> None:
    """Replace-one at owner level: one drawn owner's data replaced by any other owner's (or by
    nothing: a zero update) moves the released noise-free sum by at most 2𝓛, measured; the noise
    is z·2𝓛 on the sum, z·2𝓛/s on the released mean."""
    job = _job(local_lr=50.0, clip=0.3, sampling="uniform", sampling_rate=0.25)  # s = 10 of 40
    data = _problem()
    data[3] = (data[3][0] * 1e4, data[3][1])
    gens = [torch.Generator().manual_seed(o) for o in range(len(data))]
    deltas = [job.local_update(X, y, 0, gens[o]) for o, (X, y) in enumerate(data)]
    drawn = uniform_owners(40, 10, torch.Generator().manual_seed(1))
    total = torch.stack([deltas[o] for o in drawn]).sum(0)
    moved = max(float((total - deltas[o] + other - total).norm()) for o in drawn
                for other in [*deltas, torch.zeros_like(deltas[0])])
    assert 0.3 < moved <= 2 * 0.3 * (1 + 1e-6)  # beyond one 𝓛 (so 𝓛 would understate), within 2𝓛
    assert job.noise is not None and job.noise.sensitivity == pytest.approx(2 * 0.3 / 10, rel=1e-15)
    assert job.noise.scale == pytest.approx(job.config.noise_multiplier * 2 * 0.3 / 10, rel=1e-15)


def test_the_client_level_epsilon_of_uniform_rounds_is_dp_accountings_without_replacement() -> None:
    """For an outside observer, dp_accounting's curve of 50 of 1,000 drawn without replacement; an
    owner also knows whether it was drawn itself (then 49 of the 999 others were, else 50), so
    the guarantee is the larger of that and the mixture of the two, each from dp_accounting."""
    import dp_accounting
    import numpy as np
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
    from scipy.special import logsumexp

    job = _job(rounds=30, sampling_rate=0.05, noise_multiplier=0.8, owners=1000, sampling="uniform")
    delta = 1 / 1000**1.1
    replace_one = dp_accounting.NeighboringRelation.REPLACE_ONE

    def curve(n: int, s: int) -> np.ndarray:
        one = dp_accounting.rdp.RdpAccountant(neighboring_relation=replace_one)
        one.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, s, dp_accounting.GaussianDpEvent(0.8)))
        return np.asarray(one._rdp)

    orders = np.asarray(dp_accounting.rdp.RdpAccountant()._orders)
    observer = float(compute_epsilon(orders, 30 * curve(1000, 50), delta)[0])
    drawn, missed = curve(999, 49), curve(999, 50)
    owner = logsumexp(np.stack([np.log(0.05) + (orders - 1) * drawn, np.log(0.95) + (orders - 1) * missed]),
                      axis=0) / (orders - 1)
    want = float(compute_epsilon(orders, 30 * np.maximum(owner, curve(1000, 50)), delta)[0])
    assert observer < want < observer * 1.001
    assert job.guarantee(delta).epsilon == pytest.approx(want, rel=1e-9)
    assert job.guarantee(delta, rounds=10).epsilon < job.guarantee(delta).epsilon
