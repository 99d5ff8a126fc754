"""Who may call a member's gRPC servers: one identity policy object per member process.

Every server a member runs — the daemon's control service, each job worker's share transport,
each job's owner intake — refuses the same callers for the same reasons: a certificate the CA
revoked (the deployment's CRL), a role or name the method does not allow, a caller over its rate.
Before, each server was configured by hand, and the owner intake had no CRL and no rate limit: a
revoked owner that knew the intake's address enrolled and was counted. Now each server's
:class:`~mpc_erm.mpc.tls.Authorizer` comes from :meth:`CallerPolicy.authorizer`, so none can be
built without the member's revocation list and its rate for that kind of server.

The CRL is a file the CA operator replaces (``mpc-erm certs revoke``). :class:`RevocationList`
re-reads it when its (inode, size, mtime) change, checked at most once a second on the call path
and at once by :meth:`RevocationList.refresh` (the owner intake calls it as each round opens, so a
CRL published mid-job holds from the next round at every compute party), or by
:meth:`RevocationList.reload` (a daemon's SIGHUP). A list that does not verify (foreign CA, stale,
half written, unreadable) is logged and the previous one stays in force: an operator's mistake must
not silently un-revoke anyone. At start the list must verify, or the member does not start.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from . import tls
from .pki import revoked_serials_from_crl
from .ratelimit import CONTROL_DEFAULT, TRANSPORT_DEFAULT, RateLimit

__all__ = ["DEFAULT_RATES", "OWNER_DEFAULT", "SERVERS", "CallerPolicy", "RevocationList"]

log = logging.getLogger(__name__)

#: An owner enrols once, sends one share a round (asking again every 0.01–0.5 s while its round is
#: not open) and reads each release with waits of seconds: far under 200 calls a second.
OWNER_DEFAULT = RateLimit(rate_per_s=200.0, burst=2000.0)
#: The kinds of server a member runs, each with its own rate per caller.
SERVERS = ("control", "transport", "owners")
DEFAULT_RATES: Mapping[str, RateLimit] = {"control": CONTROL_DEFAULT, "transport": TRANSPORT_DEFAULT,
                                          "owners": OWNER_DEFAULT}
#: How often the call path looks at the CRL file's metadata (one stat; no read unless it changed).
CHECK_EVERY_S = 1.0


def _file_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class RevocationList:
    """The serials a CA-signed CRL file revokes, kept current with the file (see the module)."""

    def __init__(self, path: str | os.PathLike[str], ca_pem: bytes, *, check_every_s: float = CHECK_EVERY_S,
                 logger: logging.Logger | None = None) -> None:
        """Reads and verifies the file now: ValueError if it cannot be read, is not the CA's, or is
        stale (the caller names the field that gave the path). ``logger``: where reloads are told
        (default: this module's)."""
        self.path = Path(path)
        self.log = logger or log
        self.last_error: str | None = None  # why the file's latest content was not applied
        self._ca_pem = ca_pem
        self._every = check_every_s
        self._lock = threading.Lock()
        self._key = _file_key(self.path)
        try:
            self._serials = revoked_serials_from_crl(self.path.read_bytes(), ca_pem)
        except OSError as exc:
            raise ValueError(f"crl: cannot read: {exc.strerror or exc}") from None
        self._next_check = time.monotonic() + check_every_s

    def serials(self) -> frozenset[int]:
        """The revoked serials; looks at the file first when the last look is over a second old."""
        if time.monotonic() >= self._next_check:
            self.refresh()
        return self._serials

    def refresh(self) -> None:
        """Re-read the file if it changed since the last read."""
        self._next_check = time.monotonic() + self._every
        if _file_key(self.path) != self._key:
            self._load(explicit=False)

    def reload(self) -> bool:
        """Re-read the file now (a daemon's SIGHUP); whether it verified (and is the list in force
        now). One that does not is logged and the previous list stays in force."""
        return self._load(explicit=True)

    def _load(self, *, explicit: bool) -> bool:
        with self._lock:
            key = _file_key(self.path)
            try:
                serials = revoked_serials_from_crl(self.path.read_bytes(), self._ca_pem)
            except (OSError, ValueError) as exc:
                if explicit or key != self._key:  # a watched file: once per change
                    self.log.warning("CRL not reloaded, the previous list stays in force (%d serials): %s",
                                     len(self._serials), exc)
                self._key, self.last_error = key, str(exc)
                return False
            self._key, self.last_error, self._serials = key, None, serials
        self.log.info("CRL reloaded: %d revoked serial(s)", len(serials))
        return True


class CallerPolicy:
    """A member's identity policy for every server it runs: its CA, its revocation list (or none)
    and the rate each kind of server grants one caller identity."""

    def __init__(self, ca_pem: bytes, *, crl: str | os.PathLike[str] | None = None,
                 rates: Mapping[str, RateLimit] | None = None, logger: logging.Logger | None = None) -> None:
        """``crl``: the CA's revocation list file (ValueError if it does not verify);
        ``rates``: per kind of server (:data:`SERVERS`), the defaults for those not given;
        ``logger``: where the list's reloads are told."""
        unknown = set(rates or {}) - set(SERVERS)
        if unknown:
            raise ValueError(f"rates: unknown server kind(s) {sorted(unknown)}; expected {list(SERVERS)}")
        self.ca_pem = ca_pem
        self.revocation = None if crl is None else RevocationList(crl, ca_pem, logger=logger)
        self.rates = {**DEFAULT_RATES, **(rates or {})}

    def authorizer(self, methods: tls.Policy, server: str, *, log_refusals: bool = True,
                   field_limits: Mapping[str, int] | None = None) -> tls.Authorizer:
        """The Authorizer of one server of kind ``server`` allowing ``methods``: this policy's
        revocation list (shared: a reload holds at every server) and that kind's rate."""
        if server not in SERVERS:
            raise ValueError(f"server: {server!r} is not one of {list(SERVERS)}")
        return tls.Authorizer(methods, revocation=self.revocation, rate_limit=self.rates[server],
                              log_refusals=log_refusals, field_limits=field_limits)

    def reload(self) -> bool:
        """Re-read the CRL now (a daemon's SIGHUP); whether it verified (else the old list holds)."""
        return True if self.revocation is None else self.revocation.reload()

    def refresh(self) -> None:
        """Look at the CRL file now, re-reading it if it changed (the owner intake, each round)."""
        if self.revocation is not None:
            self.revocation.refresh()
