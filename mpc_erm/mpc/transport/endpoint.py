"""One member's view of one job: keyed point-to-point messages with deadlines.

Keys. A message is (job_id, src, dst, seq) where seq counts the messages from src to dst in this
job. The sender takes the next seq for dst when it posts a message, the receiver the next seq
for src when it posts a receive; since every member runs the same deterministic program
(CrypTen is SPMD), both sides agree on every key with no coordination, messages may arrive in
any order (concurrent streams, isend), and a collective is just a fixed pattern of such
messages. Each message also names the operation that produced it; a receiver in a different
operation fails with ProtocolDesync instead of silently mixing data.

Deadlines. Every blocking call takes an absolute deadline (monotonic seconds). A receive that
passes it raises TransportTimeout naming the job, operation, message and peer, the time waited
since the deadline was set (:mod:`.deadline`) and its limit; while waiting, the peer is pinged
every ``probe_interval_s`` and a peer that is unreachable (process gone) for
``unavailable_grace_s`` fails the wait early with PeerUnavailable, so a vanished peer is
reported within seconds rather than at the end of the deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from .._proto import transport_pb2 as pb
from ..pki import Identity
from . import codec
from .chunking import DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES, chunk_count
from .client import PeerClient
from .deadline import Deadline, waited
from .errors import (
    PeerRejected,
    PeerUnavailable,
    ProtocolDesync,
    TransportClosed,
    TransportError,
    TransportTimeout,
)
from .mailbox import Message
from .server import TransportServer
from .stats import TransportStats
from .table import PartyTable

log = logging.getLogger(__name__)

_KIND_NAMES = {
    pb.PAYLOAD_KIND_TENSOR: "tensor",
    pb.PAYLOAD_KIND_OBJECT: "object",
    pb.PAYLOAD_KIND_TOKEN: "token",
}


@dataclass(frozen=True)
class TransportOptions:
    """Timing and size knobs; the defaults suit parties on one LAN or host."""

    deadline_s: float = 60.0  # bound on every communicator operation
    deadline_name: str = "deadline_s"  # the setting an operator changes to move it, named in a timeout
    connect_timeout_s: float = 60.0  # how long connect() waits for every peer to be up
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    probe_interval_s: float = 1.0  # liveness ping period while a receive waits
    unavailable_grace_s: float = 2.0  # unreachable this long = gone
    send_threads: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be in (0, {MAX_CHUNK_BYTES}]")
        if min(self.deadline_s, self.connect_timeout_s, self.probe_interval_s) <= 0:
            raise ValueError("deadlines and intervals must be positive")


@dataclass(frozen=True)
class Ticket:
    """A receive posted (seq taken) but not yet collected: what irecv returns underneath."""

    src: int
    seq: int
    op: str
    kind: int


class Endpoint:
    """Keyed messages to and from the other members of one job (see module docstring)."""

    def __init__(
        self,
        table: PartyTable,
        rank: int,
        identity: Identity,
        *,
        server: TransportServer | None = None,
        bind: str | None = None,
        options: TransportOptions | None = None,
    ) -> None:
        self.table = table
        self.rank = rank
        self.options = options or TransportOptions()
        self._owns_server = server is None
        if server is None:
            server = TransportServer(identity, bind or table.member(rank).address)
            server.start()
        self.server = server
        self.box = server.register_job(table, rank)
        self.peers = {r: PeerClient(table, rank, r, identity) for r in range(len(table.members)) if r != rank}
        self.stats = TransportStats(table.job_id)
        self._send_seq: dict[int, int] = {}
        self._recv_seq: dict[int, int] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(self.options.send_threads, thread_name_prefix=f"mpc-send-{rank}")
        self._closed = False

    # ------------------------------------------------------------------ helpers

    @property
    def job_id(self) -> str:
        return self.table.job_id

    def describe(self, rank: int) -> str:
        return self.table.describe(rank)

    def deadline(self, seconds: float | None = None) -> Deadline:
        """An absolute deadline ``seconds`` (default: the ``deadline_s`` option) from now; it
        remembers its start, so a timeout against it reports the whole time waited."""
        if seconds is None:
            return Deadline(self.options.deadline_s, self.options.deadline_name)
        return Deadline(seconds)

    def _peer(self, rank: int) -> PeerClient:
        if rank == self.rank:
            raise ValueError(f"job {self.job_id}: rank {rank} cannot message itself")
        if rank not in self.peers:
            raise ValueError(f"job {self.job_id}: no member with rank {rank}")
        return self.peers[rank]

    def _take_seq(self, table: dict[int, int], rank: int) -> int:
        with self._lock:
            seq = table.get(rank, 0)
            table[rank] = seq + 1
            return seq

    # ------------------------------------------------------------------ sending

    def post(
        self, dst: int, op: str, payload: torch.Tensor | Any, *, kind: int, deadline: float, inline: bool = False
    ) -> Future[None]:
        """Queue one message to ``dst``; the future completes when dst's mailbox stored it.

        Encoding happens now (the caller may reuse its buffers once the future completes, as
        with torch.distributed.isend); the key's seq is taken now, in program order.
        """
        if self._closed:
            raise TransportClosed(f"job {self.job_id}: endpoint closed")
        peer = self._peer(dst)
        if kind == pb.PAYLOAD_KIND_TENSOR:
            theader, data = codec.tensor_to_bytes(payload)
        elif kind == pb.PAYLOAD_KIND_OBJECT:
            theader, data = None, memoryview(codec.encode_object(payload))
        else:
            theader, data = None, memoryview(b"")
        seq = self._take_seq(self._send_seq, dst)
        header = pb.Header(
            key=pb.MessageKey(job_id=self.job_id, src=self.rank, dst=dst, seq=seq),
            op=op,
            kind=kind,  # type: ignore[arg-type]
            total_bytes=len(data),
        )
        if theader is not None:
            header.tensor.CopyFrom(theader)
        if not inline:
            return self._pool.submit(self._deliver, peer, header, data, deadline)
        done: Future[None] = Future()
        try:
            self._deliver(peer, header, data, deadline)
            done.set_result(None)
        except TransportError as exc:
            done.set_exception(exc)
        return done

    def _deliver(self, peer: PeerClient, header: pb.Header, data: memoryview, deadline: float) -> None:
        peer.deliver(header, data, self.options.chunk_bytes, deadline, self.options.unavailable_grace_s)
        self.stats.record_sent(peer.rank, len(data), chunk_count(len(data), self.options.chunk_bytes))

    def send(self, dst: int, op: str, payload: Any, *, kind: int, deadline: float) -> None:
        """Blocking send, in the calling thread (no pool hop: small rounds are latency-bound)."""
        fut = self.post(dst, op, payload, kind=kind, deadline=deadline, inline=True)
        self.wait_all([fut], deadline)

    def wait_all(self, futures: list[Future[None]], deadline: float) -> None:
        """Wait for posted messages; the first failure is raised (each names its peer)."""
        first: BaseException | None = None
        started = time.monotonic()
        for fut in futures:
            try:
                # _deliver honours the deadline itself; the slack only covers thread scheduling.
                fut.result(timeout=max(0.0, deadline - time.monotonic()) + 5.0)
            except TransportError as exc:
                first = first or exc
            except TimeoutError:
                spent, limit, text = waited(deadline, started)
                first = first or TransportTimeout(f"job {self.job_id}: a send did not finish: waited {text}",
                                                  waited_s=spent, limit_s=limit)
        if first is not None:
            raise first

    # ------------------------------------------------------------------ receiving

    def expect(self, src: int, op: str, kind: int) -> Ticket:
        """Take the key of the next message from ``src`` now (program order), collect later."""
        self._peer(src)
        return Ticket(src=src, seq=self._take_seq(self._recv_seq, src), op=op, kind=kind)

    def collect(self, ticket: Ticket, deadline: float) -> Message:
        """Wait for the message of ``ticket``; timeout, vanished peer or desync raise, naming the peer."""
        peer = self.peers[ticket.src]
        label = self.describe(ticket.src)
        what = f"job {self.job_id}: {ticket.op}: message #{ticket.seq} from {label}"
        opts = self.options
        gone_since: float | None = None
        started = time.monotonic()
        while True:
            left = deadline - time.monotonic()
            try:
                msg = self.box.take(ticket.src, ticket.seq, min(max(left, 0.0), opts.probe_interval_s))
            except TransportClosed as exc:
                raise TransportClosed(f"{what}: mailbox closed while waiting ({exc})") from None
            if msg is not None:
                break
            now = time.monotonic()
            if now >= deadline:
                spent, limit, text = waited(deadline, started, now)
                raise TransportTimeout(f"{what} did not arrive: waited {text}", waited_s=spent, limit_s=limit)
            try:
                peer.ping(timeout=min(1.0, max(0.05, deadline - now)))
                gone_since = None
            except (PeerUnavailable, PeerRejected) as exc:
                # Unreachable, or it no longer serves the job: the message will not come (every
                # message a member sends is acknowledged before it moves on), unless it arrived
                # between our last look and the ping.
                msg = self.box.take(ticket.src, ticket.seq, 0.0)
                if msg is not None:
                    break
                gone_since = gone_since if gone_since is not None else now
                if isinstance(exc, PeerRejected) or time.monotonic() - gone_since >= opts.unavailable_grace_s:
                    raise PeerUnavailable(f"{what}: the peer went away while we waited ({exc})") from None
            except TransportTimeout:
                pass  # busy, not gone: the overall deadline decides
        header = msg.header
        if header.op != ticket.op or header.kind != ticket.kind:
            raise ProtocolDesync(
                f"{what}: expected {ticket.op}/{_KIND_NAMES.get(ticket.kind)}, the peer sent "
                f"{header.op}/{_KIND_NAMES.get(header.kind, header.kind)}: the parties' programs diverged"
            )
        self.stats.record_received(ticket.src, len(msg.data), msg.chunks)
        return msg

    def recv_tensor(self, src: int, op: str, deadline: float) -> torch.Tensor:
        return self.tensor_of(self.collect(self.expect(src, op, pb.PAYLOAD_KIND_TENSOR), deadline))

    def recv_object(self, src: int, op: str, deadline: float) -> Any:
        return codec.decode_object(self.collect(self.expect(src, op, pb.PAYLOAD_KIND_OBJECT), deadline).data)

    def recv_token(self, src: int, op: str, deadline: float) -> None:
        self.collect(self.expect(src, op, pb.PAYLOAD_KIND_TOKEN), deadline)

    @staticmethod
    def tensor_of(msg: Message) -> torch.Tensor:
        return codec.tensor_from_bytes(msg.header.tensor, msg.data)

    # ------------------------------------------------------------------ lifecycle

    def connect(self, timeout: float | None = None) -> None:
        """Wait until every peer's mailbox is up, speaks mTLS with the pinned identity, and knows the job.

        Run once before the first message so that start-up order between members does not matter
        and later sends can treat an unreachable peer as gone.
        """
        limit, source = (self.options.connect_timeout_s, "connect_timeout_s") if timeout is None else (timeout, "")
        end = Deadline(limit, source)
        for rank, peer in sorted(self.peers.items()):
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    raise PeerUnavailable(
                        f"job {self.job_id}: could not reach {peer.label}: tried for {waited(end, end.start)[2]} "
                        "(not started, wrong address, or TLS refused: other CA, other identity, expired)"
                    )
                try:
                    reply = peer.ping(timeout=left, wait_for_ready=True)
                except PeerRejected as exc:
                    if "NOT_FOUND" in str(exc):  # up, but has not registered the job yet
                        time.sleep(min(0.05, max(0.0, left)))
                        continue
                    raise
                except TransportTimeout:
                    continue  # the loop reports it with the connect-timeout message
                if (reply.name, reply.rank) != (self.table.member(rank).name, rank):
                    raise PeerRejected(f"job {self.job_id}: {peer.label} answered as {reply.name!r} rank {reply.rank}")
                break

    def close(self, grace: float = 1.0) -> None:
        """Stop: wake our waiters, drop channels, stop the server if we started it.

        The server stops with a grace period: a peer's last message may be stored here while
        its acknowledgement is still on the way, and cutting that off would fail the peer.
        """
        if self._closed:
            return
        self._closed = True
        self.server.unregister_job(self.job_id, "endpoint closed")
        self._pool.shutdown(wait=False, cancel_futures=True)
        for peer in self.peers.values():
            peer.close()
        if self._owns_server:
            self.server.stop(grace)
