"""A missing or damaged ledger never becomes a fresh budget: real `mpc-erm party serve` processes
(issue 13 item 9, issue 14 item 6).

The party's state dir holds charges in both the ledger and the hash-chained audit log (as a worker
leaves them). Then the ledger is deleted, or overwritten with garbage: the daemon must exit
non-zero before serving, with one line on stderr naming the file and the command that repairs it
(no traceback), and must not create a fresh ledger. After `mpc-erm budget rebuild` it serves
again: `budget show` reports what was spent before the damage, and the daemon's admission
refuses a job on the data set whose budget the log's charges exhausted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from parties.audit import AuditLog
from parties.ledger import LEDGER_FILE, Ledger
from tests.parties import test_daemon
from tests.parties.test_daemon import job_toml, refused, stub, submit, write_config

pki_dir = test_daemon.pki_dir  # the CA and identities (a module-scoped fixture)

pytestmark = pytest.mark.reliability
ROOT = Path(__file__).resolve().parents[2]
FAKE = "tests.parties.test_daemon"  # the stand-in worker: no job here reaches a worker that reveals


def spend(state: Path, job_id: str, epsilon: float) -> None:
    """What a worker leaves behind: the ledger row spent, then the charge in the audit log."""
    with Ledger.in_state_dir(state, {"adult": (2.5, 1e-3)}) as led:
        led.reserve(job_id, "adult", epsilon, 1e-5, "d" * 64)
        led.mark_revealed(job_id)
        led.commit(job_id)
    AuditLog.in_state_dir(state).charge(job_id, dataset="adult", epsilon=epsilon, delta=1e-5, spec_digest="d" * 64,
                                        dp_event=None)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "coordinator.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _delete(p: Path) -> None:
    p.unlink()


def _garbage(p: Path) -> None:
    p.write_bytes(os.urandom(16384))


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:4096])


@pytest.mark.parametrize(("damage", "what"), [
    (_delete, "missing, but audit.jsonl charges 3 job(s)"),
    # the other damages in `make test-all` (the default suite keeps the deleted ledger, issue 14's case)
    pytest.param(_garbage, "damaged or not a SQLite database (SQLite: file is not a database)", marks=pytest.mark.slow),
    pytest.param(_truncate, "damaged or not a SQLite database (SQLite: database disk image is malformed)",
                 marks=pytest.mark.slow),
])
def test_a_damaged_ledger_stops_the_daemon_with_one_line_then_rebuild_restores_the_spend(
        tmp_path: Path, pki_dir: Path, damage: Callable[[Path], None], what: str) -> None:
    cfg = write_config(tmp_path, pki_dir, "alice")  # adult: ε 2.5, policy ≤ 1 per job
    state = cfg.parent / "state"
    for job_id, eps in (("spent-1", 1.0), ("spent-2", 1.0), ("spent-3", 0.5)):  # the whole 2.5
        spend(state, job_id, eps)
    ledger = state / LEDGER_FILE
    with Ledger(ledger) as led:
        (before,) = led.show()
    damage(ledger)

    served = cli("party", "serve", "--config", str(cfg), "--worker-module", FAKE)
    lines = served.stderr.splitlines()
    assert served.returncode != 0 and served.stdout == "", (served.returncode, served.stdout)
    assert len(lines) == 1 and "Traceback" not in served.stderr, served.stderr
    assert lines[0].startswith(f"error: {ledger}: {what}"), lines[0]
    assert f"mpc-erm budget rebuild --state-dir {state}" in lines[0], lines[0]
    assert ledger.exists() == (damage is not _delete)  # nothing was created in its place
    assert not (state / "jobs.sqlite3").exists()  # refused before anything else was touched

    shown = cli("budget", "show", "--config", str(cfg))
    assert shown.returncode != 0 and shown.stderr.splitlines() == lines, shown.stderr

    rebuilt = cli("budget", "rebuild", "--state-dir", str(state))
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "3 charged job(s) restored as committed" in rebuilt.stdout, rebuilt.stdout

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "party", "serve", "--config", str(cfg),
                             "--worker-module", FAKE], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)
    try:
        hello = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert hello["event"] == "listening", hello
        s = stub(pki_dir, hello["port"])
        # the log's charges exhausted the budget: a fresh ledger would have admitted this job
        err = refused(lambda: submit(s, "one-more", job_toml("block", epsilon=0.5)))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "'adult'" in err.details(), err.details()
    finally:
        proc.terminate()
        proc.wait(30)
    shown = cli("budget", "show", "--config", str(cfg), "--json")
    row = json.loads(shown.stdout)["datasets"][0]
    assert (row["epsilon_total"], row["epsilon_spent"], row["epsilon_reserved"]) == (2.5, before.epsilon_spent, 0.0)
    assert row["jobs"] == 3 and before.epsilon_remaining <= 1e-9
