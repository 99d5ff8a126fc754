"""A failed job-store or ledger write no longer kills the thread that watches the job (issue 14 item 2).

Before: ``scheduler error … add_event … sqlite3.OperationalError: database or disk is full``, the
job then showed ``running`` for ever and its ledger row stayed ``revealed`` until a restart (and a
cancel while the disk was full failed with the same traceback). Now (``parties.supervision``) every
supervising loop survives a storage error: an event the store cannot take is dropped (one log
line), the job ends with its reason, its budget is settled and its terminal status written, each
retried with backoff until it succeeds; meanwhile the job store serves the terminal status from
memory (``parties.job_store``), so the job is seen ended while the disk is still full.

* fast (default suite, needs root for the tmpfs; skipped with the reason otherwise): one real
  daemon (stand-in worker, real worker processes) whose state directory is an 8 MiB tmpfs. Two jobs
  run, a third is queued; the tmpfs is filled. The running job that writes fails (STORAGE), the
  other two are cancelled: all three are seen ended while the disk is full (and still live in the
  file, which proves the daemon's own writes failed). Space freed: the file and the ledger catch
  up, and the next job succeeds with no restart.
* fast, unit level (the same daemon, the store's or ledger's methods made to fail): a job that
  cannot be started, a ledger commit and a terminal write that fail a few times, events that never
  fit, a daemon stopped while it retries (its next start settles the job).
* ``reliability`` + ``e2e`` (~35 s): a real consortium on UCI Adult (3 parties, replicated sharing), alice's
  state directory on a tmpfs filled mid-job (fresh SQLite files: their writes need new space).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tomllib

from coordinator.consortium import LocalConsortium
from mpc_erm.mpc import tls
from mpc_erm.mpc._proto import party_pb2 as pb
from parties.config import load_party_config
from parties.daemon import RESTART_REASON, PartyDaemon
from parties.ledger import Ledger
from tests.parties import test_daemon
from tests.parties.test_daemon import job_toml as fake_job
from tests.parties.test_daemon import status, stub, submit, write_config
from tests.reliability.faults import audit_records, tmpfs, wait_for
from tests.reliability.test_disk_full import fill, ledger_view, statuses, wait_ended
from tests.reliability.test_disk_full import submit as submit_gradient

pki_dir = test_daemon.pki_dir  # the CA and identities (a module-scoped fixture)
stand_ins = test_daemon.stand_ins  # the other members of the jobs: they agree to every job (module-scoped)
HERE = __name__  # the worker module of the daemons here
FULL = "database or disk is full"


# --------------------------------------------------------------------------- the stand-in worker


def run_party_job(ctx: Any) -> dict[str, Any]:
    """``probe``: marks the job revealed, then writes 4 KiB and emits an event every 50 ms until a
    write fails (the job then fails: STORAGE) or it is cancelled; other names: the stand-in of
    ``tests/parties/test_daemon.py``."""
    from parties.context import JobCancelled

    if tomllib.loads(ctx.job_toml)["job"]["name"] != "probe":
        return test_daemon.run_party_job(ctx)
    with Ledger(ctx.ledger_path) as led:
        led.mark_revealed(ctx.job_id)
    t = 0
    with (ctx.job_dir / "probe.bin").open("ab") as fh:
        while not ctx.cancelled():
            t += 1
            ctx.emit({"phase": "training", "round": t, "rounds": 10**6})
            fh.write(b"\0" * 4096)
            fh.flush()
            os.fsync(fh.fileno())
            time.sleep(0.05)
    raise JobCancelled("stopped on request")


# --------------------------------------------------------------------------- helpers


class Lines(logging.Handler):
    """The daemon's log lines, kept in memory (its log file is on the full disk)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str | None, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((getattr(record, "job_id", None), record.getMessage()))

    def of(self, job_id: str, text: str) -> list[str]:
        return [m for j, m in self.lines if j == job_id and text in m]


