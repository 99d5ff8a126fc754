"""A member's mailbox server: the ShareTransport gRPC service over mutual TLS.

Checks, in order, before a byte of payload is read: the caller is an authenticated party or
dealer of this deployment (``tls.Authorizer`` on the method), the job is registered here, the
claimed ``src`` rank belongs to the TLS identity of the caller in that job's party table (a peer
cannot send as someone else), ``dst`` is the member this mailbox serves, and the announced size
fits dtype, shape and the limits. Only then is the data streamed into a preallocated buffer.

Every refusal is logged as one warning line (job, caller, status, reason: never payload bytes)
and answered with a gRPC status the sender maps to :class:`~.errors.PeerRejected`. A caller is
also refused if its certificate serial is revoked (the member's CRL: a job worker's server takes
its authorizer from the member's :class:`~mpc_erm.mpc.callers.CallerPolicy`, as every other server
of the member does) or once it exceeds its per-identity call rate (RESOURCE_EXHAUSTED); messages
larger than ``max_message_bytes`` are refused from their header.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

import grpc

from .. import tls
from .._proto import transport_pb2 as pb
from .._proto import transport_pb2_grpc as pb_grpc
from ..callers import CallerPolicy
from ..pki import Identity
from ..ratelimit import TRANSPORT_DEFAULT, LogThrottle, RateLimit
from . import codec
from .chunking import Assembler, grpc_message_options
from .errors import PayloadError, TransportClosed
from .mailbox import DuplicateMessage, JobBox, MailboxFull, Message
from .table import PartyTable

log = logging.getLogger(__name__)

SERVICE = "/mpc_erm.v1.ShareTransport"
DEFAULT_MAX_MESSAGE_BYTES = 2 << 30  # one tensor/object: 2 GiB
DEFAULT_MAX_PENDING_BYTES = 4 << 30  # undelivered bytes per job
MAX_OBJECT_BYTES = 64 << 20


def transport_policy() -> tls.Policy:
    """Who may call the transport at all (job membership is checked per message)."""
    return {f"{SERVICE}/*": [("party", tls.WILDCARD), ("dealer", tls.WILDCARD)]}


class _Servicer(pb_grpc.ShareTransportServicer):
    def __init__(self, server: TransportServer) -> None:
        self._server = server
        self._log_throttle = LogThrottle()

    def _refuse(
        self, context: grpc.ServicerContext, code: grpc.StatusCode, message: str, level: int = logging.WARNING
    ) -> NoReturn:
        """Log one line (who, status, why; never payload; a few per second per caller at most) and abort."""
        try:
            caller = str(tls.peer(context))
        except PermissionError:
            caller = "unauthenticated caller"
        if log.isEnabledFor(level):
            ok, dropped = self._log_throttle.allow(caller)
            if ok:
                more = f" ({dropped} similar lines not logged)" if dropped else ""
                log.log(level, "refused a message from %s: %s: %s%s", caller, code.name, message, more)
        context.abort(code, message)
        raise AssertionError("unreachable: context.abort raises")

    def _job(self, job_id: str, context: grpc.ServicerContext, level: int = logging.WARNING) -> JobBox:
        box = self._server.job(job_id)
        if box is None:
            # job_id is at most what fits in a gRPC message: keep the echo (and the log line) short.
            shown = job_id if len(job_id) <= 128 else job_id[:128] + "..."
            self._refuse(context, grpc.StatusCode.NOT_FOUND, f"job {shown!r} is not registered at this member", level)
        return box  # type: ignore[return-value]

    def _authenticate_src(self, box: JobBox, src: int, context: grpc.ServicerContext) -> None:
        """The claimed sender must be the certificate's identity: no sending as someone else."""
        try:
            role, name = tls.peer_identity(context)
        except PermissionError as exc:
            self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, str(exc))
        members = box.table.members
        if all((m.role, m.name) != (role, name) for m in members):
            msg = f"job {box.job_id}: {role}/{name} is not a member of the job"
            self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, msg)
        if not 0 <= src < len(members):
            msg = f"job {box.job_id}: {role}/{name}: no member with rank {src}"
            self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, msg)
        claimed = members[src]
        if (claimed.role, claimed.name) != (role, name):
            self._refuse(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"job {box.job_id}: caller {role}/{name} may not send as {box.table.describe(src)}",
            )

    def Deliver(self, request_iterator: Iterator[pb.Chunk], context: grpc.ServicerContext) -> pb.DeliverAck:
        return self._store(next(request_iterator, None), request_iterator, context)

    def DeliverOne(self, request: pb.Chunk, context: grpc.ServicerContext) -> pb.DeliverAck:
        return self._store(request, iter(()), context)

    def _store(
        self, first: pb.Chunk | None, rest: Iterator[pb.Chunk], context: grpc.ServicerContext
    ) -> pb.DeliverAck:
        refuse = self._refuse
        if first is None or not first.HasField("header"):
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "a message must start with a header chunk")
        header = first.header
        key = header.key
        box = self._job(key.job_id, context)
        self._authenticate_src(box, key.src, context)
        if key.dst != box.local_rank:
            refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"job {box.job_id}: this mailbox serves rank {box.local_rank}, not {key.dst}",
            )
        total = header.total_bytes
        try:
            self._check_size(header)
        except PayloadError as exc:
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"job {box.job_id}: {exc}")
        try:
            charge = box.reserve(total)
        except MailboxFull as exc:
            refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, f"job {box.job_id}: mailbox full ({exc})")
        except TransportClosed as exc:
            refuse(context, grpc.StatusCode.NOT_FOUND, f"job {box.job_id}: closed ({exc})")
        stored = False
        try:
            asm = Assembler(total)
            asm.add(first)
            for chunk in rest:
                asm.add(chunk)
            box.put(Message(header=header, data=asm.finish(), chunks=asm.chunks))
            stored = True
        except PayloadError as exc:
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"job {box.job_id}: {exc}")
        except DuplicateMessage as exc:
            # A retried send whose ack was lost lands here too: not worth a warning.
            refuse(context, grpc.StatusCode.ALREADY_EXISTS, f"job {box.job_id}: {exc}", logging.INFO)
        except TransportClosed as exc:
            refuse(context, grpc.StatusCode.NOT_FOUND, f"job {box.job_id}: closed ({exc})")
        finally:
            if not stored:
                box.release(charge)
        return pb.DeliverAck(received_bytes=total)

    def _check_size(self, header: pb.Header) -> None:
        total = header.total_bytes
        if total > self._server.max_message_bytes:
            raise PayloadError(f"message of {total} bytes exceeds {self._server.max_message_bytes}")
        if header.kind == pb.PAYLOAD_KIND_TENSOR:
            if codec.expected_nbytes(header.tensor) != total:
                raise PayloadError("announced size does not match dtype and shape")
        elif header.kind == pb.PAYLOAD_KIND_OBJECT:
            if total > MAX_OBJECT_BYTES:
                raise PayloadError(f"object of {total} bytes exceeds {MAX_OBJECT_BYTES}")
        elif header.kind == pb.PAYLOAD_KIND_TOKEN:
            if total != 0:
                raise PayloadError("a token carries no data")
        else:
            raise PayloadError(f"unknown payload kind {header.kind}")

    def Ping(self, request: pb.PingRequest, context: grpc.ServicerContext) -> pb.PingReply:
        # Peers ping jobs they expect us to register soon (connect): NOT_FOUND is routine here.
        box = self._job(request.job_id, context, logging.DEBUG)
        self._authenticate_src(box, request.src, context)
        me = box.table.member(box.local_rank)
        return pb.PingReply(name=me.name, rank=box.local_rank)


