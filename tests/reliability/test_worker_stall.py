"""A stopped (not dead) worker no longer holds its job slot for ever (issue 14 item 5).

A job's worker sends its daemon a heartbeat every ``parties.context.HEARTBEAT_S`` from a thread of
its own, besides its events; the daemon (``parties.supervision``) ends a job whose worker sent
nothing for ``peer_timeout_s`` (+ ``STALL_MARGIN_S``): it SIGKILLs the worker, records the job
``failed`` with ``STALLED: … made no progress for N s (limit L s: peer_timeout_s) …``, settles the
budget (committed if the job revealed, else released) and frees the slot.

* fast (default suite): one real daemon with the stand-in worker of ``tests/parties/test_daemon.py``,
  ``peer_timeout_s = 5``, two slots. A revealed job's worker is SIGSTOPped; the job queued behind
  it must then run. The other slot's worker sends no event for over twice the limit but is not
  stopped (heartbeats only): it is left alone.
* ``reliability`` + ``e2e`` (~35 s): a real consortium (3 parties + dealer, UCI Adult, real CrypTen),
  ``peer_timeout_s = 15``; alice's worker is SIGSTOPped mid-training. Her peers fail naming her,
  her own daemon ends the job STALLED within the limit + margin, every ledger is settled, no process
  of the job is left, and the next job succeeds everywhere.

On the code before the change, alice's daemon reported the job ``running`` for as long as the
worker stayed stopped (both tests time out waiting for its end).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.consortium import LocalConsortium
from coordinator.end_to_end import LocalJob, job_toml
from mpc_erm.mpc._proto import party_pb2 as pb
from parties.config import load_party_config
from parties.daemon import PartyDaemon
from parties.supervision import STALL_MARGIN_S
from tests.parties import test_daemon
from tests.parties.test_daemon import FAKE, status, stub, submit, write_config
from tests.parties.test_daemon import job_toml as fake_job
from tests.reliability.faults import PARTIES, AuditFollower, EventStream, alive, wait_for, worker_pids

pki_dir = test_daemon.pki_dir  # the CA and identities (a module-scoped fixture)
stand_ins = test_daemon.stand_ins  # the other members of the jobs: they agree to every job (module-scoped)

STALL_RE = re.compile(r"^STALLED: the worker of job \S+ at (\w+) made no progress for (\d+) s "
                      r"\(limit (\d+(?:\.\d+)?) s: peer_timeout_s\); \1 killed it")


def _stalled_seconds(reason: str, member: str, limit: float) -> int:
    m = STALL_RE.match(reason)
    assert m is not None and m.group(1) == member and float(m.group(3)) == limit, reason
    return int(m.group(2))


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """SIGSTOP ``pid``; whatever happens, it does not outlive the block (SIGCONT, then SIGKILL)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGCONT)


