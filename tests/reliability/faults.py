"""Fault-injection harness: SIGKILL a member of a running job at an observed point, then check
that the consortium ends the job cleanly, reveals nothing after the kill, settles every budget
reservation, and that a restarted daemon comes back consistent.

Why from the outside: the kill points are reached by watching what a real job shows anyway (the
coordinator's Watch stream of job events, the daemons' logs, each party's audit log) plus a seeded
random delay, so the product runs unmodified. One :class:`FaultConsortium` (a
:class:`~coordinator.consortium.LocalConsortium` on UCI Adult, 3 parties + dealer) serves many
scenarios; only the killed daemon is restarted.

Victims (``Scenario.victim``):

* ``party_daemon``: the party daemon process alone (its job worker is orphaned and must stop by itself);
* ``party_host``: the party daemon's whole process group (daemon and worker: a host crash);
* ``dealer``: the dealer daemon's process group;
* ``party_worker`` / ``dealer_worker``: the job's worker process only (its daemon survives);
* ``coordinator``: the ``mpc-erm job submit --watch`` process (not a job member: the job must succeed).

"Nothing revealed after the kill" is checked as: after a party's daemon, host or worker is killed
only the round in flight when the killed process was gone (a zombie or reaped: until then its
orphaned worker cannot tell) completes (a reveal needs every party's share); after the dealer dies,
rounds that need no triple may still complete (it holds no share), and a job whose reveals all
completed must then succeed; a reveal anywhere implies every party charged its ledger.

Points (``Scenario.point``): ``before_shares`` (a party is loading its rows: nothing has moved),
``offline`` (the offline noise pool is being filled; for output perturbation concurrently with
the local solve), ``between_rounds`` (gradient: after round r's release), ``reveal`` (right after
a party charged its ledger: the output reveal, mid-aggregation, or gradient round 1).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from coordinator.consortium import LocalConsortium
from coordinator.end_to_end import LocalJob, job_toml
from mpc_erm.jobs.status import TERMINAL

ROOT = Path(__file__).resolve().parents[2]
PARTIES = ("alice", "bob", "carol")
DEALER = "dealer"
MEMBERS = (*PARTIES, DEALER)
RESULT_FILES = ("model.safetensors", "privacy_report.json", "metrics.json", "training_curve.png")
EPSILON, DELTA = 0.5, 1e-5
ITERATIONS = 20
# A survivor waits at most the worker's transport/look-up deadline (the party config's peer_timeout_s, 120 s by default)
# on a lost peer, then its daemon records the failure; the slack covers a loaded 2-core machine.
SURVIVOR_DEADLINE_S = 120.0 + 90.0
RESTART_PATIENCE_S = 25.0  # a killed daemon is restarted once the survivors ended, or after this
TRIGGER_TIMEOUT_S = 240.0
VICTIMS = ("party_daemon", "party_host", "dealer", "party_worker", "dealer_worker", "coordinator")
POINTS = ("before_shares", "offline", "between_rounds", "reveal")


@dataclass(frozen=True)
class Scenario:
    victim: str
    point: str
    method: str  # "output" | "gradient"
    seed: int

    def __post_init__(self) -> None:
        if self.victim not in VICTIMS or self.point not in POINTS or self.method not in ("output", "gradient"):
            raise ValueError(f"bad scenario {self}")
        if self.point == "between_rounds" and self.method != "gradient":
            raise ValueError("between_rounds needs a gradient job")

    @property
    def id(self) -> str:
        return f"{self.victim}-{self.point}-{self.method}-s{self.seed}"

    @property
    def daemon_killed(self) -> bool:
        return self.victim in ("party_daemon", "party_host", "dealer")

    def plan(self) -> dict[str, Any]:
        """The seeded choices: which party is the victim (or whose progress triggers), the round, the delay."""
        rng = random.Random(f"{self.id}")
        party = rng.choice(PARTIES)
        plan: dict[str, Any] = {"party": party,
                                "victim": DEALER if self.victim in ("dealer", "dealer_worker") else party}
        if self.point == "before_shares":
            plan["delay"] = rng.uniform(0.0, 1.5)
        elif self.point == "offline":
            # an output job's offline noise (~100 samples) and local solve take well under a second
            # on a quiet machine once workers fork warm: a longer delay would miss the worker
            plan["delay"] = rng.uniform(0.0, 3.0 if self.method == "gradient" else 0.3)
        elif self.point == "between_rounds":
            plan["round"] = rng.randint(1, ITERATIONS - 2)
            plan["delay"] = rng.uniform(0.0, 0.03)
        else:
            plan["delay"] = rng.uniform(0.0, 0.04)
        return plan


def campaign() -> list[Scenario]:
    """The ≥ 30 scenarios of the full campaign: victim × point × method × seed."""
    out: list[Scenario] = []
    seed = 0

    def add(victim: str, combos: list[tuple[str, str]]) -> None:
        nonlocal seed
        for point, method in combos:
            seed += 1
            out.append(Scenario(victim, point, method, seed))

    every = [("before_shares", "output"), ("offline", "output"), ("reveal", "output"), ("before_shares", "gradient"),
             ("offline", "gradient"), ("between_rounds", "gradient"), ("reveal", "gradient")]
    add("party_worker", every)
    add("party_daemon", [("before_shares", "output"), ("offline", "output"), ("reveal", "output"),
                         ("offline", "gradient"), ("between_rounds", "gradient"), ("between_rounds", "gradient")])
    add("party_host", [("before_shares", "gradient"), ("offline", "output"), ("reveal", "output"),
                       ("between_rounds", "gradient"), ("reveal", "gradient")])
    add("dealer", [("before_shares", "output"), ("offline", "output"), ("offline", "gradient"),
                   ("between_rounds", "gradient"), ("reveal", "output")])
    add("dealer_worker", [("offline", "output"), ("between_rounds", "gradient"), ("reveal", "gradient")])
    add("coordinator", [("before_shares", "output"), ("offline", "gradient"), ("between_rounds", "gradient"),
                        ("reveal", "output")])
    return out


# ----------------------------------------------------------------------------- processes


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def worker_pids(state_dir: Path, job_id: str) -> list[int]:
    """Pids of the job's worker processes, from the daemon's JSON log ("worker process started")."""
    out = []
    with contextlib.suppress(OSError):
        for line in (state_dir / "daemon.log").read_text(errors="replace").splitlines():
            if job_id in line and "worker process started" in line:
                with contextlib.suppress(ValueError, KeyError):
                    rec = json.loads(line)
                    if rec.get("job_id") == job_id:
                        out.append(int(rec["pid"]))
    return out


def stop_process_group(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM the process group ``proc`` leads (a daemon and its workers), SIGKILL it after ``grace_s``."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for(pred: Callable[[], Any], timeout: float, what: str | Callable[[], str], every: float = 0.05) -> Any:
    """``pred()`` once it is truthy; TimeoutError naming ``what`` (a callable: computed at the timeout,
    to say what was seen) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
        time.sleep(every)


