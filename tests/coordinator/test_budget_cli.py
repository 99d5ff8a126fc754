"""`mpc-erm budget show`: every figure whole at 80 columns, the largest ε a further job could ask
beside what is spent, what a further job of a stated ε would bring the total to, and the same
fields in --json.

The δ figures are the composition's least δ within the lifetime ε (parties.ledger.delta_used):
stated at the lifetime δ instead, one Gaussian job would "use" all of it and δ would read as gone
while admission still has room.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mpc_erm.privacy.events import GaussianRounds, PureDp, compose
from parties.audit import AuditLog
from parties.config import load_party_config
from parties.ledger import Ledger, delta_used
from tests.parties import test_daemon
from tests.parties.test_daemon import write_config

pki_dir = test_daemon.pki_dir  # the CA and identities (a module-scoped fixture)
LONG = "communities_crime"  # the longest built-in data set id


def _gauss(z: float, rounds: int = 1) -> GaussianRounds:
    return GaussianRounds(rounds=rounds, adjacency="replace", sampler_tv=1e-12, noise_multiplier=z)


def _charge(state: Path, job_id: str, dataset: str, ev: GaussianRounds, *, commit: bool = True) -> None:
    """A job as the worker leaves it (ledger spent, audit log charged); commit=False: still reserved."""
    with Ledger.in_state_dir(state) as led:
        led.reserve(job_id, dataset, 1.0, 1e-5, "d" * 64, ev)
        if not commit:
            return
        led.mark_revealed(job_id, ev)
        led.commit(job_id)
    log = AuditLog.in_state_dir(state)
    log.charge(job_id, dataset=dataset, epsilon=1.0, delta=1e-5, spec_digest="d" * 64, dp_event=ev.as_dict())
    log.release(job_id, what="noisy model", value=np.zeros(3), round=1, rounds=1)


@pytest.fixture
def party(tmp_path: Path, pki_dir: Path) -> Path:
    cfg = write_config(tmp_path, pki_dir, "alice")  # adult: ε 2.5, δ 1e-3, replace
    cfg.write_text(cfg.read_text().replace("\n[policy]\n", f'\n[datasets.{LONG}]\nformat = "npz"\npath = "rows.npz"\n'
                                           'epsilon = 1000.0\ndelta = 1e-5\nadjacency = "add_remove"\n\n[policy]\n'))
    state = load_party_config(cfg).state_dir
    with Ledger.for_config(load_party_config(cfg)):
        pass  # the budgets, written as the daemon does at start
    _charge(state, "j1", "adult", _gauss(3.0))
    _charge(state, "j2", "adult", _gauss(4.0), commit=False)  # open: counted in remaining
    _charge(state, "k1", LONG, GaussianRounds(rounds=1000, adjacency="add_remove", sampler_tv=0.0,
                                              noise_multiplier=1.1, sampling_rate=0.01))
    return cfg


def test_delta_used_is_the_dual_of_the_epsilon_figure() -> None:
    """δ used at the lifetime ε: the composition at that δ is within ε (and not at 0.1 % less);
    exactly 0 for pure ε-DP, exactly Σδ for basic composition, the whole δ when ε is over."""
    evs = [_gauss(3.0), _gauss(4.0, 10)]
    d = delta_used(evs, 4.0, 1e-3, "replace")
    assert 0 < d < 1e-3
    assert compose(evs, d, "replace").epsilon <= 4.0 * (1 + 1e-9) < compose(evs, d / 1.0011, "replace").epsilon
    assert delta_used([PureDp(rounds=2, adjacency="replace", epsilon=0.5)], 2.0, 1e-5, "replace") == 0.0
    assert delta_used([], 2.0, 1e-5, "replace") == 0.0
    assert delta_used(evs, 0.1, 1e-3, "replace") == 1e-3  # over the lifetime ε: all of δ


def test_budget_show_fits_80_columns_with_delta_remaining(party: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from coordinator.cli import cli

    monkeypatch.setenv("COLUMNS", "80")
    out = CliRunner().invoke(cli, ["budget", "show", "--config", str(party), "--json"])
    assert out.exit_code == 0, out.output
    got = {r["dataset"]: r for r in json.loads(out.output)["datasets"]}
    with Ledger.in_state_dir(load_party_config(party).state_dir) as led:
        rows = {r.dataset: r for r in led.show()}
    for ds, r in rows.items():
        j = got[ds]
        assert j["delta_remaining"] == pytest.approx(r.delta_remaining) and j["adjacency"] == r.adjacency
        assert {"epsilon_total", "epsilon_spent", "epsilon_remaining", "delta_total", "delta_spent", "jobs"} <= set(j)
        # δ runs out with ε: both left, and what is left adds up
        assert 0 < r.delta_remaining < r.delta_total and r.epsilon_remaining > 0, r
        assert math.isclose(r.delta_spent + r.delta_reserved + r.delta_remaining, r.delta_total, rel_tol=1e-9)
    assert rows["adult"].delta_reserved > 0 and rows[LONG].delta_reserved == 0

    out = CliRunner().invoke(cli, ["budget", "show", "--config", str(party)])
    assert out.exit_code == 0, out.output
    assert max(map(len, out.output.splitlines())) <= 80, "\n" + out.output
    lines = [x.rstrip() for x in out.output.splitlines()]
    header = next(x for x in lines if "data set" in x)
    for col in ("adjacency", "jobs", "spent / lifetime", "next job up to"):
        assert col in header, header
    from coordinator.cli.budget import _delta, _eps, _next_job_event

    for ds, r in rows.items():  # every figure whole, on its data set's ε row or the δ row under it
        at = next(i for i, x in enumerate(lines) if x.split()[:1] == [ds])
        eps_row, delta_row = lines[at], lines[at + 1]
        largest = got[ds]["next_job"]["largest_epsilon"]
        want = rf" {r.adjacency} +{r.jobs} +ε +{_eps(r.epsilon_spent)} / {_eps(r.epsilon_total)} +" \
               rf"{_eps(largest)}$"
        assert re.search(want, eps_row), (want, eps_row)
        want = rf"^ +δ +{_delta(r.delta_spent)} / {_delta(r.delta_total)} +at δ {_delta(r.delta_total)}$"
        assert re.search(want, delta_row), (want, delta_row)
        with Ledger.in_state_dir(load_party_config(party).state_dir) as led:  # it fits; 1 % more does not
            assert led.fits(ds, _next_job_event(largest, r.delta_total, r.adjacency))
            assert largest == min(r.epsilon_total, 100.0) or not led.fits(
                ds, _next_job_event(largest * 1.01, r.delta_total, r.adjacency))  # a job asks ε ≤ 100
    assert _delta(1e-5) == "1e-5" and _delta(2.02e-10) == "2.02e-10" and _delta(0.0) == "0"
    assert f"adult: ε {_eps(rows['adult'].epsilon_reserved)}" in out.output and "reserved by 1 open job" in out.output


def test_budget_explain_states_the_ledgers_figures_in_words(party: Path) -> None:
    """`budget explain`: the spent ε it prints is the ledger's own (`budget show`), each job is
    restated at the lifetime δ, the open job is counted apart, and an unknown data set is named."""
    from coordinator.cli import cli

    out = CliRunner().invoke(cli, ["budget", "explain", "--config", str(party), "--dataset", "adult"])
    assert out.exit_code == 0, out.output
    with Ledger.for_config(load_party_config(party)) as led:
        row = next(r for r in led.show() if r.dataset == "adult")
    assert f"**Spent: ε = {row.epsilon_spent:.4g} at δ = 0.001**" in out.output
    one = compose([_gauss(3.0)], 1e-3, "replace").epsilon
    assert f"| j1 | committed | (1, 1e-05) | {one:.4g} |" in out.output
    assert f"hold ε {row.epsilon_reserved:.4g} more" in out.output
    assert LONG not in out.output  # only the data set asked for
    bad = CliRunner().invoke(cli, ["budget", "explain", "--config", str(party), "--dataset", "nope"])
    assert bad.exit_code == 2 and "no data set 'nope'" in bad.output and "--dataset" in bad.output


def test_the_next_job_is_stated_as_the_total_it_brings_not_as_a_remainder(tmp_path: Path, pki_dir: Path) -> None:
    """A lifetime ε = 4: after an ε = 2 job a "remaining" of ε 4 − 2 = 2 read like a cap, yet a
    further ε = 2 job brings the total only to 3.04 (they compose) and is admitted, and an ε = 3
    job too (3.87). `budget show --next-epsilon` states the composed total each would bring and the
    largest ε that fits, both by the admission rule, each checked here against the ledger."""
    from coordinator.cli import cli
    from coordinator.cli.budget import _next_job_event

    cfg = write_config(tmp_path, pki_dir, "alice")
    cfg.write_text(re.sub(r"(\[datasets\.adult\][^\[]*?)epsilon = [0-9.]+", r"\g<1>epsilon = 4.0", cfg.read_text()))
    party_cfg = load_party_config(cfg)
    assert party_cfg.datasets["adult"].epsilon == 4.0
    first = _next_job_event(2.0, 1e-3, "replace")
    with Ledger.for_config(party_cfg) as led:
        led.reserve("first", "adult", 2.0, 1e-3, "d" * 64, first)
        led.mark_revealed("first", first)
        led.commit("first")
    for eps in (2.0, 3.0, 6.0):
        out = CliRunner().invoke(cli, ["budget", "show", "--config", str(cfg), "--next-epsilon", str(eps), "--json"])
        assert out.exit_code == 0, out.output
        nxt = {r["dataset"]: r for r in json.loads(out.output)["datasets"]}["adult"]["next_job"]
        want = compose([first, _next_job_event(eps, 1e-3, "replace")], 1e-3, "replace").epsilon
        stated = math.inf if nxt["total_after"] is None else nxt["total_after"]  # JSON has no inf
        assert stated == pytest.approx(want, rel=1e-9) and nxt["admitted"] == (want <= 4.0), (eps, nxt)
        assert 3.0 < nxt["largest_epsilon"] < 6.0  # more than 4 − 2, less than the ε = 6 that is refused
    assert nxt["admitted"] is False
    text = " ".join(CliRunner().invoke(cli, ["budget", "show", "--config", str(cfg), "--next-epsilon", "3"]
                                       ).output.split())
    assert re.search(r"adult: a further job of ε = 3 \(δ = 0\.001\) would bring the total to ε = 3\.[0-9]+ of 4: "
                     r"admitted", text), text
    assert "jobs compose, they do not add up" in text
