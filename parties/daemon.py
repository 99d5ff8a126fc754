"""The party (or dealer) daemon: job control over gRPC + mTLS, one worker process per job.

What happens to a job, in order (``SubmitJob``):

1. the caller is a coordinator named in ``policy.allowed_coordinators`` (``tls.Authorizer``, before
   the servicer runs; anyone else gets PERMISSION_DENIED);
2. the job TOML is validated (``mpc_erm.jobs.jobfile``; party and dealer names must be this daemon's
   peers or itself) — INVALID_ARGUMENT naming the field;
3. this daemon must be one of the job's parties (a dealer: the job's dealer) — FAILED_PRECONDITION;
4. the policy: method, ε per job, iterations — PERMISSION_DENIED naming the field;
5. the data set must be offered here, and the job's full (ε, δ) is reserved in the ledger, in one
   transaction, before anything else happens — FAILED_PRECONDITION with the ledger's reason;
6. the job is stored (``parties.jobs``) and queued. Up to ``max_concurrent_jobs`` (config,
   default 4) jobs run at once, each in its own worker process (CrypTen keeps global state, one
   MPC session per process) running ``parties.worker.run_party_job`` (the dealer:
   ``run_dealer_job``) with a :class:`ProcessWorkerContext`; more wait queued, oldest first.

Concurrency, and why: a member starts a job as soon as it admits it, and a job's worker then waits
(up to the config's ``peer_timeout_s``) for every other member's worker to publish its endpoint. Two
coordinators submitting at the same instant can reach two daemons in opposite orders; with one
job at a time each daemon then ran the job the other had queued, and both failed after the
120 s look-up wait. With several slots both simply run. At the bound the same cross-queueing can
still deadlock: daemon A's slots all hold jobs queued at B while B's slots all hold jobs queued
at A. ``GetEndpoint`` for a job that waits for a slot answers at once (NOT_FOUND with
``mpc-erm-admission`` trailing metadata: the ids of the jobs holding this daemon's slots), and
the asking daemon checks for exactly that cycle; if found, the cycle's job with the largest id
(the same choice on both sides) fails at once with a reason naming another job of the cycle,
which frees its slot so the rest proceed (if the daemon running that job does not act within
``ADMISSION_GRACE_S``, e.g. its job waits on a third member, the asking side fails its own
largest). Nothing was revealed (no member can have all endpoints of a job still
queued at one of them), so its budget is released and it can be resubmitted. A job that merely
waits for a busy peer (no cycle) keeps waiting, up to the worker's look-up limit; so does a
cycle through three or more daemons with no two-daemon cycle in it (not detected). With one
coordinator, or fewer simultaneous jobs than the bound, every daemon admits in the same order and
nothing of this arises (tests/reliability/test_concurrency.py).

Worker start-up: workers are forked from a ``forkserver`` that has already imported torch,
CrypTen and the worker's modules (``WORKER_PRELOAD``), so a job does not pay ~10-20 s of imports.
The fork server only imports modules; it never initialises CrypTen or runs a job, so every
worker starts from the same pristine module state and no MPC state is shared between jobs
(secrets come from ``os.urandom``/``secrets`` in the child). ``MPC_ERM_WORKER_START=spawn``
restores one fresh interpreter per job.

Budget: the worker marks the reservation revealed right before its first reveal. A job that
succeeds, or fails after that mark, keeps its budget spent (committed); one that ends before it
(failure, cancel, daemon restart) gets its reservation released. On start-up every job left queued
or running ends ``failed`` ("interrupted by a daemon restart") and ``Ledger.recover`` settles the
budget, so a job is never left half-released.
Before any of that, a party daemon checks its ledger against its hash-chained audit log
(:mod:`parties.ledger_check`) and refuses to start, with one line naming the file, when the ledger
is missing, unreadable or holds less than the log charged: a lost ledger must not become a fresh
budget (the repair is ``mpc-erm budget rebuild``, never automatic).

Logs are JSON lines (time, level, job_id, phase, message) to stderr and ``state_dir/daemon.log``;
they carry ids, phases, counts and reasons, never data, shares, noise or keys.

Failure reasons: a job's ``reason`` leaves the party (``GetStatus``/``Watch``/``ListJobs``/
``GetResult`` to the coordinator), so a worker's failure is recorded as ``"<CODE>: <public reason>"``
(:mod:`parties.public_errors`: data set id, member names, phase, job-file field names — never a file
path, a value or a column name); the exception's text and traceback go only to this party's log.
``GetEndpoint`` tells another member (whose worker waits for this one's transport, and which records
what it hears in its own job table and log) only the job's status and that code.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import hashlib
import importlib
import json
import logging
import multiprocessing
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from mpc_erm.mpc import pki, tls
from mpc_erm.mpc._proto import party_pb2 as pb
from mpc_erm.mpc._proto import party_pb2_grpc as pb_grpc
from mpc_erm.privacy.plan import PlanError
from mpc_erm.protocols.common import plan_job

from .config import DealerConfig, PartyConfig, split_host_port
from .jobs import LIVE, JobExists, JobRecord, JobStore, content_digest, read_result_manifest, result_files
from .ledger import (
    AdjacencyMismatch,
    AlreadyRevealed,
    BudgetExceeded,
    JobConflict,
    Ledger,
    LedgerError,
    UnknownDataset,
)
from .public_errors import code_of

if TYPE_CHECKING:
    from mpc_erm.jobs.jobfile import JobFile

__all__ = [
    "CANCEL_GRACE_S",
    "RESTART_REASON",
    "SERVICE",
    "DaemonConfig",
    "JsonFormatter",
    "PartyDaemon",
    "ProcessWorkerContext",
    "control_policy",
    "load_daemon_identity",
]

DaemonConfig = PartyConfig | DealerConfig
SERVICE = "/mpc_erm.v1.PartyControl"
COORDINATOR_METHODS = ("SubmitJob", "GetStatus", "Watch", "Cancel", "ListJobs", "GetResult")
MAX_MESSAGE_BYTES = 64 << 20
MAX_JOB_TOML_BYTES = 1 << 20
RESULT_CHUNK_BYTES = 1 << 20
CANCEL_GRACE_S = 10.0
EXIT_GRACE_S = 10.0  # a worker that reported its result but does not exit is terminated after this
MAX_ENDPOINT_WAIT_S = 30.0
ADMISSION_KEY = "mpc-erm-admission"  # GetEndpoint trailing metadata: the job waits for a slot here
ADMISSION_POLL_S = 1.0  # how often a job asks again while a peer has it queued behind a full daemon
ADMISSION_GRACE_S = 30.0  # a deadlock whose loser runs at the peer: how long to let the peer break it
WORKER_START_ENV = "MPC_ERM_WORKER_START"  # "forkserver" (default) or "spawn"
# Imported once by the fork server (what a party or dealer worker needs), not by each job.
WORKER_PRELOAD = ("parties.worker", "torch", "numpy", "mpc_erm.jobs.jobfile", "mpc_erm.data", "mpc_erm.protocols",
                  "mpc_erm.mpc.communicator", "mpc_erm.mpc.aggregator", "mpc_erm.mpc.dealer", "mpc_erm.mpc.noise",
                  "mpc_erm.mpc.rss_provider", "mpc_erm.privacy", "safetensors.torch", "matplotlib.figure",
                  "matplotlib.backends.backend_agg")
RESTART_REASON = "interrupted by a daemon restart"
STOP_REASON = "interrupted: the daemon was stopped"
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
LOG_FILE = "daemon.log"
CONTROL_THREADS = 32  # control-plane RPCs served at once (Watch streams and endpoint long-polls hold one each)


# --------------------------------------------------------------------------- logging


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, job_id, phase, message (+ a few extras)."""

    EXTRAS = ("member", "caller", "status", "code", "round", "rounds", "address", "pid")

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "job_id": getattr(record, "job_id", None),
            "phase": getattr(record, "phase", None),
            "message": record.getMessage(),
        }
        for key in self.EXTRAS:
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def _handlers(state_dir: Path, to_stderr: bool) -> list[logging.Handler]:
    handlers: list[logging.Handler] = [logging.FileHandler(state_dir / LOG_FILE, encoding="utf-8")]
    if to_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    for h in handlers:
        h.setFormatter(JsonFormatter())
    return handlers