def test_a_stopped_worker_ends_its_job_and_frees_its_slot(tmp_path: Path, pki_dir: Path,
                                                          stand_ins: dict[str, tuple[str, str]]) -> None:
    limit = 5.0
    cfg = load_party_config(write_config(tmp_path, pki_dir, "alice", peers=stand_ins))
    cfg = cfg.model_copy(update={"peer_timeout_s": limit})
    d = PartyDaemon(cfg, worker_module=FAKE, cancel_grace_s=1.0, log_to_stderr=False)
    d.start()
    d.max_jobs = 2
    try:
        s = stub(pki_dir, d.port)
        state = d.state_dir
        assert d.ledger is not None
        # "busy": alive but it sends no event (heartbeats only) while the other job stalls, > 2 limits
        assert submit(s, "busy", fake_job("block", epsilon=0.5)).accepted
        assert submit(s, "stuck", fake_job("reveal-block", epsilon=0.5)).accepted
        wait_for(lambda: worker_pids(state, "busy"), 60.0, "the busy worker")
        (pid,) = wait_for(lambda: worker_pids(state, "stuck"), 60.0, "the stuck worker")
        wait_for(lambda: d.ledger.get("stuck").revealed, 60.0, "the stuck job's reveal mark")
        # only now, with both slots held: submitted with the others, its agreement could end first on
        # a loaded machine (it did), take a slot and succeed, and never be seen queued
        assert submit(s, "next", fake_job("ok", epsilon=0.5)).accepted
        wait_for(lambda: status(s, "next") == "queued", 60.0, "next agreed")
        busy_since = time.monotonic()
        assert status(s, "next") == "queued"
        with stopped(pid):
            t0 = time.monotonic()
            wait_for(lambda: status(s, "stuck") != "running", limit + STALL_MARGIN_S + 30, "the stuck job's end")
            took = time.monotonic() - t0
            info = s.GetStatus(pb.JobRef(job_id="stuck"), timeout=10)
            wait_for(lambda: not alive(pid), 10.0, f"the stopped worker {pid} to be killed")
        assert info.status == "failed", info
        said = _stalled_seconds(info.reason, "alice", limit)
        assert info.reason.endswith("; budget spent (the job had revealed)"), info.reason
        # silent from at most one heartbeat before the SIGSTOP until the check after the limit
        assert limit + STALL_MARGIN_S <= took + 2.5 and took <= limit + STALL_MARGIN_S + 10, took
        assert limit + STALL_MARGIN_S <= said <= took + 3, (said, took)
        assert d.ledger.get("stuck").state == "committed"
        # the slot is free: the job queued behind it runs and succeeds
        wait_for(lambda: status(s, "next") == "succeeded", 60.0, "the queued job to succeed")
        assert d.ledger.get("next").state == "committed"
        # the heartbeats kept the silent, live worker's job running
        time.sleep(max(0.0, 2 * (limit + STALL_MARGIN_S) - (time.monotonic() - busy_since)))
        assert status(s, "busy") == "running", s.GetStatus(pb.JobRef(job_id="busy"), timeout=10)
        s.Cancel(pb.CancelRequest(job_id="busy"), timeout=10)
        wait_for(lambda: status(s, "busy") == "cancelled", 30.0, "busy cancelled")
        assert d.ledger.get("busy").state == "released" and d.ledger.open_reservations() == []
        phases = [e.phase for e in s.Watch(pb.WatchRequest(job_id="stuck", follow=True), timeout=10)]
        assert phases[-2:] == ["failing", "failed"], phases
        print(f"\nstopped worker: job ended {took:.1f} s after SIGSTOP (reason says {said} s; limit {limit:g} s "
              f"+ margin {STALL_MARGIN_S:g} s)")
    finally:
        d.stop()


# ------------------------------------------------------------------------- a real consortium

PEER_TIMEOUT_S = 15.0
VICTIM = "alice"


def _job(cons: LocalConsortium, name: str, rounds: int) -> str:
    path = cons.root / "jobs" / f"{name}.toml"
    path.parent.mkdir(exist_ok=True)
    job = LocalJob(name, "gradient", lam=1e-4, epsilon=0.5, delta=1e-5, iterations=rounds, learning_rate=20.0)
    path.write_text(job_toml(job, cons.party_names, cons.dataset, "dealer", "dealer"))
    with cons.client() as client:
        return str(client.submit(path)["job_id"])


def _statuses(cons: LocalConsortium, job_id: str) -> dict[str, dict[str, Any]]:
    with cons.client() as client:
        return client.status(job_id)