def audit_records(state_dir: Path, job_id: str | None = None) -> list[dict[str, Any]]:
    path = state_dir / "audit.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    recs = []
    for line in lines:
        with contextlib.suppress(ValueError):
            r = json.loads(line)
            if job_id is None or r.get("job_id") == job_id:
                recs.append(r)
    return recs


# ----------------------------------------------------------------------------- the consortium


class EventStream:
    """The job's events from the coordinator client's Watch stream, collected by a thread."""

    def __init__(self, cons: LocalConsortium, job_id: str) -> None:
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._client = cons.client()
        self.job_id = job_id
        self._thread = threading.Thread(target=self._pump, name=f"watch-{job_id[:8]}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for ev in self._client.watch(self.job_id, members=list(MEMBERS)):
                ev["seen"] = time.time()
                with self._cond:
                    self.events.append(ev)
                    self._cond.notify_all()
        except Exception as exc:  # a stream cut by a kill is expected; record it
            with self._cond:
                self.events.append({"member": "?", "phase": "error", "payload": {"message": repr(exc)}})
                self._cond.notify_all()

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str,
             member: str | None = None) -> dict[str, Any]:
        """The first event matching ``pred`` (fails early once the job ended at ``member``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for ev in self.events:
                    if pred(ev):
                        return ev
                if member is not None and (why := self.ended(member)):
                    raise AssertionError(f"{what} never came: {why}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}; events: "
                                       + ", ".join(f"{e['member']}:{e['phase']}" for e in self.events))
                self._cond.wait(min(left, 0.5))

    def ended(self, member: str) -> str | None:
        """How the job ended at ``member`` if the stream already says so."""
        with self._cond:
            for e in self.events:
                if e["member"] == member and e["phase"] in TERMINAL:
                    return f"the job ended {e['phase']} at {member} first ({e['payload'].get('message', '')})"
        return None

    def close(self) -> None:
        self._client.close()


@dataclass
class Outcome:
    """What one scenario observed; ``notes`` go into the campaign's report."""

    scenario: Scenario
    job_id: str = ""
    kill_time: float = math.nan
    # When the victim was gone (its pid reaped or a zombie), not when the signal was sent: the kernel
    # tears a large process down over tens of milliseconds on a loaded machine, and until then its
    # worker cannot tell (its parent is still there) and may take part in one more round.
    gone_time: float = math.nan
    phase_at_kill: dict[str, str] = field(default_factory=dict)
    statuses: dict[str, tuple[str, str]] = field(default_factory=dict)
    released_rounds: dict[str, list[int]] = field(default_factory=dict)
    ledger: dict[str, str] = field(default_factory=dict)
    end_s: float = math.nan  # seconds from the kill until every surviving member had ended the job
    resubmitted: str = ""
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)