class TransportServer:
    """gRPC server hosting the mailboxes of one identity (one member per registered job).

    The party daemon can host it for many jobs; the communicator starts one when given none.
    """

    def __init__(
        self,
        identity: Identity,
        bind: str,
        *,
        max_workers: int = 16,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        authorizer: tls.Authorizer | None = None,
        revoked_serials: Iterable[int] = (),
        rate_limit: RateLimit | None = TRANSPORT_DEFAULT,
    ) -> None:
        """``revoked_serials`` and ``rate_limit`` (per caller identity; None: unlimited) configure
        the default authorizer; an explicit ``authorizer`` brings its own."""
        self.identity = identity
        self.bind = bind
        self.max_message_bytes = max_message_bytes
        self.max_pending_bytes = max_pending_bytes
        self.authorizer = authorizer or tls.Authorizer(
            transport_policy(), revoked_serials=revoked_serials, rate_limit=rate_limit, log_refusals=False
        )
        self._jobs: dict[str, JobBox] = {}
        self._lock = threading.Lock()
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="mpc-mailbox"),
            interceptors=[self.authorizer],
            options=[*grpc_message_options(), ("grpc.so_reuseport", 0)],
        )
        pb_grpc.add_ShareTransportServicer_to_server(_Servicer(self), self._server)
        self.port: int | None = None

    @classmethod
    def configured(cls, identity: Identity, bind: str, *, callers: CallerPolicy,
                   max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> TransportServer:
        """A server as a daemon's job worker runs it: its callers checked by the member's policy
        (its CRL, kept current, and its transport rate), ``max_message_bytes`` from its limits."""
        return cls(identity, bind, max_message_bytes=max_message_bytes,
                   authorizer=callers.authorizer(transport_policy(), "transport", log_refusals=False))

    def start(self) -> int:
        """Listen (mTLS only) and return the bound port (useful with ``host:0``)."""
        port = self._server.add_secure_port(self.bind, tls.server_credentials(self.identity))
        if port == 0:
            raise OSError(f"cannot listen on {self.bind}")
        self._server.start()
        self.port = port
        log.info("share transport of %s/%s listening on port %d", self.identity.role, self.identity.name, port)
        return port

    def register_job(self, table: PartyTable, local_rank: int) -> JobBox:
        me = table.member(local_rank)
        if (me.role, me.name) != (self.identity.role, self.identity.name):
            raise ValueError(
                f"job {table.job_id}: rank {local_rank} is {me.role}/{me.name}, "
                f"but this server is {self.identity.role}/{self.identity.name}"
            )
        with self._lock:
            if table.job_id in self._jobs:
                raise ValueError(f"job {table.job_id} is already registered")
            box = JobBox(table, local_rank, self.max_pending_bytes)
            self._jobs[table.job_id] = box
        return box

    def unregister_job(self, job_id: str, reason: str = "job closed") -> None:
        with self._lock:
            box = self._jobs.pop(job_id, None)
        if box is not None:
            box.close(reason)

    def job(self, job_id: str) -> JobBox | None:
        with self._lock:
            return self._jobs.get(job_id)

    def stop(self, grace: float | None = 1.0) -> None:
        """Close every mailbox (waking waiters) and stop serving after ``grace`` seconds."""
        with self._lock:
            boxes = list(self._jobs.values())
            self._jobs.clear()
        for box in boxes:
            box.close("transport server stopped")
        self._server.stop(grace).wait()
