"""The party (or dealer) daemon: job control over gRPC + mTLS, one worker process per job.

This module starts and stops the daemon and wires its parts; each part is a module of its own.
What happens to a job, in order:

1. ``SubmitJob`` (PREPARE, :meth:`PartyDaemon.submit`): the caller is a coordinator named in
   ``policy.allowed_coordinators`` (:func:`parties.admission.check_caller`; any other certificate
   is refused by ``tls.Authorizer`` before the servicer runs) — PERMISSION_DENIED;
2. the job TOML is validated (``mpc_erm.jobs.jobfile``; party and dealer names must be this daemon's
   peers or itself) — INVALID_ARGUMENT naming the field;
3. :func:`parties.admission.admit` (a pure function of the config, the job and its plan): this
   daemon must be one of the job's parties (a dealer: the job's dealer) — FAILED_PRECONDITION; the
   policy: method, ε per job, test-only noise, iterations — PERMISSION_DENIED naming the field;
   the data set must be offered here — FAILED_PRECONDITION;
4. the job's planned event is reserved in the ledger, in one transaction — FAILED_PRECONDITION with
   the ledger's reason. Competing admissions are ordered by job id: a job the budget would take
   once the *larger*-id jobs prepared here were gone waits for them to be decided, any other is
   refused (:mod:`parties.agreement` says why that always admits one and cannot deadlock);
5. the job is stored ``prepared`` — not queued. A refusal in 1-4 is answered to the coordinator
   and remembered (its public reason) for the job's other members;
6. AGREE (:mod:`parties.agreement`, one thread per prepared job, daemon to daemon over mTLS with
   ``GetAdmission``, without the coordinator): the job's first party asks every other member
   until all have prepared it, then queues it; the others ask the first party and queue it when
   it has. A member that refused (or, after ``UNKNOWN_GRACE_S``, never heard of the job) ends it
   everywhere within a poll or two: ``refused``, the reason naming that member (``"<CODE>: refused
   by <member>: <public reason>"``; ``failed`` for a member lost), the reservation released, no
   worker started anywhere;
7. ``queued``: up to ``max_concurrent_jobs`` (config, default 4) jobs run at once
   (:mod:`parties.supervision`), each in its own worker process running
   ``parties.worker.run_party_job`` (the dealer: ``run_dealer_job``) with a
   :class:`parties.context.ProcessWorkerContext`; more wait queued, oldest first;
8. the workers of a job find each other through their daemons (:mod:`parties.rendezvous`, which
   also breaks a deadlock of two daemons whose slots hold each other's queued jobs);
9. the coordinator follows and fetches it (:mod:`parties.servicer`).

A job's states here: ``prepared → queued → running → succeeded | failed | cancelled``; a prepared
job ends ``refused`` (refused by a member: the reason names it), ``failed`` (a member lost, or not
agreed within ``peer_timeout_s``) or ``cancelled`` (the coordinator's ``Cancel``) without ever
running.

Budget: the worker marks the reservation revealed right before its first reveal. A job that
succeeds, or fails after that mark, keeps its budget spent (committed); one that ends before it
(failure, cancel, refusal by a member, daemon restart) gets its reservation released. On start-up
every job left prepared, queued or running ends ``failed`` ("interrupted by a daemon restart") and
``Ledger.recover`` settles the budget, so a job is never left half-released.
Before any of that, a party daemon checks its ledger against its hash-chained audit log
(:mod:`parties.ledger_check`) and refuses to start, with one line naming the file, when the ledger
is missing, unreadable or holds less than the log charged: a lost ledger must not become a fresh
budget (the repair is ``mpc-erm budget rebuild``, never automatic).

Logs are JSON lines (:mod:`parties.logs`) to stderr and ``state_dir/daemon.log``.

Failure reasons: a job's ``reason`` leaves the party, so a worker's failure is recorded as
``"<CODE>: <public reason>"`` (:mod:`parties.public_errors`: data set id, member names, phase,
job-file field names — never a file path, a value or a column name); the exception's text and
traceback go only to this party's log.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from mpc_erm.jobs.status import BUDGET_RELEASED, BUDGET_SPENT, refusal_of
from mpc_erm.mpc import pki, tls
from mpc_erm.mpc.callers import CallerPolicy
from mpc_erm.mpc.party_api import party_pb2_grpc as pb_grpc
from mpc_erm.privacy.plan import PlanError, PrivacyPlan, plan_job

from .admission import JOB_ID_RE, MAX_JOB_TOML_BYTES, Admitted, Refused, admit, check_caller, check_request
from .agreement import ASK_TIMEOUT_S, Agreement
from .callers import caller_policy
from .config import DaemonConfig, DealerConfig, PartyConfig, load_daemon_identity, split_host_port
from .job_store import LIVE, JobExists, JobRecord, JobStore, read_result_manifest, result_files
from .ledger import (
    AdjacencyMismatch,
    AlreadyRevealed,
    BudgetExceeded,
    JobConflict,
    Ledger,
    LedgerError,
    UnknownDataset,
)
from .logs import LOG_FILE, DaemonLog, log_handlers, one_line
from .public_errors import public_failure
from .rendezvous import Rendezvous, grpc_options
from .servicer import Servicer, control_policy
from .supervision import CANCEL_GRACE_S, Supervisor, WorkerSetup

__all__ = ["RESTART_REASON", "PartyDaemon", "check_data_files", "check_listen", "load_daemon_identity",
           "prestarted_thread_pool"]

RESTART_REASON = "interrupted by a daemon restart"
CONTROL_THREADS = 32  # control-plane RPCs served at once (Watch streams and endpoint long-polls hold one each)
MAX_BUDGET_WAITS = CONTROL_THREADS // 4  # submissions held at once waiting for budget a larger prepared job holds
# what a starting daemon waits for, in order (Health's ``waiting_for``; SubmitJob's refusal)
_PARSER_PHASE = "the job-file parser (imports in the daemon)"
_POOL_PHASE = "the worker pool (its fork server imports torch and the job code once, before the first worker)"


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


def check_listen(listen: str) -> None:
    """OSError naming ``listen`` when no address it resolves to can be bound (another process
    listens there, or it is not this host's); port 0 always binds.

    Why here and not only in gRPC's bind: that comes after the daemon has read and settled its
    state, and its failure is a RuntimeError (and a C-core log line) that says little."""
    host, port = split_host_port(listen, allow_zero=True)
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"listen: cannot bind {listen}: {exc.strerror}") from None
    why = ""
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
            try:
                sock.bind(addr)
                return  # gRPC serves if any resolved address binds
            except OSError as exc:
                why = exc.strerror or str(exc)
    raise OSError(f"listen: cannot bind {listen}: {why}")


def check_data_files(cfg: PartyConfig) -> None:
    """OSError naming the data set and the file when a data file the config names cannot be opened
    for reading: found at start, not by the first job (which would fail at every member)."""
    for ds, d in cfg.datasets.items():
        for field in ("path", "labels"):
            f = getattr(d, field, None)
            if not isinstance(f, Path):
                continue
            try:
                with f.open("rb"):
                    pass
            except OSError as exc:
                raise OSError(f"datasets.{ds}.{field}: cannot read {f}: {exc.strerror or exc}") from None


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
        self.log_to_stderr = log_to_stderr
        self.state_dir = Path(config.state_dir)
        self.jobs_dir = self.state_dir / "jobs"
        self.port: int | None = None
        self.address: str | None = None
        self.identity: pki.Identity | None = None
        self.store: JobStore | None = None
        self.ledger: Ledger | None = None
        self.agreement: Agreement | None = None
        self._budget_waits = 0  # submissions waiting for budget (under the agreement's lock)
        self.log = DaemonLog(logging.getLogger(f"parties.daemon.{self.name}"))
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self.supervisor = Supervisor(name=self.name, role=self.role, log=self.log, stopping=self._stopping,
                                     worker_module=worker_module, start_method=start_method,
                                     cancel_grace_s=cancel_grace_s,
                                     max_jobs=int(getattr(config, "max_concurrent_jobs", 4)),
                                     commit=self._commit, release=self._release)
        self._server: grpc.Server | None = None
        self._authorizer: tls.Authorizer | None = None
        self.callers: CallerPolicy | None = None  # who may call this daemon's servers (parties.callers)
        self.started_at = 0.0
        # start-up work after the server starts (Health answers meanwhile, with what it waits for)
        self._taking = threading.Event()  # submissions are taken (the control plane is up)
        self._answered = threading.Event()  # jobs are taken, or the start-up ended without: wait_taking returns
        self._ready = threading.Event()  # the worker pool is warm: agreed jobs start at once
        self._warmed = threading.Event()  # the warm-up ended, ready or not
        self._starting = _PARSER_PHASE
        self._start_failure: str | None = None

    @property
    def max_jobs(self) -> int:
        """Jobs run at once (``max_concurrent_jobs``); more wait queued."""
        return self.supervisor.max_jobs

    @max_jobs.setter
    def max_jobs(self, value: int) -> None:
        self.supervisor.max_jobs = value

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def starting(self) -> str:
        """What the daemon still does before it takes jobs ("" once it does): Health's ``starting``,
        and SubmitJob's refusal until then."""
        return "" if self._taking.is_set() else self._starting

    @property
    def warming(self) -> str:
        """What warms behind a daemon that takes jobs ("" once nothing does): Health's ``warming``.
        A job taken meanwhile is agreed only once this is empty at every member (this daemon
        answers ``preparing`` until then), so no member's worker starts before another's can."""
        return "" if self._ready.is_set() or not self._taking.is_set() else _POOL_PHASE

    def pool_state(self) -> str:
        """For the admission agreement: "" once agreed jobs can start here, ``"warming"`` before,
        else the public reason this daemon will run no job."""
        if self._ready.is_set():
            return ""
        return f"PEER_FAILED: {self.name} cannot start job workers" if self._start_failure else "warming"

    def wait_taking(self, timeout: float | None = None) -> bool:
        """Wait until the daemon takes jobs (True) or ``timeout`` passes (False); OSError (one
        line) when its start-up work failed: it will never take one."""
        self._answered.wait(timeout)
        if self._start_failure is not None:
            raise OSError(self._start_failure)
        return self._taking.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the daemon takes jobs and its worker pool is warm (True) or ``timeout``
        passes (False); OSError (one line) when its start-up work failed: it will never take one."""
        self._warmed.wait(timeout)
        if self._start_failure is not None:
            raise OSError(self._start_failure)
        return self._ready.is_set()

    # ---- life cycle

    def start(self, *, wait_ready: bool = True) -> int:
        """Bind, settle the previous run's state, serve, then warm up (see :meth:`_warm_up`): with
        ``wait_ready`` return once jobs are taken (stopping the daemon if that fails), else at once
        (:meth:`wait_ready`). The port is returned either way."""
        port = self._start()
        if wait_ready:
            try:
                self.wait_ready()
            except OSError:
                self.stop()
                raise
        return port

    def _start(self) -> int:
        cfg = self.config
        self.identity = load_daemon_identity(cfg)  # before touching any file: a bad config changes nothing
        # who may call its servers; the CRL is verified now: a bad one starts nothing
        self.callers = caller_policy(cfg, self.identity, self.log.logger)
        # before any state is read or settled: a second daemon started on this config (its port in
        # use) must not end the first one's jobs as "interrupted by a daemon restart"
        check_listen(cfg.listen)
        if isinstance(cfg, PartyConfig):
            check_data_files(cfg)
            # before any file is created: a missing or damaged ledger must not become a fresh
            # budget (parties.ledger_check; LedgerDamaged/AuditDamaged say in one line what to do)
            from .ledger_check import check_ledger

            check_ledger(self.state_dir)
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.jobs_dir.mkdir(mode=0o700, exist_ok=True)
        logger = self.log.logger
        logger.handlers[:] = log_handlers(self.state_dir, self.log_to_stderr)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        self.store = JobStore.in_state_dir(self.state_dir)
        if isinstance(cfg, PartyConfig):
            self.ledger = Ledger.for_config(cfg)
        self._recover()
        rendezvous = Rendezvous(config=cfg, identity=self.identity, store=self.store, slots=self.supervisor,
                                stopping=self._stopping, log=self.log)
        self.agreement = Agreement(config=cfg, identity=self.identity, store=self.store, log=self.log,
                                   pool=self.pool_state,
                                   stopping=self._stopping, agreed=self._agreed, abort=self._abort)
        self._authorizer = self.callers.authorizer(control_policy(cfg), "control",
                                                   field_limits={"*": 1024, "job_toml": MAX_JOB_TOML_BYTES})
        self._server = grpc.server(
            prestarted_thread_pool(CONTROL_THREADS, f"party-{self.name}"),
            interceptors=[self._authorizer],
            options=[*grpc_options(), ("grpc.so_reuseport", 0)],
        )
        pb_grpc.add_PartyControlServicer_to_server(Servicer(self, rendezvous), self._server)
        try:
            port = self._server.add_secure_port(cfg.listen, tls.server_credentials(self.identity))
        except RuntimeError:  # grpc: "Failed to bind to address …" (taken since check_listen)
            port = 0
        if port == 0:
            self._close_state()
            raise OSError(f"listen: cannot bind {cfg.listen} (the address is in use or not one of this host's)")
        self.port = port
        host, _ = split_host_port(cfg.listen, allow_zero=True)
        host = f"[{host}]" if ":" in host else host
        self.address = cfg.advertise or f"{host}:{port}"
        self.started_at = time.time()
        worker_config = cfg if cfg.advertise else cfg.model_copy(update={"advertise": self.address})
        self.supervisor.prepare(self.store, WorkerSetup(
            config=worker_config, identity=self.identity, jobs_dir=self.jobs_dir,
            ledger_path=None if self.ledger is None else self.ledger.path, log_path=self.state_dir / LOG_FILE),
            rendezvous.resolve)
        self._server.start()
        self.supervisor.start()
        self.log.info(f"{self.role} daemon {self.name} listening on port {port} (advertised {self.address}); "
                      "starting", phase="start", address=self.address)
        threading.Thread(target=self._warm_up, name=f"warm-up-{self.name}", daemon=True).start()
        return port

    def _warm_up(self) -> None:
        """The start-up work that follows the server's start, in two steps.

        1. The job-file parser (SubmitJob parses every job with it; no torch): jobs are taken
           from then on, and Health says ok, within a couple of seconds of the start.
        2. The worker pool: its fork server imports torch and the job code before it can fork a
           worker (seconds here, tens of seconds on a cold disk). It warms behind the control
           plane, and Health says what warms. A job taken meanwhile waits in the admission
           agreement: this daemon answers ``preparing`` and decides nothing until the pool is
           warm, so no member's worker starts and waits on a peer whose pool is still cold.

        If the pool cannot start, jobs are refused from then on and those waiting end at once."""
        t0 = time.monotonic()
        try:  # self._starting is _PARSER_PHASE from the start
            import mpc_erm.jobs.jobfile  # noqa: F401  (SubmitJob parses every job with it)

            self._starting = _POOL_PHASE
            if not self._stopping.is_set():
                self._taking.set()
                self._answered.set()
                self.log.info(f"taking jobs ({time.monotonic() - t0:.1f} s of start-up work); the worker pool "
                              "warms behind", phase="ready")
            self.supervisor.warm_up()
        except Exception as exc:
            self._start_failure = f"{self.role} daemon {self.name} cannot start job workers: {one_line(exc)}"
            self._starting = f"nothing more: it cannot start job workers ({one_line(exc)}); see its log"
            self._taking.clear()
            self.log.error(self._start_failure, phase="start")
        else:
            if not self._stopping.is_set():
                self._ready.set()
                self.log.info(f"ready: the worker pool is warm ({time.monotonic() - t0:.1f} s of start-up work)",
                              phase="ready")
        finally:
            self._answered.set()
            self._warmed.set()
            if self.agreement is not None:
                self.agreement.notify()  # the jobs waiting on the pool decide now

    def reload_crl(self) -> bool:
        """Re-read ``identity.crl`` now (``mpc-erm party serve`` calls this on SIGHUP; without it a
        changed file is noticed within a second, here and in every running job's worker:
        :mod:`mpc_erm.mpc.callers`) and refuse the newly revoked from the next call on. A list that
        does not verify (foreign CA, stale, unreadable) is logged and the old one kept: an
        operator's mistake must not silently un-revoke anyone. Returns whether it was applied."""
        if self.callers is None:
            raise RuntimeError("reload_crl: the daemon is not started")
        return self.callers.reload()  # the list tells the daemon's log what it did

    def _recover(self) -> None:
        """Settle what a dead predecessor left: live jobs end failed, their budget released unless
        they revealed; a job that revealed *and* whose worker wrote every result (its manifest
        matches the files) ends succeeded, so it is fetched, not resubmitted and paid twice."""
        assert self.store is not None
        kept: list[Any] = []
        if self.ledger is not None:
            released, kept = self.ledger.recover(RESTART_REASON)
            for r in released:
                self.log.info("budget reservation released (nothing was revealed)", job_id=r.job_id, phase="recover")
        revealed = {r.job_id for r in kept}
        for rec in self.store.list(statuses=LIVE):
            summary = read_result_manifest(self.jobs_dir / rec.id) if rec.id in revealed else None
            if summary is not None and self.store.finish(rec.id, "succeeded", None, summary):
                self.log.info("job succeeded: its worker had written every result before the daemon stopped",
                              job_id=rec.id, phase="succeeded", status="succeeded")
            elif self.store.finish(rec.id, "failed", RESTART_REASON):
                self.log.info(f"job ended: {RESTART_REASON}", job_id=rec.id, phase="failed")
        for r in kept:
            job = self.store.get(r.job_id)
            if self.ledger is not None and (job is None or job.terminal):
                self.ledger.commit(r.job_id)
            self.log.info("budget kept as spent (the job had revealed)", job_id=r.job_id, phase="recover")

    def stop(self, grace: float = 2.0) -> None:
        """Stop serving, interrupt the running jobs (they end failed; budget settled as for any
        failure); prepared and queued jobs stay so and end failed at the next start."""
        if self._stopping.is_set():
            self._stopped.wait()
            return
        self._stopping.set()
        try:
            if self._server is not None:
                self._server.stop(grace).wait()
            if self.agreement is not None:  # prepared jobs stay prepared; they end failed at the next start
                self.agreement.join(ASK_TIMEOUT_S + 1.0)
            self.supervisor.stop()
            self.log.info(f"{self.role} daemon {self.name} stopped", phase="stop")
        finally:
            self._close_state()
            self._stopped.set()

    def _close_state(self) -> None:
        for h in self.log.logger.handlers:
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

    # ---- jobs

    def submit(self, job_id: str, job_toml: str, caller: str) -> tuple[JobRecord, bool]:
        """PREPARE (the first phase of :mod:`parties.agreement`): check the caller, validate, admit,
        reserve budget and store the job ``prepared`` — (record, newly prepared); the job is queued
        only once every member has prepared it. Raises :class:`parties.admission.Refused` with the
        gRPC status and a one-line reason; a refusal of a job this daemon does not hold is
        remembered (its public reason) for the job's other members, which then end it at once."""
        assert self.store is not None and self.agreement is not None
        if self._stopping.is_set():
            raise Refused(grpc.StatusCode.UNAVAILABLE, "the daemon is stopping")
        job_members: list[tuple[str, str]] = []
        try:
            refused = check_caller(self.config, caller)
            if refused is not None:
                raise refused
            if not self._taking.is_set():  # the job's other members hear it too, and end the job at once
                waiting = self.starting
                raise Refused(grpc.StatusCode.UNAVAILABLE, f"{self.name} is starting (waiting for {waiting}); "
                              "submit again once its health check says ok",
                              public=f"{self.name} is starting and takes no job yet")
            refusal = check_request(job_id, job_toml)
            if refusal is not None:
                raise Refused.of(refusal)
            with self.agreement.submitting(job_id):
                try:
                    rec, new = self._prepare(job_id, job_toml, caller, job_members)
                except Refused:
                    raise
                except Exception as exc:  # never a raw exception text across the boundary
                    raise self._admission_failure(job_id, exc) from None
        except Refused as exc:
            if JOB_ID_RE.fullmatch(job_id) and self.store.get(job_id) is None:
                self.agreement.remember(job_id, exc.public_reason(self.name), job_members or None)
            raise
        if new:
            self.agreement.forget(job_id)  # an earlier refusal of the same id is no longer the answer
            self.agreement.start(rec)
        return rec, new

    def _admission_failure(self, job_id: str, exc: Exception) -> Refused:
        """The refusal for a job this daemon could not admit because of its own failure, with the
        public code and reason every job failure gets (:func:`parties.public_errors.public_failure`:
        a full disk, SQLite's ``database or disk is full``, is ``STORAGE``; a bug ``INTERNAL``); the
        detail goes to this daemon's log only (it may name files)."""
        code, reason = public_failure(exc, member=self.name, job_id=job_id)
        public = reason.removeprefix(f"{code}: ") + "; nothing was reserved"
        status = grpc.StatusCode.RESOURCE_EXHAUSTED if code == "STORAGE" else grpc.StatusCode.INTERNAL
        self.log.error(f"job not admitted: {type(exc).__name__}: {one_line(exc)}", job_id=job_id[:64] or None,
                       phase="refused", code=code)
        return Refused(status, f"{code}: {public}", public_code=code, public=public)

    def _prepare(self, job_id: str, job_toml: str, caller: str,
                 job_members: list[tuple[str, str]]) -> tuple[JobRecord, bool]:
        from mpc_erm.jobs.jobfile import JobFileError, parse_job_file

        assert self.store is not None
        cfg = self.config
        try:
            job = parse_job_file(job_toml, source="job.toml", known_parties={*cfg.peers, self.name})
        except JobFileError as exc:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(exc.problems)) from None
        jt, spec = job.job, job.spec
        job_members[:] = [(p, "party") for p in jt.parties] + ([(jt.dealer, "dealer")] if jt.dealer else [])
        digest = job.spec_digest()
        old = self.store.get(job_id)
        if old is not None:
            if old.digest != digest:
                raise Refused(grpc.StatusCode.ALREADY_EXISTS, f"job_id: {job_id} is already used by another job")
            return old, False
        plan: PrivacyPlan | PlanError
        try:  # the job's privacy, planned once; its event is what the ledger reserves and composes
            plan = plan_job(job.spec, sampler="mpc", test_no_noise=job.job.test_no_noise, noise_split=job.noise_split())
        except PlanError as exc:
            plan = exc
        decision = admit(cfg, job, caller, plan)
        if not isinstance(decision, Admitted):
            raise Refused.of(decision)
        self._reserve(job_id, digest, decision)
        try:
            rec = self.store.create(job_id, name=jt.name, job_toml=job_toml, digest=digest, dataset=jt.dataset,
                                    method=spec.method, parties=jt.parties, dealer=jt.dealer,
                                    coordinator=decision.coordinator, status="prepared")
        except JobExists as exc:  # the same submission twice at once: the other one prepared it
            return exc.record, False
        except BaseException:
            self._release(job_id, "could not store the job")
            self.agreement.notify()  # type: ignore[union-attr]
            raise
        self.log.info(f"job {jt.name!r} prepared for {caller}: {spec.method}, ε={spec.privacy.epsilon:g}, "
                      f"δ={spec.privacy.delta:g}; it starts once every member has prepared it", job_id=job_id,
                      phase="prepared", caller=caller)
        return rec, True

    def cancel(self, job_id: str, reason: str) -> JobRecord:
        assert self.store is not None
        rec = self.store.get(job_id)
        if rec is not None and rec.status == "prepared":  # not started: ends here; the other members learn it
            self.store.request_cancel(job_id)
            if self.store.finish(job_id, "cancelled", reason, only_from=("prepared",)):
                self._release(job_id, reason)
                self.log.info("prepared job cancelled", job_id=job_id, phase="cancelled")
                if self.agreement is not None:
                    self.agreement.notify()
                return self.store.get(job_id)  # type: ignore[return-value]
        rec = self.supervisor.cancel(job_id, reason)
        if rec is None:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"no job {job_id!r} at {self.name}")
        return rec

    # ---- the agreement's decisions (parties.agreement)

    def _agreed(self, job_id: str, how: str) -> None:
        """Every member prepared the job: prepared → queued, for a worker slot."""
        assert self.store is not None and self.agreement is not None
        if self.store.set_queued(job_id, how):
            self.supervisor.enqueue(job_id)
        self.agreement.notify()

    def _abort(self, job_id: str, reason: str) -> None:
        """The prepared job ends here before it started: ``refused`` when a member refused it
        (``reason`` is ``"<CODE>: refused by <member>: …"``, so every member lists who refused and
        why), else ``failed`` (a member lost, no agreement in time); its reservation is released."""
        assert self.store is not None and self.agreement is not None
        rec = self.store.get(job_id)
        if rec is None or rec.status != "prepared":
            return  # cancelled meanwhile (and settled by the cancel)
        # released first: a submission waiting for this budget must never see the job ended but
        # still holding it (only this job's agreement thread could queue it, and it is here)
        note = self._release(job_id, reason)
        status = "refused" if refusal_of(reason) is not None else "failed"
        if self.store.finish(job_id, status, reason + (f"; {note}" if note else ""), only_from=("prepared",)):
            self.log.info(f"job ended before it started: {reason}", job_id=job_id, phase=status, status=status)
        self.agreement.notify()

    def result_files(self, job_id: str) -> list[tuple[str, Path]]:
        return result_files(self.jobs_dir / job_id)

    # ---- budget

    def _reserve(self, job_id: str, digest: str, decision: Admitted) -> None:
        """Reserve the job's event, ordering competing admissions by job id (parties.agreement):
        if the budget is held, but would fit once the jobs with larger ids that are prepared here
        (not yet agreed) were gone, wait for them to be decided and try again; else refuse."""
        if self.ledger is None or decision.dataset is None:
            return  # the dealer: no data, no budget
        assert self.agreement is not None
        ds, agreement = decision.dataset, self.agreement
        give_up = time.monotonic() + float(self.config.peer_timeout_s)
        waiting = logged = False
        try:
            while True:
                try:
                    self.ledger.reserve(job_id, ds, decision.epsilon, decision.delta, digest, decision.event)
                    return
                except BudgetExceeded as exc:
                    held = self._prepared_here(ds, job_id)  # read first, then whether the budget freed meanwhile
                    if self.ledger.fits(ds, decision.event):
                        continue  # a reservation was released between the two reads: try again
                    larger = [j for j in held if j > job_id]
                    if not waiting and larger:
                        with agreement.lock:
                            waiting = self._budget_waits < MAX_BUDGET_WAITS
                            self._budget_waits += waiting
                    if (not waiting or not larger or self._stopping.is_set() or time.monotonic() >= give_up
                            or not self.ledger.fits(ds, decision.event, excluding=larger)):
                        smaller = sorted(j for j in held if j < job_id)
                        order = (f"; job(s) {', '.join(smaller)} prepared here hold it: competing admissions are "
                                 "ordered by job id, the smaller wins" if smaller else "")
                        raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                                      f"privacy budget of {self.name}: {exc}{self._largest_that_fits(decision)}"
                                      f"{order}", public_code="BUDGET",
                                      public=f"{self.name}'s privacy budget for data set {ds!r} has no room for the "
                                             f"job{order}") from None
                    if not logged:
                        self.log.info(f"waiting for budget held by job(s) {', '.join(larger)} (prepared here, "
                                      "larger ids: competing admissions are ordered by job id)", job_id=job_id,
                                      phase="preparing")
                        logged = True
                    agreement.wait(0.25)
                except (JobConflict, UnknownDataset, AdjacencyMismatch) as exc:
                    raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{self.name}: {exc}", public_code="BUDGET",
                                  public=f"{self.name}'s ledger refused the job ({type(exc).__name__})") from None
        finally:
            if waiting:
                with agreement.lock:
                    self._budget_waits -= 1

    def _largest_that_fits(self, decision: Admitted) -> str:
        """For a budget refusal (to the submitting coordinator only): the largest ε this job — its δ,
        rounds and sampling — could ask for now, by the ledger's own admission rule."""
        assert self.ledger is not None and decision.dataset is not None
        if decision.event_at is None:
            return ""
        rel_tol = 0.02
        try:
            found = self.ledger.fitting_bracket(decision.dataset, decision.event_at, decision.epsilon,
                                                rel_tol=rel_tol, time_budget_s=2.0)
        except (ValueError, LedgerError):
            return ""
        if found is None:
            return f"; no ε above {decision.epsilon / 1000:.3g} fits this job now"
        eps, above = found
        # each step calibrates the job's plan; one whose accounting is slow (a member's view of every
        # party) may not narrow the search in the time a refusal may take: say what is known
        short = (f" or more, below {above:.4g} (the search stopped at its time limit)"
                 if above / eps > 1.0 + rel_tol else "")
        return (f"; the largest ε this job (its δ = {decision.delta:g}, rounds and sampling) could ask now: "
                f"{eps:.4g}{short}")

    def _prepared_here(self, dataset: str, job_id: str) -> list[str]:
        """The other jobs on ``dataset`` whose reservation here is not (yet, or any more) that of
        an agreed job: prepared, still being stored (no job record yet), or ending (its
        reservation about to be released)."""
        assert self.ledger is not None and self.store is not None
        out = []
        for r in self.ledger.open_reservations(dataset):
            if r.job_id == job_id or r.state != "reserved":
                continue
            rec = self.store.get(r.job_id)
            if rec is None or rec.status not in ("queued", "running", "succeeded"):
                out.append(r.job_id)
        return out

    def _commit(self, job_id: str) -> None:
        """Keep a succeeded job's budget spent (none was reserved where the job read no data set of
        this member: a compute party of a job with owners)."""
        if self.ledger is not None and self.ledger.get(job_id) is not None:
            try:
                self.ledger.commit(job_id)
            except LedgerError as exc:  # released meanwhile: the worker revealed without a reservation
                self.log.warning(f"ledger: {exc}", job_id=job_id, phase="ledger")

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
                return BUDGET_RELEASED
        except AlreadyRevealed:
            pass
        except LedgerError as exc:
            self.log.warning(f"ledger: {exc}", job_id=job_id, phase="ledger")
            return ""
        self.ledger.commit(job_id)
        return BUDGET_SPENT
