"""The party daemon (gRPC servicers, job workers, dataset registry, budget ledger).

Arrives with issue 4; it will host `mpc_erm.protocols` behind the MPC engine's aggregator.
"""
