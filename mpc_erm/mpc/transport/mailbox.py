"""The receiving side's store: messages that arrived, by (src, seq), until the party takes them.

A sender never waits for the receiver to be *in* the matching recv (the message is stored on
arrival), so two parties that send to each other before receiving cannot deadlock, and isend/
irecv need no rendezvous. Memory is bounded per job (``max_pending_bytes``): a runaway or
hostile peer of the job gets RESOURCE_EXHAUSTED, not the host's memory. Each stored message is
charged ``MESSAGE_OVERHEAD`` bytes on top of its data (what its Python objects cost), so a flood
of empty messages (tokens, or zero-size tensors, at ever new sequence numbers) is bounded too.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from .._proto import transport_pb2 as pb
from .errors import TransportClosed
from .table import PartyTable

MESSAGE_OVERHEAD = 1024  # bytes charged per stored message besides its data (header, objects)


class DuplicateMessage(Exception):
    """A message with this key was already delivered (a retried send whose ack was lost)."""


class MailboxFull(Exception):
    """Accepting the message would exceed the job's pending-bytes bound."""


@dataclass
class Message:
    header: pb.Header
    data: bytearray
    chunks: int


class JobBox:
    """Mailbox of one member (``local_rank``) in one job."""

    def __init__(self, table: PartyTable, local_rank: int, max_pending_bytes: int) -> None:
        self.table = table
        self.local_rank = local_rank
        self.max_pending_bytes = max_pending_bytes
        self._cond = threading.Condition()
        self._slots: dict[tuple[int, int], Message] = {}
        self._reserved = 0
        # Consumed keys per src: every seq below the floor, plus the set above it.
        self._floor: dict[int, int] = {}
        self._taken: dict[int, set[int]] = {}
        self._closed: str | None = None

    @property
    def job_id(self) -> str:
        return self.table.job_id

    def reserve(self, nbytes: int) -> int:
        """Claim room for a message of ``nbytes`` before reading its data; returns the charge
        (data plus overhead) to :meth:`release` if the message is not stored after all."""
        charge = nbytes + MESSAGE_OVERHEAD
        with self._cond:
            if self._closed is not None:
                raise TransportClosed(self._closed)
            if self._reserved + charge > self.max_pending_bytes:
                raise MailboxFull(
                    f"{self._reserved} bytes pending in {len(self._slots)} messages, limit {self.max_pending_bytes}"
                )
            self._reserved += charge
        return charge

    def release(self, nbytes: int) -> None:
        with self._cond:
            self._reserved -= nbytes

    def _consumed(self, src: int, seq: int) -> bool:
        return seq < self._floor.get(src, 0) or seq in self._taken.get(src, ())

    def put(self, message: Message) -> None:
        """Store a message whose bytes were reserved; the reservation moves with it."""
        key = (message.header.key.src, message.header.key.seq)
        with self._cond:
            if self._closed is not None:
                raise TransportClosed(self._closed)
            if key in self._slots or self._consumed(*key):
                raise DuplicateMessage(f"message src={key[0]} seq={key[1]} already delivered")
            self._slots[key] = message
            self._cond.notify_all()

    def take(self, src: int, seq: int, timeout: float) -> Message | None:
        """Remove and return the message (src, seq), waiting at most ``timeout`` seconds."""
        end = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while True:
                msg = self._slots.pop((src, seq), None)
                if msg is not None:
                    self._reserved -= len(msg.data) + MESSAGE_OVERHEAD
                    self._mark_taken(src, seq)
                    return msg
                if self._closed is not None:
                    raise TransportClosed(self._closed)
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def _mark_taken(self, src: int, seq: int) -> None:
        floor = self._floor.get(src, 0)
        taken = self._taken.setdefault(src, set())
        taken.add(seq)
        while floor in taken:
            taken.discard(floor)
            floor += 1
        self._floor[src] = floor

    def pending(self) -> int:
        with self._cond:
            return len(self._slots)

    def close(self, reason: str) -> None:
        """Wake every waiter with TransportClosed(reason) and refuse new messages."""
        with self._cond:
            if self._closed is None:
                self._closed = reason
            self._slots.clear()
            self._reserved = 0
            self._cond.notify_all()
