"""The spelling of identity names (a party, dealer, coordinator or owner), in one light place.

Names become file names (``<name>.crt``, ``<name>.key``) and certificate fields, so they keep to
a safe, portable alphabet. The PKI (:mod:`mpc_erm.mpc.pki`, which re-exports these) issues and
checks certificates by them, and the job file (:mod:`mpc_erm.jobs.jobfile`) checks the names it
lists by the same rule without importing the PKI and its cryptography.
"""

from __future__ import annotations

import re

__all__ = ["NAME_RE", "RESERVED_NAMES", "validate_name"]

#: 1-64 characters from [A-Za-z0-9._-] (and not starting with '.': see :func:`validate_name`)
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
RESERVED_NAMES = frozenset({"ca"})
"""``ca`` would collide with ``ca.crt``/``ca.key`` in the shared certificate directory."""


def validate_name(name: object, field: str = "name") -> str:
    """Names become file names and certificate fields: keep them to a safe, portable alphabet."""
    if not isinstance(name, str):
        raise ValueError(f"{field}: must be a string")
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"{field}: must be 1-64 characters from [A-Za-z0-9._-], got {name!r}")
    if name.startswith("."):
        raise ValueError(f"{field}: must not start with '.', got {name!r}")
    if name.lower() in RESERVED_NAMES:
        raise ValueError(f"{field}: {name!r} is reserved (it would collide with the CA's files)")
    return name
