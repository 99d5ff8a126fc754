"""Two-phase admission: a job's worker starts nowhere until every member of the job has prepared it.

Phase 1, PREPARE (``SubmitJob`` at each member, :meth:`parties.daemon.PartyDaemon.submit`): the
member checks the caller, the job, its policy and its budget, reserves the job's event in its
ledger and stores the job ``prepared``. Nothing is queued, no worker starts. A refusal is answered
to the coordinator and remembered here (:meth:`Agreement.remember`, a bounded in-memory table:
job id → public reason) for the job's other members.

Phase 2, AGREE (this module, one thread per prepared job, over the members' mTLS control
channel; the coordinator takes no part, so it may die or be refused by a member meanwhile):

* the job's **first party** (``job.parties[0]``, the same at every member) decides. It asks every
  other member ``GetAdmission`` until, in one round, every answer is ``prepared`` (or
  ``agreed``); then it queues the job here (``prepared → queued``) — the commit point;
* every other member asks only the first party, and queues the job once it answers ``agreed``;
* an answer ``refused`` (the member refused the job, or its copy ended failed or cancelled: the
  reason says who and why, ``"<CODE>: refused by <member>: <public reason>"``) ends the job here
  at once: ``refused`` with that reason (``failed`` where the reason names no refusing member),
  the reservation released; the first party relays it to the others through its own answer, so
  every member ends within a poll or two of the refusal;
* a member that does not know the job for ``UNKNOWN_GRACE_S`` (the coordinator could not submit it
  there, or died first) counts as refusing it (``PEER_LOST``); a member whose daemon cannot be
  reached, or a job still not agreed after ``peer_timeout_s`` (the config's), likewise.

Why one decider rather than every member deciding for itself: a member may abort on a timeout
while another, seeing a moment later that everyone prepared, would start. With one decider a
commit happens in one place, after every member said ``prepared``, and no member that said so
gives up while the decider still answers; the other members merely learn the decision. (A
decider that becomes unreachable after deciding leaves the others to time out: that job fails,
and nothing can be revealed without every member's worker.)

Ordering competing admissions (``PartyDaemon._reserve``): when the ledger refuses a job X because
the data set's budget is held, and the budget *would* fit X were the jobs with larger ids that
are prepared here but not yet agreed gone, X waits (its ``SubmitJob`` is held; asked, this member
answers ``preparing``) until one of them is decided, then tries again; a job that would not fit
even then is refused (``BUDGET``). So a smaller job id waits for a larger one and a larger one
meeting a smaller is refused ("wait-die"): of two identical submissions that fit the budget once,
the smaller id X is refused nowhere unless the larger Y was prepared at *every* member first (then
Y is agreed and X refused everywhere); otherwise Y is refused at a member that had X first, Y
ends everywhere, and X takes the budget it waited for. Why not let the smaller job take the
budget from a prepared larger one at once ("wound-wait"): a member that had already said
``prepared`` for Y would retract it, and if the decider of Y had meanwhile committed, Y would
start at some members and X be refused by them — both would fail. Waiting only ever runs from a
smaller id to a larger one, so waits form no cycle; and every prepared job is decided within
``peer_timeout_s``, so every wait ends: no deadlock.

A member whose worker pool still warms (the daemon takes jobs within seconds of its start, and
its fork server imports torch behind it) answers ``preparing`` (reason ``WARMING``) for its
prepared jobs, and as the decider decides nothing, until the pool is warm: an agreed job's workers
then start at once at every member. The deadline does not run while a member warms (the pool's own
timeout bounds that). A member whose pool cannot start ends its prepared jobs (``PEER_FAILED``).

``GetAdmission`` answers a job's members only (a party or dealer that is not one, or asks about a
job this member never heard of, gets ``unknown``); its reasons are public (codes and wording of
:mod:`parties.public_errors`, job-file fields, member names, the data set id; never a value).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from mpc_erm.jobs.status import refusal_of
from mpc_erm.mpc import tls
from mpc_erm.mpc.party_api import party_pb2 as pb
from mpc_erm.mpc.party_api import party_pb2_grpc as pb_grpc
from mpc_erm.mpc.pki import Identity

from .config import DaemonConfig
from .job_store import JobRecord, JobStore
from .logs import DaemonLog
from .public_errors import code_of, public_failure
from .rendezvous import grpc_options, members

__all__ = ["ASK_TIMEOUT_S", "MAX_REMEMBERED", "STATES", "UNKNOWN_GRACE_S", "WARMING", "Agreement", "decider"]

#: What a member answers (with ``preparing``) while its worker pool warms: a start-up bounded by
#: the pool's own timeout, so the job's deadline does not run meanwhile.
WARMING = "its worker pool warms"
UNKNOWN_GRACE_S = 10.0  # a member that has not heard of a job prepared elsewhere this long counts as refusing it
ASK_TIMEOUT_S = 5.0  # one GetAdmission call
POLL_S = (0.05, 0.05, 0.1, 0.1, 0.2)  # pause between rounds (then the last one): the prepare phase is short
MAX_REMEMBERED = 4096  # refusals remembered for the members' questions (the oldest forgotten first)
STATES = ("unknown", "preparing", "prepared", "agreed", "refused")


def decider(rec: JobRecord) -> str:
    """The member that decides whether the job starts: its first party (the same at every member)."""
    return rec.parties[0]


@dataclass(frozen=True)
class _Refusal:
    reason: str  # "<CODE>: refused by <member>: ..." — public
    members: frozenset[tuple[str, str]] | None  # who may be told (None: not known, the job was not read)


class Agreement:
    """This daemon's side of the two-phase admission: the refusals it remembers, the submissions
    it is deciding, its answers to the other members, and one deciding thread per prepared job.

    ``agreed(job_id, how)`` queues a prepared job; ``abort(job_id, reason)`` ends a prepared job
    failed and releases its reservation (the daemon's; both do nothing to a job that is no
    longer prepared). :attr:`changed` is notified whenever a submission or a prepared job here
    is decided (what a job waiting for budget waits on)."""

    def __init__(self, *, config: DaemonConfig, identity: Identity, store: JobStore, log: DaemonLog,
                 stopping: threading.Event, agreed: Callable[[str, str], None],
                 abort: Callable[[str, str], None], pool: Callable[[], str] = lambda: "") -> None:
        """``pool``: "" once this daemon's worker pool can start an agreed job's worker at once,
        ``"warming"`` before, else the public reason it will start none (it ends its prepared jobs)."""
        self.name = config.identity.name
        self._pool = pool
        self.peers = config.peers
        self.deadline_s = float(config.peer_timeout_s)
        self.identity = identity
        self.store = store
        self.log = log
        self._stopping = stopping
        self._agreed, self._abort = agreed, abort
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self._refused: collections.OrderedDict[str, _Refusal] = collections.OrderedDict()
        self._deciding: collections.Counter[str] = collections.Counter()
        self._threads: dict[str, threading.Thread] = {}

    # ---- bookkeeping (called by the daemon)

    @contextlib.contextmanager
    def submitting(self, job_id: str) -> Iterator[None]:
        """While a submission of ``job_id`` is decided here, the job's members are told ``preparing``."""
        with self.changed:
            self._deciding[job_id] += 1
        try:
            yield
        finally:
            with self.changed:
                self._deciding[job_id] -= 1
                if self._deciding[job_id] <= 0:
                    del self._deciding[job_id]
                self.changed.notify_all()

    def remember(self, job_id: str, reason: str, job_members: list[tuple[str, str]] | None = None) -> None:
        """Remember why ``job_id`` was refused (or ended) here, for the members' questions."""
        with self.changed:
            self._refused[job_id] = _Refusal(reason, None if job_members is None else frozenset(job_members))
            self._refused.move_to_end(job_id)
            while len(self._refused) > MAX_REMEMBERED:
                self._refused.popitem(last=False)
            self.changed.notify_all()

    def forget(self, job_id: str) -> None:
        """The job is held here after all (submitted again, and prepared): its record answers now."""
        with self.changed:
            self._refused.pop(job_id, None)

    def notify(self) -> None:
        """A prepared job here was decided (or cancelled): wake the submissions waiting for budget."""
        with self.changed:
            self.changed.notify_all()

    def wait(self, timeout: float) -> None:
        with self.changed:
            self.changed.wait(timeout)

    def start(self, rec: JobRecord) -> None:
        """Decide (or learn the decision on) the prepared job ``rec`` in a thread of its own."""
        t = threading.Thread(target=self._run, args=(rec,), name=f"agree-{rec.id[:12]}", daemon=True)
        with self.lock:
            self._threads = {j: th for j, th in self._threads.items() if th.is_alive()}
            self._threads[rec.id] = t
        t.start()

    def join(self, timeout: float) -> None:
        """Wait for the deciding threads (the daemon stops: they return at their next round)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            threads = list(self._threads.values())
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    # ---- this daemon's answer to another member

    def answer(self, job_id: str, caller: tls.Peer, digest: str) -> tuple[str, str]:
        """(state, public reason) of ``job_id`` here, for the member ``caller`` (see STATES)."""
        who = (caller.name, caller.role)
        with self.lock:  # before the store: a submission ending meanwhile is then found there
            remembered = self._refused.get(job_id)
            deciding = self._deciding.get(job_id, 0) > 0
        rec = self.store.get(job_id)
        if rec is not None:
            if who not in members(rec):  # as for an unknown id: a non-member learns nothing
                self.log.warning(f"GetAdmission refused: {caller} is not a member of job {rec.id}", job_id=rec.id,
                                 phase="refused", caller=str(caller))
                return "unknown", ""
            if digest and digest != rec.digest:
                return "refused", (f"AGREEMENT: refused by {self.name}: {self.name} holds another job under this id "
                                   f"(spec digest {rec.digest[:12]}…, not {digest[:12]}…)")
            if rec.status == "prepared":  # prepared here, but not while the pool warms: no worker could start
                pool = self._pool()
                return ("preparing", WARMING) if pool == "warming" else ("refused", pool) if pool else ("prepared", "")
            if rec.status in ("queued", "running", "succeeded"):
                return "agreed", ""
            if remembered is not None:
                return "refused", remembered.reason
            refusal = refusal_of(rec.reason) if rec.status == "refused" else None
            if refusal is not None:  # after a restart: the refusal it recorded, relayed as it heard it
                return "refused", str(refusal)
            code = code_of(rec.reason) or ("CANCELLED" if rec.status == "cancelled" else "PEER_FAILED")
            never = " (it never started there)" if rec.started_at is None else ""
            return "refused", f"{code}: the job is {rec.status} at {self.name}{never}"
        if remembered is not None and (remembered.members is None or who in remembered.members):
            return "refused", remembered.reason
        return ("preparing", "") if deciding else ("unknown", "")

    # ---- deciding one prepared job

    def _run(self, rec: JobRecord) -> None:
        try:
            self._decide(rec)
        except Exception as exc:  # never leave a job prepared for ever because of a bug or a full disk here
            self.log.exception("admission agreement error", job_id=rec.id, phase="agreement")
            with contextlib.suppress(Exception):
                self._abort(rec.id, public_failure(exc, member=self.name, job_id=rec.id, phase="admission")[1])

    def _decide(self, rec: JobRecord) -> None:
        me, lead = self.name, decider(rec)
        ask = [(m, r) for m, r in members(rec) if m != me] if me == lead else [(lead, "party")]
        channels: dict[str, grpc.Channel] = {}
        t0 = time.monotonic()
        unknown_since: dict[str, float] = {}
        heard = t0  # a member that is not the decider gives up only while the decider does not answer prepared
        rounds = 0
        try:
            for m, role in ask:
                peer = self.peers.get(m)
                if peer is None:  # admission checked the job's members are our peers
                    self._end(rec, f"JOB_SPEC: refused by {me}: {m!r} is not among {me}'s peers")
                    return
                channels[m] = tls.secure_channel(peer.address, self.identity, m, grpc_options(), expected_role=role)
            stubs = {m: pb_grpc.PartyControlStub(ch) for m, ch in channels.items()}
            request = pb.AdmissionRequest(job_id=rec.id, spec_digest=rec.digest)
            while not self._stopping.is_set():
                cur = self.store.get(rec.id)
                if cur is None or cur.status != "prepared":
                    return  # cancelled meanwhile: the daemon settled it
                pool = self._pool()
                if pool not in ("", "warming"):  # the worker pool failed: this member will run nothing
                    self._end(rec, pool)
                    return
                answers = self._ask(stubs, request)
                now = time.monotonic()
                pending: list[str] = []
                for m, (state, reason) in answers.items():
                    if state == "refused":
                        self._end(rec, reason or f"PEER_FAILED: refused by {m}")
                        return
                    if state == "unknown":
                        since = unknown_since.setdefault(m, now)
                        if now - since >= UNKNOWN_GRACE_S:
                            self._end(rec, f"PEER_LOST: {m} had not heard of the job {now - since:.1f} s after {me} "
                                           f"prepared it (the coordinator could not submit it there, or {m} refused it "
                                           "before a restart)")
                            return
                    else:
                        unknown_since.pop(m, None)
                    if state == "agreed" or (state == "prepared" and me == lead):
                        continue
                    if state == "prepared" or reason == WARMING:  # the decider has not decided yet, or a
                        heard = now  # member's pool warms (bounded by its own timeout): the deadline waits
                    pending.append(f"{m}: {state}" + (f" ({reason})" if reason else ""))
                if pool == "warming" and me == lead:  # the decider decides once its own pool is warm
                    pending.append(f"{me}: preparing ({WARMING})")
                    heard = now
                if not pending:
                    how = ("every member prepared it" if me == lead
                           else f"{lead} saw every member prepare it")
                    self.log.info(f"admission agreed: {how} ({now - t0:.2f} s); queued", job_id=rec.id,
                                  phase="agreed")
                    self._agreed(rec.id, f"{how}: queued for a worker slot")
                    return
                if now - heard >= self.deadline_s:
                    self._end(rec, f"PEER_LOST: the job was not agreed within {self.deadline_s:g} s (peer_timeout_s) "
                                   f"at {me}: {'; '.join(pending)}"[:480])
                    return
                time.sleep(POLL_S[min(rounds, len(POLL_S) - 1)])
                rounds += 1
        finally:
            for ch in channels.values():
                ch.close()

    def _ask(self, stubs: dict[str, Any], request: pb.AdmissionRequest) -> dict[str, tuple[str, str]]:
        """Every member's answer, asked at once: (state, reason); ("unreachable", why) if none came."""
        calls = {m: s.GetAdmission.future(request, timeout=ASK_TIMEOUT_S) for m, s in stubs.items()}
        out: dict[str, tuple[str, str]] = {}
        for m, call in calls.items():
            try:
                reply = call.result()
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                if code == grpc.StatusCode.UNIMPLEMENTED:  # a daemon of a version without two-phase admission
                    out[m] = ("refused", f"AGREEMENT: refused by {m}: {m}'s daemon does not take part in the "
                                         "two-phase admission (an older version)")
                else:
                    out[m] = ("unreachable", code.name)
                continue
            state = reply.state if reply.state in STATES else "unknown"
            out[m] = (state, " ".join(reply.reason.split())[:500])
        return out

    def _end(self, rec: JobRecord, reason: str) -> None:
        """End the prepared job here for ``reason`` (which names who refused it), and remember
        it for the members that ask this member next."""
        self.remember(rec.id, reason, members(rec))
        self.log.warning(f"admission refused: {reason}", job_id=rec.id, phase="refused")
        self._abort(rec.id, reason)