def _one_line(exc: BaseException) -> str:
    msg = " ".join(str(exc).split()) or type(exc).__name__
    return msg if len(msg) <= 2000 else msg[:1997] + "..."


# --------------------------------------------------------------------------- identity and policy


def prestarted_thread_pool(workers: int, prefix: str) -> ThreadPoolExecutor:
    """A thread pool whose ``workers`` threads all exist before it is returned.

    ``ThreadPoolExecutor`` starts threads lazily and never retires them, so a daemon's thread count
    would step up to its busiest moment and stay there, and a real leak would hide in those steps.
    Started up front, the count is constant for the daemon's life (the soak test relies on it).
    """
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix)
    barrier = threading.Barrier(workers + 1)
    for _ in range(workers):  # none is idle until all have started: each submit starts a new thread
        pool.submit(barrier.wait)
    barrier.wait()
    return pool


def load_daemon_identity(cfg: DaemonConfig) -> pki.Identity:
    """The daemon's TLS identity from ``[identity]`` (``IdentityConfig.load``) in the daemon's role."""
    return cfg.identity.load("dealer" if isinstance(cfg, DealerConfig) else "party")  # type: ignore[no-any-return]


def control_policy(cfg: DaemonConfig) -> tls.Policy:
    """Who may call what: the coordinator methods only the allowed coordinators; GetEndpoint any
    party or dealer (job membership is checked per request); Health anyone of this CA."""
    coordinators = [("coordinator", n) for n in cfg.policy.allowed_coordinators]
    policy: dict[str, list[tuple[str, str]]] = {f"{SERVICE}/{m}": coordinators for m in COORDINATOR_METHODS}
    policy[f"{SERVICE}/GetEndpoint"] = [("party", tls.WILDCARD), ("dealer", tls.WILDCARD)]
    policy[f"{SERVICE}/Health"] = [(tls.WILDCARD, tls.WILDCARD)]
    return policy


