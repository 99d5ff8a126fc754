"""A party's records of what a job spends, as its job worker hands them to the run's
:class:`~mpc_erm.runs.RevealGuard` (which orders them: check, then reveal, then charge).

Here only what is the party's own: room for the records before the job starts, and each record
that cannot be written (a full disk, an I/O error) turned into a public STORAGE failure that
names what was and was not revealed."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator

from torch import Tensor

from mpc_erm.privacy.events import DpEvent
from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.runs import PROGRESS_EVERY, ChargeFacts, CurvePoint, RevealGuard

from .audit import AuditLog
from .context import JobCancelled, WorkerContext
from .ledger import Ledger
from .public_errors import PublicError, storage_problem

__all__ = ["PROGRESS_EVERY", "RecordedAudit", "RecordedLedger", "WorkerProgress", "check_room", "party_audit",
           "party_guard"]

AUDIT_RECORD_BYTES = 600  # a release record is ~450 bytes, a charge with its mechanism ~700
SQLITE_FRAME_BYTES = 4096 + 24  # one WAL frame: what a ledger mark or a job-table event adds
SPACE_MARGIN_BYTES = 1 << 20  # results (model, report, metrics, curve), log lines, SQLite checkpoints


log = logging.getLogger(__name__)


def check_room(ctx: WorkerContext) -> None:
    """Refuse the job, before anything is revealed or spent anywhere, when this party's state
    directory cannot hold what the job will write there: one audit record per round and the charge,
    a ledger mark per round (a WAL frame; the WAL stops growing at SQLite's 1000-frame checkpoint),
    a job-table event per ``PROGRESS_EVERY`` rounds, and a margin for the results."""
    if ctx.ledger_path is None:
        return
    spec = ctx.job.spec
    rounds = 1 if spec.method == "output" else int(spec.training.iterations)
    audit = (rounds + 2) * AUDIT_RECORD_BYTES
    need = (audit + (min(rounds, 1000) + 16) * SQLITE_FRAME_BYTES
            + (rounds // PROGRESS_EVERY + 16) * SQLITE_FRAME_BYTES + SPACE_MARGIN_BYTES)
    st = os.statvfs(ctx.ledger_path.parent)
    free = st.f_bavail * st.f_frsize
    if free < need:
        me = ctx.identity.name
        raise PublicError("STORAGE", f"the state directory of {me} has {free} bytes free; the job's audit records "
                                     f"need ~{audit} ({rounds} round(s)), ~{need} with the ledger's and job table's "
                                     f"pages and a {SPACE_MARGIN_BYTES >> 20} MiB margin; nothing was revealed: free "
                                     "space there and submit the job again")


def _unrecorded(ctx: WorkerContext, exc: BaseException, what: str, then: str) -> PublicError:
    """This party could not write ``what`` (disk full, I/O error): a public STORAGE failure."""
    why = storage_problem(exc) or type(exc).__name__
    return PublicError("STORAGE", f"{ctx.identity.name} could not record {what} ({why}): {then}; see "
                                  f"{ctx.identity.name}'s log", f"{what}: {exc}")


class RecordedLedger:
    """The party's ledger, whose failed mark (one transaction: nothing of it was written) stops the
    job before the round is revealed, with a public STORAGE reason."""

    def __init__(self, ctx: WorkerContext, ledger: Ledger) -> None:
        self.ctx, self.ledger = ctx, ledger

    def mark_revealed(self, job_id: str, dp_event: DpEvent, *, rounds: int) -> object:
        try:
            return self.ledger.mark_revealed(job_id, dp_event, rounds=rounds)
        except (OSError, sqlite3.OperationalError) as exc:
            raise _unrecorded(self.ctx, exc, f"round {rounds} in its ledger", f"round {rounds} was not "
                              "revealed") from exc


class RecordedAudit:
    """The audit log, whose failed append (it leaves the log as it was: parties.audit) ends the job
    with a public STORAGE reason. The charge comes before the first reveal, so it fails with nothing
    revealed (the ledger, marked first, keeps that round as spent); a release record comes after its
    reveal, so the job stops there and the rounds revealed stay charged (the daemon commits them)."""

    def __init__(self, ctx: WorkerContext, log: AuditLog) -> None:
        self.ctx, self.log = ctx, log

    def charge(self, job_id: str, *, dataset: str, epsilon: float, delta: float, spec_digest: str,
               dp_event: dict[str, object]) -> object:
        try:
            return self.log.charge(job_id, dataset=dataset, epsilon=epsilon, delta=delta, spec_digest=spec_digest,
                                   dp_event=dp_event)
        except OSError as exc:
            raise _unrecorded(self.ctx, exc, "the job's charge in its audit log", "nothing was revealed; its "
                              "ledger keeps the round it marked just before as spent") from exc

    def release(self, job_id: str, *, what: str, value: Tensor, round: int, rounds: int) -> object:
        try:
            return self.log.release(job_id, what=what, value=value, round=round, rounds=rounds)
        except OSError as exc:
            raise _unrecorded(self.ctx, exc, f"the release of round {round} of {rounds} in its audit log",
                              f"the job stops; the {round} round(s) revealed stay charged") from exc

    def head(self) -> str:
        return str(self.log.head())


def party_audit(ctx: WorkerContext) -> RecordedAudit | None:
    """The party's hash-chained audit log (parties.audit) in its state dir; None without one (the
    dealer, a stand-in context)."""
    if ctx.ledger_path is None:
        return None
    return RecordedAudit(ctx, AuditLog.in_state_dir(ctx.ledger_path.parent))


def record_refused(ctx: WorkerContext, audit: RecordedAudit | None, round_: int, members: list[str], bound: float,
                   phase: str) -> None:
    """Members whose contribution to round ``round_`` (from 1) failed the bound check on its
    shares and was left out: named (public identities, never a value) in this party's log, the
    job's events and its audit log (an append that fails raises its ``OSError``)."""
    log.warning("job %s round %d: the contribution of %s failed the bound check and was left out", ctx.job_id,
                round_, ", ".join(members))
    ctx.emit({"phase": phase, "message": f"round {round_}: left out {', '.join(members)} (contribution outside its "
                                         "public bound)", "refused": members})
    if audit is not None:
        audit.log.refused(ctx.job_id, round=round_, members=members, bound=bound)


