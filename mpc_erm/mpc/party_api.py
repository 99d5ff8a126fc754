"""The party daemon's gRPC API (``proto/party.proto``), for the code that speaks it: the daemon
(:mod:`parties`), the coordinator and the owners. ``party_pb2`` holds the messages,
``party_pb2_grpc`` the stubs and servicers.

The generated modules themselves stay in the private package ``_proto`` (regenerated from the
.proto, never edited; see its ``generate``); this module is their public name outside
:mod:`mpc_erm.mpc`.
"""

from __future__ import annotations

from ._proto import party_pb2, party_pb2_grpc

__all__ = ["party_pb2", "party_pb2_grpc"]
