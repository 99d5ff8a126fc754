"""Audit appends that cannot leave a torn record, and the torn-tail repair (issue 14 item 1).

An append that fails (ENOSPC on a real tmpfs, a short write then ENOSPC, an fsync EIO) leaves the
log byte for byte as it was; a torn final line (a crash mid-append) is moved aside to
``audit.jsonl.torn-<UTC time>`` by ``check_ledger`` (the daemon's start) and by the next append; a
torn or edited line before the last one is still refused. The worker turns a record it cannot
write into a public STORAGE failure, and refuses a job whose records its state directory cannot
hold before it joins the MPC.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from parties import audit as audit_mod
from parties.audit import AuditError, AuditLog, AuditWriteError, repair_tail, verify
from parties.ledger import Ledger
from parties.ledger_check import AuditDamaged, check_ledger
from parties.public_errors import PublicError, public_failure
from tests.reliability.faults import tmpfs


def _fill(log: AuditLog, jobs: int = 2, rounds: int = 3) -> None:
    for j in range(jobs):
        log.charge(f"job{j}", dataset="adult", epsilon=1.0, delta=1e-5, spec_digest="d" * 64, dp_event=None)
        for t in range(1, rounds + 1):
            log.release(f"job{j}", what="noisy gradient", value=np.full(4, t / 7), round=t, rounds=rounds)


def _spent_state(state: Path) -> AuditLog:
    """A state dir as a worker leaves it: the ledger row spent, then the log's charge and releases."""
    with Ledger.in_state_dir(state, {"adult": (3.0, 1e-3)}) as led:
        for j in range(2):
            led.reserve(f"job{j}", "adult", 1.0, 1e-5, "d" * 64)
            led.mark_revealed(f"job{j}")
            led.commit(f"job{j}")
    log = AuditLog.in_state_dir(state)
    _fill(log)
    return log


# --------------------------------------------------------------------------- the torn tail


