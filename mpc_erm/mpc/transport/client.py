"""Sending side: one mTLS channel per peer, message delivery with bounded retries, liveness pings."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import grpc

from .. import tls
from .._proto import transport_pb2 as pb
from .._proto import transport_pb2_grpc as pb_grpc
from ..pki import Identity
from .chunking import grpc_message_options, iter_chunks
from .deadline import waited
from .errors import PeerRejected, PeerUnavailable, TransportError, TransportTimeout
from .table import PartyTable

log = logging.getLogger(__name__)

# Reconnect quickly after a blip instead of gRPC's default 1 s .. 120 s backoff, so that a peer
# that is merely restarting its listener is found again within the unavailable grace period.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
]
_REJECTIONS = {
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
}


class PeerClient:
    """Client stubs to one peer's mailbox, pinned to the peer's certificate identity."""

    def __init__(self, table: PartyTable, my_rank: int, peer_rank: int, identity: Identity) -> None:
        self.table = table
        self.my_rank = my_rank
        self.rank = peer_rank
        member = table.member(peer_rank)
        self.label = table.describe(peer_rank)
        self.channel = tls.secure_channel(
            member.address,
            identity,
            expected_peer=member.name,
            expected_role=member.role,  # type: ignore[arg-type]
            options=[*grpc_message_options(), *_CHANNEL_OPTIONS],
        )
        self.stub = pb_grpc.ShareTransportStub(self.channel)

    def _error(
        self, err: grpc.RpcError, op: str, what: str, *, deadline: float | None = None, since: float | None = None
    ) -> TransportError:
        """The transport error for a failed call; ``deadline`` and ``since`` (when the wait began)
        let a timeout state the time waited and its limit."""
        code = err.code()
        detail = err.details() or ""
        where = f"job {self.table.job_id}: {op}: {what} {self.label}"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            if deadline is None or since is None:
                return TransportTimeout(f"{where} did not complete before the deadline")
            spent, limit, text = waited(deadline, since)
            return TransportTimeout(f"{where} did not complete: waited {text}", waited_s=spent, limit_s=limit)
        if code == grpc.StatusCode.UNAVAILABLE:
            return PeerUnavailable(f"{where} failed: peer unreachable ({detail})")
        if code == grpc.StatusCode.CANCELLED:  # we never cancel: the peer's server is going away
            return PeerUnavailable(f"{where} failed: peer cancelled the call, shutting down ({detail})")
        if code in _REJECTIONS:
            return PeerRejected(f"{where} was refused ({code.name}: {detail})")
        return TransportError(f"{where} failed ({code.name}: {detail})")

    def deliver(
        self,
        header: pb.Header,
        data: memoryview,
        chunk_bytes: int,
        deadline: float,
        unavailable_grace: float,
    ) -> None:
        """Stream one message; retry while the peer is UNAVAILABLE for at most ``unavailable_grace``.

        A retry after a lost ack finds the key already stored (ALREADY_EXISTS): that is success,
        which is what makes retrying safe.
        """
        op = header.op
        first_failure: float | None = None
        started = time.monotonic()
        while True:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                spent, limit, text = waited(deadline, started)
                raise TransportTimeout(f"job {self.table.job_id}: {op}: sending to {self.label} did not complete: "
                                       f"waited {text}", waited_s=spent, limit_s=limit)
            chunks: Iterator[pb.Chunk] = iter_chunks(header, data, chunk_bytes)
            try:
                if len(data) <= chunk_bytes:
                    self.stub.DeliverOne(next(chunks), timeout=timeout)
                else:
                    self.stub.Deliver(chunks, timeout=timeout)
                return
            except grpc.RpcError as err:
                code = err.code()  # type: ignore[attr-defined]
                if code == grpc.StatusCode.ALREADY_EXISTS and first_failure is not None:
                    return
                if code != grpc.StatusCode.UNAVAILABLE:
                    raise self._error(
                        err, op, "sending to", deadline=deadline, since=started  # type: ignore[arg-type]
                    ) from None
                now = time.monotonic()
                first_failure = first_failure if first_failure is not None else now
                if now - first_failure >= unavailable_grace:
                    raise self._error(err, op, "sending to") from None  # type: ignore[arg-type]
                time.sleep(min(0.1, max(0.0, deadline - now)))

    def ping(self, timeout: float, wait_for_ready: bool = False) -> pb.PingReply:
        """Is the peer alive, reachable over mTLS, and does it know our job?"""
        request = pb.PingRequest(job_id=self.table.job_id, src=self.my_rank)
        started = time.monotonic()
        try:
            return self.stub.Ping(request, timeout=timeout, wait_for_ready=wait_for_ready)
        except grpc.RpcError as err:
            raise self._error(
                err, "ping", "pinging", deadline=started + timeout, since=started  # type: ignore[arg-type]
            ) from None

    def close(self) -> None:
        self.channel.close()
