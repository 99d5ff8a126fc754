"""The ledger checked against the audit log (parties.ledger_check), `budget show` on a damaged
ledger, and `mpc-erm budget rebuild` through the CLI's main.

A state dir is built the way a worker leaves it: the ledger row reserved, marked revealed and
committed, then the job's charge (and a release) appended to the hash-chained audit log.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from parties.audit import AuditLog
from parties.config import load_party_config
from parties.ledger import LEDGER_FILE, Ledger
from parties.ledger_check import AuditDamaged, LedgerDamaged, check_ledger, rebuild_ledger
from parties.sqlite_store import StoreDamaged
from tests.parties import test_daemon
from tests.parties.test_daemon import write_config

pki_dir = test_daemon.pki_dir  # the CA and identities (a module-scoped fixture)
TOTALS = {"adult": (2.5, 1e-3), "housing": (1.0, 1e-3)}


def gaussian_event() -> dict:
    """A Gaussian-rounds mechanism in the dict form the ledger and the log hold (the rebuild stores
    it as the log holds it, without interpreting it)."""
    try:
        from mpc_erm.privacy.events import GaussianRounds
    except ImportError:  # the ledger's event dicts before the typed events of issue 13
        return {"kind": "gaussian", "noise_multiplier": 20.0, "rounds": 4, "delta_extra": 1e-10}
    return GaussianRounds(rounds=4, adjacency="replace", sampler_tv=1e-12, noise_multiplier=20.0).as_dict()


def charge(state: Path, job_id: str, epsilon: float, dataset: str = "adult", *, event: dict | None = None,
           in_ledger: bool = True, in_log: bool = True) -> None:
    """One job as the worker leaves it: ledger row spent, then the log's charge and a release."""
    if in_ledger:
        with Ledger.in_state_dir(state, TOTALS) as led:
            led.reserve(job_id, dataset, epsilon, 1e-5, "d" * 64, event)
            led.mark_revealed(job_id, event)
            led.commit(job_id)
    if in_log:
        log = AuditLog.in_state_dir(state)
        log.charge(job_id, dataset=dataset, epsilon=epsilon, delta=1e-5, spec_digest="d" * 64, dp_event=event)
        log.release(job_id, what="noisy model", value=np.zeros(3), round=1, rounds=1)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    s = tmp_path / "state"
    charge(s, "j1", 1.0)
    charge(s, "j2", 0.5)
    charge(s, "h1", 0.25, "housing")
    return s


def one_line_naming(exc: BaseException, path: Path, *words: str) -> str:
    msg = str(exc)
    assert "\n" not in msg and msg.startswith(f"{path}: "), msg
    for w in words:
        assert w in msg, (w, msg)
    return msg


def sql(path: Path, stmt: str, *args: object) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(stmt, args)
    conn.close()


# --------------------------------------------------------------------------- the check


def test_a_fresh_state_dir_passes_and_nothing_is_created(tmp_path: Path) -> None:
    c = check_ledger(tmp_path / "new")
    assert (c.ledger_exists, c.audit_records, c.charged_jobs) == (False, 0, 0)
    assert not (tmp_path / "new").exists()


def test_a_ledger_without_an_audit_log_passes(tmp_path: Path) -> None:
    with Ledger.in_state_dir(tmp_path, TOTALS) as led:  # reservations, never revealed: nothing logged
        led.reserve("r1", "adult", 1.0, 1e-5, "d" * 64)
    assert check_ledger(tmp_path).charged_jobs == 0


def test_a_clean_state_passes(state: Path) -> None:
    c = check_ledger(state)
    assert (c.ledger_exists, c.charged_jobs, c.audit_records) == (True, 3, 6)
    assert c.audit_head == AuditLog.in_state_dir(state).head()


def test_a_ledger_row_spent_but_not_yet_logged_passes(state: Path) -> None:
    charge(state, "j3", 0.5, in_log=False)  # the worker marks the ledger before it appends the charge
    assert check_ledger(state).charged_jobs == 3


@pytest.mark.parametrize("sidecars", [False, True])
def test_a_deleted_ledger_is_refused(state: Path, sidecars: bool) -> None:
    (state / LEDGER_FILE).unlink()
    if sidecars:  # a WAL left behind does not make it a ledger again
        (state / (LEDGER_FILE + "-wal")).write_bytes(b"")
    with pytest.raises(LedgerDamaged) as info:
        check_ledger(state)
    one_line_naming(info.value, state / LEDGER_FILE, "missing, but audit.jsonl charges 3 job(s)",
                    "first: job 'j1', ε=1 on 'adult'", f"mpc-erm budget rebuild --state-dir {state}")
    assert not (state / LEDGER_FILE).exists()  # the check created nothing