def grpc_options() -> list[tuple[str, Any]]:
    return [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


def _members(rec: JobRecord) -> list[tuple[str, str]]:
    return [(p, "party") for p in rec.parties] + ([(rec.dealer, "dealer")] if rec.dealer else [])


# --------------------------------------------------------------------------- the worker's context


class ProcessWorkerContext:
    """:class:`parties.context.WorkerContext` for a worker in its own process, over multiprocessing
    queues: events, the published endpoint and endpoint look-ups go up to the daemon, look-up
    answers come down, cancellation is an Event (or the daemon process having gone away).

    Besides the contract's attributes it carries ``job_toml`` (the submitted text; ``job`` is parsed
    from it on first use, so a worker that never needs the spec does not import torch).

    ``_daemon_pid`` is, in the worker, its parent while the daemon lives: the daemon itself
    (spawn) or the daemon's fork server (``_worker_main`` sets it); a worker whose parent changed
    has lost its daemon and counts as cancelled. The fork server does *not* exit with a SIGKILLed
    daemon while a worker lives (each forked child holds the server's "alive" pipe), so the worker
    also watches the daemon process itself (``_daemon``: pid and /proc start time, so a reused pid
    does not pass for it)."""

    def __init__(self, *, job_id: str, job_toml: str, config: DaemonConfig, identity: pki.Identity,
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

    def publish_endpoint(self, address: str) -> None:
        split_host_port(address)  # a bad address fails here, in the worker, not at the peers
        self._up.put(("endpoint", address))

    def lookup_endpoint(self, member: str, timeout_s: float) -> str:
        """Raises TimeoutError naming the member if it is not published in time; RuntimeError if
        the member's daemon refuses for good (job unknown there after it ended, not a member, ...).
        Both are :class:`parties.public_errors.PublicError`: the daemon's text (which may quote the
        member's own reason) is their detail, for this party's log; their public reason names the
        member and, where the job ended there, only that member's code."""
        from .context import JobCancelled
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


def _worker_main(ctx: ProcessWorkerContext, module: str, function: str, log_path: str) -> None:
    """The worker process: run ``module.function(ctx)`` and report its summary or failure."""
    ctx._daemon_pid = os.getppid()  # the daemon (spawn) or its fork server; see ProcessWorkerContext
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
    from .context import JobCancelled

    try:
        entry = getattr(importlib.import_module(module), function)
        summary = entry(ctx)
        msg: tuple[str, Any] = ("done", json.loads(json.dumps(summary or {}, default=str)))
    except JobCancelled as exc:
        msg = ("cancelled", _one_line(exc))
    except BaseException as exc:
        # The daemon records (and serves, and tells the other members) only a code and a public
        # reason; the detail and the traceback stay in this party's own log (parties.public_errors).
        code, reason = _public_failure(ctx, exc)
        log.error("job failed (%s): %s", code, _one_line(exc), exc_info=True, extra={"phase": "failed", "code": code})
        msg = ("failed", reason)
    try:
        ctx._up.put(msg)
        ctx._up.close()
        ctx._up.join_thread()
    finally:
        for h in root.handlers:
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


# --------------------------------------------------------------------------- the daemon


@dataclass
class _Run:
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


def _admission_of(exc: grpc.RpcError) -> list[str] | None:
    """The job ids a peer's full slots hold, if its NOT_FOUND says the job is queued there."""
    try:
        meta = exc.trailing_metadata() or ()  # type: ignore[attr-defined]
    except Exception:
        return None
    for key, value in meta:
        if key == ADMISSION_KEY:
            text = value.decode() if isinstance(value, bytes) else str(value)
            return [j for j in text.split(",") if JOB_ID_RE.fullmatch(j)]
    return None


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class PartyDaemon:
    """A party daemon (``PartyConfig``) or the dealer daemon (``DealerConfig``).

    ``start()`` binds ``config.listen`` (port 0: any free port; see :attr:`port` and
    :attr:`address`), settles what a previous run left behind and starts serving; ``stop()`` stops
    serving and interrupts the running jobs; ``wait()`` blocks until stopped.
    ``worker_module`` names the module with ``run_party_job``/``run_dealer_job`` (tests swap it).
    ``start_method``: how workers start, "forkserver" or "spawn" (default: $MPC_ERM_WORKER_START,
    else "forkserver").
    """

    def __init__(self, config: DaemonConfig, *, worker_module: str = "parties.worker",
                 cancel_grace_s: float = CANCEL_GRACE_S, log_to_stderr: bool = True,
                 start_method: str | None = None) -> None:
        self.config = config
        self.role = "dealer" if isinstance(config, DealerConfig) else "party"
        self.name = config.identity.name
        self.worker_module = worker_module
        self.cancel_grace_s = cancel_grace_s
        self.log_to_stderr = log_to_stderr
        self.max_jobs = int(getattr(config, "max_concurrent_jobs", 4))
        self.start_method = start_method or os.environ.get(WORKER_START_ENV) or "forkserver"
        if self.start_method not in ("forkserver", "spawn"):
            raise ValueError(f"{WORKER_START_ENV}: must be 'forkserver' or 'spawn', got {self.start_method!r}")
        self.state_dir = Path(config.state_dir)
        self.jobs_dir = self.state_dir / "jobs"
        self.port: int | None = None
        self.address: str | None = None
        self.identity: pki.Identity | None = None
        self.store: JobStore | None = None
        self.ledger: Ledger | None = None
        self.log = logging.getLogger(f"parties.daemon.{self.name}")
        self._lock = threading.RLock()
        self._endpoint_changed = threading.Condition(self._lock)
        self._endpoints: dict[str, str] = {}
        self._queue: queue.Queue[str] = queue.Queue()  # job ids to admit ("" only wakes the scheduler)
        self._runs: dict[str, _Run] = {}  # the admitted jobs, at most max_jobs
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._server: grpc.Server | None = None
        self._authorizer: tls.Authorizer | None = None
        self._scheduler: threading.Thread | None = None
        self._mp: Any = multiprocessing.get_context("spawn")  # replaced in start()
        self._started_at = 0.0

    # ---- life cycle

    def start(self) -> int:
        cfg = self.config
        self.identity = load_daemon_identity(cfg)  # before touching any file: a bad config changes nothing
        revoked = self._read_crl()
        if isinstance(cfg, PartyConfig):
            # before any file is created: a missing or damaged ledger must not become a fresh
            # budget (parties.ledger_check; LedgerDamaged/AuditDamaged say in one line what to do)
            from .ledger_check import check_ledger

            check_ledger(self.state_dir)
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.jobs_dir.mkdir(mode=0o700, exist_ok=True)
        self.log.handlers[:] = _handlers(self.state_dir, self.log_to_stderr)
        self.log.setLevel(logging.INFO)
        self.log.propagate = False
        self.store = JobStore.in_state_dir(self.state_dir)
        if isinstance(cfg, PartyConfig):
            self.ledger = Ledger.for_config(cfg)
        self._recover()
        self._authorizer = tls.Authorizer(
            control_policy(cfg), revoked_serials=revoked,
            rate_limit=tls.RateLimit(cfg.limits.control_calls_per_s, cfg.limits.control_burst),
            field_limits={"*": 1024, "job_toml": MAX_JOB_TOML_BYTES})
        self._server = grpc.server(
            prestarted_thread_pool(CONTROL_THREADS, f"party-{self.name}"),
            interceptors=[self._authorizer],
            options=[*grpc_options(), ("grpc.so_reuseport", 0)],
        )
        pb_grpc.add_PartyControlServicer_to_server(_Servicer(self), self._server)
        port = self._server.add_secure_port(cfg.listen, tls.server_credentials(self.identity))
        if port == 0:
            self._close_state()
            raise OSError(f"listen: cannot bind {cfg.listen}")
        self.port = port
        host, _ = split_host_port(cfg.listen, allow_zero=True)
        host = f"[{host}]" if ":" in host else host
        self.address = cfg.advertise or f"{host}:{port}"
        self._started_at = time.time()
        self._mp = self._worker_context()
        self._server.start()
        self._scheduler = threading.Thread(target=self._schedule, name=f"scheduler-{self.name}", daemon=True)
        self._scheduler.start()
        self._info(f"{self.role} daemon {self.name} listening on port {port} (advertised {self.address})",
                   phase="start", address=self.address)
        return port

    def _read_crl(self) -> frozenset[int]:
        """Serials revoked by the config's CRL (checked against our CA and its validity dates)."""
        crl = self.config.identity.crl
        if crl is None:
            return frozenset()
        assert self.identity is not None
        try:
            return pki.revoked_serials_from_crl(crl.read_bytes(), self.identity.ca_pem)
        except (OSError, ValueError) as exc:
            raise ValueError(f"identity.crl: {exc}") from None

    def reload_crl(self) -> bool:
        """Re-read ``identity.crl`` (``mpc-erm party serve`` calls this on SIGHUP) and refuse the
        newly revoked from the next call on; each new job's transport reads the file itself. A
        list that does not verify (foreign CA, stale, unreadable) is logged and the old one kept:
        an operator's mistake must not silently un-revoke anyone. Returns whether it was applied."""
        try:
            revoked = self._read_crl()
        except ValueError as exc:
            self._warn(f"CRL not reloaded, the previous list stays in force: {exc}", phase="crl")
            return False
        if self._authorizer is None:
            raise RuntimeError("reload_crl: the daemon is not started")
        self._authorizer.set_revoked(serials=revoked)
        self._info(f"CRL reloaded: {len(revoked)} revoked serial(s)", phase="crl")
        return True

    def _worker_context(self) -> Any:
        """The multiprocessing context workers start in. A fork server is started now, so that it
        imports torch and CrypTen while the daemon waits for its first job, not during it."""
        mp = multiprocessing.get_context(self.start_method)
        if self.start_method == "forkserver":
            heavy = WORKER_PRELOAD if self.worker_module == "parties.worker" else ()
            # process-wide: the first daemon of a process chooses (one daemon per process in production)
            mp.set_forkserver_preload(["parties.daemon", self.worker_module, *heavy])
            from multiprocessing import forkserver

            forkserver.ensure_running()
        return mp

    def _recover(self) -> None:
        """Settle what a dead predecessor left: live jobs end failed, their budget released unless
        they revealed; a job that revealed *and* whose worker wrote every result (its manifest
        matches the files) ends succeeded, so it is fetched, not resubmitted and paid twice."""
        assert self.store is not None
        kept: list[Any] = []
        if self.ledger is not None:
            released, kept = self.ledger.recover(RESTART_REASON)
            for r in released:
                self._info("budget reservation released (nothing was revealed)", job_id=r.job_id, phase="recover")
        revealed = {r.job_id for r in kept}
        for rec in self.store.list(statuses=LIVE):
            summary = read_result_manifest(self.jobs_dir / rec.id) if rec.id in revealed else None
            if summary is not None and self.store.finish(rec.id, "succeeded", None, summary):
                self._info("job succeeded: its worker had written every result before the daemon stopped",
                           job_id=rec.id, phase="succeeded", status="succeeded")
            elif self.store.finish(rec.id, "failed", RESTART_REASON):
                self._info(f"job ended: {RESTART_REASON}", job_id=rec.id, phase="failed")
        for r in kept:
            job = self.store.get(r.job_id)
            if self.ledger is not None and (job is None or job.terminal):
                self.ledger.commit(r.job_id)
            self._info("budget kept as spent (the job had revealed)", job_id=r.job_id, phase="recover")

    def stop(self, grace: float = 2.0) -> None:
        """Stop serving, interrupt the running jobs (they end failed; budget settled as for any
        failure); queued jobs stay queued and end failed at the next start."""
        if self._stopping.is_set():
            self._stopped.wait()
            return
        self._stopping.set()
        try:
            if self._server is not None:
                self._server.stop(grace).wait()
            if self._scheduler is not None:
                self._scheduler.join(timeout=5.0)  # admits nothing once stopping is set
            with self._lock:
                runs = list(self._runs.values())
                for run in runs:
                    if run.cancel_at is None:
                        run.cancel_at = time.monotonic() - max(0.0, self.cancel_grace_s - 2.0)  # 2 s to stop
                        run.cancel_reason, run.end_status = STOP_REASON, "failed"
                        run.cancel.set()
                self._endpoint_changed.notify_all()
            deadline = time.monotonic() + self.cancel_grace_s + 30
            for run in runs:
                if run.thread is not None:
                    run.thread.join(timeout=max(0.0, deadline - time.monotonic()))
            self._info(f"{self.role} daemon {self.name} stopped", phase="stop")
        finally:
            self._close_state()
            self._stopped.set()

    def _close_state(self) -> None:
        for h in self.log.handlers:
            h.close()
        if self.store is not None:
            self.store.close()
        if self.ledger is not None:
            self.ledger.close()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def __enter__(self) -> PartyDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- logging

    def _info(self, msg: str, *, job_id: str | None = None, phase: str | None = None, **extra: Any) -> None:
        self.log.info(msg, extra={"job_id": job_id, "phase": phase, **extra})

    def _warn(self, msg: str, *, job_id: str | None = None, phase: str | None = None, **extra: Any) -> None:
        self.log.warning(msg, extra={"job_id": job_id, "phase": phase, **extra})

    # ---- submission

    def submit(self, job_id: str, job_toml: str, caller: str) -> tuple[JobRecord, bool]:
        """Validate, check policy, reserve budget, store and queue; (record, newly queued).
        Raises _Refused with the gRPC status and a one-line reason."""
        from mpc_erm.jobs.jobfile import JobFileError, parse_job_file

        assert self.store is not None
        bad_arg, denied, precondition = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED,
                                         grpc.StatusCode.FAILED_PRECONDITION)
        if self._stopping.is_set():
            raise _Refused(grpc.StatusCode.UNAVAILABLE, "the daemon is stopping")
        if not JOB_ID_RE.fullmatch(job_id):
            raise _Refused(bad_arg, f"job_id: must be 1-64 of [A-Za-z0-9_-] starting alphanumeric, got {job_id!r}")
        if len(job_toml.encode()) > MAX_JOB_TOML_BYTES:
            raise _Refused(bad_arg, f"job_toml: larger than {MAX_JOB_TOML_BYTES} bytes")
        cfg = self.config
        try:
            job = parse_job_file(job_toml, source="job.toml", known_parties={*cfg.peers, self.name})
        except JobFileError as exc:
            raise _Refused(bad_arg, "; ".join(exc.problems)) from None
        digest = job.spec_digest()
        old = self.store.get(job_id)
        if old is not None:
            if old.digest != digest:
                raise _Refused(grpc.StatusCode.ALREADY_EXISTS, f"job_id: {job_id} is already used by another job")
            return old, False
        jt, spec = job.job, job.spec
        if self.role == "party":
            if self.name not in jt.parties:
                raise _Refused(precondition, f"job.parties: this party ({self.name}) is not one of "
                                             f"{', '.join(jt.parties)}")
        elif jt.dealer != self.name:
            raise _Refused(precondition, f"job.dealer: this dealer ({self.name}) is not the job's dealer "
                                         f"({jt.dealer or 'none: trust = ' + jt.trust})")
        for p in jt.parties:
            if p != self.name and cfg.peers[p].role != "party":
                raise _Refused(precondition, f"job.parties: {p!r} is a {cfg.peers[p].role} in this daemon's peers")
        if jt.dealer is not None and jt.dealer != self.name and cfg.peers[jt.dealer].role != "dealer":
            raise _Refused(precondition, f"job.dealer: {jt.dealer!r} is a {cfg.peers[jt.dealer].role} in this "
                                         "daemon's peers, not a dealer")
        try:  # the job's privacy, planned once; its event is what the ledger reserves and composes
            plan = plan_job(spec, sampler="mpc", test_no_noise=bool(getattr(jt, "test_no_noise", False)))
        except PlanError as exc:
            raise _Refused(bad_arg, str(exc)) from None
        pol = cfg.policy
        if spec.method not in pol.allowed_methods:
            raise _Refused(denied, f"method: {spec.method!r} is not allowed by {self.name}'s policy "
                                   f"(allowed: {', '.join(pol.allowed_methods)})")
        if spec.privacy.epsilon > pol.max_epsilon_per_job:
            raise _Refused(denied, f"privacy.epsilon: {spec.privacy.epsilon:g} exceeds {self.name}'s "
                                   f"max_epsilon_per_job ({pol.max_epsilon_per_job:g})")
        if getattr(jt, "test_no_noise", False) and not pol.allow_test_only:
            raise _Refused(denied, f"job.test_no_noise: a zero-noise (test-only) job is refused by {self.name}'s "
                                   "policy (allow_test_only = false)")
        if spec.method == "gradient" and spec.training.iterations > pol.max_iterations:
            raise _Refused(denied, f"training.iterations: {spec.training.iterations} exceeds {self.name}'s "
                                   f"max_iterations ({pol.max_iterations})")
        if self.ledger is not None:
            assert isinstance(cfg, PartyConfig)
            if jt.dataset not in cfg.datasets:
                raise _Refused(precondition, f"job.dataset: {self.name} offers no dataset {jt.dataset!r}")
            try:
                self.ledger.reserve(job_id, jt.dataset, spec.privacy.epsilon, spec.privacy.delta, digest,
                                    plan.event)
            except BudgetExceeded as exc:
                raise _Refused(precondition, f"privacy budget of {self.name}: {exc}") from None
            except (JobConflict, UnknownDataset, AdjacencyMismatch) as exc:
                raise _Refused(precondition, f"{self.name}: {exc}") from None
        try:
            rec = self.store.create(job_id, name=jt.name, job_toml=job_toml, digest=digest, dataset=jt.dataset,
                                    method=spec.method, parties=jt.parties, dealer=jt.dealer, coordinator=caller)
        except JobExists as exc:  # the same submission twice at once: the other one queued it
            return exc.record, False
        except BaseException:
            self._release(job_id, "could not store the job")
            raise
        self._queue.put(job_id)
        self._info(f"job {jt.name!r} accepted from {caller}: {spec.method}, ε={spec.privacy.epsilon:g}, "
                   f"δ={spec.privacy.delta:g}", job_id=job_id, phase="queued", caller=caller)
        return rec, True

    def cancel(self, job_id: str, reason: str) -> JobRecord:
        assert self.store is not None
        with self._lock:
            rec = self.store.get(job_id)
            if rec is None:
                raise _Refused(grpc.StatusCode.NOT_FOUND, f"no job {job_id!r} at {self.name}")
            if rec.terminal:
                return rec
            self.store.request_cancel(job_id)
            run = self._runs.get(job_id)
            if run is not None:
                if run.cancel_at is None:
                    run.cancel_at, run.cancel_reason = time.monotonic(), reason
                    run.cancel.set()
                    self._info(f"cancel requested; the worker has {self.cancel_grace_s:g} s to stop",
                               job_id=job_id, phase="cancelling")
                    self.store.add_event(job_id, "cancelling", {"message": reason})
                    self._endpoint_changed.notify_all()
                return self.store.get(job_id)  # type: ignore[return-value]
            if self.store.finish(job_id, "cancelled", reason, only_from=("queued",)):
                self._release(job_id, reason)
                self._info("queued job cancelled", job_id=job_id, phase="cancelled")
        return self.store.get(job_id)  # type: ignore[return-value]

    def _release(self, job_id: str, reason: str) -> str:
        """Settle the budget of a job that did not succeed: release it unless it revealed."""
        if self.ledger is None:
            return ""
        try:
            r = self.ledger.get(job_id)
            if r is None or r.state in ("released", "committed"):
                return ""
            if not r.revealed:
                self.ledger.release(job_id, reason)
                return "budget released (nothing was revealed)"
        except AlreadyRevealed:
            pass
        except LedgerError as exc:
            self._warn(f"ledger: {exc}", job_id=job_id, phase="ledger")
            return ""
        self.ledger.commit(job_id)
        return "budget spent (the job had revealed)"

    # ---- scheduling and workers

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
                with self._lock:
                    if len(self._runs) >= self.max_jobs:
                        break
                job_id = pending.popleft()
                try:
                    self._admit(job_id)
                except Exception:  # never let one job kill the scheduler
                    self._internal_error(job_id)

    def _internal_error(self, job_id: str) -> None:
        assert self.store is not None
        self.log.exception("scheduler error", extra={"job_id": job_id, "phase": "scheduler"})
        with contextlib.suppress(Exception):
            note = self._release(job_id, "internal error in the daemon")
            self.store.finish(job_id, "failed", "internal error in the daemon" + (f"; {note}" if note else ""))

    def _admit(self, job_id: str) -> None:
        """queued → running: take a slot and start the job's supervising thread."""
        assert self.store is not None
        with self._lock:
            if self._stopping.is_set():
                return  # stays queued; ends failed at the next start
            rec = self.store.get(job_id)
            if rec is None or not self.store.set_running(job_id):
                return  # cancelled while queued
            run = _Run(job_id, rec, self._mp.Event(), self._mp.Queue())
            self._runs[job_id] = run
            run.thread = threading.Thread(target=self._run_thread, args=(run,), name=f"job-{job_id[:12]}",
                                          daemon=True)
            run.thread.start()

    def _run_thread(self, run: _Run) -> None:
        try:
            self._run(run)
        except Exception:
            self._internal_error(run.job_id)
        finally:
            with self._lock:
                self._runs.pop(run.job_id, None)
                self._endpoints.pop(run.job_id, None)
                self._endpoint_changed.notify_all()
            self._queue.put("")  # a slot is free: wake the scheduler

    def _run(self, run: _Run) -> None:
        assert self.store is not None and self.identity is not None
        job_id, rec, up = run.job_id, run.record, self._mp.Queue()
        job_dir = self.jobs_dir / job_id
        job_dir.mkdir(mode=0o700, exist_ok=True)
        config = self.config if self.config.advertise else self.config.model_copy(update={"advertise": self.address})
        ctx = ProcessWorkerContext(job_id=job_id, job_toml=rec.job_toml, config=config, identity=self.identity,
                                   job_dir=job_dir, ledger_path=None if self.ledger is None else self.ledger.path,
                                   up=up, down=run.down, cancel=run.cancel)
        entry = "run_dealer_job" if self.role == "dealer" else "run_party_job"
        proc = self._mp.Process(target=_worker_main,
                                args=(ctx, self.worker_module, entry, str(self.state_dir / LOG_FILE)),
                                name=f"mpc-erm-job-{job_id[:12]}")
        run.process = proc
        self._info(f"starting worker ({self.worker_module}.{entry}, {self.start_method})", job_id=job_id,
                   phase="running")
        try:
            proc.start()
        except Exception as exc:
            self._warn(f"cannot start the worker process: {_one_line(exc)}", job_id=job_id, phase="running")
            run.outcome = ("failed", f"INTERNAL: {self.name} could not start the job's worker process; "
                                     f"see {self.name}'s log")
        else:
            self._supervise(run, up)
        self._finish(run, proc.exitcode)
        up.close()
        run.down.close()
        with contextlib.suppress(Exception):
            proc.close()  # its sentinel descriptor: a long-lived daemon must not keep one per job

    def _supervise(self, run: _Run, up: Any) -> None:
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
                self._warn("worker reported but did not exit; terminating it", job_id=run.job_id, phase="exit")
                self._kill(proc)
            with self._lock:
                overdue = run.cancel_at is not None and now - run.cancel_at > self.cancel_grace_s
            if overdue:
                self._warn("worker did not stop in time; terminating it", job_id=run.job_id, phase="cancelling")
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

    def _handle(self, run: _Run, msg: Any) -> None:
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
            self._info(text or phase, job_id=run.job_id, phase=phase, **extra)
        elif kind == "endpoint":
            with self._lock:
                self._endpoints[run.job_id] = str(msg[1])
                self._endpoint_changed.notify_all()
            self._info("worker transport published", job_id=run.job_id, phase="endpoint", address=msg[1])
        elif kind == "lookup":
            _, rid, member, timeout_s = msg
            t = threading.Thread(target=self._answer_lookup, args=(run, rid, str(member), float(timeout_s)),
                                 name=f"lookup-{member}", daemon=True)
            run.threads.append(t)
            t.start()
        elif kind in ("done", "failed", "cancelled"):
            run.outcome = (kind, msg[1])

    def _answer_lookup(self, run: _Run, rid: int, member: str, timeout_s: float) -> None:
        try:
            answer: tuple[int, str, str] = (rid, "ok", self._resolve_endpoint(run, member, timeout_s))
        except TimeoutError as exc:
            answer = (rid, "timeout", str(exc))
        except Exception as exc:
            answer = (rid, "error", _one_line(exc))
        self._info(f"endpoint look-up of {member}: {answer[1]}", job_id=run.job_id, phase="lookup", member=member)
        with contextlib.suppress(Exception):
            run.down.put(answer)

    def _resolve_endpoint(self, run: _Run, member: str, timeout_s: float) -> str:
        """``member``'s published transport address for this job, from its daemon (mTLS, pinned)."""
        assert self.identity is not None
        members = dict(_members(run.record))
        if member not in members:
            raise ValueError(f"{member!r} is not a member of job {run.job_id}")
        deadline = time.monotonic() + timeout_s
        if member == self.name:
            with self._endpoint_changed:
                while run.job_id not in self._endpoints:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"{member!r} (this daemon's own worker) published no endpoint in time")
                    self._endpoint_changed.wait(min(left, 0.5))
                return self._endpoints[run.job_id]
        peer = self.config.peers.get(member)
        if peer is None:
            raise ValueError(f"{member!r} is not among {self.name}'s peers")
        role = members[member]
        last = "no answer"
        cycle_since: float | None = None
        with tls.secure_channel(peer.address, self.identity, member, grpc_options(), expected_role=role) as ch:
            stub = pb_grpc.PartyControlStub(ch)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"endpoint of {member!r} for job {run.job_id} not published within "
                                       f"{timeout_s:g} s (last: {last})")
                if run.cancel.is_set() or self._stopping.is_set():
                    raise RuntimeError("job cancelled or daemon stopping")
                wait = min(left, 5.0)
                pause = 0.2
                try:
                    reply = stub.GetEndpoint(pb.EndpointRequest(job_id=run.job_id, member=member, wait_s=wait),
                                             timeout=wait + 5.0)
                    return reply.address
                except grpc.RpcError as exc:
                    code = exc.code()  # type: ignore[attr-defined]
                    last = f"{code.name}: {exc.details()}"  # type: ignore[attr-defined]
                    if code not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE,
                                    grpc.StatusCode.DEADLINE_EXCEEDED):
                        raise RuntimeError(f"{member}'s daemon: {last}") from None
                    peer_running = _admission_of(exc) if code == grpc.StatusCode.NOT_FOUND else None
                    if peer_running is not None:  # queued there behind full slots: a cycle with us?
                        pause = ADMISSION_POLL_S
                        failed, cycle_since = self._break_cross_queueing(run, member, stub, peer_running,
                                                                         cycle_since)
                        if failed:
                            raise RuntimeError(run.cancel_reason) from None
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))

    def _finish(self, run: _Run, exitcode: int | None) -> None:
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
            if self.ledger is not None:
                try:
                    self.ledger.commit(run.job_id)
                except LedgerError as exc:  # released meanwhile: the worker revealed without a reservation
                    self._warn(f"ledger: {exc}", job_id=run.job_id, phase="ledger")
        else:
            note = self._release(run.job_id, reason or status)
            reason = f"{reason}; {note}" if note else reason
        self.store.finish(run.job_id, status, reason, summary)
        self._info(f"job {status}" + (f": {reason}" if reason else ""), job_id=run.job_id, phase=status,
                   status=status)

    # ---- queries used by the servicer

    def endpoint(self, job_id: str, wait_s: float) -> str | None:
        """The job's published worker address, waiting up to ``wait_s``; None at once if the job
        waits for a slot here (see :meth:`admission`), is being cancelled, or the daemon stops."""
        deadline = time.monotonic() + max(0.0, min(wait_s, MAX_ENDPOINT_WAIT_S))
        with self._endpoint_changed:
            while job_id not in self._endpoints:
                left = deadline - time.monotonic()
                run = self._runs.get(job_id)
                if (left <= 0 or self._stopping.is_set() or (run is not None and run.cancel_at is not None)
                        or (run is None and len(self._runs) >= self.max_jobs)):
                    return None
                self._endpoint_changed.wait(min(left, 0.5))
            return self._endpoints[job_id]

    def admission(self, job_id: str) -> list[str] | None:
        """If ``job_id`` is queued here behind ``max_jobs`` running jobs: the ids of those jobs
        (what a peer needs to see a cross-queueing deadlock); else None."""
        assert self.store is not None
        with self._lock:
            if job_id in self._runs or len(self._runs) < self.max_jobs:
                return None
            running = sorted(self._runs)
        rec = self.store.get(job_id)
        return running if rec is not None and rec.status == "queued" else None

    def _queued_here(self) -> set[str]:
        assert self.store is not None
        return {r.id for r in self.store.list(statuses=("queued",))}

    def _fail_run(self, run: _Run, reason: str) -> None:
        """End a running job as failed (its worker is cancelled; budget settled as for any failure)."""
        assert self.store is not None
        with self._lock:
            if run.cancel_at is not None:
                return
            run.cancel_at, run.cancel_reason, run.end_status = time.monotonic(), reason, "failed"
            run.cancel.set()
            self._endpoint_changed.notify_all()
        self._warn(reason, job_id=run.job_id, phase="deadlock")
        self.store.add_event(run.job_id, "failing", {"message": reason})

    def _break_cross_queueing(self, run: _Run, member: str, stub: Any, peer_running: list[str],
                              since: float | None) -> tuple[bool, float | None]:
        """``run`` waits for a slot at ``member``, whose slots hold ``peer_running``. A deadlock:
        every job running there is queued here, and every job running here is queued there (so
        neither daemon can free a slot). Then the largest job id of the two sets fails, on the
        daemon that runs it (both sides pick the same); if the other side has not acted after
        ``ADMISSION_GRACE_S`` (it may be waiting on a third member), this side fails its own
        largest. Returns (whether ``run`` itself was failed, when the cycle was first seen)."""
        with self._lock:
            mine = {j: r for j, r in self._runs.items() if r.cancel_at is None}
            full = len(self._runs) >= self.max_jobs
            freeing = len(mine) < len(self._runs)  # a job here is ending: its slot frees soon
        queued = self._queued_here()
        if not full or freeing or not peer_running or not set(peer_running) <= queued:
            return False, None
        for job_id in sorted(set(mine) - {run.job_id}):  # is each of ours queued at the peer, behind its slots?
            members = dict(_members(mine[job_id].record))
            if member not in members:
                return False, None  # it does not need the peer: it can finish and free a slot
            try:
                stub.GetEndpoint(pb.EndpointRequest(job_id=job_id, member=member, wait_s=0.0), timeout=10.0)
                return False, None  # running there
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND or not _admission_of(exc):  # type: ignore[attr-defined]
                    return False, None
        now = time.monotonic()
        since = now if since is None else since
        loser, why = max([*mine, *peer_running]), "the largest job id of the cycle"
        if loser not in mine:
            if now - since < ADMISSION_GRACE_S:
                return False, since
            loser, why = max(mine), f"{member} did not break the cycle within {ADMISSION_GRACE_S:g} s"
        other = max(set(peer_running) | (set(mine) - {loser}))
        reason = (f"admission deadlock: {self.name} and {member} each run max_concurrent_jobs jobs that are queued "
                  f"at the other (this job and e.g. {other}); this job gives way ({why}) so the others can run "
                  "- nothing was revealed; resubmit it")
        self._fail_run(mine[loser], reason)
        return loser == run.job_id, since

    def job_info(self, rec: JobRecord) -> pb.JobInfo:
        assert self.store is not None
        last = self.store.last_event(rec.id)
        progress = self.store.last_event(rec.id, with_key="round")
        return pb.JobInfo(
            job_id=rec.id, name=rec.name, status=rec.status, reason=rec.reason or "", spec_digest=rec.digest,
            dataset=rec.dataset or "", method=rec.method or "", created_at=rec.created_at,
            started_at=rec.started_at or 0.0, ended_at=rec.ended_at or 0.0,
            summary_json="" if rec.summary is None else json.dumps(rec.summary),
            coordinator=rec.coordinator or "", member=self.name, parties=list(rec.parties), dealer=rec.dealer or "",
            last_phase="" if last is None else last.phase,
            progress_json="" if progress is None else json.dumps(progress.payload),
            cancel_requested=rec.cancel_requested,
        )

    def result_files(self, job_id: str) -> list[tuple[str, Path]]:
        return result_files(self.jobs_dir / job_id)


