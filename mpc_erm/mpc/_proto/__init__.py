"""Generated protobuf/gRPC modules (do not edit: regenerate with ``python -m mpc_erm.mpc._proto.generate``)."""
