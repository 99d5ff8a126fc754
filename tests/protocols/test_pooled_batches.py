"""A batch of exactly b of the parties' pooled rows each round (``training.batch_size``): the
spec's checks, the plan's accounting (the largest of the observer's and every party's view,
replace-one), the simulator's joint draw (uniform over b-subsets, split by party), and the
released sum against the stated sensitivity when one row is replaced (plaintext replay)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
from scipy import stats

from mpc_erm.privacy.member_view import pooled_rows_curve
from mpc_erm.privacy.plan import PublicSizes, plan_job
from mpc_erm.privacy.subsampled import RDP_ORDERS
from mpc_erm.protocols.aggregation import NoiseSpec
from mpc_erm.protocols.dpsgd import DpSgd
from mpc_erm.protocols.row_draws import RowDraws, pooled_draws
from mpc_erm.simulate.aggregator import InProcessAggregator
from mpc_erm.spec import JobSpec

ROWS = {"alice": 120, "bob": 80, "carol": 100}


def _spec(training: dict[str, object] | None = None, privacy: dict[str, object] | None = None) -> JobSpec:
    return JobSpec.model_validate({
        "method": "gradient",
        "model": {"name": "mlp", "input_shape": [6], "n_classes": 2, "hidden": [], "init_seed": 3},
        "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0, "adjacency": "replace", "party_rows": ROWS,
                    **(privacy or {})},
        "training": {"iterations": 30, "learning_rate": 0.5, "batch_size": 30, **(training or {})},
    })


def test_the_spec_asks_for_replace_one_and_the_public_counts_and_keeps_old_digests() -> None:
    spec = _spec()
    assert spec.training.batch_size == 30 and spec.privacy.party_rows == ROWS
    with pytest.raises(ValueError, match="privacy.party_rows: required"):
        _spec(privacy={"party_rows": None})
    with pytest.raises(ValueError, match="privacy.adjacency: a batch of exactly b"):
        _spec(privacy={"adjacency": "add_remove", "public_n": 300})
    with pytest.raises(ValueError, match="one or the other"):
        _spec({"sampling_rate": 0.1})
    with pytest.raises(ValueError, match="fewer than the 300 pooled rows"):
        _spec({"batch_size": 300})
    with pytest.raises(ValueError, match="privacy.party_rows: only with training.batch_size"):
        _spec({"batch_size": None, "sampling_rate": 0.1}, {"adjacency": "add_remove", "public_n": 300})
    with pytest.raises(ValueError, match="1 to 10"):
        _spec(privacy={"party_rows": {"alice": 0}})
    poisson = JobSpec.model_validate({**_spec().model_dump(mode="json", exclude_none=True),
                                      "training": {"iterations": 30, "learning_rate": 0.5, "sampling_rate": 0.1},
                                      "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0,
                                                  "adjacency": "add_remove", "public_n": 300}})
    assert "batch_size" not in poisson.canonical_json() and "party_rows" not in poisson.canonical_json()


def test_the_plan_accounts_every_partys_view_of_b_of_the_pooled_rows_replace_one() -> None:
    plan = plan_job(_spec(), sampler="ideal", sizes=PublicSizes(counts=(120, 80, 100)))
    assert plan.population == 300 and plan.sample_size == 30 and plan.sampling_rate == pytest.approx(0.1)
    assert plan.unit == "record" and plan.member_rows == (80, 100, 120)
    ev = plan.event
    assert ev.population == 300 and ev.member_rows == (80, 100, 120) and ev.as_dict()["member_rows"] == [80, 100, 120]
    curve = pooled_rows_curve(plan.noise_multiplier, 300, 30, (120, 80, 100))
    eps = float(compute_epsilon(RDP_ORDERS, 30 * curve, 1e-5)[0])
    assert plan.guarantee().epsilon == pytest.approx(eps, rel=1e-12) and eps <= 1.0 * (1 + 1e-9)
    assert plan.sensitivity_l2() == pytest.approx(2 * 1.0 / 30)  # one row replaced moves the sum by 2C, over b
    assert plan.weight(1, 80) == pytest.approx(1 / 30)
    assert plan.member_bound(1) == pytest.approx(30 * 1.0 / 30)  # at most b of its rows
    d = plan.describe()
    assert d["population"] == 300 and d["public_counts"] == [120, 80, 100] and d["event"]["member_rows"]
    assert "pooled rows" in plan.accountant_statement() and "which of its own rows" in plan.accountant_statement()
    with pytest.raises(ValueError, match="privacy.party_rows"):
        plan.with_sizes(PublicSizes(counts=(120, 80, 99)), None)


def test_the_pooled_draw_is_b_uniform_rows_a_round_split_by_party() -> None:
    counts, b, rounds = (120, 80, 100), 30, 4000
    draws = pooled_draws(counts, b, rounds, torch.Generator().manual_seed(7))
    bits = np.concatenate([np.stack([d.bits(t) for t in range(rounds)]) for d in draws], axis=1)
    assert np.all(bits.sum(axis=1) == b)  # exactly b a round
    per_row = bits.sum(axis=0)  # each row drawn w.p. b/N a round
    assert stats.chisquare(per_row).pvalue > 1e-4
    alice = bits[:, :120].sum(axis=1)  # alice's count a round: hypergeometric(300, 120, 30)
    k = np.arange(0, 31)
    expected = stats.hypergeom(300, 120, 30).pmf(k) * rounds
    obs = np.bincount(alice, minlength=31)
    keep = expected >= 5
    obs_k = np.append(obs[keep], obs[~keep].sum())
    exp_k = np.append(expected[keep], expected[~keep].sum())
    assert stats.chisquare(obs_k, exp_k * obs_k.sum() / exp_k.sum()).pvalue > 1e-4
    assert draws[1].next().max() < 80 and draws[1].round == 1


def test_replacing_a_row_moves_the_release_by_at_most_the_stated_sensitivity() -> None:
    """Noise-free rounds on the same draws: party bob's first row replaced by one whose gradient
    points the other way; the revealed sums differ by ≤ 2C/b, reached when that row is drawn."""
    spec = _spec()
    g = torch.Generator().manual_seed(0)
    parts = []
    for n in ROWS.values():
        X = torch.randn(n, 6, generator=g) * 4.0
        parts.append((X, (X[:, 0] > 0).long()))
    worst, stated = 0.0, None
    for seed in range(6):
        releases = []
        for flip in (False, True):
            rows = [(X.clone(), y.clone()) for X, y in parts]
            if flip:
                rows[1][0][0] = -rows[1][0][0]
            draws = pooled_draws(list(ROWS.values()), 30, 1, torch.Generator().manual_seed(seed))
            job = DpSgd(spec, noise=NoiseSpec("none", 0.0))
            contrib = torch.cat([job.local_contribution(X, y, d)[0] for (X, y), d in zip(rows, draws, strict=True)])
            releases.append(InProcessAggregator(torch.Generator()).aggregate(
                contrib, torch.full((3,), job.weight, dtype=torch.float64), NoiseSpec("none", 0.0)))
            stated = job.plan.sensitivity_l2()
        worst = max(worst, float((releases[0] - releases[1]).norm()))
    assert stated == pytest.approx(2.0 / 30)
    assert 0.5 * stated < worst <= stated * (1 + 1e-12)


def test_a_partys_draws_refuse_a_wrong_shape_and_running_out() -> None:
    with pytest.raises(ValueError, match="packed bytes expected for 9 rows"):
        RowDraws(np.zeros((2, 1), dtype=np.uint8), 9)
    d = RowDraws(np.packbits(np.array([[1, 0, 1]], dtype=np.uint8), axis=1), 3)
    assert d.next().tolist() == [0, 2]
    with pytest.raises(ValueError, match="only 1 rounds"):
        d.next()


def test_a_job_file_draws_pooled_batches_only_with_three_replicated_parties_each_counted() -> None:
    import tomllib

    from mpc_erm.jobs.jobfile import JobFile, JobFileError
    from tests.parties.test_pooled_batch_daemons import JOB

    text = JOB.format(alice=120)
    assert JobFile.from_toml_dict(tomllib.loads(text)).spec.training.batch_size == 30
    for change, field in ((('trust = "replicated"', 'trust = "dealer"\ndealer = "dealer"'), "training.batch_size"),
                          (("carol = 100", "dave = 100"), "privacy.party_rows"),
                          (('trust = "replicated"', 'trust = "replicated"\nsecurity = "malicious"'),
                           "training.batch_size: security")):
        with pytest.raises(JobFileError, match=field):
            JobFile.from_toml_dict(tomllib.loads(text.replace(*change)))


def test_job_plan_says_how_the_batches_are_drawn(tmp_path: Any, monkeypatch: Any) -> None:
    from click.testing import CliRunner

    from coordinator.cli import cli
    from tests.parties.test_pooled_batch_daemons import JOB

    monkeypatch.chdir(tmp_path)
    for i, (name, n) in enumerate(ROWS.items()):
        X = np.random.default_rng(i).normal(size=(n, 6)) / 3.0
        np.savez(tmp_path / f"{name}.npz", X=X, y=np.where(X[:, 0] > 0, 1.0, -1.0))
    (tmp_path / "job.toml").write_text(JOB.format(alice=120))
    args = ["job", "plan", "job.toml", "--runs", "1", *[a for n in ROWS for a in ("--data", f"{n}.npz")]]
    run = CliRunner().invoke(cli, args)
    assert run.exit_code == 0, run.output
    assert "batches: exactly 30 of the 300 pooled rows a round, drawn by the parties' secret shuffle" in run.output
    (tmp_path / "job.toml").write_text(JOB.format(alice=121))
    wrong = CliRunner().invoke(cli, args)
    assert wrong.exit_code != 0 and "privacy.party_rows" in wrong.output, wrong.output