def _truncate_half(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _garbage(p: Path) -> None:
    p.write_bytes(os.urandom(8192))


def _empty(p: Path) -> None:
    p.write_bytes(b"")


@pytest.mark.parametrize(("damage", "words"), [
    (_truncate_half, ("damaged or not a SQLite database", "database disk image is malformed")),
    (_garbage, ("damaged or not a SQLite database", "file is not a database")),
    (_empty, ("holds no ledger tables (empty or truncated), but audit.jsonl charges 3 job(s)",)),
])
def test_a_truncated_or_garbage_ledger_is_refused(state: Path, damage: Callable[[Path], None],
                                                  words: tuple[str, ...]) -> None:
    path = state / LEDGER_FILE
    assert not (state / (LEDGER_FILE + "-wal")).exists()  # every row is in the main file
    damage(path)
    with pytest.raises(LedgerDamaged) as info:
        check_ledger(state)
    one_line_naming(info.value, path, *words, "budget rebuild")


@pytest.mark.parametrize(("edit", "words"), [
    ("DELETE FROM jobs WHERE job_id = 'j2'",
     "1 of the 3 job(s) charged in audit.jsonl are not in it (first: 'j2', ε=0.5 on 'adult', audit record 3)"),
    ("UPDATE jobs SET epsilon = 0.1 WHERE job_id = 'j1'", "1 job(s) with less ε than charged ('j1' holds ε=0.1, "
                                                          "charged ε=1)"),
    ("UPDATE jobs SET state = 'released' WHERE job_id = 'h1'",
     "1 job(s) charged but not spent here ('h1' is released)"),
    ("UPDATE jobs SET dataset = 'housing' WHERE job_id = 'j1'",
     "1 job(s) on another data set ('j1' on 'housing', charged on 'adult')"),
])
def test_a_ledger_holding_less_than_the_log_is_refused(state: Path, edit: str, words: str) -> None:
    sql(state / LEDGER_FILE, edit)
    with pytest.raises(LedgerDamaged) as info:
        check_ledger(state)
    one_line_naming(info.value, state / LEDGER_FILE, f"does not match {state / 'audit.jsonl'}", words,
                    "would grant spent budget again")


def test_an_older_backup_of_the_ledger_is_refused(state: Path, tmp_path: Path) -> None:
    backup = tmp_path / "backup.sqlite3"
    backup.write_bytes((state / LEDGER_FILE).read_bytes())
    charge(state, "j3", 0.5)
    os.replace(backup, state / LEDGER_FILE)  # restored from yesterday's backup
    with pytest.raises(LedgerDamaged, match=r"1 of the 4 job\(s\) charged in audit.jsonl are not in it "
                                            r"\(first: 'j3'"):
        check_ledger(state)


def test_a_broken_audit_log_is_refused(state: Path) -> None:
    log = state / "audit.jsonl"
    lines = log.read_text().splitlines()
    del lines[2]
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(AuditDamaged) as info:
        check_ledger(state)
    one_line_naming(info.value, log, "does not verify (line 3: chain broken", "audit_head")


@pytest.mark.parametrize("store", ["ledger", "jobs"])
def test_the_stores_name_a_file_sqlite_cannot_read(tmp_path: Path, store: str) -> None:
    from parties.job_store import JobStore

    path = tmp_path / f"{store}.sqlite3"
    _garbage(path)
    with pytest.raises(StoreDamaged) as info:
        Ledger(path, TOTALS) if store == "ledger" else JobStore(path)
    assert isinstance(info.value, sqlite3.DatabaseError) and isinstance(info.value, ValueError)
    one_line_naming(info.value, path, "damaged or not a SQLite database (SQLite: file is not a database)",
                    "move the file aside")


# --------------------------------------------------------------------------- rebuild


def spent(state: Path) -> dict[str, float]:
    with Ledger.in_state_dir(state) as led:
        return {row.dataset: led.spent(row.dataset) for row in led.show()}


def test_rebuild_restores_every_charge_as_committed(state: Path) -> None:
    before = spent(state)
    (state / LEDGER_FILE).unlink()
    r = rebuild_ledger(state, TOTALS)
    assert r.moved_to is None and r.restored == ("j1", "j2", "h1") and r.kept == () and r.placeholder_totals == ()
    assert spent(state) == before == {"adult": 1.5, "housing": 0.25}
    with Ledger.in_state_dir(state) as led:
        row = led.get("j1")
        assert (row.state, row.dataset, row.epsilon, row.delta, row.spec_digest) == ("committed", "adult", 1.0,
                                                                                      1e-5, "d" * 64)
        assert row.reason == "restored from audit.jsonl record 1"
    check_ledger(state)


def test_rebuild_keeps_the_dp_event_and_spent_rows_the_log_lacks(tmp_path: Path) -> None:
    state, event = tmp_path / "state", gaussian_event()
    charge(state, "j1", 0.5, event=event)
    charge(state, "j2", 0.5, event=event)
    charge(state, "j3", 0.5, event=event, in_log=False)  # crashed between the ledger's mark and the log
    before = spent(state)
    with Ledger.in_state_dir(state) as led:
        events = {j: led.get(j).dp_event for j in ("j1", "j2", "j3")}
    sql(state / LEDGER_FILE, "DELETE FROM jobs WHERE job_id = 'j1'")
    r = rebuild_ledger(state, TOTALS)
    assert r.restored == ("j1", "j2") and r.kept == ("j3",)
    assert r.moved_to is not None and r.moved_to.name.startswith(LEDGER_FILE + ".damaged-")
    with sqlite3.connect(r.moved_to) as old:  # the damaged file is kept as it was
        assert [j for (j,) in old.execute("SELECT job_id FROM jobs ORDER BY job_id")] == ["j2", "j3"]
    with Ledger.in_state_dir(state) as led:
        assert {j: led.get(j).dp_event for j in ("j1", "j2", "j3")} == events
    assert spent(state) == before  # composed as before the damage


def test_rebuild_without_totals_leaves_nothing_to_spend_until_the_config_says(state: Path) -> None:
    _garbage(state / LEDGER_FILE)
    r = rebuild_ledger(state)
    assert r.placeholder_totals == ("adult", "housing")
    with Ledger.in_state_dir(state) as led:
        assert {row.dataset: row.epsilon_remaining for row in led.show()} == {"adult": 0.0, "housing": 0.0}
    with Ledger.in_state_dir(state, TOTALS) as led:  # what the daemon does at start
        assert {row.dataset: row.epsilon_remaining for row in led.show()} == {"adult": 1.0, "housing": 0.75}


def test_rebuild_refuses_without_a_log_a_broken_log_or_a_healthy_ledger(state: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="matches audit.jsonl .*nothing to rebuild"):
        rebuild_ledger(state, TOTALS)
    assert rebuild_ledger(state, TOTALS, force=True).restored == ("j1", "j2", "h1")
    lonely = tmp_path / "lonely"
    with Ledger.in_state_dir(lonely, TOTALS):
        pass
    _garbage(lonely / LEDGER_FILE)
    with pytest.raises(ValueError, match="no audit log, nothing to rebuild"):
        rebuild_ledger(lonely, TOTALS)
    assert (lonely / LEDGER_FILE).exists()  # left as it was


# --------------------------------------------------------------------------- the CLI (its real main)


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str,
                                                                                                       str]:
    from coordinator.cli import main

    monkeypatch.setattr(sys, "argv", ["mpc-erm", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def party(tmp_path: Path, pki_dir: Path) -> tuple[Path, Path]:
    cfg = write_config(tmp_path, pki_dir, "alice")  # adult: ε 2.5, δ 1e-3; state dir alice/state
    state = load_party_config(cfg).state_dir
    charge(state, "j1", 1.0)
    charge(state, "j2", 0.5)
    return cfg, state


def test_cli_budget_show_and_rebuild(party: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg, state = party
    code, out, _ = run_main(monkeypatch, capsys, "budget", "show", "--config", str(cfg), "--json")
    assert code == 0 and json.loads(out)["datasets"][0]["epsilon_spent"] == 1.5
    (state / LEDGER_FILE).unlink()
    code, out, err = run_main(monkeypatch, capsys, "budget", "show", "--config", str(cfg))
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {state / LEDGER_FILE}: missing, but audit.jsonl charges 2 job(s)"), err
    assert not (state / LEDGER_FILE).exists()  # `show` did not create a fresh ledger

    code, out, err = run_main(monkeypatch, capsys, "budget", "rebuild", "--state-dir", str(state), "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["restored"] == ["j1", "j2"] and got["moved_to"] is None and got["epsilon_spent"] == {"adult": 1.5}
    code, out, _ = run_main(monkeypatch, capsys, "budget", "show", "--config", str(cfg), "--json")
    row = json.loads(out)["datasets"][0]
    assert code == 0 and (row["epsilon_total"], row["epsilon_spent"], row["epsilon_remaining"]) == (2.5, 1.5, 1.0)

    code, out, err = run_main(monkeypatch, capsys, "budget", "rebuild", "--config", str(cfg))
    assert code == 2 and "nothing to rebuild" in err and len(err.splitlines()) == 1


def test_cli_rebuild_of_a_garbage_ledger_with_the_config(party: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    cfg, state = party
    _garbage(state / LEDGER_FILE)
    code, out, err = run_main(monkeypatch, capsys, "budget", "show", "--config", str(cfg))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {state / LEDGER_FILE}: damaged or not a SQLite database (SQLite: file is not a "
                          "database); stop here"), err
    code, out, err = run_main(monkeypatch, capsys, "budget", "rebuild", "--config", str(cfg))
    assert code == 0, err
    assert "2 charged job(s) restored as committed" in out and "adult: ε spent 1.5 of 2.5" in out
    (moved,) = state.glob(LEDGER_FILE + ".damaged-*")
    assert f"the old file is at {moved}" in out and len(moved.read_bytes()) == 8192
    assert math.isclose(spent(state)["adult"], 1.5)
    code, _, err = run_main(monkeypatch, capsys, "budget", "rebuild")
    assert code == 2 and "exactly one of --state-dir and --config" in err