@contextlib.contextmanager
def daemon(cfg_path: Path, pki: Path) -> Iterator[tuple[PartyDaemon, Any, Lines]]:
    """alice's daemon (in this process, its workers real processes) with the stand-in worker."""
    d = PartyDaemon(load_party_config(cfg_path), worker_module=HERE, cancel_grace_s=1.0, log_to_stderr=False)
    d.start()
    lines = Lines()
    d.log.logger.addHandler(lines)
    try:
        yield d, stub(pki, d.port), lines
    finally:
        d.stop()


def stored(state: Path, job_id: str) -> str | None:
    """The job's status in the file itself (read-only: no write, whatever the disk)."""
    with contextlib.closing(sqlite3.connect(f"file:{state / 'jobs.sqlite3'}?mode=ro", uri=True)) as c:
        row = c.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return None if row is None else str(row[0])


def ledger_state(state: Path, job_id: str) -> str | None:
    with contextlib.closing(sqlite3.connect(f"file:{state / 'ledger.sqlite3'}?mode=ro", uri=True)) as c:
        row = c.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
    return None if row is None else str(row[0])


def failing(real: Callable[..., Any], times: int) -> Callable[..., Any]:
    """``real``, except that its first ``times`` calls raise SQLite's disk-full error."""
    calls = {"n": 0}

    def call(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= times:
            raise sqlite3.OperationalError(FULL)
        return real(*args, **kwargs)

    return call


def failing_events(store: Any, fails: Callable[[str], bool]) -> None:
    """Make the job store's event inserts (every write of a job's state adds one: its status, its
    progress) raise SQLite's disk-full error where ``fails(phase)``; the transaction rolls back."""
    real = store._add_event

    def add(c: Any, job_id: str, phase: str, payload: dict[str, Any], now: float) -> int:
        if fails(phase):
            raise sqlite3.OperationalError(FULL)
        return int(real(c, job_id, phase, payload, now))

    store._add_event = add


def info(s: Any, job_id: str) -> Any:
    return s.GetStatus(pb.JobRef(job_id=job_id), timeout=10)


# --------------------------------------------------------------------------- a real full disk, fast


def test_a_full_state_dir_ends_the_jobs_settles_their_budget_and_serves_again(
        tmp_path: Path, pki_dir: Path, stand_ins: dict[str, tuple[str, str]]) -> None:
    cfg_path = write_config(tmp_path, pki_dir, "alice", peers=stand_ins, budget=20.0)
    state = cfg_path.parent / "state"
    with tmpfs(state, 8 << 20), daemon(cfg_path, pki_dir) as (d, s, log):
        d.max_jobs = 2
        assert submit(s, "p1", fake_job("probe", epsilon=0.5)).accepted  # writes until the disk is full
        assert submit(s, "b1", fake_job("block", epsilon=0.5)).accepted  # waits for its cancel
        wait_for(lambda: status(s, "p1") == status(s, "b1") == "running", 60.0, "p1 and b1 running")
        assert submit(s, "q1", fake_job("block", epsilon=0.5)).accepted  # queued behind them
        wait_for(lambda: status(s, "q1") == "queued", 60.0, "q1 queued")
        wait_for(lambda: ledger_state(state, "p1") == "revealed", 60.0, "p1 revealed")

        fill(state / "filler")
        t0 = time.monotonic()
        # a cancel while the job store cannot be written (it used to fail with the SQLite error)
        assert s.Cancel(pb.CancelRequest(job_id="b1"), timeout=10).job_id == "b1"
        assert s.Cancel(pb.CancelRequest(job_id="q1"), timeout=10).status == "cancelled"
        wait_for(lambda: status(s, "p1") != "running" and status(s, "b1") != "running", 30.0,
                 "p1 and b1 to end while the disk is full")
        seen_ended = time.monotonic() - t0
        p1, b1, q1 = info(s, "p1"), info(s, "b1"), info(s, "q1")
        assert p1.status == "failed" and p1.reason.startswith("STORAGE: the state directory of alice is full or "
                                                              "cannot be written"), p1.reason
        assert "ENOSPC" in p1.reason or "SQLITE_FULL" in p1.reason or FULL in p1.reason, p1.reason
        assert b1.status == "cancelled" and b1.reason.startswith("cancelled by coord"), b1
        assert q1.status == "cancelled", q1
        # the file still says what it said before the disk filled: the daemon's own writes failed
        assert (stored(state, "p1"), stored(state, "b1"), stored(state, "q1")) == ("running", "running", "queued")
        assert log.of("p1", "could not record the job's events") or log.of("p1", "could not settle"), log.lines
        assert log.of("p1", "could not settle the job's budget in the ledger"), log.lines
        assert log.of("b1", "could not record the cancel request"), log.lines
        assert log.of("q1", "could not record the cancel of the queued job"), log.lines
        # every live job's reservation is still open: the ledger cannot be written either
        assert ledger_state(state, "p1") == "revealed"

        (state / "filler").unlink()
        t1 = time.monotonic()
        wait_for(lambda: (stored(state, "p1"), stored(state, "b1"), stored(state, "q1"))
                 == ("failed", "cancelled", "cancelled"), 30.0, "the statuses to be written once there is room")
        wait_for(lambda: (ledger_state(state, "p1"), ledger_state(state, "b1"), ledger_state(state, "q1"))
                 == ("committed", "released", "released"), 30.0, "the ledger to be settled once there is room")
        caught_up = time.monotonic() - t1
        assert d.ledger is not None and d.ledger.open_reservations() == []
        assert info(s, "p1").reason == p1.reason  # as served while the disk was full
        phases = [e.phase for e in s.Watch(pb.WatchRequest(job_id="p1", follow=True), timeout=10)]
        assert phases[-1] == "failed", phases
        assert submit(s, "after", fake_job("ok", epsilon=0.5)).accepted
        wait_for(lambda: status(s, "after") == "succeeded", 60.0, "the next job to succeed")
        assert d.ledger.get("after").state == "committed"
    print(f"\nfull disk: the jobs were seen ended {seen_ended:.1f} s after the fill; file and ledger caught up "
          f"{caught_up:.1f} s after space was freed")


# --------------------------------------------------------------------------- each branch, unit level


def test_a_full_disk_at_admission_is_refused_with_the_public_storage_code(
        tmp_path: Path, pki_dir: Path, stand_ins: dict[str, tuple[str, str]]) -> None:
    """A submission to a party whose state directory is full: refused with the public ``STORAGE``
    code and reason (what the coordinator prints), not SQLite's text behind gRPC's "Exception
    calling application"; nothing reserved; with room again the next submission is taken."""
    import grpc

    cfg_path = write_config(tmp_path, pki_dir, "alice", peers=stand_ins, budget=20.0)
    state = cfg_path.parent / "state"
    with tmpfs(state, 8 << 20), daemon(cfg_path, pki_dir) as (d, s, log):
        fill(state / "filler")
        with pytest.raises(grpc.RpcError) as refused:
            submit(s, "f1", fake_job("block", epsilon=0.5))
        code, details = refused.value.code(), refused.value.details()  # type: ignore[attr-defined]
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert details.startswith("STORAGE: the state directory of alice is full or cannot be written ("), details
        assert "nothing was reserved" in details and "Exception calling application" not in details, details
        assert str(state) not in details
        assert log.of("f1", "job not admitted: OperationalError"), log.lines  # the detail: alice's log only
        assert d.ledger is not None and d.ledger.get("f1") is None
        state_f1, why = d.agreement.answer("f1", tls.Peer("party", "bob", None), "")  # what the other members hear
        assert state_f1 == "refused" and why.startswith("STORAGE: refused by alice: the state directory"), why
        (state / "filler").unlink()
        assert submit(s, "f2", fake_job("block", epsilon=0.5)).accepted
        assert s.Cancel(pb.CancelRequest(job_id="f2"), timeout=10).job_id == "f2"


def test_a_job_the_store_cannot_start_ends_failed_with_its_budget_released(
        tmp_path: Path, pki_dir: Path, stand_ins: dict[str, tuple[str, str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    with daemon(write_config(tmp_path, pki_dir, "alice", peers=stand_ins), pki_dir) as (d, s, log):
        assert d.store is not None and d.ledger is not None
        monkeypatch.setattr(d.store, "set_running", failing(d.store.set_running, 1))
        assert submit(s, "j1", fake_job("ok", epsilon=0.5)).accepted
        wait_for(lambda: status(s, "j1") == "failed", 30.0, "j1 failed")
        assert info(s, "j1").reason == ("STORAGE: alice could not record the job's start (SQLite: database or disk "
                                        "is full); see alice's log; budget released (nothing was revealed)")
        assert d.ledger.get("j1").state == "released"
        assert submit(s, "j2", fake_job("ok", epsilon=0.5)).accepted  # the scheduler lives on
        wait_for(lambda: status(s, "j2") == "succeeded", 30.0, "j2 succeeded")
        assert log.of("j1", "cannot start the job")


def test_a_failed_commit_and_terminal_write_are_retried_until_written(
        tmp_path: Path, pki_dir: Path, stand_ins: dict[str, tuple[str, str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    with daemon(write_config(tmp_path, pki_dir, "alice", peers=stand_ins), pki_dir) as (d, s, log):
        assert d.store is not None and d.ledger is not None
        monkeypatch.setattr(d.ledger, "commit", failing(d.ledger.commit, 3))
        ends = {"n": 0}

        def fails(phase: str) -> bool:  # every event of the job's run; its terminal status 4 times
            if phase in ("prepared", "queued", "running"):
                return False
            if phase in ("succeeded", "failed", "cancelled"):
                ends["n"] += 1
                return ends["n"] <= 4
            return True

        failing_events(d.store, fails)
        assert submit(s, "j1", fake_job("ok", epsilon=0.5)).accepted
        wait_for(lambda: status(s, "j1") == "succeeded", 60.0, "j1 seen succeeded")
        wait_for(lambda: stored(d.state_dir, "j1") == "succeeded", 60.0, "j1 written")
        assert d.ledger.get("j1").state == "committed" and ends["n"] == 5
        assert log.of("j1", "settle the job's budget in the ledger: done after 3 failed attempt(s)"), log.lines
        assert log.of("j1", "record how the job ended in the job store: done after 3 failed attempt(s)"), log.lines
        # the events the worker sent were dropped with one line, counted in the last one
        assert len(log.of("j1", "could not record the job's events")) == 1, log.lines
        assert log.of("j1", "job succeeded (4 event(s) could not be recorded)"), log.lines


def test_a_daemon_stopped_while_it_retries_settles_the_job_at_its_next_start(
        tmp_path: Path, pki_dir: Path, stand_ins: dict[str, tuple[str, str]]) -> None:
    cfg_path = write_config(tmp_path, pki_dir, "alice", peers=stand_ins)
    with daemon(cfg_path, pki_dir) as (d, s, log):
        assert d.store is not None
        failing_events(d.store, lambda phase: phase == "failed")  # its end is never written
        assert submit(s, "j1", fake_job("reveal-fail", epsilon=0.5)).accepted
        wait_for(lambda: status(s, "j1") == "failed", 60.0, "j1 seen failed")
        assert info(s, "j1").reason.startswith("INTERNAL: internal error at alice")
        t0 = time.monotonic()
    stop_s = time.monotonic() - t0
    assert stop_s < 15, stop_s  # it gave up at the stop; it did not hold the daemon
    assert log.of("j1", "gave up trying to record how the job ended"), log.lines
    state = cfg_path.parent / "state"
    assert stored(state, "j1") == "running"
    with daemon(cfg_path, pki_dir) as (d, s, _):
        assert d.ledger is not None
        assert (info(s, "j1").status, info(s, "j1").reason) == ("failed", RESTART_REASON)
        assert d.ledger.get("j1").state == "committed"  # it had revealed


def test_a_job_directory_that_cannot_be_made_fails_the_job_not_the_thread(
        tmp_path: Path, pki_dir: Path, stand_ins: dict[str, tuple[str, str]]) -> None:
    with daemon(write_config(tmp_path, pki_dir, "alice", peers=stand_ins), pki_dir) as (d, s, _):
        (d.jobs_dir / "j1").write_bytes(b"")  # a file where the job's directory goes: mkdir fails
        assert submit(s, "j1", fake_job("ok", epsilon=0.5)).accepted
        wait_for(lambda: status(s, "j1") == "failed", 30.0, "j1 failed")
        assert info(s, "j1").reason.startswith("INTERNAL: internal error at alice while trying to record the job's "
                                               "directory (FileExistsError)"), info(s, "j1").reason
        assert d.ledger is not None and d.ledger.get("j1").state == "released"


# --------------------------------------------------------------------------- a real consortium, slow

VICTIM = "alice"


@pytest.mark.reliability
@pytest.mark.e2e
@pytest.mark.timeout(1200)
@pytest.mark.slow  # `make test-all`; default suite: a full disk mid-job: tests/reliability/test_disk_full.py
def test_a_full_state_dir_mid_job_in_a_real_consortium(tmp_path: Path) -> None:
    cons = LocalConsortium(tmp_path / "c", parties=3, dataset="adult", dealer=False, budget_epsilon=3.0,
                           max_epsilon_per_job=1.0, peer_timeout_s=30.0, start_timeout_s=120.0)
    cons.write()
    state = cons.root / VICTIM / "state"
    with tmpfs(state, 16 << 20), cons:
        filler = state / "filler"
        job_b = submit_gradient(cons, "store-full-b", 60)
        wait_for(lambda: sum(r["event"] == "release" for r in audit_records(state, job_b)) >= 3, 420.0,
                 f"3 releases of the job in {VICTIM}'s audit log", every=0.05)
        fill(filler)
        t0 = time.monotonic()
        wait_for(lambda: statuses(cons, job_b)[VICTIM]["status"] not in ("prepared", "queued", "running"), 120.0,
                 f"the job to end at {VICTIM} while the disk is full", every=0.5)
        seen_ended = time.monotonic() - t0
        st = wait_ended(cons, job_b)
        assert all(v["status"] == "failed" for v in st.values()), st
        reason = st[VICTIM]["reason"]
        assert reason.startswith(f"STORAGE: {VICTIM} could not record") or reason.startswith(
            f"STORAGE: the state directory of {VICTIM}"), reason
        held = stored(state, job_b)  # "running": the daemon's own terminal write had failed too
        daemon_log = cons.members[VICTIM].log.read_text(errors="replace")
        assert "could not" in daemon_log and ("SQLITE_FULL" in daemon_log or FULL in daemon_log), daemon_log[-3000:]

        filler.unlink()
        t1 = time.monotonic()
        wait_for(lambda: stored(state, job_b) == "failed", 60.0, "the status to be written once there is room")
        view = wait_for(lambda: (lambda v: v if all(row["jobs"]["B"] and row["jobs"]["B"][0] == "committed"
                                                    for row in v.values()) else None)(ledger_view(cons, {"B": job_b})),
                        60.0, "every ledger to commit the rounds revealed")
        caught_up = time.monotonic() - t1
        with Ledger(state / "ledger.sqlite3") as led:
            assert led.open_reservations() == []
        job_c = submit_gradient(cons, "store-full-c", 10)
        st = wait_ended(cons, job_c)
        assert all(v["status"] == "succeeded" for v in st.values()), st
    print(f"\nreal consortium, {VICTIM}'s state dir filled mid-job: seen ended {seen_ended:.1f} s after the fill "
          f"(file: {held!r} until space was freed); caught up {caught_up:.1f} s after; ledgers {view}; "
          f"reason {reason!r}")