@pytest.mark.parametrize("torn", [
    lambda rec: rec[: len(rec) // 2],                # cut short: no newline
    lambda rec: rec[:-1][:-3],                       # cut a few bytes before its newline
    lambda rec: b"\0" * 300,                         # a crash left zeros (no newline)
    lambda rec: rec[: len(rec) // 2] + b"\n",        # half a record, then a newline: not JSON
])
def test_a_torn_tail_is_moved_aside_and_the_chain_continues(tmp_path: Path, torn, caplog) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    _fill(log)
    good = log.path.read_bytes()
    head = log.head()
    rec = (json.dumps({"seq": 99, "event": "release", "job_id": "x", "prev": head, "hash": "0" * 64}) + "\n").encode()
    bad = torn(rec)
    with log.path.open("ab") as f:
        f.write(bad)
    with pytest.raises(AuditError, match=r"jsonl:9: not a JSON record"):
        verify(log.path)  # verify itself repairs nothing
    assert log.head() == head  # the last complete record

    with caplog.at_level(logging.WARNING, logger="parties.audit"):
        fixed = repair_tail(log.path)
    assert fixed is not None and fixed.moved_to is not None and fixed.size == len(bad) and fixed.offset == len(good)
    assert fixed.moved_to.name.startswith("audit.jsonl.torn-") and fixed.moved_to.read_bytes() == bad
    assert log.path.read_bytes() == good
    (line,) = [r.getMessage() for r in caplog.records if r.name == "parties.audit"]
    assert "torn last record" in line and fixed.moved_to.name in line and "\n" not in line
    assert verify(log.path).records == 8
    assert repair_tail(log.path) is None  # idempotent
    log.release("job1", what="noisy gradient", value=np.zeros(4), round=4, rounds=4)
    assert verify(log.path).records == 9


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    _fill(log)
    log.path.write_bytes(log.path.read_bytes()[:-1])  # the write stopped just before the newline
    fixed = repair_tail(log.path)
    assert fixed is not None and fixed.moved_to is None
    assert not list(tmp_path.glob("audit.jsonl.torn-*"))
    assert verify(log.path).records == 8 and log.path.read_bytes().endswith(b"\n")


def test_the_next_append_repairs_a_torn_tail_first(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    _fill(log, jobs=1)
    with log.path.open("ab") as f:
        f.write(b'{"seq":5,"event":"rel')
    log.charge("job9", dataset="adult", epsilon=0.5, delta=1e-5, spec_digest="d" * 64, dp_event=None)
    v = verify(log.path)
    assert (v.records, v.jobs) == (5, 2)
    assert len(list(tmp_path.glob("audit.jsonl.torn-*"))) == 1


@pytest.mark.parametrize("also_tail", [False, True])
def test_a_torn_line_in_the_middle_is_still_refused(tmp_path: Path, also_tail: bool) -> None:
    state = tmp_path / "state"
    log = _spent_state(state)
    lines = log.path.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3][:40] + b"\n"  # damage, not an interrupted append: never repaired
    log.path.write_bytes(b"".join(lines) + (b'{"seq":9,' if also_tail else b""))
    with pytest.raises(AuditDamaged, match=r"does not verify \(line 4: not a JSON record\)"):
        check_ledger(state)
    assert len(list(state.glob("audit.jsonl.torn-*"))) == int(also_tail)  # only the final line is ever moved
    with pytest.raises(AuditError, match="jsonl:4: not a JSON record"):
        verify(log.path)


def test_check_ledger_repairs_a_torn_tail_before_it_verifies(tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = _spent_state(state)
    with log.path.open("ab") as f:
        f.write(b'{"seq":9,"event":"charge","job_id":"job2","da')
    c = check_ledger(state)
    assert c.torn_tail is not None and c.torn_tail.moved_to is not None and c.audit_records == 8
    assert check_ledger(state).torn_tail is None


def test_check_ledger_names_a_torn_tail_it_cannot_move(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    log = _spent_state(state)
    with log.path.open("ab") as f:
        f.write(b'{"seq":9')

    def no_space(*_a, **_k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(audit_mod, "_move_aside", no_space)
    with pytest.raises(AuditDamaged, match="torn record that cannot be moved aside .No space left on device") as info:
        check_ledger(state)
    assert "\n" not in str(info.value)
    assert log.path.read_bytes().endswith(b'{"seq":9')  # left as it was


# --------------------------------------------------------------------------- failed appends


def test_a_short_write_then_enospc_is_rolled_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    _fill(log, jobs=1)
    good = log.path.read_bytes()
    real_write, calls = os.write, []

    def short_then_full(fd: int, data) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:100]))  # what a file system returns at its last page
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(audit_mod.os, "write", short_then_full)
    with pytest.raises(AuditWriteError) as info:
        log.release("job0", what="x", value=np.zeros(2), round=4, rounds=4)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC and "truncated back" in str(info.value)
    assert len(calls) == 2 and log.path.read_bytes() == good


def test_a_failed_fsync_is_rolled_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    _fill(log, jobs=1)
    good = log.path.read_bytes()
    real_fsync, calls = os.fsync, []

    def eio_once(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(audit_mod.os, "fsync", eio_once)
    with pytest.raises(AuditWriteError) as info:
        log.charge("job1", dataset="adult", epsilon=1.0, delta=1e-5, spec_digest="d" * 64, dp_event=None)
    assert info.value.errno == errno.EIO and log.path.read_bytes() == good


def test_appends_on_a_full_tmpfs_never_leave_half_a_record(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "tmpfs", 64 << 10) as d:
        log = AuditLog(d / "audit.jsonl")
        n, failures = 0, 0
        while failures < 3:
            before = log.path.read_bytes() if log.path.exists() else b""
            try:
                log.release("job0", what="noisy weighted sum of clipped gradients", value=np.full(8, n), round=n + 1,
                            rounds=10_000)
                n += 1
            except AuditWriteError as exc:
                assert exc.errno == errno.ENOSPC, exc
                assert log.path.read_bytes() == before  # byte for byte what it was
                failures += 1
        assert n > 50 and verify(log.path).records == n
        assert log.path.read_bytes().endswith(b"\n") and not list(d.glob("audit.jsonl.torn-*"))


def test_a_ledger_mark_on_a_full_disk_changes_nothing(tmp_path: Path) -> None:
    """mark_revealed is one transaction: a full disk leaves the job reserved, never revealed
    without its round count (which would charge every planned round)."""
    from mpc_erm.privacy.events import GaussianRounds

    ev = GaussianRounds(rounds=50, adjacency="replace", noise_multiplier=20.0)
    with tmpfs(tmp_path / "tmpfs", 1 << 20) as d, Ledger.in_state_dir(d, {"adult": (3.0, 1e-3)}) as led:
        led.reserve("j", "adult", 1.0, 1e-5, "d" * 64, ev)
        filler = d / "filler"
        with filler.open("ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        with pytest.raises(sqlite3.OperationalError, match="disk is full"):
            for t in range(1, 51):
                led.mark_revealed("j", ev, rounds=t)
        r = led.get("j")
        assert r is not None and (r.state == "reserved" or r.revealed_rounds is not None), r
        filler.unlink()
        if r.state == "revealed":  # some rounds fitted before the disk was full: exactly those count
            assert 1 <= r.revealed_rounds < 50


# --------------------------------------------------------------------------- the worker


def _ctx(tmp_path: Path, *, method: str = "gradient", rounds: int = 40) -> SimpleNamespace:
    state = tmp_path / "state"
    state.mkdir(parents=True, exist_ok=True)
    spec = SimpleNamespace(method=method, training=SimpleNamespace(iterations=rounds))
    return SimpleNamespace(ledger_path=state / "ledger.sqlite3", identity=SimpleNamespace(name="alice"),
                           job=SimpleNamespace(spec=spec), job_id="j1")


def test_the_preflight_refuses_a_job_the_state_directory_cannot_hold(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from parties import spend as worker

    ctx = _ctx(tmp_path, rounds=200)
    worker.check_room(ctx)  # a normal disk: plenty
    monkeypatch.setattr(worker.os, "statvfs", lambda _p: SimpleNamespace(f_bavail=100, f_frsize=4096))
    with pytest.raises(PublicError) as info:
        worker.check_room(ctx)
    err = info.value
    assert err.code == "STORAGE" and err.reason.startswith("STORAGE: the state directory of alice has 409600 bytes "
                                                           "free; the job's audit records need ~121200 (200 round(s))")
    assert "nothing was revealed" in err.reason and str(tmp_path) not in err.reason
    with pytest.raises(PublicError, match=r"audit records need ~1800 \(1 round"):
        worker.check_room(_ctx(tmp_path / "o", method="output"))  # one record: refused all the same (the margin)
    worker.check_room(SimpleNamespace(ledger_path=None))  # the dealer: no state of its own to fill


def test_a_record_the_worker_cannot_write_is_a_public_storage_failure(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from parties import spend as worker

    ctx = _ctx(tmp_path)

    def full(*_a, **_k):
        raise AuditWriteError(errno.ENOSPC, f"{tmp_path}/state/audit.jsonl: appending a release record failed")

    monkeypatch.setattr(AuditLog, "append", full)
    audit = worker.party_audit(ctx)
    assert audit is not None
    with pytest.raises(PublicError) as info:
        audit.release("j1", what="x", value=np.zeros(2), round=7, rounds=40)
    assert info.value.reason == ("STORAGE: alice could not record the release of round 7 of 40 in its audit log "
                                 "(ENOSPC: No space left on device): the job stops; the 7 round(s) revealed stay "
                                 "charged; see alice's log")
    with pytest.raises(PublicError) as info:
        audit.charge("j1", dataset="adult", epsilon=1.0, delta=1e-5, spec_digest="d" * 64, dp_event=None)
    assert info.value.reason.startswith("STORAGE: alice could not record the job's charge in its audit log (ENOSPC")
    assert "nothing was revealed" in info.value.reason and str(tmp_path) not in info.value.reason
    # anything else that finds the state directory full (the results, say) is STORAGE too, not INTERNAL
    code, reason = public_failure(OSError(errno.ENOSPC, "No space left on device", "/secret/path"), member="alice",
                                  job_id="j1", phase="writing")
    assert code == "STORAGE" and "/secret" not in reason and "ENOSPC" in reason
    code, _ = public_failure(sqlite3.OperationalError("database or disk is full"), member="alice", job_id="j1")
    assert code == "STORAGE"