class WorkerProgress:
    """A run's progress at a party: public events to the daemon's job table, each curve point,
    private part included, to the job's ``.private/progress.jsonl`` (``mpc-erm party progress``),
    which the daemon never serves."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx

    def event(self, event: dict[str, object]) -> None:
        self.ctx.emit(dict(event))

    def point(self, point: CurvePoint) -> None:
        private = self.ctx.job_dir / ".private"
        with contextlib.suppress(OSError):  # progress is a convenience: a full disk must not fail the job here
            private.mkdir(parents=True, mode=0o700, exist_ok=True)
            with open(private / "progress.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(point.as_dict(), default=float) + "\n")


def _check_cancel(ctx: WorkerContext) -> None:
    if ctx.cancelled():
        raise JobCancelled("cancelled by the coordinator")


@contextlib.contextmanager
def party_guard(ctx: WorkerContext, plan: PrivacyPlan, *, spends: bool,
                extra: Callable[[], dict[str, float]] | None = None) -> Iterator[RevealGuard]:
    """The reveal guard of a party's job: its ledger and audit log when the job ``spends`` this
    party's data (a compute party serving data owners holds none: its owners charge theirs)."""
    job = ctx.job
    facts = ChargeFacts(ctx.job_id, job.job.dataset, job.spec.privacy.epsilon, job.spec.privacy.delta,
                        job.spec_digest())
    ledger = Ledger(ctx.ledger_path) if spends and ctx.ledger_path is not None else None
    try:
        yield RevealGuard(plan, facts, check=lambda: _check_cancel(ctx),
                          ledger=None if ledger is None else RecordedLedger(ctx, ledger),
                          audit=party_audit(ctx) if spends else None, progress=WorkerProgress(ctx), extra=extra)
    finally:
        if ledger is not None:
            ledger.close()
