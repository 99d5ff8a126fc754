"""The owner intake's gRPC API (``proto/owner.proto``), for the code that speaks it: a compute
party's intake and a data owner's client (:mod:`parties.owner.intake`). ``owner_pb2`` holds the
messages, ``owner_pb2_grpc`` the stubs and servicers.

The generated modules stay in the private package ``_proto`` (regenerated from the .proto, never
edited); this module is their public name outside :mod:`mpc_erm.mpc`, as
:mod:`~mpc_erm.mpc.party_api` is the party daemon's.
"""

from __future__ import annotations

from ._proto import owner_pb2, owner_pb2_grpc

__all__ = ["owner_pb2", "owner_pb2_grpc"]
