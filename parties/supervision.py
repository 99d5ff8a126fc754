"""Running admitted jobs: a scheduler that fills ``max_concurrent_jobs`` slots, oldest job first,
and one thread per running job that starts its worker process, relays what the worker sends and
ends it (cancel, stop, a worker that will not exit).

Why a process per job: CrypTen keeps global state (one MPC session per process), and a crashed or
cancelled job must not take the daemon down (``parties.context``).

Worker start-up: workers are forked from a ``forkserver`` that has already imported torch,
CrypTen and the worker's modules (``WORKER_PRELOAD``), so a job does not pay ~10-20 s of imports.
The fork server only imports modules; it never initialises CrypTen or runs a job, so every
worker starts from the same pristine module state and no MPC state is shared between jobs
(secrets come from ``os.urandom``/``secrets`` in the child). ``MPC_ERM_WORKER_START=spawn``
restores one fresh interpreter per job.

Ending: a cancelled (or stopped) job's worker gets ``cancel_grace_s`` to stop by itself, and a
worker that reported its result ``EXIT_GRACE_S`` to exit; then it is terminated. How a job ended
is decided here; its budget is settled by the daemon (``commit``/``release``).

Progress, not only existence: the worker sends a heartbeat every ``parties.context.HEARTBEAT_S``
from a thread of its own, besides its events, so a long phase (the offline noise pool, a local
solve, CrypTen's start-up) keeps it alive here. A worker from which nothing came for the config's
``peer_timeout_s`` (plus ``STALL_MARGIN_S``; ``START_GRACE_S`` more before its first message) is
stopped or frozen: its peers give up on it after ``peer_timeout_s`` anyway. It is SIGKILLed (with any
process it started) and the job ends ``failed`` (``STALLED: … made no progress for 125 s (limit
120 s: peer_timeout_s) …``), its budget settled, its slot free.

Storage errors (the state directory full, an I/O error, the SQLite file locked or read-only) never
end a supervising thread. An event that cannot be written is dropped (one log line per job). A
job that cannot be started ends ``failed`` (``STORAGE: <member> could not record …``). The budget
settlement and the terminal status are retried with backoff (``STORE_RETRY_S``) until they are
written; meanwhile the job store serves the terminal status from memory (``parties.job_store``). Only a
stopping daemon gives up, and its next start settles the job as any interrupted one.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import queue
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mpc_erm.mpc.pki import Identity

from .config import DaemonConfig
from .context import ProcessWorkerContext, worker_main
from .job_store import LIVE, JobRecord, JobStore, read_result_manifest, result_files
from .logs import DaemonLog, one_line
from .public_errors import PublicError, storage_problem

__all__ = ["CANCEL_GRACE_S", "ENDPOINT_SERVICES", "EXIT_GRACE_S", "START_GRACE_S", "STALL_MARGIN_S", "STOP_REASON",
           "STORAGE_ERRORS", "STORE_RETRY_S", "WARM_UP_TIMEOUT_S", "WORKER_PRELOAD", "WORKER_START_ENV", "Run",
           "Supervisor", "WorkerSetup", "endpoint_key"]

_T = TypeVar("_T")

CANCEL_GRACE_S = 10.0
EXIT_GRACE_S = 10.0  # a worker that reported its result but does not exit is terminated after this
WORKER_START_ENV = "MPC_ERM_WORKER_START"  # "forkserver" (default) or "spawn"
# Imported once by the fork server (what a party or dealer worker needs), not by each job.
WORKER_PRELOAD = ("parties.worker", "torch", "numpy", "mpc_erm.jobs.jobfile", "mpc_erm.data", "mpc_erm.protocols",
                  "mpc_erm.mpc.communicator", "mpc_erm.mpc.aggregator", "mpc_erm.mpc.dealer", "mpc_erm.mpc.noise",
                  "mpc_erm.mpc.rss_provider", "mpc_erm.privacy", "safetensors.torch", "matplotlib.figure",
                  "matplotlib.backends.backend_agg")
STOP_REASON = "interrupted: the daemon was stopped"
#: What a worker may publish: its share transport ("") and, in a job with owners, its owner intake.
ENDPOINT_SERVICES = ("", "owners")


def _warm_up_probe() -> None:
    """What :meth:`Supervisor.warm_up` runs in a process from the fork server: nothing."""


def endpoint_key(job_id: str, service: str = "") -> str:
    """The key of a published address in :attr:`Supervisor.endpoints`."""
    return job_id if not service else f"{job_id}/{service}"
WARM_UP_TIMEOUT_S = 600.0  # the fork server's imports, at most (a cold disk, a loaded host)
STALL_MARGIN_S = 5.0  # a worker silent for peer_timeout_s + this is stalled (heartbeats come every 2 s)
START_GRACE_S = 60.0  # more silence allowed before a worker's first message (a spawned worker imports first)
STORE_RETRY_S = (0.2, 5.0)  # a failed ledger or job-store write is retried after 0.2 s, doubling up to 5 s
# what a write to the state directory raises when it is full, read-only, damaged or locked
STORAGE_ERRORS: tuple[type[BaseException], ...] = (sqlite3.DatabaseError, OSError)


@dataclass
class Run:
    job_id: str
    record: JobRecord
    cancel: Any
    down: Any
    process: Any = None
    cancel_at: float | None = None  # monotonic time a cancel (or stop) was requested
    cancel_reason: str = ""
    end_status: str = "cancelled"  # what a cancelled run ends as (stop: failed)
    outcome: tuple[str, Any] | None = None
    threads: list[threading.Thread] = field(default_factory=list)
    thread: threading.Thread | None = None  # the daemon thread that supervises this run
    progress_at: float = 0.0  # monotonic time of the worker's last message (heartbeats included)
    heard: bool = False  # whether the worker sent anything yet
    dropped_events: int = 0  # events the job store could not take


@dataclass(frozen=True)
class WorkerSetup:
    """What every job's worker is given, known once the daemon has started."""

    config: DaemonConfig  # the daemon's, with ``advertise`` filled in
    identity: Identity
    jobs_dir: Path  # each job's results go to jobs_dir/<job_id>
    ledger_path: Path | None  # None at the dealer
    log_path: Path  # the worker's log lines go to the daemon's log file


