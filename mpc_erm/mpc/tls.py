"""Mutual TLS for every mpc_erm gRPC channel, with identity pinning and per-method authorisation.

Checks, each where it cannot be skipped by the peer:

1. **Same CA, both ways** (TLS handshake). Servers use ``require_client_auth=True`` with the
   deployment CA as the only root; clients trust only that CA. A peer without a certificate, with
   one from another CA, expired or not yet valid, fails the handshake (client sees UNAVAILABLE).
2. **The server is the peer we meant** (client side, handshake). gRPC's Python client cannot see
   the server certificate after connecting, so we make gRPC's own host-name check do the pinning:
   every certificate carries the synthetic SAN ``<name>.<role>.mpc-erm.invalid`` (and
   ``<name>.id.mpc-erm.invalid``), and :func:`secure_channel` sets ``grpc.ssl_target_name_override``
   to the expected peer's synthetic name. A server with a valid certificate for another identity
   fails the handshake, before any byte of application data (no share) is sent. The dialled
   address (IP, port, DNS) can be anything: routing and identity are decoupled, which suits
   NAT/port-forwarded deployments. The CA refuses to put ``*.mpc-erm.invalid`` names in ``hosts``,
   so no identity can claim another's synthetic name.
3. **The caller may call this method** (server side, per RPC). :class:`Authorizer` reads the
   client's identity from its certificate (``auth_context()["x509_pem_cert"]``), checks it against
   a per-method allow-list and a revocation set, and aborts with PERMISSION_DENIED naming the
   caller and the method. Methods missing from the policy are denied.
4. **The caller is not flooding** (server side, per RPC, optional). An Authorizer given a
   :class:`~mpc_erm.mpc.ratelimit.RateLimit` keeps a token bucket per authenticated identity and
   answers RESOURCE_EXHAUSTED, naming the caller and the limit, once it is empty.
5. **The request parses** (server side). A request that is not the method's protobuf message is
   answered INVALID_ARGUMENT naming the caller, after the checks above (gRPC's own answer would
   be INTERNAL with a traceback in the log, and before authorisation); so is a top-level string
   field longer than the Authorizer's ``field_limits`` (ids are echoed in refusals).

Every refusal, and every error status a servicer answers, is logged as one line (method, status,
caller, a bounded reason; never request bytes), at most a few lines per second per caller.

Revocation is checked in the Authorizer (serials and/or identity names), not in the handshake:
grpcio's Python API has no CRL hook for ``ssl_server_credentials``. A revoked peer can still
complete a handshake but every call is refused. Lists can be loaded from a CA-signed CRL
(:func:`mpc_erm.mpc.pki.revoked_serials_from_crl`) and swapped at runtime with
:meth:`Authorizer.set_revoked` (e.g. on SIGHUP) without restarting the server.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from cryptography import x509

from mpc_erm.mpc.pki import (
    ROLES,
    URI_SCHEME,
    Identity,
    Role,
    identity_hostname,
    identity_of_certificate,
    validate_name,
    validate_role,
)
from mpc_erm.mpc.ratelimit import LogThrottle, RateLimit, RateLimiter

log = logging.getLogger(__name__)

TARGET_NAME_OVERRIDE = "grpc.ssl_target_name_override"
WILDCARD = "*"

ChannelOptions = Sequence[tuple[str, Any]]


# --------------------------------------------------------------------------- credentials


def server_credentials(identity: Identity) -> grpc.ServerCredentials:
    """Server side of mTLS: present our cert, demand a client cert from the same CA."""
    return grpc.ssl_server_credentials(
        [(identity.key_pem, identity.cert_pem)],
        root_certificates=identity.ca_pem,
        require_client_auth=True,
    )


def channel_credentials(identity: Identity) -> grpc.ChannelCredentials:
    """Client side of mTLS: trust only the deployment CA, present our own cert."""
    return grpc.ssl_channel_credentials(
        root_certificates=identity.ca_pem,
        private_key=identity.key_pem,
        certificate_chain=identity.cert_pem,
    )


def parse_expected_peer(expected_peer: str, expected_role: Role | None = None) -> tuple[Role | None, str]:
    """Accept ``"p2"``, ``"party/p2"`` or ``"mpc-erm://party/p2"``; return (role or None, name)."""
    spec = expected_peer
    prefix = f"{URI_SCHEME}://"
    if spec.startswith(prefix):
        spec = spec[len(prefix) :]
    role: Role | None = None
    if "/" in spec:
        role_s, _, spec = spec.partition("/")
        role = validate_role(role_s, "expected_peer role")
    name = validate_name(spec, "expected_peer")
    if expected_role is not None:
        validate_role(expected_role, "expected_role")
        if role is not None and role != expected_role:
            raise ValueError(f"expected_role: {expected_role!r} contradicts expected_peer {expected_peer!r}")
        role = expected_role
    return role, name


def expected_peer_target_name(expected_peer: str, expected_role: Role | None = None) -> str:
    """The host name gRPC's TLS check must find in the server's SAN for ``expected_peer``."""
    role, name = parse_expected_peer(expected_peer, expected_role)
    return identity_hostname(name, role)


def _pinned_options(options: ChannelOptions, expected_peer: str, expected_role: Role | None) -> list[tuple[str, Any]]:
    opts = list(options)
    if any(key == TARGET_NAME_OVERRIDE for key, _ in opts):
        # Overriding it would silently disable identity pinning.
        raise ValueError(f"options: {TARGET_NAME_OVERRIDE} is set by secure_channel from expected_peer")
    opts.append((TARGET_NAME_OVERRIDE, expected_peer_target_name(expected_peer, expected_role)))
    return opts


def secure_channel(
    target: str,
    identity: Identity,
    expected_peer: str,
    options: ChannelOptions = (),
    *,
    expected_role: Role | None = None,
) -> grpc.Channel:
    """mTLS channel to ``target`` that only completes if the server's certificate names ``expected_peer``.

    ``expected_peer`` is a name (any role) or ``"role/name"``; ``expected_role`` pins the role too.
    Pinning the role matters when one CA has issued the same name to two roles.
    """
    opts = _pinned_options(options, expected_peer, expected_role)
    return grpc.secure_channel(target, channel_credentials(identity), options=opts)


# --------------------------------------------------------------------------- peer identity


@dataclass(frozen=True)
class Peer:
    """Who is calling: from the client certificate the TLS handshake verified."""

    role: Role
    name: str
    serial: int | None

    def __str__(self) -> str:
        return f"{self.role}/{self.name}"


@functools.lru_cache(maxsize=512)
def _peer_from_pem(pem: bytes) -> Peer:
    # Cached: one parse per client certificate, not one per RPC on the share hot path.
    cert = x509.load_pem_x509_certificate(pem)
    role, name = identity_of_certificate(cert)
    return Peer(role=role, name=name, serial=cert.serial_number)


def _peer_from_auth_context(auth: Mapping[str, Sequence[bytes]]) -> Peer:
    pems = auth.get("x509_pem_cert") or []
    if pems:
        try:
            return _peer_from_pem(bytes(pems[0]))
        except ValueError as exc:
            raise PermissionError(f"peer certificate carries no valid mpc-erm identity: {exc}") from exc
    # Fallback (older gRPC cores): the SAN list, without the serial.
    prefix = f"{URI_SCHEME}://".encode()
    sans = [bytes(v) for key in ("peer_uri", "x509_subject_alternative_name") for v in auth.get(key, [])]
    uris = sorted({v for v in sans if v.startswith(prefix)})
    if len(uris) == 1:
        role_s, _, name = uris[0][len(prefix) :].decode(errors="replace").partition("/")
        try:
            return Peer(role=validate_role(role_s), name=validate_name(name), serial=None)
        except ValueError as exc:
            raise PermissionError(f"peer certificate carries no valid mpc-erm identity: {exc}") from exc
    raise PermissionError("no authenticated peer certificate (is the channel mutual TLS?)")


def peer(context: grpc.ServicerContext) -> Peer:
    """The verified caller of this RPC; PermissionError if the call is not mTLS-authenticated."""
    return _peer_from_auth_context(context.auth_context() or {})


def peer_identity(context: grpc.ServicerContext) -> tuple[Role, str]:
    """(role, name) of the verified caller; PermissionError if the call is not mTLS-authenticated."""
    p = peer(context)
    return p.role, p.name


# --------------------------------------------------------------------------- authorisation


class RevocationSource(Protocol):
    """Revoked certificate serials kept current by their owner (e.g. from a CRL file)."""

    def serials(self) -> frozenset[int]: ...


Policy = Mapping[str, Iterable[tuple[str, str]]]
"""method ("/pkg.Service/Method" or "/pkg.Service/*") -> allowed (role, name); "*" is a wildcard."""


class Denied(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, caller: Peer | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.caller = caller


def _normalise_policy(policy: Policy) -> dict[str, frozenset[tuple[str, str]]]:
    out: dict[str, frozenset[tuple[str, str]]] = {}
    for method, entries in policy.items():
        if not isinstance(method, str) or not method.startswith("/") or method.count("/") != 2:
            raise ValueError(f"policy: method must look like '/pkg.Service/Method' or '/pkg.Service/*', got {method!r}")
        allowed = set()
        for entry in entries:
            if not (isinstance(entry, tuple) and len(entry) == 2):
                raise ValueError(f"policy[{method!r}]: entries must be (role, name) pairs, got {entry!r}")
            role, name = entry
            if role != WILDCARD:
                validate_role(role, f"policy[{method!r}] role")
            if name != WILDCARD:
                validate_name(name, f"policy[{method!r}] name")
            allowed.add((role, name))
        out[method] = frozenset(allowed)
    return out


def _normalise_revoked_identities(items: Iterable[str | tuple[str, str]]) -> frozenset[tuple[str, str]]:
    out = set()
    for item in items:
        if isinstance(item, str):
            out.add((WILDCARD, validate_name(item, "revoked_identities")))
        else:
            role, name = item
            out.add((validate_role(role, "revoked_identities role"), validate_name(name, "revoked_identities")))
    return frozenset(out)


class Authorizer(grpc.ServerInterceptor):
    """Per-method allow-list + revocation check on the mTLS-verified caller, for sync servers.

    Use as ``grpc.server(pool, interceptors=[Authorizer(policy)])``. Servicers can also call
    :meth:`check` themselves. Fail closed: a method absent
    from the policy, a caller without an identity, or a revoked caller are all refused.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        revoked_serials: Iterable[int] = (),
        revoked_identities: Iterable[str | tuple[str, str]] = (),
        revocation: RevocationSource | None = None,
        rate_limit: RateLimit | RateLimiter | None = None,
        log_refusals: bool = True,
        field_limits: Mapping[str, int] | None = None,
    ) -> None:
        """``revocation``: a list kept current elsewhere (a CRL file:
        :class:`~mpc_erm.mpc.callers.RevocationList`), asked on every call, besides ``revoked_serials``.

        ``log_refusals``: also log every call the servicer itself ends with an error status (one
        line: method, status, caller, the first 300 characters of the reason) besides the refusals
        decided here; off for servicers that log their refusals themselves.

        ``field_limits``: longest allowed top-level string/bytes field of a unary request, in bytes,
        by field name (``"*"``: every other one); longer ones are INVALID_ARGUMENT before the servicer
        runs. Why: servicers echo ids in their refusals, and a megabyte "job id" echoed into the
        answer's trailer or the log is a denial of service (gRPC cannot even send such a trailer)."""
        self._policy = _normalise_policy(policy)
        self.log_refusals = log_refusals
        self.field_limits = dict(field_limits or {})
        self._log_throttle = LogThrottle()
        self.limiter = RateLimiter(rate_limit) if isinstance(rate_limit, RateLimit) else rate_limit
        self._write_lock = threading.Lock()  # readers take the current frozensets without locking
        self._revoked_serials: frozenset[int] = frozenset(revoked_serials)
        self._revoked_ids = _normalise_revoked_identities(revoked_identities)
        self.revocation = revocation

    # ---- revocation (swapped atomically: safe while the server runs)

    def set_revoked(
        self,
        *,
        serials: Iterable[int] | None = None,
        identities: Iterable[str | tuple[str, str]] | None = None,
    ) -> None:
        """Replace the revocation sets (None leaves one unchanged)."""
        new_ids = None if identities is None else _normalise_revoked_identities(identities)
        with self._write_lock:
            if serials is not None:
                self._revoked_serials = frozenset(serials)
            if new_ids is not None:
                self._revoked_ids = new_ids

    def revoke(self, *, serial: int | None = None, identity: str | tuple[str, str] | None = None) -> None:
        """Add one serial and/or identity ("name" for every role, or (role, name))."""
        new_ids = _normalise_revoked_identities([] if identity is None else [identity])
        with self._write_lock:
            if serial is not None:
                self._revoked_serials = self._revoked_serials | {serial}
            self._revoked_ids = self._revoked_ids | new_ids

    # ---- decision

    def _allowed_for(self, method: str) -> frozenset[tuple[str, str]] | None:
        if method in self._policy:
            return self._policy[method]
        service = method.rsplit("/", 1)[0]
        return self._policy.get(f"{service}/{WILDCARD}")

    def decide(self, auth_context: Mapping[str, Sequence[bytes]], method: str) -> Peer:
        """The caller if allowed, else raise :class:`Denied` with the status to return."""
        try:
            caller = _peer_from_auth_context(auth_context)
        except PermissionError as exc:
            raise Denied(grpc.StatusCode.UNAUTHENTICATED, f"unauthenticated call to {method}: {exc}") from None
        limiter = self.limiter
        if limiter is not None:  # first: refusals of a flooding peer are cheap and logged sparingly
            wait = limiter.take((caller.role, caller.name))
            if wait > 0:
                raise Denied(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{caller} exceeded its rate limit of {limiter.limit}; refused {method}, retry in {wait:.2f} s",
                    caller,
                )
        revoked_ids = self._revoked_ids
        if (caller.role, caller.name) in revoked_ids or (WILDCARD, caller.name) in revoked_ids:
            raise Denied(grpc.StatusCode.PERMISSION_DENIED, f"{caller} is revoked; refused {method}")
        listed = self.revocation.serials() if self.revocation is not None else frozenset()
        if self._revoked_serials or listed:
            if caller.serial is None:  # cannot tell: fail closed
                raise Denied(grpc.StatusCode.PERMISSION_DENIED, f"{caller}: serial unknown, revocation uncheckable")
            if caller.serial in self._revoked_serials or caller.serial in listed:
                raise Denied(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{caller} certificate serial {caller.serial:#x} is revoked; refused {method}",
                )
        allowed = self._allowed_for(method)
        if allowed is None:
            raise Denied(grpc.StatusCode.PERMISSION_DENIED, f"{caller} may not call {method} (method not in policy)")
        for role, name in ((caller.role, caller.name), (caller.role, WILDCARD), (WILDCARD, caller.name)):
            if (role, name) in allowed:
                return caller
        if (WILDCARD, WILDCARD) in allowed:
            return caller
        raise Denied(grpc.StatusCode.PERMISSION_DENIED, f"{caller} may not call {method}")

    def _warn(self, key: object, fmt: str, *args: object) -> None:
        """A refusal log line, at most a few per second per caller (see LogThrottle)."""
        ok, dropped = self._log_throttle.allow(key)
        if ok and dropped:
            log.warning(fmt + " (%d similar lines not logged)", *args, dropped)
        elif ok:
            log.warning(fmt, *args)

    def _refuse(self, method: str, denied: Denied) -> None:
        if denied.code == grpc.StatusCode.RESOURCE_EXHAUSTED and denied.caller is not None and self.limiter:
            first, suppressed = self.limiter.should_log((denied.caller.role, denied.caller.name))
            if not first:
                return
            if suppressed:
                log.warning("refused %s: %s (%d more refusals of %s not logged)", method, denied.message,
                            suppressed, denied.caller)
                return
        key = str(denied.caller) if denied.caller is not None else denied.message.split(":", 1)[0]
        self._warn(key, "refused %s: %s", method, denied.message)

    def answered(self, context: grpc.ServicerContext, method: str, caller: Peer) -> None:
        """After a servicer raised: log the error status it set (never payload, just its reason)."""
        if not self.log_refusals:
            return
        try:
            code = context.code()
            details = context.details()
        except (AttributeError, NotImplementedError):  # pragma: no cover - older grpcio
            return
        if code is None or code == grpc.StatusCode.OK:
            return  # a crash: gRPC logs it with its traceback and answers UNKNOWN
        text = details.decode(errors="replace") if isinstance(details, bytes) else str(details or "")
        text = " ".join(text.split())
        text = text if len(text) <= 300 else text[:297] + "..."
        self._warn(str(caller), "%s answered %s to %s: %s", method, code.name, caller, text)

    def oversized_field(self, request: Any) -> str | None:
        """The first top-level string/bytes field longer than ``field_limits`` allows, described."""
        limits = self.field_limits
        if not limits or not hasattr(request, "ListFields"):
            return None
        default = limits.get(WILDCARD)
        for fd, value in request.ListFields():
            if isinstance(value, str | bytes):
                limit = limits.get(fd.name, default)
                n = len(value) if isinstance(value, bytes) else len(value.encode(errors="replace"))
                if limit is not None and n > limit:
                    return f"{fd.name}: {n} bytes, longer than the {limit} allowed"
        return None

    def malformed(self, context: grpc.ServicerContext, method: str, request: _Malformed | str) -> None:
        """Abort a call whose request did not parse (or has an oversized field): INVALID_ARGUMENT
        naming the caller and what is wrong, never the payload."""
        who = _describe_caller(context)
        message = f"{who}: malformed request to {method}: {request}"
        self._warn(who, "refused %s: %s", method, message)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

    def check(self, context: grpc.ServicerContext, method: str) -> Peer:
        """For servicers that authorise by hand: the caller, or abort the RPC."""
        try:
            return self.decide(context.auth_context() or {}, method)
        except Denied as denied:
            self._refuse(method, denied)
            context.abort(denied.code, denied.message)
            raise AssertionError("unreachable: context.abort raises") from None

    # ---- sync interceptor

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        handler = continuation(handler_call_details)
        if handler is None:
            if self._allowed_for(method) is not None:
                return None  # allowed but not implemented: UNIMPLEMENTED as usual
            return _wrap_sync(_DENY_HANDLER, method, self)
        return _wrap_sync(handler, method, self)


def _deny_behaviour(request: Any, context: grpc.ServicerContext) -> bytes:  # pragma: no cover - never reached
    context.abort(grpc.StatusCode.PERMISSION_DENIED, "method not in policy")
    return b""


_DENY_HANDLER = grpc.unary_unary_rpc_method_handler(_deny_behaviour)


class _Malformed:
    """Stands in for a request message that did not parse (the handler is never given it)."""

    __slots__ = ("nbytes", "error")

    def __init__(self, nbytes: int, error: str) -> None:
        self.nbytes, self.error = nbytes, error

    def __str__(self) -> str:
        return f"{self.nbytes} bytes that are not a valid request message ({self.error})"


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """A deserializer that returns :class:`_Malformed` instead of raising (so that we, not gRPC,
    answer: after authorisation, with INVALID_ARGUMENT instead of INTERNAL)."""
    if deserializer is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:  # DecodeError and friends; the message names no payload bytes
            return _Malformed(len(raw), type(exc).__name__)

    return parse


def _describe_caller(context: grpc.ServicerContext) -> str:
    try:
        return str(peer(context))
    except PermissionError:
        return "unauthenticated caller"


Malformed = Callable[[grpc.ServicerContext, str, "_Malformed | str"], None]


def _checked_requests(requests: Any, context: grpc.ServicerContext, method: str, malformed: Malformed) -> Any:
    for request in requests:
        if isinstance(request, _Malformed):
            malformed(context, method, request)
        yield request


def _wrap_sync(handler: grpc.RpcMethodHandler, method: str, auth: Authorizer) -> grpc.RpcMethodHandler:
    """The handler behind authorisation (and rate limit), request parsing check and refusal log."""
    common = {
        "request_deserializer": _tolerant(handler.request_deserializer),
        "response_serializer": handler.response_serializer,
    }
    check, malformed, answered = auth.check, auth.malformed, auth.answered
    if handler.unary_unary:
        inner_uu = handler.unary_unary

        def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
            caller = check(context, method)
            bad = request if isinstance(request, _Malformed) else auth.oversized_field(request)
            if bad is not None:
                malformed(context, method, bad)
            try:
                return inner_uu(request, context)
            except Exception:
                answered(context, method, caller)
                raise

        return grpc.unary_unary_rpc_method_handler(unary_unary, **common)
    if handler.unary_stream:
        inner_us = handler.unary_stream

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Any:
            caller = check(context, method)
            bad = request if isinstance(request, _Malformed) else auth.oversized_field(request)
            if bad is not None:
                malformed(context, method, bad)
            try:
                yield from inner_us(request, context)
            except Exception:
                answered(context, method, caller)
                raise

        return grpc.unary_stream_rpc_method_handler(unary_stream, **common)
    if handler.stream_unary:
        inner_su = handler.stream_unary

        def stream_unary(request_iterator: Any, context: grpc.ServicerContext) -> Any:
            caller = check(context, method)
            try:
                return inner_su(_checked_requests(request_iterator, context, method, malformed), context)
            except Exception:
                answered(context, method, caller)
                raise

        return grpc.stream_unary_rpc_method_handler(stream_unary, **common)
    inner_ss = handler.stream_stream

    def stream_stream(request_iterator: Any, context: grpc.ServicerContext) -> Any:
        caller = check(context, method)
        try:
            yield from inner_ss(_checked_requests(request_iterator, context, method, malformed), context)
        except Exception:
            answered(context, method, caller)
            raise

    return grpc.stream_stream_rpc_method_handler(stream_stream, **common)


__all__ = [
    "ROLES",
    "WILDCARD",
    "Authorizer",
    "Denied",
    "Peer",
    "Policy",
    "RateLimit",
    "RevocationSource",
    "channel_credentials",
    "expected_peer_target_name",
    "parse_expected_peer",
    "peer",
    "peer_identity",
    "secure_channel",
    "server_credentials",
]