@pytest.mark.reliability
@pytest.mark.e2e
@pytest.mark.slow  # 40 s, in `make test-reliability`; the default suite keeps the 20 s one above
@pytest.mark.timeout(900)
def test_a_stopped_worker_in_a_real_consortium(tmp_path: Path) -> None:
    from parties.ledger import Ledger

    cons = LocalConsortium(tmp_path / "c", parties=3, dataset="adult", budget_epsilon=10.0,
                           peer_timeout_s=PEER_TIMEOUT_S, start_timeout_s=120.0)
    pid = 0
    with cons:
        state = cons.root / VICTIM / "state"
        job_id = _job(cons, "stall", 300)
        events = EventStream(cons, job_id)
        try:
            (pid,) = wait_for(lambda: worker_pids(state, job_id), 240.0, f"{VICTIM}'s worker")
            AuditFollower(state, job_id).wait(lambda a: a["event"] == "release" and a["round"] >= 3, 300.0,
                                              f"{VICTIM}'s third release", lambda: events.ended(VICTIM))
            with stopped(pid):
                t0 = time.monotonic()
                ended: dict[str, float] = {}

                def all_ended() -> bool:
                    for m, v in _statuses(cons, job_id).items():
                        if v["status"] not in ("queued", "running"):
                            ended.setdefault(m, time.monotonic() - t0)
                    return len(ended) == len(cons.members)

                # generous for collecting the ends, so that a late member is named by the bounds
                # asserted below (a loaded CI machine once passed 80 s here without saying who)
                wait_for(all_ended, PEER_TIMEOUT_S + STALL_MARGIN_S + 180,
                         lambda: f"the job's end at every member (ended after: {ended}; now {_statuses(cons, job_id)})",
                         0.5)
                st = _statuses(cons, job_id)
                wait_for(lambda: not alive(pid), 10.0, f"{VICTIM}'s stopped worker {pid} to be killed")
        finally:
            events.close()
        assert all(v["status"] == "failed" for v in st.values()), st
        said = _stalled_seconds(st[VICTIM]["reason"], VICTIM, PEER_TIMEOUT_S)
        assert ended[VICTIM] <= PEER_TIMEOUT_S + STALL_MARGIN_S + 15, ended
        assert PEER_TIMEOUT_S + STALL_MARGIN_S <= said <= ended[VICTIM] + 3, (said, ended)
        for m in cons.members:
            if m != VICTIM:  # they lost alice within their own peer timeout
                assert VICTIM in st[m]["reason"] and ended[m] <= PEER_TIMEOUT_S + 20, (m, st[m], ended)
        # issue 14 item 7: each party that lost alice says, in its own log, how long it actually
        # waited and the limit (was: only the last receive's share of the wait)
        for m in PARTIES:
            if m == VICTIM:
                continue
            text = "".join(f.read_text(errors="replace") for f in (cons.members[m].log,
                                                                  cons.root / m / "state" / "daemon.log")
                           if f.exists())
            waits = [(float(w), float(lim)) for w, lim in
                     re.findall(r"(?:waited|for) ([0-9.]+) s \(limit ([0-9.]+) s", text)]
            assert waits, (m, text[-2000:])
            waited, limit = max(waits)
            assert limit == PEER_TIMEOUT_S and limit - 0.5 <= waited <= ended[m] + 1.0, (m, waits, ended)
        # every ledger settled: alice had revealed, so did the others (a reveal needs every share)
        for p in PARTIES:
            with Ledger(cons.root / p / "state" / "ledger.sqlite3") as led:
                assert led.get(job_id).state == "committed", (p, led.get(job_id))
                assert led.open_reservations() == [], (p, led.open_reservations())
        # no worker of the job left anywhere
        pids = [w for m in cons.members for w in worker_pids(cons.root / m / "state", job_id)]
        wait_for(lambda: not [w for w in pids if alive(w)], 60.0, f"the job's workers {pids} to exit")
        # alice's slot is free: the next job succeeds everywhere
        nxt = _job(cons, "after-stall", 10)
        done = wait_for(lambda: (lambda s: s if all(v["status"] in ("succeeded", "failed", "cancelled")
                                                    for v in s.values()) else None)(_statuses(cons, nxt)),
                        400.0, "the next job", 0.5)
        assert all(v["status"] == "succeeded" for v in done.values()), done
    print(f"\nstopped worker at {VICTIM}: member ended after SIGSTOP "
          + ", ".join(f"{m} {t:.1f} s" for m, t in sorted(ended.items())) + f"; {VICTIM}'s reason says {said} s")