class FaultConsortium:
    """A LocalConsortium for fault scenarios: big budgets so that many jobs fit, a restart of one
    killed daemon with its own config and state dir, job submission and observation."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cons = LocalConsortium(root / "consortium", parties=3, dataset="adult", budget_epsilon=1000.0,
                                    budget_delta=0.01, max_epsilon_per_job=1.0)
        self.jobs_dir = root / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> FaultConsortium:
        self.cons.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cons.stop()

    def state_dir(self, name: str) -> Path:
        return self.cons.root / name / "state"

    def job_file(self, method: str) -> Path:
        path = self.jobs_dir / f"{method}.toml"
        if not path.exists():
            job = (LocalJob("fault-output", "output", lam=1e-3, epsilon=EPSILON, delta=DELTA) if method == "output"
                   else LocalJob("fault-gradient", "gradient", lam=1e-4, epsilon=EPSILON, delta=DELTA,
                                iterations=ITERATIONS, learning_rate=20.0))
            path.write_text(job_toml(job, list(PARTIES), "adult", "dealer", DEALER))
        return path

    def daemon_pid(self, name: str) -> int | None:
        proc = self.cons.members[name].proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def restart(self, name: str) -> None:
        """Start a killed daemon again with the same config and state dir (as LocalConsortium.start)."""
        from coordinator.consortium import _child_env

        m = self.cons.members[name]
        if m.proc is not None:
            m.proc.wait(30)
            if m.proc.stdout is not None:
                m.proc.stdout.close()
        cmd = [sys.executable, "-m", "coordinator.cli", m.role, "serve", "--config", str(m.config)]
        with open(m.log, "ab") as log:
            m.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                      cwd=m.config.parent, start_new_session=True, env=_child_env())
        self.cons._await_listening(m)

    def ensure_up(self) -> None:
        """Every daemon running (a failed scenario must not take the next ones down with it)."""
        for name in MEMBERS:
            if self.daemon_pid(name) is None:
                self.restart(name)

    def submit(self, method: str) -> str:
        with self.cons.client() as c:
            return str(c.submit(self.job_file(method))["job_id"])

    def statuses(self, job_id: str) -> dict[str, dict[str, Any]]:
        with self.cons.client() as c:
            return c.status(job_id)

    def wait_terminal(self, job_id: str, members: list[str], timeout: float) -> dict[str, dict[str, Any]]:
        """GetStatus through the coordinator client until each of ``members`` reports a terminal status."""
        def done() -> dict[str, dict[str, Any]] | None:
            try:
                st = self.statuses(job_id)
            except Exception:
                return None
            return st if all(st.get(m, {}).get("status") in TERMINAL for m in members) else None

        return wait_for(done, timeout, f"job {job_id} to end at {', '.join(members)}", every=0.5)

    def run_to_end(self, method: str, timeout: float = 400.0) -> tuple[str, dict[str, dict[str, Any]]]:
        job_id = self.submit(method)
        return job_id, self.wait_terminal(job_id, list(MEMBERS), timeout)


@contextlib.contextmanager
def coordinator_process(fc: FaultConsortium, method: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``mpc-erm job submit FILE --watch --json`` as its own process; yields (process, job id)."""
    from coordinator.consortium import _child_env

    cmd = [sys.executable, "-m", "coordinator.cli", "job", "submit", str(fc.job_file(method)), "--config",
           str(fc.cons.coordinator_config), "--watch", "--json"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=_child_env())
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if not first:
            raise RuntimeError(f"the coordinator process exited ({proc.wait()}) before submitting")
        yield proc, str(json.loads(first)["job_id"])
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# ----------------------------------------------------------------------------- observation


