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
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpc_erm.mpc.pki import Identity

from .config import DaemonConfig
from .context import ProcessWorkerContext, worker_main
from .jobs import JobRecord, JobStore
from .logs import DaemonLog, one_line

__all__ = ["CANCEL_GRACE_S", "EXIT_GRACE_S", "STOP_REASON", "WORKER_PRELOAD", "WORKER_START_ENV", "Run",
           "Supervisor", "WorkerSetup"]

CANCEL_GRACE_S = 10.0
EXIT_GRACE_S = 10.0  # a worker that reported its result but does not exit is terminated after this
WORKER_START_ENV = "MPC_ERM_WORKER_START"  # "forkserver" (default) or "spawn"
# Imported once by the fork server (what a party or dealer worker needs), not by each job.
WORKER_PRELOAD = ("parties.worker", "torch", "numpy", "mpc_erm.jobs.jobfile", "mpc_erm.data", "mpc_erm.protocols",
                  "mpc_erm.mpc.communicator", "mpc_erm.mpc.aggregator", "mpc_erm.mpc.dealer", "mpc_erm.mpc.noise",
                  "mpc_erm.mpc.rss_provider", "mpc_erm.privacy", "safetensors.torch", "matplotlib.figure",
                  "matplotlib.backends.backend_agg")
STOP_REASON = "interrupted: the daemon was stopped"


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
    member, timeout_s) -> address`` answers a worker's endpoint look-up (``prepare`` is given it)."""

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

    # ---- life cycle

    def prepare(self, store: JobStore, setup: WorkerSetup, lookup: Callable[[Run, str, float], str]) -> None:
        """Take what the jobs need, and start the fork server now, so that it imports torch and
        CrypTen while the daemon waits for its first job, not during it."""
        self.store, self.setup, self.lookup = store, setup, lookup
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

    # ---- requests

    def enqueue(self, job_id: str) -> None:
        self._queue.put(job_id)

    def running(self) -> int:
        with self.lock:
            return len(self.runs)

    def cancel(self, job_id: str, reason: str) -> JobRecord | None:
        """Cancel a queued or running job (a finished one is left as it is); None if unknown."""
        assert self.store is not None
        with self.lock:
            rec = self.store.get(job_id)
            if rec is None:
                return None
            if rec.terminal:
                return rec
            self.store.request_cancel(job_id)
            run = self.runs.get(job_id)
            if run is not None:
                if run.cancel_at is None:
                    run.cancel_at, run.cancel_reason = time.monotonic(), reason
                    run.cancel.set()
                    self.log.info(f"cancel requested; the worker has {self.cancel_grace_s:g} s to stop",
                                  job_id=job_id, phase="cancelling")
                    self.store.add_event(job_id, "cancelling", {"message": reason})
                    self.changed.notify_all()
                return self.store.get(job_id)
            if self.store.finish(job_id, "cancelled", reason, only_from=("queued",)):
                self.release(job_id, reason)
                self.log.info("queued job cancelled", job_id=job_id, phase="cancelled")
        return self.store.get(job_id)

    def fail(self, run: Run, reason: str, *, phase: str) -> None:
        """End a running job as failed (its worker is cancelled; budget settled as for any failure)."""
        assert self.store is not None
        with self.lock:
            if run.cancel_at is not None:
                return
            run.cancel_at, run.cancel_reason, run.end_status = time.monotonic(), reason, "failed"
            run.cancel.set()
            self.changed.notify_all()
        self.log.warning(reason, job_id=run.job_id, phase=phase)
        self.store.add_event(run.job_id, "failing", {"message": reason})

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
                except Exception:  # never let one job kill the scheduler
                    self._internal_error(job_id)

    def _internal_error(self, job_id: str) -> None:
        assert self.store is not None
        self.log.exception("scheduler error", job_id=job_id, phase="scheduler")
        with contextlib.suppress(Exception):
            note = self.release(job_id, "internal error in the daemon")
            self.store.finish(job_id, "failed", "internal error in the daemon" + (f"; {note}" if note else ""))

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
            self.runs[job_id] = run
            run.thread = threading.Thread(target=self._run_thread, args=(run,), name=f"job-{job_id[:12]}",
                                          daemon=True)
            run.thread.start()

    # ---- one job

    def _run_thread(self, run: Run) -> None:
        try:
            self._run(run)
        except Exception:
            self._internal_error(run.job_id)
        finally:
            with self.lock:
                self.runs.pop(run.job_id, None)
                self.endpoints.pop(run.job_id, None)
                self.changed.notify_all()
            self._queue.put("")  # a slot is free: wake the scheduler

    def _run(self, run: Run) -> None:
        assert self.store is not None and self.setup is not None
        setup = self.setup
        job_id, rec, up = run.job_id, run.record, self._mp.Queue()
        job_dir = setup.jobs_dir / job_id
        job_dir.mkdir(mode=0o700, exist_ok=True)
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
        while True:
            try:
                msg = up.get(timeout=0.2)
            except queue.Empty:
                msg = None
            except (EOFError, OSError, ValueError):  # a worker killed mid-message
                msg = None
            if msg is not None:
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
                overdue = run.cancel_at is not None and now - run.cancel_at > self.cancel_grace_s
            if overdue:
                self.log.warning("worker did not stop in time; terminating it", job_id=run.job_id, phase="cancelling")
                self._kill(proc)
        proc.join()
        while True:  # what the worker sent just before it exited
            try:
                self._handle(run, up.get(timeout=0.05))
            except (queue.Empty, EOFError, OSError, ValueError):
                break
        for t in run.threads:
            t.join(timeout=1.0)

    @staticmethod
    def _kill(proc: Any) -> None:
        proc.terminate()
        proc.join(3.0)
        if proc.is_alive():
            proc.kill()
            proc.join(3.0)

    def _handle(self, run: Run, msg: Any) -> None:
        assert self.store is not None
        kind = msg[0]
        if kind == "event":
            event = msg[1] if isinstance(msg[1], dict) else {"message": str(msg[1])}
            phase = str(event.get("phase") or "progress")[:64]
            self.store.add_event(run.job_id, phase, event)
            extra = {k: event[k] for k in ("round", "rounds") if k in event}
            text = str(event.get("message") or "")[:500]
            if not text and "round" in event:
                text = f"round {event['round']}/{event.get('rounds', '?')}"
            self.log.info(text or phase, job_id=run.job_id, phase=phase, **extra)
        elif kind == "endpoint":
            with self.lock:
                self.endpoints[run.job_id] = str(msg[1])
                self.changed.notify_all()
            self.log.info("worker transport published", job_id=run.job_id, phase="endpoint", address=msg[1])
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
        if status == "succeeded":
            self.commit(run.job_id)
        else:
            note = self.release(run.job_id, reason or status)
            reason = f"{reason}; {note}" if note else reason
        self.store.finish(run.job_id, status, reason, summary)
        self.log.info(f"job {status}" + (f": {reason}" if reason else ""), job_id=run.job_id, phase=status,
                      status=status)
