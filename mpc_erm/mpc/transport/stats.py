"""Per-job traffic counters of one member, kept by the transport itself.

CrypTen's own counters (``comm_rounds``/``comm_bytes``) are estimates made by a decorator and
only when ``cfg.communicator.verbose`` is set; these count what actually crossed the wire
(payload bytes, messages, chunks, per peer), always, so a job report can state real figures.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class PeerCounters:
    messages_sent: int = 0
    messages_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    chunks_sent: int = 0
    chunks_received: int = 0


@dataclass
class TransportStats:
    """Thread-safe counters; payload bytes exclude protobuf/gRPC/TLS framing."""

    job_id: str
    _peers: dict[int, PeerCounters] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _peer(self, rank: int) -> PeerCounters:
        if rank not in self._peers:
            self._peers[rank] = PeerCounters()
        return self._peers[rank]

    def record_sent(self, dst: int, nbytes: int, chunks: int) -> None:
        with self._lock:
            c = self._peer(dst)
            c.messages_sent += 1
            c.bytes_sent += nbytes
            c.chunks_sent += chunks

    def record_received(self, src: int, nbytes: int, chunks: int) -> None:
        with self._lock:
            c = self._peer(src)
            c.messages_received += 1
            c.bytes_received += nbytes
            c.chunks_received += chunks

    def totals(self) -> PeerCounters:
        with self._lock:
            out = PeerCounters()
            for c in self._peers.values():
                for name in vars(out):
                    setattr(out, name, getattr(out, name) + getattr(c, name))
            return out

    def per_peer(self) -> dict[int, PeerCounters]:
        with self._lock:
            return {r: PeerCounters(**vars(c)) for r, c in sorted(self._peers.items())}

    def as_dict(self) -> dict[str, object]:
        per_peer = {r: vars(c) for r, c in self.per_peer().items()}
        return {"job_id": self.job_id, **vars(self.totals()), "per_peer": per_peer}