class AuditFollower:
    """Tails one party's audit log (only the new bytes each time) to catch a charge or a release fast."""

    def __init__(self, state_dir: Path, job_id: str) -> None:
        self.path = state_dir / "audit.jsonl"
        self.job_id = job_id
        self.records: list[dict[str, Any]] = []
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return self.records
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                r = json.loads(line)
                if r.get("job_id") == self.job_id:
                    self.records.append(r)
        return self.records

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str,
             ended: Callable[[], str | None] = lambda: None) -> dict[str, Any]:
        """The first record matching ``pred``; ``ended()`` names why it can no longer come (the job ended)."""
        self._offset = 0  # the whole log once, then only what is appended
        self._partial = b""
        self.records = []
        deadline = time.monotonic() + timeout
        polls = 0
        while True:
            for r in self.poll():
                if pred(r):
                    return r
            polls += 1
            if polls % 100 == 0 and (why := ended()):
                raise AssertionError(f"{what} never came: {why}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:g} s waiting for {what} in {self.path}")
            time.sleep(0.002)


def _trigger(fc: FaultConsortium, sc: Scenario, plan: dict[str, Any], events: EventStream, job_id: str) -> str:
    """Block until the scenario's point is reached at ``plan['party']``; returns what was seen."""
    party = plan["party"]
    if sc.point == "before_shares":
        events.wait(lambda e: e["member"] == party and e["phase"] == "loading", TRIGGER_TIMEOUT_S, f"{party} loading",
                    party)
        return f"{party} loading"
    if sc.point == "offline":
        phase = "local" if sc.method == "output" else "offline"
        events.wait(lambda e: e["member"] == party and e["phase"] == phase, TRIGGER_TIMEOUT_S, f"{party} {phase}",
                    party)
        return f"{party} {phase}"
    follower = AuditFollower(fc.state_dir(party), job_id)
    if sc.point == "between_rounds":
        r = plan["round"]
        follower.wait(lambda a: a["event"] == "release" and a["round"] >= r, TRIGGER_TIMEOUT_S,
                      f"{party}'s release of round {r}", lambda: events.ended(party))
        return f"{party} released round {r}"
    follower.wait(lambda a: a["event"] == "charge", TRIGGER_TIMEOUT_S, f"{party}'s charge", lambda: events.ended(party))
    return f"{party} charged"


