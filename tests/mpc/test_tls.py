"""Mutual TLS on real gRPC servers (127.0.0.1, ephemeral ports, real handshakes).

A tiny generic service (no proto) echoes bytes and the caller identity the server saw. Every
refusal asserts the status code, and that the handler never ran when the handshake should fail.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from mpc_erm.mpc import pki, tls

SERVICE = "mpc_erm.test.Echo"
ECHO = f"/{SERVICE}/Echo"
STREAM = f"/{SERVICE}/Stream"
ADMIN = f"/{SERVICE}/Admin"
UNLISTED = f"/{SERVICE}/Unlisted"
POLICY: tls.Policy = {
    ECHO: {("party", "*"), ("dealer", "d1")},
    STREAM: {("party", "*")},
    ADMIN: {("coordinator", "*")},
}
TIMEOUT = 5.0
UTC = dt.timezone.utc


class Server:
    """A real gRPC server on an ephemeral loopback port, counting handler invocations."""

    def __init__(self, identity: pki.Identity | None, authorizer: tls.Authorizer | None) -> None:
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

        def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                role, name = tls.peer_identity(context)
            except PermissionError as exc:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            with self._lock:
                self.calls.append((role, name))
            return f"{role}/{name}:".encode() + request

        def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            yield from (request[i : i + 1] for i in range(len(request)))

        handlers = {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Admin": grpc.unary_unary_rpc_method_handler(echo),
            "Unlisted": grpc.unary_unary_rpc_method_handler(echo),
        }
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4),
            handlers=[grpc.method_handlers_generic_handler(SERVICE, handlers)],
            interceptors=[authorizer] if authorizer else [],
        )
        if identity is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            self.port = self.server.add_secure_port("127.0.0.1:0", tls.server_credentials(identity))
        self.server.start()
        self.target = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(None)


@pytest.fixture(scope="module")
def ca() -> pki.CertificateAuthority:
    return pki.create_ca("test CA", valid_days=30)


@pytest.fixture(scope="module")
def evil_ca() -> pki.CertificateAuthority:
    return pki.create_ca("test CA", valid_days=30)  # same name, different key


@pytest.fixture(scope="module")
def ids(ca: pki.CertificateAuthority) -> dict[str, pki.Identity]:
    return {
        name: pki.issue_identity(ca, name, role)
        for name, role in [("p1", "party"), ("p2", "party"), ("d1", "dealer"), ("d2", "dealer"), ("c", "coordinator")]
    }


@pytest.fixture(scope="module")
def server(ids: dict[str, pki.Identity]) -> Iterator[Server]:
    srv = Server(ids["p1"], tls.Authorizer(POLICY))
    yield srv
    srv.stop()


@pytest.fixture
def make_server() -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def make(identity: pki.Identity | None, authorizer: tls.Authorizer | None = None) -> Server:
        srv = Server(identity, authorizer)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


def call(channel: grpc.Channel, method: str = ECHO, payload: bytes = b"hi") -> bytes:
    try:
        return channel.unary_unary(method)(payload, timeout=TIMEOUT)
    finally:
        channel.close()


def refused(fn: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        fn()
    return err.value


# --------------------------------------------------------------------------- accepted


def test_good_mtls_call_sees_peer_identity(server: Server, ids: dict[str, pki.Identity]) -> None:
    assert call(tls.secure_channel(server.target, ids["p2"], "p1")) == b"party/p2:hi"
    assert call(tls.secure_channel(server.target, ids["d1"], "party/p1")) == b"dealer/d1:hi"
    assert call(tls.secure_channel(server.target, ids["p2"], "p1", expected_role="party")) == b"party/p2:hi"
    assert ("party", "p2") in server.calls and ("dealer", "d1") in server.calls


def test_streaming_method_is_authorised_and_works(server: Server, ids: dict[str, pki.Identity]) -> None:
    ch = tls.secure_channel(server.target, ids["p2"], "mpc-erm://party/p1")
    try:
        assert list(ch.unary_stream(STREAM)(b"abc", timeout=TIMEOUT)) == [b"a", b"b", b"c"]
        err = refused(lambda: list(tls.secure_channel(server.target, ids["d1"], "p1").unary_stream(STREAM)(b"x")))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        ch.close()


def test_listener_cert_also_serves_plain_tls_clients_by_ip(server: Server, ids: dict[str, pki.Identity]) -> None:
    # No name override: the standard host-name check against the 127.0.0.1 IP SAN (e.g. grpcurl).
    ch = grpc.secure_channel(server.target, tls.channel_credentials(ids["p2"]))
    assert call(ch) == b"party/p2:hi"


# --------------------------------------------------------------------------- refused in the handshake


def test_client_without_certificate_refused(server: Server, ids: dict[str, pki.Identity]) -> None:
    n = len(server.calls)
    creds = grpc.ssl_channel_credentials(root_certificates=ids["p2"].ca_pem)
    ch = grpc.secure_channel(server.target, creds, options=[("grpc.ssl_target_name_override", "p1.id.mpc-erm.invalid")])
    assert refused(lambda: call(ch)).code() == grpc.StatusCode.UNAVAILABLE
    assert len(server.calls) == n


def test_client_cert_from_another_ca_refused(server: Server, evil_ca: pki.CertificateAuthority,
                                             ca: pki.CertificateAuthority) -> None:
    # The impostor even trusts the right CA for the server, and claims a valid name.
    n = len(server.calls)
    forged = pki.issue_identity(evil_ca, "p2", "party")
    impostor = pki.Identity("p2", "party", forged.cert_pem, forged.key_pem, ca.cert_pem)
    err = refused(lambda: call(tls.secure_channel(server.target, impostor, "p1")))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert len(server.calls) == n


def test_server_cert_from_another_ca_refused_by_client(make_server: Callable[..., Server],
                                                       evil_ca: pki.CertificateAuthority,
                                                       ca: pki.CertificateAuthority,
                                                       ids: dict[str, pki.Identity]) -> None:
    # The rogue server accepts our CA's client certs, so only the client's check can stop this.
    forged = pki.issue_identity(evil_ca, "p1", "party")
    srv = make_server(pki.Identity("p1", "party", forged.cert_pem, forged.key_pem, ca.cert_pem), tls.Authorizer(POLICY))
    err = refused(lambda: call(tls.secure_channel(srv.target, ids["p2"], "p1")))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "handshake failed" in err.details().lower()  # the client's verdict, not a closed socket
    assert srv.calls == []


@pytest.mark.parametrize("expected", ["p2", "dealer/p1", "P1", "coordinator/p1"])
def test_right_ca_wrong_server_identity_refused(server: Server, ids: dict[str, pki.Identity], expected: str) -> None:
    n = len(server.calls)
    err = refused(lambda: call(tls.secure_channel(server.target, ids["p2"], expected)))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "verification" in err.details().lower()  # gRPC's host-name check refused the server
    assert len(server.calls) == n  # nothing (no share) reached the wrong peer's handler


@pytest.mark.parametrize(
    "window",
    [
        ("expired", -2, -1),
        ("not-yet-valid", 1, 2),
    ],
)
def test_client_cert_outside_validity_refused(server: Server, ca: pki.CertificateAuthority,
                                              window: tuple[str, int, int]) -> None:
    _label, start_days, end_days = window
    now = dt.datetime.now(UTC)
    ident = pki.issue_identity(ca, "p2", "party", not_before=now + dt.timedelta(days=start_days),
                               not_after=now + dt.timedelta(days=end_days))
    n = len(server.calls)
    assert refused(lambda: call(tls.secure_channel(server.target, ident, "p1"))).code() == grpc.StatusCode.UNAVAILABLE
    assert len(server.calls) == n


def test_expired_server_cert_refused_by_client(make_server: Callable[..., Server], ca: pki.CertificateAuthority,
                                               ids: dict[str, pki.Identity]) -> None:
    now = dt.datetime.now(UTC)
    stale = pki.issue_identity(ca, "p1", "party", not_before=now - dt.timedelta(days=2),
                               not_after=now - dt.timedelta(days=1))
    srv = make_server(stale, tls.Authorizer(POLICY))
    assert refused(lambda: call(tls.secure_channel(srv.target, ids["p2"], "p1"))).code() == grpc.StatusCode.UNAVAILABLE
    assert srv.calls == []


# --------------------------------------------------------------------------- refused by the Authorizer


def test_identity_not_in_allow_list_denied(server: Server, ids: dict[str, pki.Identity],
                                           caplog: pytest.LogCaptureFixture) -> None:
    n = len(server.calls)
    with caplog.at_level(logging.WARNING, logger="mpc_erm.mpc.tls"):
        err = refused(lambda: call(tls.secure_channel(server.target, ids["d2"], "p1")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "dealer/d2" in err.details() and ECHO in err.details()
    assert "dealer/d2" in caplog.text and ECHO in caplog.text
    assert "PRIVATE KEY" not in caplog.text and "CERTIFICATE" not in caplog.text
    err = refused(lambda: call(tls.secure_channel(server.target, ids["p2"], "p1"), ADMIN))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "party/p2" in err.details()
    assert call(tls.secure_channel(server.target, ids["c"], "p1"), ADMIN) == b"coordinator/c:hi"
    assert len(server.calls) == n + 1


@pytest.mark.parametrize("method", [UNLISTED, f"/{SERVICE}/NoSuchMethod", "/other.Service/Echo"])
def test_methods_missing_from_policy_denied(server: Server, ids: dict[str, pki.Identity], method: str) -> None:
    err = refused(lambda: call(tls.secure_channel(server.target, ids["c"], "p1"), method))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "coordinator/c" in err.details() and method in err.details()


def test_service_wildcard_policy(make_server: Callable[..., Server], ids: dict[str, pki.Identity]) -> None:
    srv = make_server(ids["p1"], tls.Authorizer({f"/{SERVICE}/*": {("*", "c")}}))
    assert call(tls.secure_channel(srv.target, ids["c"], "p1"), UNLISTED) == b"coordinator/c:hi"
    assert refused(lambda: call(tls.secure_channel(srv.target, ids["p2"], "p1"))).code() == (
        grpc.StatusCode.PERMISSION_DENIED
    )


def test_revoked_identity_and_serial_denied(make_server: Callable[..., Server], ca: pki.CertificateAuthority,
                                           ids: dict[str, pki.Identity]) -> None:
    auth = tls.Authorizer(POLICY, revoked_identities=["d1"])
    srv = make_server(ids["p1"], auth)
    err = refused(lambda: call(tls.secure_channel(srv.target, ids["d1"], "p1")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "dealer/d1 is revoked" in err.details()

    # Revoke p2's current certificate by serial (from a CA-signed CRL), at runtime: a re-issued p2 still works.
    assert call(tls.secure_channel(srv.target, ids["p2"], "p1")) == b"party/p2:hi"
    crl = pki.create_crl(ca, [pki.certificate_serial(ids["p2"].cert_pem)])
    auth.set_revoked(serials=pki.revoked_serials_from_crl(crl, ca.cert_pem))
    err = refused(lambda: call(tls.secure_channel(srv.target, ids["p2"], "p1")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "serial" in err.details()
    assert call(tls.secure_channel(srv.target, pki.issue_identity(ca, "p2", "party"), "p1")) == b"party/p2:hi"

    auth.revoke(identity=("party", "p2"))
    err = refused(lambda: call(tls.secure_channel(srv.target, pki.issue_identity(ca, "p2", "party"), "p1")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    auth.set_revoked(serials=(), identities=())
    assert call(tls.secure_channel(srv.target, ids["d1"], "p1")) == b"dealer/d1:hi"


def test_registered_method_handlers_are_intercepted(ids: dict[str, pki.Identity]) -> None:
    # grpcio-tools >= 1.63 stubs register methods with add_registered_method_handlers; the
    # Authorizer must guard that path too.
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return "/".join(tls.peer_identity(context)).encode()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[tls.Authorizer(POLICY)])
    server.add_registered_method_handlers(SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(echo),
                                                    "Unlisted": grpc.unary_unary_rpc_method_handler(echo)})
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(ids["p1"]))
    server.start()
    try:
        with tls.secure_channel(f"127.0.0.1:{port}", ids["p2"], "p1") as ch:
            assert ch.unary_unary(ECHO, _registered_method=True)(b"", timeout=TIMEOUT) == b"party/p2"
            with pytest.raises(grpc.RpcError) as err:
                ch.unary_unary(UNLISTED, _registered_method=True)(b"", timeout=TIMEOUT)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with tls.secure_channel(f"127.0.0.1:{port}", ids["d2"], "p1") as ch:
            with pytest.raises(grpc.RpcError) as err:
                ch.unary_unary(ECHO, _registered_method=True)(b"", timeout=TIMEOUT)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        server.stop(None)


def test_plaintext_call_is_unauthenticated(make_server: Callable[..., Server]) -> None:
    # Misconfigured insecure port: the Authorizer and peer_identity fail closed.
    guarded = make_server(None, tls.Authorizer(POLICY))
    err = refused(lambda: call(grpc.insecure_channel(guarded.target)))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    bare = make_server(None, None)
    err = refused(lambda: call(grpc.insecure_channel(bare.target)))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "certificate" in err.details()
    assert guarded.calls == [] and bare.calls == []


# --------------------------------------------------------------------------- API edges


def test_expected_peer_forms() -> None:
    assert tls.parse_expected_peer("p1") == (None, "p1")
    assert tls.parse_expected_peer("party/p1") == ("party", "p1")
    assert tls.parse_expected_peer("mpc-erm://dealer/d") == ("dealer", "d")
    assert tls.parse_expected_peer("d", "dealer") == ("dealer", "d")
    assert tls.expected_peer_target_name("party/p1") == "p1.party.mpc-erm.invalid"
    with pytest.raises(ValueError, match="expected_role"):
        tls.parse_expected_peer("party/p1", "dealer")
    with pytest.raises(ValueError, match="expected_peer"):
        tls.parse_expected_peer("bad name")
    with pytest.raises(ValueError, match="expected_peer role"):
        tls.parse_expected_peer("admin/p1")


def test_secure_channel_refuses_to_unpin(ids: dict[str, pki.Identity]) -> None:
    with pytest.raises(ValueError, match="ssl_target_name_override"):
        tls.secure_channel("127.0.0.1:1", ids["p1"], "p2", options=[("grpc.ssl_target_name_override", "x")])


@pytest.mark.parametrize(
    "policy",
    [{"Echo": {("party", "*")}}, {ECHO: {("admin", "*")}}, {ECHO: {("party", "bad name")}}, {ECHO: {"party"}}],
)
def test_bad_policy_rejected(policy: tls.Policy) -> None:
    with pytest.raises(ValueError, match="policy"):
        tls.Authorizer(policy)
