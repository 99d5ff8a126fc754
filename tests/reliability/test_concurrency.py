"""Several jobs at once on the same daemons: real daemons as processes, real jobs on UCI Adult.

The bug this guards against: a daemon ran one job at a time and a member starts a job as soon as
it admits it. Two coordinators submitting at the same instant could reach two daemons in
opposite orders; each daemon then ran the job the other one had queued, and both jobs failed after
the 120 s endpoint wait. Now a daemon runs up to ``max_concurrent_jobs`` jobs at once.

- two jobs forced into opposite orders (alice and carol get X first, bob and the dealer Y first)
  both succeed at the default bound;
- two coordinator clients submitting at the same instant, repeatedly: both succeed every time;
- at ``max_concurrent_jobs = 1`` two jobs queued in opposite orders at two daemons are a real
  deadlock: it is broken at once — the larger job id fails at every member with a reason naming
  the deadlock, well before the 120 s look-up limit, its budget released — and the other job
  succeeds. (Since admission is two-phase, a member queues a job when it learns that every member
  prepared it, not when it is submitted, so the forced submission orders make that deadlock likely
  rather than certain: where it does not arise, both jobs succeed);
- more jobs at once than the bound: all succeed, and no daemon ever reports more running jobs
  than its bound;
- workers forked from the fork server start from pristine module state: CrypTen state a job
  changes is not seen by the next job (and the fork server had imported the worker's modules).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.soak import Job, Soak
from mpc_erm.mpc._proto import party_pb2 as pb
from mpc_erm.mpc.crypten_compat import import_crypten
from parties.ledger import Ledger

pytestmark = pytest.mark.reliability
ROOT = Path(__file__).resolve().parents[2]
MEMBERS = ("alice", "bob", "carol", "dealer")
LOOKUP_LIMIT_S = 120.0  # peer_timeout_s default: what a deadlocked job used to wait before failing

import_crypten()  # at import: the fork server that preloads this module (as a worker module) holds crypten
_IMPORTED_IN = os.getpid()


# --------------------------------------------------------------------------- helpers


def _ends(client: Any, job_id: str) -> dict[str, tuple[str, str]]:
    """member -> (terminal phase, its message), following the job to its end."""
    ends: dict[str, tuple[str, str]] = {}
    for ev in client.watch(job_id):
        if ev["phase"] in ("succeeded", "failed", "cancelled"):
            ends[ev["member"]] = (ev["phase"], str(ev["payload"].get("message", "")))
    return ends


def _submit_to(client: Any, job_id: str, text: str, members: tuple[str, ...]) -> None:
    for m in members:
        r = client._call(m, "SubmitJob", pb.SubmitRequest(job_id=job_id, job_toml=text), timeout=120)
        assert r.accepted, (m, r.reason)


def _cross_submit(soak: Soak, x: str, y: str, text_x: str, text_y: str) -> None:
    """alice and carol get X first, bob and the dealer Y first; then each the other job."""
    a, b = soak.clients[0], soak.clients[1]
    first = [threading.Thread(target=_submit_to, args=(a, x, text_x, ("alice", "carol"))),
             threading.Thread(target=_submit_to, args=(b, y, text_y, ("bob", "dealer")))]
    for t in first:
        t.start()
    for t in first:
        t.join()
    second = [threading.Thread(target=_submit_to, args=(a, x, text_x, ("bob", "dealer"))),
              threading.Thread(target=_submit_to, args=(b, y, text_y, ("alice", "carol")))]
    for t in second:
        t.start()
    for t in second:
        t.join()


def _follow_both(soak: Soak, x: str, y: str) -> tuple[dict[str, Any], dict[str, Any]]:
    got: dict[str, Any] = {}

    def follow(client: Any, job_id: str) -> None:
        got[job_id] = _ends(client, job_id)
        got[job_id + "@t"] = time.monotonic()

    ts = [threading.Thread(target=follow, args=(soak.clients[0], x)),
          threading.Thread(target=follow, args=(soak.clients[1], y))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return got[x], got[y]


def _gradient(index: int, rounds: int = 5, trust: str = "dealer") -> str:
    return Job(index, "gradient", rounds, trust).toml()


def _output(index: int, mechanism: str = "gaussian") -> str:
    return Job(index, "output", 1, "dealer", mechanism).toml()


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Soak]:
    """One consortium at the default bound (max_concurrent_jobs = 4), four coordinator clients."""
    with Soak(tmp_path_factory.mktemp("concurrency"), clients=4, scratch=64) as s:
        yield s


# --------------------------------------------------------------------------- the known bug


def test_jobs_queued_in_opposite_orders_at_two_daemons_both_succeed(soak: Soak) -> None:
    x, y = "0" * 31 + "x", "f" * 31 + "y"
    t0 = time.monotonic()
    _cross_submit(soak, x, y, _gradient(1), _output(2))
    ex, ey = _follow_both(soak, x, y)
    assert set(ex) == set(ey) == set(MEMBERS)
    assert all(v[0] == "succeeded" for v in ex.values()), ex
    assert all(v[0] == "succeeded" for v in ey.values()), ey
    assert time.monotonic() - t0 < LOOKUP_LIMIT_S  # no member waited out the look-up limit


@pytest.mark.slow
def test_two_coordinators_submitting_at_the_same_instant_repeatedly_both_succeed(soak: Soak) -> None:
    for rep in range(3):
        batch = [Job(10 + 2 * rep, "gradient", 5, "dealer"), Job(11 + 2 * rep, "gradient", 5, "replicated")]
        results = soak.run_batch(batch)
        for r in results:
            assert set(r["status"]) == set(MEMBERS if r["trust"] == "dealer" else MEMBERS[:3]), r
            assert set(r["status"].values()) == {"succeeded"}, r


@pytest.mark.slow
def test_more_jobs_than_the_bound_all_succeed_and_the_bound_holds(soak: Soak) -> None:
    bound = 4
    health: list[dict[str, Any]] = []
    done = threading.Event()

    def watch_health() -> None:
        client = soak.consortium.client()
        try:
            while not done.is_set():
                health.append(client.health())
                time.sleep(0.5)
        finally:
            client.close()

    watcher = threading.Thread(target=watch_health)
    watcher.start()
    try:
        jobs = [Job(20 + k, "gradient", 5, "dealer") for k in range(6)]
        texts = {f"{k:02d}" + "c" * 30: j.toml() for k, j in enumerate(jobs)}
        client = soak.clients[0]
        threads = [threading.Thread(target=_submit_to, args=(client, jid, text, MEMBERS))
                   for jid, text in texts.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ends = {jid: _ends(client, jid) for jid in texts}
    finally:
        done.set()
        watcher.join()
    for jid, e in ends.items():
        assert set(e) == set(MEMBERS) and all(v[0] == "succeeded" for v in e.values()), (jid, e)
    running = [h[m]["running"] for h in health for m in MEMBERS if "running" in h.get(m, {})]
    assert running and max(running) <= bound, running
    assert max(running) >= 2  # they did run concurrently


# --------------------------------------------------------------------------- at the bound


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Soak]:
    with Soak(tmp_path_factory.mktemp("one-slot"), max_concurrent_jobs=1, clients=2, scratch=64) as s:
        yield s


@pytest.mark.slow
def test_a_cross_queueing_deadlock_at_the_bound_fails_fast_with_a_reason(one_slot: Soak) -> None:
    x, y = "1" * 31 + "x", "e" * 31 + "y"  # y > x: y is the one that gives way
    t0 = time.monotonic()
    _cross_submit(one_slot, x, y, _gradient(30), _gradient(31))
    ex, ey = _follow_both(one_slot, x, y)
    elapsed = time.monotonic() - t0
    assert set(ex) == set(ey) == set(MEMBERS)
    assert all(v[0] == "succeeded" for v in ex.values()), ex
    assert elapsed < LOOKUP_LIMIT_S, elapsed
    if all(v[0] == "succeeded" for v in ey.values()):  # queued in the same order everywhere: no deadlock arose
        return
    assert all(v[0] == "failed" for v in ey.values()), ey
    reasons = " | ".join(v[1] for v in ey.values())
    assert "admission deadlock" in reasons and x in reasons, reasons
    assert "not published within" not in reasons, reasons  # not the 120 s look-up timeout
    for name in ("alice", "bob", "carol"):
        with Ledger(one_slot.consortium.root / name / "state" / "ledger.sqlite3") as led:
            assert led.get(y).state == "released" and led.get(x).state == "committed"


# --------------------------------------------------------------------------- the fork server


def run_party_job(ctx: Any) -> dict[str, Any]:
    """Stand-in worker: what module state it started from, then it changes that state."""
    crypten = import_crypten()
    from crypten.config import cfg

    seen = {"pid": os.getpid(), "ppid": os.getppid(), "preloaded": _IMPORTED_IN != os.getpid(),
            "protocol": str(cfg.mpc.protocol), "marker": getattr(crypten, "_mpc_erm_marker", None),
            "initialized": bool(crypten.is_initialized())}
    cfg.mpc.protocol = "tampered"
    crypten._mpc_erm_marker = ctx.job_id
    return seen


def test_forked_workers_start_from_pristine_crypten_state(tmp_path: Path) -> None:
    from mpc_erm.mpc import pki
    from tests.parties.test_daemon import job_toml, stand_in_members, status, stub, submit, wait_for, write_config

    pki_dir = tmp_path / "pki"
    ca = pki.create_ca("test CA")
    for name, role in [("alice", "party"), ("bob", "party"), ("carol", "party"), ("dealer", "dealer"),
                       ("coord", "coordinator")]:
        pki.save_identity(pki.issue_identity(ca, name, role), pki_dir)  # type: ignore[arg-type]
    # alice's jobs start once every member prepared them (two-phase admission): bob, carol and the
    # dealer are stand-ins that have agreed to every job
    with stand_in_members(pki_dir, {"bob": "party", "carol": "party", "dealer": "dealer"}) as peers:
        cfg = write_config(tmp_path, pki_dir, "alice", peers=peers)
        env = dict(os.environ, MPC_ERM_WORKER_START="forkserver", PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "party", "serve", "--config", str(cfg),
                                 "--worker-module", __name__], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=env)
        try:
            hello = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
            s = stub(pki_dir, hello["port"])
            seen = []
            for job_id in ("p1", "p2"):
                assert submit(s, job_id, job_toml("ok", epsilon=0.5)).accepted
                wait_for(lambda j=job_id: status(s, j) in ("succeeded", "failed"), timeout=180, what=job_id)
                info = s.GetStatus(pb.JobRef(job_id=job_id), timeout=10)
                assert info.status == "succeeded", info.reason
                seen.append(json.loads(info.summary_json))
        finally:
            proc.terminate()
            proc.wait(30)
    first, second = seen
    assert first["preloaded"] and second["preloaded"], seen  # the worker module came from the fork server
    assert first["ppid"] == second["ppid"] != proc.pid, seen  # both forked by the same fork server
    assert first["pid"] != second["pid"]
    assert second["protocol"] == first["protocol"] != "tampered", seen  # job 1's change is not seen by job 2
    assert second["marker"] is None and not second["initialized"], seen


# --------------------------------------------------------------------------- the config field


@pytest.fixture(scope="module")
def alice_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mpc_erm.mpc import pki

    d = tmp_path_factory.mktemp("pki")
    pki.save_identity(pki.issue_identity(pki.create_ca("test CA"), "alice", "party"), d)
    return d


@pytest.mark.parametrize(("line", "expect"), [
    ("", 4), ("max_concurrent_jobs = 1", 1), ("max_concurrent_jobs = 64", 64),
    ("max_concurrent_jobs = 0", "max_concurrent_jobs: must be >= 1 (got 0)"),
    ("max_concurrent_jobs = 65", "max_concurrent_jobs: must be <= 64 (got 65)"),
    ('max_concurrent_jobs = "4"', "max_concurrent_jobs: Input should be a valid integer"),
    ("max_concurrent_jobs = 2.0", "max_concurrent_jobs: Input should be a valid integer"),
    ("max_concurrent_jobs = true", "max_concurrent_jobs: Input should be a valid integer"),
])
def test_max_concurrent_jobs_is_validated(alice_pki: Path, tmp_path: Path, line: str, expect: int | str) -> None:
    from parties.config import ConfigError, load_party_config
    from tests.parties.test_daemon import write_config

    path = write_config(tmp_path, alice_pki, "alice")
    path.write_text(f"{line}\n" + path.read_text())
    if isinstance(expect, int):
        assert load_party_config(path).max_concurrent_jobs == expect
        return
    with pytest.raises(ConfigError) as info:
        load_party_config(path)
    assert expect in str(info.value), str(info.value)