def _last_phases(events: EventStream, before: float) -> dict[str, str]:
    out: dict[str, str] = {}
    with events._cond:
        for e in events.events:
            if e.get("seen", math.inf) <= before and e["member"] in MEMBERS:
                out[e["member"]] = e["phase"] + (f"@{e['payload']['round']}" if "round" in e.get("payload", {}) else "")
    return out


# ----------------------------------------------------------------------------- the scenario


class FaultMissed(Exception):
    """The victim had already exited when the kill came: the job outran the trigger and the delay."""


MISS_ATTEMPTS = 3


def run_scenario(fc: FaultConsortium, sc: Scenario, scratch: Path) -> Outcome:
    """Run one scenario end to end and check it; raises AssertionError naming what broke.

    A worker victim can finish its job between the observed point and the kill (an output job's
    local phase takes well under a second once it is seen): that job injected no fault, so it is
    checked to have succeeded everywhere and the scenario runs again on a new job, with no delay."""
    missed: list[str] = []
    for attempt in range(MISS_ATTEMPTS):
        try:
            out = _run_once(fc, sc, scratch, zero_delay=attempt > 0)
        except FaultMissed as e:
            missed.append(str(e))
            continue
        out.notes.extend(missed)
        return out
    raise AssertionError(f"[{sc.id}] the fault point was missed {MISS_ATTEMPTS} times: " + "; ".join(missed))


def _run_once(fc: FaultConsortium, sc: Scenario, scratch: Path, zero_delay: bool) -> Outcome:
    from parties.daemon import RESTART_REASON

    tic = time.perf_counter()
    fc.ensure_up()
    plan = sc.plan()
    if zero_delay:
        plan["delay"] = 0.0
    victim, out = plan["victim"], Outcome(sc)
    out.notes.append(f"plan {plan}")
    coord: contextlib.AbstractContextManager[Any] = (coordinator_process(fc, sc.method) if sc.victim == "coordinator"
                                                     else contextlib.nullcontext(None))
    ledger_before: str | None = None
    orphans: list[int] = []
    with coord as cp:
        job_id = cp[1] if cp is not None else fc.submit(sc.method)
        out.job_id = job_id
        events = EventStream(fc.cons, job_id)
        try:
            target: int | None = None
            if sc.victim in ("party_worker", "dealer_worker", "party_daemon"):
                pids = wait_for(lambda: worker_pids(fc.state_dir(victim), job_id), TRIGGER_TIMEOUT_S,
                                f"{victim}'s worker of job {job_id}")
                target = pids[-1]
                if sc.victim == "party_daemon":
                    orphans, target = [pids[-1]], fc.daemon_pid(victim)
            elif sc.daemon_killed:
                target = fc.daemon_pid(victim)
            out.notes.append("trigger: " + _trigger(fc, sc, plan, events, job_id))
            time.sleep(plan["delay"])
            out.kill_time = time.time()
            if sc.victim == "coordinator":
                assert cp is not None
                cp[0].send_signal(signal.SIGKILL)
            elif sc.victim in ("party_host", "dealer"):
                assert target is not None
                os.killpg(target, signal.SIGKILL)
            else:
                assert target is not None
                try:
                    os.kill(target, signal.SIGKILL)
                except ProcessLookupError:
                    _missed(fc, sc, job_id, target)
            if target is not None and sc.victim != "coordinator":
                wait_for(lambda: not alive(target), 30.0, f"the killed {sc.victim} to be gone", every=0.002)
            out.gone_time = time.time()
            out.phase_at_kill = _last_phases(events, out.kill_time)
            survivors = [m for m in MEMBERS if not (sc.daemon_killed and m == victim)]
            if sc.daemon_killed:
                proc = fc.cons.members[victim].proc
                assert proc is not None
                proc.wait(30)
                with contextlib.suppress(TimeoutError):
                    fc.wait_terminal(job_id, survivors, RESTART_PATIENCE_S)
                if victim in PARTIES:
                    ledger_before = _ledger_row(fc, victim, job_id).state
                for pid in orphans:  # an orphaned worker notices its daemon is gone and stops by itself
                    wait_for(lambda pid=pid: not alive(pid), 120.0, f"the orphaned worker {pid} to exit")
                fc.restart(victim)
            left = SURVIVOR_DEADLINE_S - (time.time() - out.kill_time)
            st = fc.wait_terminal(job_id, list(MEMBERS), max(left, 5.0))
        finally:
            events.close()
    ended = [st[m]["ended_at"] for m in survivors if st[m].get("ended_at")]
    out.end_s = max(ended) - out.kill_time if ended else math.nan
    out.statuses = {m: (st[m]["status"], st[m]["reason"] or "") for m in MEMBERS}
    _check(fc, sc, out, victim, st, ledger_before, scratch, RESTART_REASON)
    if sc.daemon_killed:
        _check_resubmission(fc, sc, out)
    out.wall_s = time.perf_counter() - tic
    return out


