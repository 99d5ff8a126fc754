"""The daemon's gRPC face (``PartyControl``): who may call what, each call mapped to the daemon,
job records turned into replies, results streamed in chunks. The decisions are the daemon's
(``submit``/``cancel``), the rendezvous' (``GetEndpoint``) and the admission agreement's
(``GetAdmission``, :mod:`parties.agreement`); here they become gRPC statuses.

Failure reasons: a job's ``reason`` leaves the party (``GetStatus``/``Watch``/``ListJobs``/
``GetResult`` to the coordinator), which is why a worker's failure is recorded as ``"<CODE>: <public
reason>"`` (:mod:`parties.public_errors`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc

from mpc_erm.mpc import tls
from mpc_erm.mpc.party_api import party_pb2 as pb
from mpc_erm.mpc.party_api import party_pb2_grpc as pb_grpc

from .admission import Refused
from .config import DaemonConfig
from .job_store import JobRecord, content_digest

if TYPE_CHECKING:
    from .daemon import PartyDaemon
    from .rendezvous import Rendezvous

__all__ = ["COORDINATOR_METHODS", "SERVICE", "Servicer", "control_policy"]

SERVICE = "/mpc_erm.v1.PartyControl"
COORDINATOR_METHODS = ("SubmitJob", "GetStatus", "Watch", "Cancel", "ListJobs", "GetResult")
RESULT_CHUNK_BYTES = 1 << 20


def control_policy(cfg: DaemonConfig) -> tls.Policy:
    """Who may call what: the coordinator methods only the allowed coordinators; GetEndpoint and
    GetAdmission any party or dealer, GetEndpoint also a data owner (job membership and the
    service an owner may ask for are checked per request), GetOwnerRelease and GetOwnerJob only a
    data owner (the job's: checked per request); Health anyone of
    this CA. SubmitJob lets any coordinator through to the daemon, which refuses one not in
    ``policy.allowed_coordinators`` itself (:func:`parties.admission.check_caller`, the same
    status and message) so that the job's other members learn of the refusal at once."""
    coordinators = [("coordinator", n) for n in cfg.policy.allowed_coordinators]
    policy: dict[str, list[tuple[str, str]]] = {f"{SERVICE}/{m}": coordinators for m in COORDINATOR_METHODS}
    policy[f"{SERVICE}/SubmitJob"] = [("coordinator", tls.WILDCARD)]
    for m in ("GetEndpoint", "GetAdmission"):
        policy[f"{SERVICE}/{m}"] = [("party", tls.WILDCARD), ("dealer", tls.WILDCARD)]
    policy[f"{SERVICE}/GetEndpoint"].append(("owner", tls.WILDCARD))  # a job's owners: its owner intake only
    for m in ("GetOwnerRelease", "GetOwnerJob"):  # a job's owners: checked per request
        policy[f"{SERVICE}/{m}"] = [("owner", tls.WILDCARD)]
    policy[f"{SERVICE}/Health"] = [(tls.WILDCARD, tls.WILDCARD)]
    return policy


class Servicer(pb_grpc.PartyControlServicer):
    def __init__(self, daemon: PartyDaemon, rendezvous: Rendezvous) -> None:
        self.d = daemon
        self.rendezvous = rendezvous

    def _record(self, job_id: str, context: grpc.ServicerContext) -> JobRecord:
        assert self.d.store is not None
        rec = self.d.store.get(job_id)
        if rec is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {job_id!r} at {self.d.name}")
        return rec  # type: ignore[return-value]

    def job_info(self, rec: JobRecord) -> pb.JobInfo:
        assert self.d.store is not None
        last = self.d.store.last_event(rec.id)
        progress = self.d.store.last_event(rec.id, with_key="round")
        return pb.JobInfo(
            job_id=rec.id, name=rec.name, status=rec.status, reason=rec.reason or "", spec_digest=rec.digest,
            dataset=rec.dataset or "", method=rec.method or "", created_at=rec.created_at,
            started_at=rec.started_at or 0.0, ended_at=rec.ended_at or 0.0,
            summary_json="" if rec.summary is None else json.dumps(rec.summary),
            coordinator=rec.coordinator or "", member=self.d.name, parties=list(rec.parties), dealer=rec.dealer or "",
            last_phase="" if last is None else last.phase,
            progress_json="" if progress is None else json.dumps(progress.payload),
            cancel_requested=rec.cancel_requested,
        )

    def SubmitJob(self, request: pb.SubmitRequest, context: grpc.ServicerContext) -> pb.SubmitReply:
        caller = tls.peer(context)
        try:
            rec, new = self.d.submit(request.job_id, request.job_toml, caller.name)
        except Refused as exc:
            self.d.log.warning(f"job refused: {exc.message}", job_id=request.job_id[:64] or None, phase="refused",
                               caller=str(caller), code=exc.code.name)
            context.abort(exc.code, exc.message)
        return pb.SubmitReply(job_id=rec.id, accepted=True, reason="" if new else "already submitted",
                              spec_digest=rec.digest, member=self.d.name, status=rec.status)

    def GetStatus(self, request: pb.JobRef, context: grpc.ServicerContext) -> pb.JobInfo:
        return self.job_info(self._record(request.job_id, context))

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
            if rec.terminal or not request.follow or not context.is_active() or self.d.stopping:
                return  # terminal: its event was written with the status, so it was just sent
            store.wait(0.5)

    def Cancel(self, request: pb.CancelRequest, context: grpc.ServicerContext) -> pb.CancelReply:
        caller = tls.peer(context)
        reason = f"cancelled by {caller.name}" + (f": {request.reason}" if request.reason else "")
        try:
            rec = self.d.cancel(request.job_id, reason)
        except Refused as exc:
            context.abort(exc.code, exc.message)
        return pb.CancelReply(job_id=rec.id, status=rec.status, reason=rec.reason or "")

    def ListJobs(self, request: pb.ListRequest, context: grpc.ServicerContext) -> pb.ListReply:
        assert self.d.store is not None
        return pb.ListReply(jobs=[self.job_info(r) for r in self.d.store.list(limit=request.limit)])

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
        return self.rendezvous.get_endpoint(rec, caller, request, context)

    def _owners_record(self, job_id: str, context: grpc.ServicerContext) -> JobRecord:
        """The job's record for one of its data owners; NOT_FOUND for anyone else, as for an unknown
        id (a non-member learns nothing)."""
        from .rendezvous import job_owners

        rec = self._record(job_id, context)
        if tls.peer(context).name not in job_owners(rec):
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {job_id!r} at {self.d.name}")
        return rec

    def GetOwnerJob(self, request: pb.JobRef, context: grpc.ServicerContext) -> pb.OwnerJobState:
        rec = self._owners_record(request.job_id, context)
        ended = rec.terminal and rec.status != "succeeded"  # a job's reason is public ("<CODE>: ...")
        return pb.OwnerJobState(job_id=rec.id, member=self.d.name, status=rec.status,
                                reason=(rec.reason or "") if ended else "")

    def GetOwnerRelease(self, request: pb.OwnerReleaseRequest, context: grpc.ServicerContext) -> pb.OwnerRelease:
        from parties.owner.intake import state_bytes

        from .owner.release import read_release

        rec = self._owners_record(request.job_id, context)
        kept = read_release(self.d.jobs_dir / rec.id)
        if kept is None or kept.job_id != rec.id:
            if not rec.terminal:
                context.abort(grpc.StatusCode.NOT_FOUND, f"job {rec.id}: no release kept at {self.d.name} yet (the "
                                                         f"job is {rec.status})")
            # ended: it will never come here (a damaged file is never served)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"job {rec.id}: {self.d.name} keeps no release of it (the job {rec.status}"
                          + ("; its kept release is missing or unreadable)" if rec.status == "succeeded" else
                             " without releasing)"))
        assert kept is not None
        if request.round != kept.round:  # an ended job keeps no other: it will never come
            context.abort(grpc.StatusCode.FAILED_PRECONDITION if rec.terminal else grpc.StatusCode.NOT_FOUND,
                          f"round: {request.round} is not kept at {self.d.name}, only the job's last release "
                          f"(round {kept.round})")
        return pb.OwnerRelease(job_id=rec.id, round=kept.round, state=state_bytes(kept.state),
                               shape=list(kept.state.shape), owners_counted=kept.roster.count,
                               spec_digest=kept.spec_digest, member=self.d.name, signatures=list(kept.signatures),
                               counted=kept.roster.counted, refused_owners=kept.roster.refused)

    def GetAdmission(self, request: pb.AdmissionRequest, context: grpc.ServicerContext) -> pb.AdmissionReply:
        assert self.d.agreement is not None
        state, reason = self.d.agreement.answer(request.job_id, tls.peer(context), request.spec_digest)
        return pb.AdmissionReply(job_id=request.job_id, member=self.d.name, state=state, reason=reason)

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("mpc-erm")
        except PackageNotFoundError:
            v = "unknown"
        assert self.d.store is not None
        running = self.d.supervisor.running()
        queued = len(self.d.store.list(statuses=("queued",)))
        return pb.HealthReply(name=self.d.name, role=self.d.role, version=v,
                              uptime_s=time.time() - self.d.started_at, queued=queued, running=running,
                              starting=self.d.starting, warming=self.d.warming)
