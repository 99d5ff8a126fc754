"""How a job's workers find each other: each publishes its transport address to its own daemon,
and looks the others' up from their daemons (``GetEndpoint``, mTLS, members of the job only).

Why the admission check is here: a member queues a job as soon as it learns that every member
prepared it (:mod:`parties.agreement`), and the job's worker then waits (up to the config's
``peer_timeout_s``) for every other member's worker to publish. Two jobs agreed at the same moment
can be queued at two daemons in opposite orders (as two coordinators submitting at the same instant
could do before admission was two-phase); with one job at a time each daemon then ran the job the
other had queued, and both failed after the 120 s look-up wait. With several slots both simply run.
At the bound the same cross-queueing can still deadlock: daemon A's slots all hold jobs queued at B
while B's slots all hold jobs queued at A. ``GetEndpoint`` for a job that waits for a slot answers
at once (NOT_FOUND with ``mpc-erm-admission`` trailing metadata: the ids of the jobs holding this
daemon's slots), and the asking daemon checks for exactly that cycle; if found, the cycle's job
with the largest id (the same choice on both sides) fails at once with a reason naming another job
of the cycle, which frees its slot so the rest proceed (if the daemon running that job does not act
within ``ADMISSION_GRACE_S``, e.g. its job waits on a third member, the asking side fails its own
largest). Nothing was revealed (no member can have all endpoints of a job still queued at one of
them), so its budget is released and it can be resubmitted. A job that merely waits for a busy peer
(no cycle) keeps waiting, up to the worker's look-up limit; so does a cycle through three or more
daemons with no two-daemon cycle in it (not detected). With fewer simultaneous jobs than the bound
nothing of this arises (tests/reliability/test_concurrency.py).

``GetEndpoint`` tells another member (whose worker waits for this one's transport, and which
records what it hears in its own job table and log) only the job's status and its reason's code.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import grpc

from mpc_erm.mpc import tls
from mpc_erm.mpc.party_api import party_pb2 as pb
from mpc_erm.mpc.party_api import party_pb2_grpc as pb_grpc
from mpc_erm.mpc.pki import Identity

from .admission import JOB_ID_RE
from .config import DaemonConfig
from .job_store import JobRecord, JobStore
from .logs import DaemonLog
from .public_errors import code_of
from .supervision import ENDPOINT_SERVICES, Run, Supervisor, endpoint_key

__all__ = ["ADMISSION_GRACE_S", "ADMISSION_KEY", "ADMISSION_POLL_S", "MAX_ENDPOINT_WAIT_S", "Rendezvous",
           "admission_of", "grpc_options", "members"]

MAX_MESSAGE_BYTES = 64 << 20
MAX_ENDPOINT_WAIT_S = 30.0
OWNER_ENDPOINT_WAIT_S = 1.0  # the longest a data owner's GetEndpoint holds a control thread
ADMISSION_KEY = "mpc-erm-admission"  # GetEndpoint trailing metadata: the job waits for a slot here
ADMISSION_POLL_S = 1.0  # how often a job asks again while a peer has it queued behind a full daemon
ADMISSION_GRACE_S = 30.0  # a deadlock whose loser runs at the peer: how long to let the peer break it


def grpc_options() -> list[tuple[str, Any]]:
    """The control channel's message limits (this daemon's server and its calls to peers' daemons)."""
    return [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


def members(rec: JobRecord) -> list[tuple[str, str]]:
    """The job's members as (name, role)."""
    return [(p, "party") for p in rec.parties] + ([(rec.dealer, "dealer")] if rec.dealer else [])


def job_owners(rec: JobRecord) -> frozenset[str]:
    """The data owners a job lists (none for a job of parties only)."""
    return _owners_of(rec.job_toml)


@functools.lru_cache(maxsize=64)
def _owners_of(job_toml: str) -> frozenset[str]:
    """Parsed once per job text: every owner asks each compute party's daemon for the endpoint."""
    from mpc_erm.jobs.jobfile import parse_job_file

    return frozenset(parse_job_file(job_toml).job.owners)


def admission_of(exc: grpc.RpcError) -> list[str] | None:
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


class Rendezvous:
    """Endpoints between this daemon's workers and the other members' daemons, over the slots of
    ``slots`` (its ``runs``, ``endpoints`` and ``max_jobs``, read under its lock)."""

    def __init__(self, *, config: DaemonConfig, identity: Identity, store: JobStore, slots: Supervisor,
                 stopping: threading.Event, log: DaemonLog) -> None:
        self.name = config.identity.name
        self.peers = config.peers
        self.identity = identity
        self.store = store
        self.slots = slots
        self.log = log
        self._stopping = stopping

    # ---- this daemon's side: GetEndpoint

    def get_endpoint(self, rec: JobRecord, caller: tls.Peer, request: pb.EndpointRequest,
                     context: grpc.ServicerContext) -> pb.EndpointReply:
        """Answer a member's ``GetEndpoint`` for ``rec`` (aborts the call with the reason)."""
        service = request.service
        if service not in ENDPOINT_SERVICES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"service: one of {list(ENDPOINT_SERVICES)}, got "
                                                            f"{service[:32]!r}")
        member = (caller.role == "owner" and caller.name in job_owners(rec)) if service == "owners" else \
            (caller.name, caller.role) in members(rec)
        if not member:
            # answered exactly as for an unknown id: a non-member learns nothing, not even that the job exists
            self.log.warning(f"GetEndpoint refused: {caller} is not a member of job {rec.id}", job_id=rec.id,
                             phase="refused", caller=str(caller), code=grpc.StatusCode.NOT_FOUND.name)
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id!r} at {self.name}")
        if request.member and request.member != self.name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"member: this daemon is {self.name}, "
                                                            f"not {request.member}")
        if rec.terminal:  # another member learns the status and the reason's public code, not its text
            code = code_of(rec.reason)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job {rec.id} is {rec.status} at {self.name}"
                          + (f": {code}: see {self.name}'s status" if code else ""))
        # an owner's look-up waits briefly and asks again: hundreds of owners each holding a control
        # thread for MAX_ENDPOINT_WAIT_S starved the members' own look-ups (their workers never met)
        wait = request.wait_s if caller.role != "owner" else min(request.wait_s, OWNER_ENDPOINT_WAIT_S)
        address = self.endpoint(rec.id, wait, service)
        if address is None:
            running = self.queued_behind(rec.id)
            if running is not None:  # queued behind full slots: tell the asker which jobs hold them
                context.set_trailing_metadata(((ADMISSION_KEY, ",".join(running)),))
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"job {rec.id} is queued at {self.name}: all {self.slots.max_jobs} slots "
                              f"(max_concurrent_jobs) are busy")
            context.abort(grpc.StatusCode.NOT_FOUND, f"job {rec.id}: {self.name}'s worker has not published "
                                                     "its endpoint yet")
        return pb.EndpointReply(job_id=rec.id, member=self.name, address=address)

    def endpoint(self, job_id: str, wait_s: float, service: str = "") -> str | None:
        """The job's published worker address (of ``service``: :data:`ENDPOINT_SERVICES`), waiting
        up to ``wait_s``; None at once if the job waits for a slot here (see :meth:`queued_behind`),
        is being cancelled, or the daemon stops."""
        slots = self.slots
        key = endpoint_key(job_id, service)
        deadline = time.monotonic() + max(0.0, min(wait_s, MAX_ENDPOINT_WAIT_S))
        with slots.changed:
            while key not in slots.endpoints:
                left = deadline - time.monotonic()
                run = slots.runs.get(job_id)
                if (left <= 0 or self._stopping.is_set() or (run is not None and run.cancel_at is not None)
                        or (run is None and len(slots.runs) >= slots.max_jobs)):
                    return None
                slots.changed.wait(min(left, 0.5))
            return slots.endpoints[key]

    def queued_behind(self, job_id: str) -> list[str] | None:
        """If ``job_id`` is queued here behind ``max_jobs`` running jobs: the ids of those jobs
        (what a peer needs to see a cross-queueing deadlock); else None."""
        with self.slots.lock:
            if job_id in self.slots.runs or len(self.slots.runs) < self.slots.max_jobs:
                return None
            running = sorted(self.slots.runs)
        rec = self.store.get(job_id)
        return running if rec is not None and rec.status == "queued" else None

    # ---- the other side: a worker's look-up of a member

    def resolve(self, run: Run, member: str, timeout_s: float) -> str:
        """``member``'s published transport address for this job, from its daemon (mTLS, pinned)."""
        roles = dict(members(run.record))
        if member not in roles:
            raise ValueError(f"{member!r} is not a member of job {run.job_id}")
        deadline = time.monotonic() + timeout_s
        slots = self.slots
        if member == self.name:
            with slots.changed:
                while run.job_id not in slots.endpoints:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"{member!r} (this daemon's own worker) published no endpoint in time")
                    slots.changed.wait(min(left, 0.5))
                return slots.endpoints[run.job_id]
        peer = self.peers.get(member)
        if peer is None:
            raise ValueError(f"{member!r} is not among {self.name}'s peers")
        role = roles[member]
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
                    peer_running = admission_of(exc) if code == grpc.StatusCode.NOT_FOUND else None
                    if peer_running is not None:  # queued there behind full slots: a cycle with us?
                        pause = ADMISSION_POLL_S
                        failed, cycle_since = self._break_cross_queueing(run, member, stub, peer_running,
                                                                         cycle_since)
                        if failed:
                            raise RuntimeError(run.cancel_reason) from None
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))

    def _queued_here(self) -> set[str]:
        return {r.id for r in self.store.list(statuses=("queued",))}

    def _break_cross_queueing(self, run: Run, member: str, stub: Any, peer_running: list[str],
                              since: float | None) -> tuple[bool, float | None]:
        """``run`` waits for a slot at ``member``, whose slots hold ``peer_running``. A deadlock:
        every job running there is queued here, and every job running here is queued there (so
        neither daemon can free a slot). Then the largest job id of the two sets fails, on the
        daemon that runs it (both sides pick the same); if the other side has not acted after
        ``ADMISSION_GRACE_S`` (it may be waiting on a third member), this side fails its own
        largest. Returns (whether ``run`` itself was failed, when the cycle was first seen)."""
        with self.slots.lock:
            mine = {j: r for j, r in self.slots.runs.items() if r.cancel_at is None}
            full = len(self.slots.runs) >= self.slots.max_jobs
            freeing = len(mine) < len(self.slots.runs)  # a job here is ending: its slot frees soon
        queued = self._queued_here()
        if not full or freeing or not peer_running or not set(peer_running) <= queued:
            return False, None
        for job_id in sorted(set(mine) - {run.job_id}):  # is each of ours queued at the peer, behind its slots?
            if member not in dict(members(mine[job_id].record)):
                return False, None  # it does not need the peer: it can finish and free a slot
            try:
                stub.GetEndpoint(pb.EndpointRequest(job_id=job_id, member=member, wait_s=0.0), timeout=10.0)
                return False, None  # running there
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND or not admission_of(exc):  # type: ignore[attr-defined]
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
        self.slots.fail(mine[loser], reason, phase="deadlock")
        return loser == run.job_id, since