def _missed(fc: FaultConsortium, sc: Scenario, job_id: str, pid: int) -> None:
    """The worker ``pid`` was gone before the kill: raise FaultMissed if the job then succeeded
    everywhere, AssertionError (naming every member's status) if it did not."""
    st = fc.wait_terminal(job_id, list(MEMBERS), SURVIVOR_DEADLINE_S)
    statuses = {m: (st[m]["status"], st[m].get("reason") or "") for m in MEMBERS}
    if any(s != "succeeded" for s, _ in statuses.values()):
        raise AssertionError(f"[{sc.id} job {job_id}] the {sc.victim} {pid} exited before the kill and the job "
                             f"did not succeed: {statuses}")
    raise FaultMissed(f"job {job_id} ended before its {sc.victim} could be killed")


def _ledger_row(fc: FaultConsortium, party: str, job_id: str) -> Any:
    from parties.ledger import Ledger

    with Ledger(fc.state_dir(party) / "ledger.sqlite3") as led:
        return led.get(job_id)


def _names_a_cause(reason: str, me: str, victim: str) -> bool:
    """A failure reason must say why: the lost peer (any other member whose loss it saw) or the kill itself."""
    others = [m for m in MEMBERS if m != me]
    return (victim in reason or any(f"'{m}'" in reason or f"{m}:" in reason or f" {m} " in reason for m in others)
            or "worker process exited" in reason)