class Supervisor:
    """The daemon's job slots. ``runs`` (the running jobs) and ``endpoints`` (the transport address
    each one's worker published) change under ``lock``, and ``changed`` is notified when they do
    (or when a run is being cancelled), which the endpoint look-ups wait on.

    ``commit(job_id)``/``release(job_id, reason) -> note`` settle a job's budget; ``lookup(run,
    member, timeout_s) -> address`` answers a worker's endpoint look-up (``prepare`` is given it).
    Writes that fail for storage reasons are retried (module docstring); ``settlers`` are the
    threads retrying them for jobs no job thread supervises (queued, or refused at start)."""

    def __init__(self, *, name: str, role: str, log: DaemonLog, stopping: threading.Event, worker_module: str,
                 start_method: str | None, cancel_grace_s: float, max_jobs: int, commit: Callable[[str], None],
                 release: Callable[[str, str], str]) -> None:
        self.name = name
        self.entry = "run_dealer_job" if role == "dealer" else "run_party_job"
        self.log = log
        self.worker_module = worker_module
        self.cancel_grace_s = cancel_grace_s
        self.max_jobs = max_jobs
        self.start_method = start_method or os.environ.get(WORKER_START_ENV) or "forkserver"
        if self.start_method not in ("forkserver", "spawn"):
            raise ValueError(f"{WORKER_START_ENV}: must be 'forkserver' or 'spawn', got {self.start_method!r}")
        self.commit, self.release = commit, release
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.endpoints: dict[str, str] = {}
        self.runs: dict[str, Run] = {}  # the admitted jobs, at most max_jobs
        self._stopping = stopping
        self._queue: queue.Queue[str] = queue.Queue()  # job ids to admit ("" only wakes the scheduler)
        self._scheduler: threading.Thread | None = None
        self._mp: Any = multiprocessing.get_context("spawn")  # replaced in prepare()
        self.store: JobStore | None = None
        self.setup: WorkerSetup | None = None
        self.lookup: Callable[[Run, str, float], str] | None = None
        self.peer_timeout_s = 120.0  # the config's, in prepare(): how long a silent worker may be silent
        self.settlers: list[threading.Thread] = []

    # ---- life cycle

    def prepare(self, store: JobStore, setup: WorkerSetup, lookup: Callable[[Run, str, float], str]) -> None:
        """Take what the jobs need, and start the fork server now, so that it imports torch and
        CrypTen while the daemon waits for its first job, not during it."""
        self.store, self.setup, self.lookup = store, setup, lookup
        self.peer_timeout_s = float(setup.config.peer_timeout_s)
        mp = multiprocessing.get_context(self.start_method)
        if self.start_method == "forkserver":
            heavy = WORKER_PRELOAD if self.worker_module == "parties.worker" else ()
            # process-wide: the first daemon of a process chooses (one daemon per process in production).
            # parties.daemon imports this module's worker_main, what each forked worker runs.
            mp.set_forkserver_preload(["parties.daemon", self.worker_module, *heavy])
            from multiprocessing import forkserver

            forkserver.ensure_running()
        self._mp = mp

    def start(self) -> None:
        self._scheduler = threading.Thread(target=self._schedule, name=f"scheduler-{self.name}", daemon=True)
        self._scheduler.start()

    def warm_up(self, timeout_s: float = WARM_UP_TIMEOUT_S) -> None:
        """Return once a worker process can start without waiting: a no-op process is started the
        way workers are, and joined. Raises RuntimeError when it cannot start or does not end.

        Why: the fork server imports torch and the job code (``WORKER_PRELOAD``) before it forks
        anything, tens of seconds on a cold disk; a job admitted meanwhile would wait for that
        with its peers' workers waiting on it. The daemon takes no job before this returns."""
        if self.start_method != "forkserver":
            return  # spawn: every worker imports for itself; nothing is shared to wait for
        proc = self._mp.Process(target=_warm_up_probe, name="mpc-erm-warm-up", daemon=True)
        try:
            proc.start()
            proc.join(timeout_s)
        except Exception as exc:
            raise RuntimeError(f"the fork server could not start a process: {one_line(exc)}") from None
        if proc.exitcode is None:
            with contextlib.suppress(Exception):
                proc.kill()
            raise RuntimeError(f"the fork server had not started a process after {timeout_s:g} s")
        if proc.exitcode != 0:
            raise RuntimeError(f"a process from the fork server exited with {proc.exitcode} (its preload: "
                               f"{', '.join(['parties.daemon', self.worker_module])} and their imports failed?)")
        with contextlib.suppress(Exception):
            proc.close()

    def stop(self) -> None:
        """Admit nothing more and interrupt the running jobs (they end failed; 2 s to stop, then the
        rest of the cancel grace); wait for their threads. Queued jobs stay queued."""
        if self._scheduler is not None:
            self._scheduler.join(timeout=5.0)  # admits nothing once stopping is set
        with self.lock:
            runs = list(self.runs.values())
            for run in runs:
                if run.cancel_at is None:
                    run.cancel_at = time.monotonic() - max(0.0, self.cancel_grace_s - 2.0)  # 2 s to stop
                    run.cancel_reason, run.end_status = STOP_REASON, "failed"
                    run.cancel.set()
            self.changed.notify_all()
        deadline = time.monotonic() + self.cancel_grace_s + 30
        for run in runs:
            if run.thread is not None:
                run.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with self.lock:
            settlers = list(self.settlers)
        for t in settlers:  # each makes one more attempt once stopping is set, then gives up
            t.join(timeout=max(1.0, deadline - time.monotonic()))

    # ---- requests

    def enqueue(self, job_id: str) -> None:
        self._queue.put(job_id)

    def running(self) -> int:
        with self.lock:
            return len(self.runs)

    def cancel(self, job_id: str, reason: str) -> JobRecord | None:
        """Cancel a queued or running job (a finished one is left as it is); None if unknown."""
        assert self.store is not None
        store = self.store
        with self.lock:
            rec = store.get(job_id)
            if rec is None:
                return None
            if rec.terminal:
                return rec
            try:
                store.request_cancel(job_id)  # only a flag for GetStatus: the cancel goes on without it
            except STORAGE_ERRORS as exc:
                self.log.warning(f"could not record the cancel request: {one_line(exc)}", job_id=job_id,
                                 phase="storage")
            run = self.runs.get(job_id)
            if run is not None:
                if run.cancel_at is None:
                    run.cancel_at, run.cancel_reason = time.monotonic(), reason
                    run.cancel.set()
                    self.log.info(f"cancel requested; the worker has {self.cancel_grace_s:g} s to stop",
                                  job_id=job_id, phase="cancelling")
                    self._event(run, "cancelling", {"message": reason})
                    self.changed.notify_all()
                return store.get(job_id)
            try:
                ended = store.finish(job_id, "cancelled", reason, only_from=("queued",))
            except STORAGE_ERRORS as exc:  # served from memory meanwhile: the scheduler will not start it
                self.log.warning(f"could not record the cancel of the queued job: {one_line(exc)}", job_id=job_id,
                                 phase="storage")
                self._background(job_id, lambda: self._cancel_queued(job_id, reason))
                return store.get(job_id)
            if ended:
                self.log.info("queued job cancelled", job_id=job_id, phase="cancelled")
                try:
                    self.release(job_id, reason)
                except STORAGE_ERRORS:
                    self._background(job_id, lambda: self._retry(job_id, "release the cancelled job's budget",
                                                                 lambda: self.release(job_id, reason)))
        return store.get(job_id)

    def _cancel_queued(self, job_id: str, reason: str) -> None:
        assert self.store is not None
        store = self.store
        _, ended = self._retry(job_id, "record the cancel of the queued job",
                               lambda: store.finish(job_id, "cancelled", reason, only_from=("queued",)), failures=1)
        if ended:
            self._retry(job_id, "release the cancelled job's budget", lambda: self.release(job_id, reason))

    def fail(self, run: Run, reason: str, *, phase: str, detail: str = "") -> bool:
        """End a running job as failed (its worker is cancelled; budget settled as for any failure).
        False if the job was already ending. ``detail`` goes to this daemon's log only."""
        assert self.store is not None
        with self.lock:
            if run.cancel_at is not None:
                return False
            run.cancel_at, run.cancel_reason, run.end_status = time.monotonic(), reason, "failed"
            run.cancel.set()
            self.changed.notify_all()
        self.log.warning(reason + detail, job_id=run.job_id, phase=phase)
        self._event(run, "failing", {"message": reason})
        return True

    # ---- storage errors

    def _public_storage(self, exc: BaseException, what: str) -> str:
        """The public reason of a job this daemon could not record or start because of ``exc``."""
        disk = storage_problem(exc)
        if disk is None:  # not the disk (too many open files, a locked file, a bug): no STORAGE code
            return PublicError("INTERNAL", f"internal error at {self.name} while trying to record {what} "
                                           f"({type(exc).__name__}); see {self.name}'s log").reason
        return PublicError("STORAGE", f"{self.name} could not record {what} ({disk}); see {self.name}'s log").reason

    def _retry(self, job_id: str, what: str, fn: Callable[[], _T], *, failures: int = 0) -> tuple[bool, _T | None]:
        """``fn()`` until it raises no storage error, with backoff (``STORE_RETRY_S``); the first
        failure is logged (unless the caller did: ``failures``), and so is the success that follows
        failures. Once the daemon is stopping it makes one more attempt and gives up (the next
        start settles the job). Returns (done, what ``fn`` returned)."""
        delay, cap = STORE_RETRY_S
        stopping = self._stopping.is_set() and failures > 0
        while True:
            try:
                value = fn()
            except STORAGE_ERRORS as exc:
                failures += 1
                if stopping:
                    self.log.warning(f"gave up trying to {what} after {failures} attempt(s), the daemon is "
                                     f"stopping (its next start settles the job): {one_line(exc)}", job_id=job_id,
                                     phase="storage")
                    return False, None
                if failures == 1:
                    self.log.warning(f"could not {what}: {one_line(exc)}; retrying every {cap:g} s at most until it "
                                     "succeeds", job_id=job_id, phase="storage")
                stopping = self._stopping.wait(delay)
                delay = min(2 * delay, cap)
                continue
            if failures:
                self.log.info(f"{what}: done after {failures} failed attempt(s)", job_id=job_id, phase="storage")
            return True, value

    def _background(self, job_id: str, fn: Callable[[], object]) -> None:
        """Run ``fn`` (a settlement that retries) in a settler thread: the caller does not wait."""

        def settle() -> None:
            try:
                fn()
            except Exception:  # a bug: logged, never a dead thread without a trace
                self.log.exception("could not settle the job", job_id=job_id, phase="storage")

        t = threading.Thread(target=settle, name=f"settle-{job_id[:12]}", daemon=True)
        with self.lock:
            self.settlers = [x for x in self.settlers if x.is_alive()] + [t]
        t.start()

    def _settle(self, job_id: str, status: str, reason: str | None,
                summary: dict[str, Any] | None = None) -> str | None:
        """End a live job: settle its budget (a success: commit; otherwise release, or commit if it
        revealed; the ledger's note joins the reason), then record its terminal status, each retried
        until written. Returns the reason recorded.

        Budget first, so that a job seen ended has its budget settled (a resubmission fits). When
        the ledger cannot be written, the status is recorded first (from memory if the job store
        cannot take it either) without the ledger's note (logged once the ledger is settled): the
        job must not show running while the ledger waits for space."""
        assert self.store is not None
        store = self.store

        def budget() -> str:
            if status == "succeeded":
                self.commit(job_id)
                return ""
            return self.release(job_id, reason or status)

        def record(why: str | None) -> bool:
            return store.finish(job_id, status, why, summary, only_from=LIVE)

        try:
            note: str | None = budget()
        except STORAGE_ERRORS as exc:
            self.log.warning(f"could not settle the job's budget in the ledger: {one_line(exc)}; the job ends now, "
                             "its budget once the ledger can be written", job_id=job_id, phase="storage")
            with contextlib.suppress(*STORAGE_ERRORS):
                record(reason)  # served from memory if the job store cannot take it either
            _, note = self._retry(job_id, "settle the job's budget in the ledger", budget, failures=1)
            if note:
                self.log.info(note, job_id=job_id, phase="ledger")
            # the reason as it was served meanwhile (a terminal status does not change)
            self._retry(job_id, "record how the job ended in the job store", lambda: record(reason))
            return reason
        if note:
            reason = f"{reason}; {note}" if reason else note
        self._retry(job_id, "record how the job ended in the job store", lambda: record(reason))
        return reason

    def _event(self, run: Run, phase: str, payload: dict[str, Any]) -> None:
        """Record a job event; one the job store cannot take is dropped (the first one logged)."""
        assert self.store is not None
        try:
            self.store.add_event(run.job_id, phase, payload)
        except STORAGE_ERRORS as exc:
            run.dropped_events += 1
            if run.dropped_events == 1:
                self.log.warning(f"could not record the job's events ({one_line(exc)}); they are dropped while the "
                                 "job store cannot be written", job_id=run.job_id, phase="storage")

    # ---- scheduling

    def _schedule(self) -> None:
        """Admit queued jobs, oldest first, while fewer than ``max_jobs`` run; each admitted job is
        supervised by its own thread, which wakes this one when it ends."""
        assert self.store is not None
        pending: collections.deque[str] = collections.deque()
        while not self._stopping.is_set():
            try:
                item = self._queue.get(timeout=0.2)
                while True:
                    if item:
                        pending.append(item)
                    item = self._queue.get_nowait()
            except queue.Empty:
                pass
            while pending and not self._stopping.is_set():
                with self.lock:
                    if len(self.runs) >= self.max_jobs:
                        break
                job_id = pending.popleft()
                try:
                    self._admit(job_id)
                except Exception as exc:  # never let one job kill the scheduler
                    self._not_started(job_id, exc)

    def _not_started(self, job_id: str, exc: Exception) -> None:
        """A job the scheduler could not start ends failed (its budget released), retried by a settler."""
        if isinstance(exc, STORAGE_ERRORS):
            reason = self._public_storage(exc, "the job's start")
            self.log.warning(f"cannot start the job: {one_line(exc)}", job_id=job_id, phase="storage")
        else:
            reason = "internal error in the daemon"
            self.log.exception("scheduler error", job_id=job_id, phase="scheduler")  # in the except block
        self._background(job_id, lambda: self._settle(job_id, "failed", reason))

    def _admit(self, job_id: str) -> None:
        """queued → running: take a slot and start the job's supervising thread."""
        assert self.store is not None
        with self.lock:
            if self._stopping.is_set():
                return  # stays queued; ends failed at the next start
            rec = self.store.get(job_id)
            if rec is None or not self.store.set_running(job_id):
                return  # cancelled while queued
            run = Run(job_id, rec, self._mp.Event(), self._mp.Queue())
            run.thread = threading.Thread(target=self._run_thread, args=(run,), name=f"job-{job_id[:12]}",
                                          daemon=True)
            self.runs[job_id] = run
            try:
                run.thread.start()
            except BaseException:
                self.runs.pop(job_id, None)
                raise

    # ---- one job

    def _run_thread(self, run: Run) -> None:
        try:
            self._run(run)
        except Exception:  # a bug: the job still ends, its worker does not outlive it
            self.log.exception("internal error supervising the job", job_id=run.job_id, phase="supervisor")
            try:
                if run.process is not None and run.process.pid is not None:
                    self._kill_hard(run.process)
                self._settle(run.job_id, "failed", "internal error in the daemon")
            except Exception:
                self.log.exception("could not end the job", job_id=run.job_id, phase="supervisor")
        finally:
            with self.lock:
                self.runs.pop(run.job_id, None)
                for service in ENDPOINT_SERVICES:
                    self.endpoints.pop(endpoint_key(run.job_id, service), None)
                self.changed.notify_all()
            self._queue.put("")  # a slot is free: wake the scheduler

    def _run(self, run: Run) -> None:
        assert self.store is not None and self.setup is not None
        setup = self.setup
        job_id, rec, up = run.job_id, run.record, self._mp.Queue()
        job_dir = setup.jobs_dir / job_id
        try:
            job_dir.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            self.log.warning(f"cannot create the job's directory: {one_line(exc)}", job_id=job_id, phase="storage")
            run.outcome = ("failed", self._public_storage(exc, "the job's directory"))
            self._finish(run, None)
            up.close()
            run.down.close()
            return
        ctx = ProcessWorkerContext(job_id=job_id, job_toml=rec.job_toml, config=setup.config, identity=setup.identity,
                                   job_dir=job_dir, ledger_path=setup.ledger_path, up=up, down=run.down,
                                   cancel=run.cancel)
        proc = self._mp.Process(target=worker_main, args=(ctx, self.worker_module, self.entry, str(setup.log_path)),
                                name=f"mpc-erm-job-{job_id[:12]}")
        run.process = proc
        self.log.info(f"starting worker ({self.worker_module}.{self.entry}, {self.start_method})", job_id=job_id,
                      phase="running")
        try:
            proc.start()
        except Exception as exc:
            self.log.warning(f"cannot start the worker process: {one_line(exc)}", job_id=job_id, phase="running")
            run.outcome = ("failed", f"INTERNAL: {self.name} could not start the job's worker process; "
                                     f"see {self.name}'s log")
        else:
            self._supervise(run, up)
        self._finish(run, proc.exitcode)
        up.close()
        run.down.close()
        with contextlib.suppress(Exception):
            proc.close()  # its sentinel descriptor: a long-lived daemon must not keep one per job

    def _supervise(self, run: Run, up: Any) -> None:
        proc = run.process
        reported_at: float | None = None
        run.progress_at = tick = time.monotonic()
        while True:
            now = time.monotonic()
            if now - tick > STALL_MARGIN_S:  # this thread did not run (host paused, starved): no silence to judge
                run.progress_at = max(run.progress_at, now)
            tick = now
            try:
                msg = up.get(timeout=0.2)
            except queue.Empty:
                msg = None
            except (EOFError, OSError, ValueError):  # a worker killed mid-message
                msg = None
            if msg is not None:
                run.progress_at, run.heard = time.monotonic(), True
                self._handle(run, msg)
                if run.outcome is not None and reported_at is None:
                    reported_at = time.monotonic()
                continue
            if not proc.is_alive():
                break
            now = time.monotonic()
            if reported_at is not None and now - reported_at > EXIT_GRACE_S:
                self.log.warning("worker reported but did not exit; terminating it", job_id=run.job_id, phase="exit")
                self._kill(proc)
            with self.lock:
                cancel_at = run.cancel_at
            if cancel_at is not None and now - cancel_at > self.cancel_grace_s:
                self.log.warning("worker did not stop in time; terminating it", job_id=run.job_id, phase="cancelling")
                self._kill(proc)
            elif reported_at is None and cancel_at is None:
                silent = now - run.progress_at
                if silent > self.peer_timeout_s + STALL_MARGIN_S + (0.0 if run.heard else START_GRACE_S):
                    self._stalled(run, silent)
        proc.join()
        while True:  # what the worker sent just before it exited
            try:
                self._handle(run, up.get(timeout=0.05))
            except (queue.Empty, EOFError, OSError, ValueError):
                break
        for t in run.threads:
            t.join(timeout=1.0)

    def _stalled(self, run: Run, silent: float) -> None:
        """Nothing came from the worker (not even a heartbeat) for ``silent`` seconds: it is stopped
        or frozen. Kill it and end the job failed, naming the wait and its limit."""
        reason = PublicError("STALLED", f"the worker of job {run.job_id} at {self.name} made no progress for "
                                        f"{silent:.0f} s (limit {self.peer_timeout_s:g} s: peer_timeout_s); "
                                        f"{self.name} killed it").reason
        if self.fail(run, reason, phase="stalled", detail=f" (pid {run.process.pid}: SIGKILL)"):
            self._kill_hard(run.process)

    @staticmethod
    def _kill(proc: Any) -> None:
        proc.terminate()
        proc.join(3.0)
        if proc.is_alive():
            Supervisor._kill_hard(proc)

    @staticmethod
    def _kill_hard(proc: Any) -> None:
        """SIGKILL the worker and every process it started (SIGKILL also ends a stopped process,
        which SIGTERM does not). Not its process group: a forked worker shares its daemon's."""
        pids = [proc.pid, *_descendants(proc.pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        proc.join(5.0)

    def _handle(self, run: Run, msg: Any) -> None:
        assert self.store is not None
        kind = msg[0]
        if kind == "heartbeat":
            return  # progress only (the caller noted the time)
        if kind == "event":
            event = msg[1] if isinstance(msg[1], dict) else {"message": str(msg[1])}
            phase = str(event.get("phase") or "progress")[:64]
            self._event(run, phase, event)
            extra = {k: event[k] for k in ("round", "rounds") if k in event}
            text = str(event.get("message") or "")[:500]
            if not text and "round" in event:
                text = f"round {event['round']}/{event.get('rounds', '?')}"
            self.log.info(text or phase, job_id=run.job_id, phase=phase, **extra)
        elif kind == "endpoint":
            service = str(msg[2]) if len(msg) > 2 else ""
            if service not in ENDPOINT_SERVICES:
                raise ValueError(f"endpoint service {service!r}")
            with self.lock:
                self.endpoints[endpoint_key(run.job_id, service)] = str(msg[1])
                self.changed.notify_all()
            self.log.info(f"worker {service or 'transport'} published", job_id=run.job_id, phase="endpoint",
                          address=msg[1])
        elif kind == "lookup":
            _, rid, member, timeout_s = msg
            t = threading.Thread(target=self._answer_lookup, args=(run, rid, str(member), float(timeout_s)),
                                 name=f"lookup-{member}", daemon=True)
            run.threads.append(t)
            t.start()
        elif kind in ("done", "failed", "cancelled"):
            run.outcome = (kind, msg[1])

    def _answer_lookup(self, run: Run, rid: int, member: str, timeout_s: float) -> None:
        assert self.lookup is not None
        try:
            answer: tuple[int, str, str] = (rid, "ok", self.lookup(run, member, timeout_s))
        except TimeoutError as exc:
            answer = (rid, "timeout", str(exc))
        except Exception as exc:
            answer = (rid, "error", one_line(exc))
        self.log.info(f"endpoint look-up of {member}: {answer[1]}", job_id=run.job_id, phase="lookup", member=member)
        with contextlib.suppress(Exception):
            run.down.put(answer)

    def _finish(self, run: Run, exitcode: int | None) -> None:
        assert self.store is not None
        kind, value = run.outcome or ("crashed", None)
        summary = None
        if kind == "done":
            status, reason, summary = "succeeded", None, value
        elif run.cancel_at is not None:
            status, reason = run.end_status, run.cancel_reason or "cancelled"
        elif kind == "cancelled":
            status, reason = "cancelled", str(value)
        elif kind == "failed":
            status, reason = "failed", str(value)
        else:
            status, reason = "failed", f"the worker process exited (code {exitcode}) without reporting a result"
        if status != "succeeded":
            self._hide_partial_results(run.job_id)
        reason = self._settle(run.job_id, status, reason, summary)
        dropped = f" ({run.dropped_events} event(s) could not be recorded)" if run.dropped_events else ""
        self.log.info(f"job {status}" + (f": {reason}" if reason else "") + dropped, job_id=run.job_id, phase=status,
                      status=status)


    def _hide_partial_results(self, job_id: str) -> None:
        """A job that did not succeed serves no result. A worker killed after writing some result
        files but before their manifest (the worker's last write) leaves them behind: they move to
        ``.incomplete/`` in the job's directory (kept for this party, never served: dot names are
        not results). A job whose manifest is complete keeps its files (the restart rule)."""
        if self.setup is None:
            return
        root = self.setup.jobs_dir / job_id
        if not root.is_dir() or read_result_manifest(root) is not None:
            return
        files = result_files(root)
        if not files:
            return
        hidden = root / ".incomplete"
        try:
            hidden.mkdir(mode=0o700, exist_ok=True)
            for rel, path in files:
                target = hidden / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
        except OSError as exc:
            self.log.warning(f"could not set aside the partial result files of a failed job: {exc.strerror or exc}",
                             job_id=job_id)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, theirs, ...), from /proc; [] where there is none."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out
