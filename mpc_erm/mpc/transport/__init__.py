"""Share transport of the MPC engine: keyed point-to-point messages over gRPC + mutual TLS.

``Endpoint`` is one member's view of one job (send/receive with deadlines); ``TransportServer``
hosts the mailboxes; ``mpc_erm.mpc.communicator`` puts CrypTen on top.
"""

from .endpoint import Endpoint, Ticket, TransportOptions
from .errors import (
    PayloadError,
    PeerRejected,
    PeerUnavailable,
    ProtocolDesync,
    TransportClosed,
    TransportError,
    TransportTimeout,
)
from .server import TransportServer
from .stats import TransportStats
from .table import Member, PartyTable

__all__ = [
    "Endpoint",
    "Member",
    "PartyTable",
    "PayloadError",
    "PeerRejected",
    "PeerUnavailable",
    "ProtocolDesync",
    "Ticket",
    "TransportClosed",
    "TransportError",
    "TransportOptions",
    "TransportServer",
    "TransportStats",
    "TransportTimeout",
]