def _check(fc: FaultConsortium, sc: Scenario, out: Outcome, victim: str, st: dict[str, dict[str, Any]],
           ledger_before: str | None, scratch: Path, restart_reason: str) -> None:
    from parties.audit import verify
    from parties.job_store import JobStore, read_result_manifest
    from parties.ledger import Ledger

    job_id, kill = out.job_id, out.kill_time
    rounds = 1 if sc.method == "output" else ITERATIONS
    ctx = f"[{sc.id} job {job_id}]"

    # 1. every member ended the job, each for a stated reason; the job tables and ListJobs agree
    with fc.cons.client() as c:
        listed = next((j for j in c.list() if j["job_id"] == job_id), None)
    assert listed is not None, f"{ctx} ListJobs does not show the job"
    for m in MEMBERS:
        status, reason = out.statuses[m]
        store = JobStore.in_state_dir(fc.state_dir(m))
        try:
            rec = store.get(job_id)
        finally:
            store.close()
        assert rec is not None and (rec.status, rec.reason or "") == (status, reason), f"{ctx} {m}: job table {rec}"
        assert listed["members"].get(m) == status, f"{ctx} ListJobs {listed} vs GetStatus {m}: {status}"
        if sc.daemon_killed and m == victim:
            # Its orphaned worker may have written every result and their manifest before it
            # stopped: then the job revealed, ε is spent and the model is there, and the restarted
            # daemon must say succeeded (a "failed" would be resubmitted and paid twice).
            complete = ledger_before == "revealed" and read_result_manifest(fc.state_dir(m) / "jobs" / job_id)
            expected = ("succeeded", "") if complete else ("failed", restart_reason)
            assert (status, reason) == expected, f"{ctx} restarted {m}: {status} {reason!r}, expected {expected}"
        elif sc.victim == "coordinator":
            assert status == "succeeded", f"{ctx} {m} ended {status} ({reason}) though only the coordinator died"
        elif status != "succeeded":
            assert status in ("failed", "cancelled") and _names_a_cause(reason, m, victim), (
                f"{ctx} {m} ended {status} with a reason that names no lost peer or cause: {reason!r}")

    # 2. nothing revealed after the kill beyond the one round in flight; no results where the job failed
    releases: dict[str, list[tuple[int, float]]] = {}
    charged: dict[str, bool] = {}
    for p in PARTIES:
        if (fc.state_dir(p) / "audit.jsonl").exists():  # absent until the party's first charge
            verify(fc.state_dir(p) / "audit.jsonl")  # the hash chain is intact after the crash
        recs = audit_records(fc.state_dir(p), job_id)
        releases[p] = [(int(r["round"]), float(r["time"])) for r in recs if r["event"] == "release"]
        charged[p] = any(r["event"] == "charge" for r in recs)
        out.released_rounds[p] = [r for r, _ in releases[p]]
    gone = out.gone_time
    r0 = max((r for rel in releases.values() for r, t in rel if t <= gone), default=0)
    for p, rel in releases.items():
        late = [r for r, t in rel if t > gone]
        # A reveal needs every party's share, so after a party (or its worker) is killed only the
        # round in flight can complete. The dealer holds no share and the rounds' reveals need no
        # triple (the noise was drawn offline), so after the dealer dies rounds may go on until the
        # next triple request; the coordinator is no member at all.
        if sc.victim not in ("dealer", "dealer_worker", "coordinator"):
            assert all(r <= r0 + 1 for r in late), (
                f"{ctx} {p} released rounds {late} after the victim was gone; only round {r0 + 1} was in flight")
        assert sorted(r for r, _ in rel) == list(range(1, len(rel) + 1)), f"{ctx} {p}: rounds {rel}"
    counts = [len(rel) for rel in releases.values()]
    assert max(counts) - min(counts) <= 1, f"{ctx} the parties released different rounds: {out.released_rounds}"
    if any(releases.values()):
        out.notes.append(f"released before the victim was gone up to round {r0} "
                         f"({gone - kill:.3f} s after the kill)")
    for p in PARTIES:
        status = out.statuses[p][0]
        files = [f for f in RESULT_FILES if (fc.state_dir(p) / "jobs" / job_id / f).exists()]
        if status == "succeeded":
            assert len(releases[p]) == rounds and files == list(RESULT_FILES), f"{ctx} {p} succeeded: {files}"
        elif sc.victim == "party_daemon" and p == victim:
            pass  # its orphaned worker may have finished a reveal it had started; checked with the ledger below
        else:
            assert not files, f"{ctx} {p} ended {status} but holds result files {files}"

    # 3. every ledger settled: no open reservation, the job's ε charged once iff this party revealed
    any_release = any(releases.values())
    for p in PARTIES:
        with Ledger(fc.state_dir(p) / "ledger.sqlite3") as led:
            row = led.get(job_id)
            assert row is not None, f"{ctx} {p} has no reservation for the job"
            out.ledger[p] = row.state
            assert row.state in ("released", "committed"), f"{ctx} {p}'s reservation left {row.state}"
            assert math.isclose(row.epsilon, EPSILON) and math.isclose(row.delta, DELTA), f"{ctx} {p}: {row}"
            assert not led.open_reservations(), f"{ctx} {p}: open reservations {led.open_reservations()}"
            assert all(abs(b.epsilon_reserved) <= 1e-9 for b in led.show()), f"{ctx} {p}: {led.show()}"
        if any_release:  # a reveal anywhere needs every party's share: each marked its spend first
            assert row.state == "committed", f"{ctx} {p}: {row.state} although {releases} were revealed"
        if p == victim and sc.victim in ("party_daemon", "party_host", "party_worker"):
            if charged[p]:
                assert row.state == "committed", f"{ctx} {p} charged its audit log but its ledger is {row.state}"
            files = [f for f in RESULT_FILES if (fc.state_dir(p) / "jobs" / job_id / f).exists()]
            assert not files or row.state == "committed", f"{ctx} {p} holds {files} with the budget {row.state}"
        else:
            assert (row.state == "committed") == charged[p], (
                f"{ctx} {p}: ledger {row.state} but audit charge {'present' if charged[p] else 'absent'}")

    # 4. a restarted party daemon settled its open reservation by Ledger.recover
    if sc.daemon_killed and victim in PARTIES:
        assert ledger_before in ("reserved", "revealed"), f"{ctx} {victim}'s row before restart: {ledger_before}"
        row = _ledger_row(fc, victim, job_id)
        assert row.state == ("committed" if ledger_before == "revealed" else "released"), f"{ctx} {row}"
        if row.state == "released":
            assert row.reason == restart_reason, f"{ctx} {row}"
        log = (fc.state_dir(victim) / "daemon.log").read_text(errors="replace")
        assert any(job_id in line and '"phase": "recover"' in line for line in log.splitlines()), (
            f"{ctx} {victim}'s restart did not log the recovery of the job's reservation")

    # no worker of the job is left running anywhere
    pids = [pid for m in MEMBERS for pid in worker_pids(fc.state_dir(m), job_id)]
    wait_for(lambda: not [p for p in pids if alive(p)], 60.0, f"the job's workers {pids} to exit")

    if sc.victim == "coordinator":  # another coordinator picks the job up: one model at every party
        with fc.cons.client() as c:
            res = c.result(job_id, scratch / job_id)
        assert res["models_identical"], f"{ctx} {res['model_sha256']}"