# --------------------------------------------------------------------------- gRPC servicer


class _Servicer(pb_grpc.PartyControlServicer):
    def __init__(self, daemon: PartyDaemon) -> None:
        self.d = daemon

    def _record(self, job_id: str, context: grpc.ServicerContext) -> JobRecord:
        assert self.d.store is not None
        rec = self.d.store.get(job_id)
        if rec is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {job_id!r} at {self.d.name}")
        return rec  # type: ignore[return-value]

    def SubmitJob(self, request: pb.SubmitRequest, context: grpc.ServicerContext) -> pb.SubmitReply:
        caller = tls.peer(context)
        try:
            rec, new = self.d.submit(request.job_id, request.job_toml, caller.name)
        except _Refused as exc:
            self.d._warn(f"job refused: {exc.message}", job_id=request.job_id[:64] or None, phase="refused",
                         caller=str(caller), code=exc.code.name)
            context.abort(exc.code, exc.message)
        return pb.SubmitReply(job_id=rec.id, accepted=True, reason="" if new else "already submitted",
                              spec_digest=rec.digest, member=self.d.name, status=rec.status)

    def GetStatus(self, request: pb.JobRef, context: grpc.ServicerContext) -> pb.JobInfo:
        return self.d.job_info(self._record(request.job_id, context))

    def Watch(self, request: pb.WatchRequest, context: grpc.ServicerContext) -> Iterator[pb.JobEvent]:
        store = self.d.store
        assert store is not None
        self._record(request.job_id, context)
        after = request.after_seq
        while True:
            rec = store.get(request.job_id)
            assert rec is not None
            for ev in store.events(request.job_id, after):
                after = ev.seq
                yield pb.JobEvent(job_id=ev.job_id, seq=ev.seq, time=ev.time, phase=ev.phase,
                                  payload_json=json.dumps(ev.payload), member=self.d.name)
            if rec.terminal or not request.follow or not context.is_active() or self.d._stopping.is_set():
                return  # terminal: its event was written with the status, so it was just sent
            store.wait(0.5)

    def Cancel(self, request: pb.CancelRequest, context: grpc.ServicerContext) -> pb.CancelReply:
        caller = tls.peer(context)
        reason = f"cancelled by {caller.name}" + (f": {request.reason}" if request.reason else "")
        try:
            rec = self.d.cancel(request.job_id, reason)
        except _Refused as exc:
            context.abort(exc.code, exc.message)
        return pb.CancelReply(job_id=rec.id, status=rec.status, reason=rec.reason or "")

    def ListJobs(self, request: pb.ListRequest, context: grpc.ServicerContext) -> pb.ListReply:
        assert self.d.store is not None
        return pb.ListReply(jobs=[self.d.job_info(r) for r in self.d.store.list(limit=request.limit)])

    def GetResult(self, request: pb.ResultRequest, context: grpc.ServicerContext) -> Iterator[pb.FileChunk]:
        rec = self._record(request.job_id, context)
        if rec.status != "succeeded":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"job {rec.id} is {rec.status} at {self.d.name}: no result"
                          + (f" ({rec.reason})" if rec.reason else ""))
        for name, path in self.d.result_files(rec.id):
            h, offset = hashlib.sha256(), 0
            with path.open("rb") as fh:
                while True:
                    data = fh.read(RESULT_CHUNK_BYTES)
                    h.update(data)
                    at_end = len(data) < RESULT_CHUNK_BYTES
                    if not request.manifest_only and (data or offset == 0 or at_end):
                        if at_end:
                            yield pb.FileChunk(name=name, offset=offset, data=data, last=True,
                                               size=offset + len(data), sha256=h.hexdigest(),
                                               content_sha256=content_digest(path))
                        else:
                            yield pb.FileChunk(name=name, offset=offset, data=data)
                    offset += len(data)
                    if at_end:
                        break
            if request.manifest_only:
                yield pb.FileChunk(name=name, last=True, size=offset, sha256=h.hexdigest(),
                                   content_sha256=content_digest(path))

    def GetEndpoint(self, request: pb.EndpointRequest, context: grpc.ServicerContext) -> pb.EndpointReply:
        caller = tls.peer(context)
        rec = self._record(request.job_id, context)
        if (caller.name, caller.role) not in _members(rec):
            # answered exactly as for an unknown id: a non-member learns nothing, not even that the job exists
            self.d._warn(f"GetEndpoint refused: {caller} is not a member of job {rec.id}", job_id=rec.id,
                         phase="refused", caller=str(caller), code=grpc.StatusCode.NOT_FOUND.name)
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id!r} at {self.d.name}")
        if request.member and request.member != self.d.name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"member: this daemon is {self.d.name}, "
                                                            f"not {request.member}")
        if rec.terminal:  # another member learns the status and the reason's public code, not its text
            code = code_of(rec.reason)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job {rec.id} is {rec.status} at {self.d.name}"
                          + (f": {code}: see {self.d.name}'s status" if code else ""))
        address = self.d.endpoint(rec.id, request.wait_s)
        if address is None:
            running = self.d.admission(rec.id)
            if running is not None:  # queued behind full slots: tell the asker which jobs hold them
                context.set_trailing_metadata(((ADMISSION_KEY, ",".join(running)),))
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"job {rec.id} is queued at {self.d.name}: all {self.d.max_jobs} slots "
                              f"(max_concurrent_jobs) are busy")
            context.abort(grpc.StatusCode.NOT_FOUND, f"job {rec.id}: {self.d.name}'s worker has not published "
                                                     "its endpoint yet")
        return pb.EndpointReply(job_id=rec.id, member=self.d.name, address=address)

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("mpc-erm")
        except PackageNotFoundError:
            v = "unknown"
        assert self.d.store is not None
        with self.d._lock:
            running = len(self.d._runs)
        queued = len(self.d.store.list(statuses=("queued",)))
        return pb.HealthReply(name=self.d.name, role=self.d.role, version=v,
                              uptime_s=time.time() - self.d._started_at, queued=queued, running=running)
