"""Transport errors: every failure names the job, the peer (rank and name) and the operation.

They subclass RuntimeError because CrypTen's TTP server loop treats RuntimeError as "stop".
"""

from __future__ import annotations


class TransportError(RuntimeError):
    """Base class of everything the share transport raises."""


class TransportTimeout(TransportError):
    """A wait passed its deadline: the peer is slow, stuck, or the programs diverged."""


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
