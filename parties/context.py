"""The contract between the party daemon and a job's worker process, and the worker's side of it.

Why a separate process per job: CrypTen keeps global state (one MPC session per process), and
a crashed or cancelled job must not take the daemon down. The daemon (``parties.daemon``)
validates, reserves budget and starts the worker (``parties.supervision``); the worker
(``parties.worker``) runs the MPC. They talk only through :class:`WorkerContext`, implemented
here over multiprocessing queues (:class:`ProcessWorkerContext`, run by :func:`worker_main` in the
worker process), so the worker can be tested with an in-process implementation.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from mpc_erm.jobs.jobfile import JobFile
from mpc_erm.mpc.pki import Identity

from .config import DaemonConfig, split_host_port
from .logs import JsonFormatter, one_line

__all__ = ["HEARTBEAT_S", "JobCancelled", "ProcessWorkerContext", "WorkerContext", "worker_main"]

# The worker process tells its daemon it is alive this often (a thread of its own, whatever the job
# does: an offline noise pool, a local solve, CrypTen's start-up); a stopped or frozen process sends
# nothing, and its daemon ends the job once nothing came for peer_timeout_s (parties.supervision).
HEARTBEAT_S = 2.0


class JobCancelled(RuntimeError):
    """Raised inside the worker when the daemon was asked to cancel the job."""


class WorkerContext(Protocol):
    """What a worker receives. All methods are safe to call from the worker process."""

    job_id: str
    job: JobFile
    config: DaemonConfig  # this member's daemon config (a party's, or the dealer's)
    identity: Identity  # this member's TLS identity (certificate, key, CA)
    job_dir: Path  # state_dir/jobs/<job_id>: results go here (model, report, metrics, plot)
    ledger_path: Path | None  # the party's budget ledger (None in the dealer)

    def use_job(self, job: JobFile) -> None:
        """Run ``job`` (the same file, with what this party's schema fills in) from now on."""

    def emit(self, event: dict[str, Any]) -> None:
        """Progress for ``job watch``: {"phase": str, "message": str, "round": int, "rounds": int,
        "epsilon_spent": float, ...} (JSON-serialisable; never data, shares, noise or keys)."""

    def publish_endpoint(self, address: str, service: str = "") -> None:
        """Tell the daemon where this worker's share transport ("") or owner intake ("owners")
        listens ("host:port")."""

    def lookup_endpoint(self, member: str, timeout_s: float) -> str:
        """The transport address of ``member``'s worker for this job, asked of that member's daemon
        over mTLS; blocks until it is published or raises TimeoutError naming the member."""

    def cancelled(self) -> bool:
        """True once a cancel request for this job reached the daemon."""


class ProcessWorkerContext:
    """:class:`WorkerContext` for a worker in its own process, over multiprocessing
    queues: events, the published endpoint and endpoint look-ups go up to the daemon, look-up
    answers come down, cancellation is an Event (or the daemon process having gone away).

    Besides the contract's attributes it carries ``job_toml`` (the submitted text; ``job`` is parsed
    from it on first use).

    ``_daemon_pid`` is, in the worker, its parent while the daemon lives: the daemon itself
    (spawn) or the daemon's fork server (:func:`worker_main` sets it); a worker whose parent changed
    has lost its daemon and counts as cancelled. The fork server does *not* exit with a SIGKILLed
    daemon while a worker lives (each forked child holds the server's "alive" pipe), so the worker
    also watches the daemon process itself (``_daemon``: pid and /proc start time, so a reused pid
    does not pass for it).

    In the worker, :meth:`start_heartbeat` sends ``("heartbeat",)`` up every :data:`HEARTBEAT_S`
    from a thread until the worker reports its result: the daemon supervises the worker's
    progress, not only its existence."""

    def __init__(self, *, job_id: str, job_toml: str, config: DaemonConfig, identity: Identity,
                 job_dir: Path, ledger_path: Path | None, up: Any, down: Any, cancel: Any) -> None:
        self.job_id = job_id
        self.job_toml = job_toml
        self.config = config
        self.identity = identity
        self.job_dir = job_dir
        self.ledger_path = ledger_path
        self._up, self._down, self._cancel = up, down, cancel
        self._daemon_pid = os.getpid()
        self._daemon = (os.getpid(), _start_time(os.getpid()))
        self._job: JobFile | None = None
        self._lock = threading.Lock()
        self._next_request = 0
        self.phase: str | None = None  # the last phase the worker emitted: named in a public failure reason

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_job"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def use_job(self, job: JobFile) -> None:
        """The job as this worker runs it: the parsed file with what this party's public schema
        fills in (a softmax's class count, :meth:`JobFile.with_schema_classes`); same digest."""
        assert job.spec_digest() == self.job.spec_digest()
        self._job = job

    @property
    def job(self) -> JobFile:
        if self._job is None:
            from mpc_erm.jobs.jobfile import parse_job_file

            self._job = parse_job_file(self.job_toml, source="job.toml")
        return self._job

    def emit(self, event: dict[str, Any]) -> None:
        if isinstance(event.get("phase"), str):
            self.phase = event["phase"][:64]
        self._up.put(("event", json.loads(json.dumps(dict(event), default=str))))

    def publish_endpoint(self, address: str, service: str = "") -> None:
        split_host_port(address)  # a bad address fails here, in the worker, not at the peers
        self._up.put(("endpoint", address, service))

    def lookup_endpoint(self, member: str, timeout_s: float) -> str:
        """Raises TimeoutError naming the member if it is not published in time; RuntimeError if
        the member's daemon refuses for good (job unknown there after it ended, not a member, ...).
        Both are :class:`parties.public_errors.PublicError`: the daemon's text (which may quote the
        member's own reason) is their detail, for this party's log; their public reason names the
        member and, where the job ended there, only that member's code."""
        from .public_errors import peer_lookup_failure, peer_lookup_timeout

        with self._lock:  # one look-up at a time: the answers share one queue
            self._next_request += 1
            rid = self._next_request
            self._up.put(("lookup", rid, member, float(timeout_s)))
            deadline = time.monotonic() + float(timeout_s) + 10.0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise peer_lookup_timeout(member, self.job_id, timeout_s, "no answer from the daemon")
                try:
                    got, kind, value = self._down.get(timeout=min(left, 0.5))
                except queue.Empty:
                    if self.cancelled():
                        raise JobCancelled("cancelled while looking up a peer's endpoint") from None
                    continue
                if got != rid:
                    continue  # the answer to an abandoned request
                if kind == "ok":
                    return str(value)
                if kind == "timeout":
                    raise peer_lookup_timeout(member, self.job_id, timeout_s, str(value))
                raise peer_lookup_failure(member, self.job_id, str(value))

    def cancelled(self) -> bool:
        return (self._cancel.is_set() or os.getppid() != self._daemon_pid
                or _start_time(self._daemon[0]) != self._daemon[1])

    def start_heartbeat(self, every_s: float = HEARTBEAT_S) -> threading.Event:
        """In the worker: send a heartbeat now and every ``every_s`` from a daemon thread; set the
        returned event to stop it (before the worker's last message)."""
        stop = threading.Event()

        def beat() -> None:
            while True:
                try:
                    self._up.put(("heartbeat",))
                except Exception:  # the queue is closed: the worker is reporting or exiting
                    return
                if stop.wait(every_s):
                    return

        threading.Thread(target=beat, name="heartbeat", daemon=True).start()
        return stop


def _start_time(pid: int) -> str | None:
    """The process's start time from /proc (Linux): with the pid, an identity pid reuse cannot fake.
    None once it is gone (a zombie counts as gone); without /proc, "" while signal 0 reaches it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def worker_main(ctx: ProcessWorkerContext, module: str, function: str, log_path: str) -> None:
    """The worker process: run ``module.function(ctx)`` and report its summary or failure."""
    ctx._daemon_pid = os.getppid()  # the daemon (spawn) or its fork server; see ProcessWorkerContext
    from mpc_erm.mpc.memory import limit_malloc_arenas

    limit_malloc_arenas()  # before the job's gRPC threads: share buffers freed across threads (mpc_erm.mpc.memory)
    heartbeat = ctx.start_heartbeat()
    handler = logging.FileHandler(log_path, encoding="utf-8")
    stderr = logging.StreamHandler(sys.stderr)
    job_filter = _JobFilter(ctx.job_id)
    for h in (handler, stderr):
        h.setFormatter(JsonFormatter())
        h.addFilter(job_filter)
    root = logging.getLogger()
    root.handlers[:] = [handler, stderr]
    root.setLevel(logging.WARNING)
    logging.getLogger("parties").setLevel(logging.INFO)
    log = logging.getLogger("parties.worker.process")
    log.info("worker process started", extra={"phase": "worker", "pid": os.getpid()})
    try:
        entry = getattr(importlib.import_module(module), function)
        summary = entry(ctx)
        msg: tuple[str, Any] = ("done", json.loads(json.dumps(summary or {}, default=str)))
    except JobCancelled as exc:
        msg = ("cancelled", one_line(exc))
    except BaseException as exc:
        # The daemon records (and serves, and tells the other members) only a code and a public
        # reason; the detail and the traceback stay in this party's own log (parties.public_errors).
        code, reason = _public_failure(ctx, exc)
        log.error("job failed (%s): %s", code, one_line(exc), exc_info=True, extra={"phase": "failed", "code": code})
        msg = ("failed", reason)
    heartbeat.set()
    try:
        ctx._up.put(msg)
        ctx._up.close()
        ctx._up.join_thread()
    finally:
        for h in root.handlers:
            with contextlib.suppress(Exception):  # a full disk must not keep the process from its _exit
                h.flush()
        os._exit(0)  # whatever threads the job left behind (gRPC servers, pools) must not keep it alive


def _public_failure(ctx: ProcessWorkerContext, exc: BaseException) -> tuple[str, str]:
    """(code, public reason) of a worker's failure: what may leave the party."""
    from .public_errors import public_failure

    name = ctx.identity.name
    try:
        jt = ctx.job.job
        dataset, members = jt.dataset, [*jt.parties, *([jt.dealer] if jt.dealer else [])]
    except Exception:  # the job text did not parse: nothing more to name
        dataset, members = None, []
    try:
        return public_failure(exc, member=name, job_id=ctx.job_id, dataset=dataset, phase=ctx.phase,
                              members=members)
    except Exception:  # never let the classification hide the failure
        return "INTERNAL", f"INTERNAL: internal error at {name} ({type(exc).__name__}); see {name}'s log"


class _JobFilter(logging.Filter):
    def __init__(self, job_id: str) -> None:
        super().__init__()
        self.job_id = job_id

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "job_id", None) is None:
            record.job_id = self.job_id
        if getattr(record, "phase", None) is None:
            record.phase = "worker"
        return True
