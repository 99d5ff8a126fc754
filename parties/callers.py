"""A daemon's identity policy (:class:`~mpc_erm.mpc.callers.CallerPolicy`) from its config: the
CA, ``identity.crl`` and the ``[limits]`` rates. The daemon makes one for its control service; a
job worker makes one for the servers of its job (the share transport, the owner intake)."""

from __future__ import annotations

import logging

from mpc_erm.mpc.callers import CallerPolicy
from mpc_erm.mpc.pki import Identity
from mpc_erm.mpc.ratelimit import RateLimit

from .config import DaemonConfig

__all__ = ["caller_policy"]


def caller_policy(config: DaemonConfig, identity: Identity, logger: logging.Logger | None = None) -> CallerPolicy:
    """The policy ``config`` states; ValueError naming ``identity.crl`` if the CRL does not verify.
    ``logger``: where the CRL's reloads are told (the daemon's log)."""
    lim = config.limits
    try:
        return CallerPolicy(identity.ca_pem, crl=config.identity.crl, logger=logger, rates={
            "control": RateLimit(lim.control_calls_per_s, lim.control_burst),
            "transport": RateLimit(lim.transport_calls_per_s, lim.transport_burst),
            "owners": RateLimit(lim.owner_calls_per_s, lim.owner_burst)})
    except ValueError as exc:
        raise ValueError(f"identity.crl: {exc}") from None