def _check_resubmission(fc: FaultConsortium, sc: Scenario, out: Outcome) -> None:
    """The same job under a new id succeeds on the consortium with the restarted daemon."""
    from parties.ledger import Ledger

    job_id, st = fc.run_to_end(sc.method)
    out.resubmitted = job_id
    ctx = f"[{sc.id} resubmitted as {job_id}]"
    assert {m: st[m]["status"] for m in MEMBERS} == dict.fromkeys(MEMBERS, "succeeded"), (
        f"{ctx} " + "; ".join(f"{m}: {v['status']} {v.get('reason')}" for m, v in st.items()))
    rounds = 1 if sc.method == "output" else ITERATIONS
    for p in PARTIES:
        rel = [r for r in audit_records(fc.state_dir(p), job_id) if r["event"] == "release"]
        assert len(rel) == rounds, f"{ctx} {p} released {len(rel)} rounds"
        with Ledger(fc.state_dir(p) / "ledger.sqlite3") as led:
            assert led.get(job_id).state == "committed", f"{ctx} {p}: {led.get(job_id)}"
        assert all((fc.state_dir(p) / "jobs" / job_id / f).exists() for f in RESULT_FILES), f"{ctx} {p}"


def summary_line(o: Outcome) -> str:
    st = ", ".join(f"{m}={s}" + (f" ({r[:140]})" if r else "") for m, (s, r) in o.statuses.items())
    return (f"{o.scenario.id}: job {o.job_id[:8]} kill at {o.phase_at_kill} -> {st}; end {o.end_s:.1f} s after "
            f"the kill; rounds {o.released_rounds}; ledger {o.ledger}; wall {o.wall_s:.0f} s; {'; '.join(o.notes)}")


@contextlib.contextmanager
def tmpfs(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted on ``path`` (needs root: the test is skipped otherwise),
    unmounted afterwards: a party state directory, or any file system, that can fill up."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs: {exc}")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): "
                    f"{(r.stderr or r.stdout).strip() or f'mount exited {r.returncode}'}")
    try:
        yield path
    finally:
        for _ in range(20):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)  # a process of ours still closing a file there
        else:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
