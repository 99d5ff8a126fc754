"""Transport errors: every failure names the job, the peer (rank and name) and the operation.

They subclass RuntimeError because CrypTen's TTP server loop treats RuntimeError as "stop".
"""

from __future__ import annotations


class TransportError(RuntimeError):
    """Base class of everything the share transport raises."""


class TransportTimeout(TransportError):
    """A wait passed its deadline: the peer is slow, stuck, or the programs diverged.

    ``waited_s``: the time actually waited (from the start of the wait, across every retry and
    every call that shared its deadline); ``limit_s``: the configured limit. The message states
    both; None where unknown."""

    def __init__(self, message: str, *, waited_s: float | None = None, limit_s: float | None = None) -> None:
        super().__init__(message)
        self.waited_s = waited_s
        self.limit_s = limit_s


class PeerUnavailable(TransportError):
    """The peer cannot be reached (process gone, server down, TLS refused)."""


class PeerRejected(TransportError):
    """The peer's server refused a message (unknown job, identity mismatch, malformed)."""


class ProtocolDesync(TransportError):
    """A message arrived for a different operation than the one this party is in."""


class PayloadError(TransportError):
    """A payload cannot be encoded or decoded (dtype, size, type not allowed)."""


class TransportClosed(TransportError):
    """The mailbox or endpoint was shut down while an operation was waiting."""
