"""The mutual-TLS identity matrix against a real party daemon process and a real share transport.

One table: who calls (a certificate: none, another CA's, expired, not yet valid, revoked through
the deployment's CRL, the right CA but the wrong identity or role), what it calls (the daemon's
coordinator-only methods, GetEndpoint, Health; the transport's Deliver/DeliverOne/Ping), and
the exact refusal. Refusals decided on a verified identity are PERMISSION_DENIED and name that
identity and the method; refusals in the TLS handshake are UNAVAILABLE at the client (the server
never learns a verified identity, so nothing can name it) and no handler runs. After every case
a legitimate call is served (the daemon: coordinator ListJobs + Health, process alive; the
transport: a member's message stored and read back).

The daemon is ``mpc-erm party serve`` with ``identity.crl`` set; the transport is bob's
``TransportServer.configured(..., callers=...)`` with a ``CallerPolicy`` on that CRL, as a job worker
of a daemon with that CRL runs it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from mpc_erm.mpc import pki, tls
from mpc_erm.mpc._proto import party_pb2 as cpb
from mpc_erm.mpc._proto import party_pb2_grpc as cpb_grpc
from mpc_erm.mpc._proto import transport_pb2 as pb
from mpc_erm.mpc._proto import transport_pb2_grpc as pb_grpc
from mpc_erm.mpc.callers import CallerPolicy
from mpc_erm.mpc.transport import PartyTable, TransportServer
from parties.config import load_party_config
from parties.daemon import PartyDaemon
from tests.reliability.test_wire import DaemonProcess, wait_logged

pytestmark = pytest.mark.reliability

T = 20.0
UTC = dt.timezone.utc
CONTROL = "/mpc_erm.v1.PartyControl"
TRANSPORT = "/mpc_erm.v1.ShareTransport"
DENIED, UNAVAILABLE = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAVAILABLE
SHARE = b"\x07" * 64


@dataclasses.dataclass
class Matrix:
    """The deployment: one CA, the daemon (alice) and bob's transport, and every caller's certificate."""

    ca: pki.CertificateAuthority
    ids: dict[str, pki.Identity]
    revoked: dict[str, int]
    daemon: DaemonProcess
    transport: TransportServer
    table: PartyTable
    root: Path


def _variants(ca: pki.CertificateAuthority, evil: pki.CertificateAuthority, name: str, role: str,
              ) -> dict[str, pki.Identity]:
    now = dt.datetime.now(UTC)
    return {
        "revoked": pki.issue_identity(ca, name, role),  # type: ignore[arg-type]
        "expired": pki.issue_identity(ca, name, role, not_before=now - dt.timedelta(days=10),  # type: ignore[arg-type]
                                      not_after=now - dt.timedelta(days=1)),
        "not-yet-valid": pki.issue_identity(ca, name, role, not_before=now + dt.timedelta(days=1),  # type: ignore[arg-type]
                                            not_after=now + dt.timedelta(days=10)),
        # a certificate for the same identity from another CA (of the same name); the caller
        # still trusts the real CA, so only its own certificate is wrong
        "other-ca": dataclasses.replace(pki.issue_identity(evil, name, role), ca_pem=ca.cert_pem),  # type: ignore[arg-type]
    }


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    root = tmp_path_factory.mktemp("identity-matrix")
    ca, evil = pki.create_ca("matrix CA", valid_days=30), pki.create_ca("matrix CA", valid_days=30)
    pki_dir = root / "pki"
    ids: dict[str, pki.Identity] = {}
    for key, name, role in [("alice", "alice", "party"), ("bob", "bob", "party"), ("dave", "dave", "party"),
                            ("dealer", "dealer", "dealer"), ("coord", "coord", "coordinator"),
                            ("intruder", "intruder", "coordinator"), ("party/coord", "coord", "party"),
                            ("dealer/alice", "alice", "dealer")]:
        ids[key] = pki.issue_identity(ca, name, role)  # type: ignore[arg-type]
    pki.save_identity(ids["alice"], pki_dir)  # the daemon's own files; callers stay in memory
    for base, name, role in (("coord", "coord", "coordinator"), ("alice", "alice", "party"), ("bob", "bob", "party")):
        for variant, ident in _variants(ca, evil, name, role).items():
            ids[f"{base}:{variant}"] = ident
    revoked = {k: pki.certificate_serial(ids[f"{k}:revoked"].cert_pem) for k in ("coord", "alice", "bob")}
    crl = pki_dir / "ca.crl"
    crl.write_bytes(pki.create_crl(ca, revoked.values()))
    daemon = DaemonProcess(root, pki_dir, crl=crl).start()
    transport = TransportServer.configured(ids["bob"], "127.0.0.1:0", callers=CallerPolicy(ca.cert_pem, crl=crl))
    port = transport.start()
    table = PartyTable.from_pairs("matrix-job", [("alice", "127.0.0.1:1"), ("bob", f"127.0.0.1:{port}")])
    transport.register_job(table, 1)
    try:
        yield Matrix(ca, ids, revoked, daemon, transport, table, root)
    finally:
        transport.stop(0)
        daemon.stop()


def _channel(m: Matrix, target: str, server: str, who: str) -> grpc.Channel:
    opts = [(tls.TARGET_NAME_OVERRIDE, tls.expected_peer_target_name(server, "party"))]
    if who == "no-cert":  # TLS with the right root, but no client certificate at all
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=m.ca.cert_pem), opts)
    return tls.secure_channel(target, m.ids[who], server, expected_role="party")


_JOB = ('method = "output"\n\n[job]\nname = "m"\ndataset = "adult"\nparties = ["alice", "bob", "carol"]\n'
        'trust = "replicated"\n\n[privacy]\nepsilon = 0.5\ndelta = 1e-5\nmechanism = "gaussian"\n'
        '\n[training]\niterations = 10\n')
CONTROL_CALLS: dict[str, Callable[[cpb_grpc.PartyControlStub], object]] = {
    "SubmitJob": lambda s: s.SubmitJob(cpb.SubmitRequest(job_id="m1", job_toml=_JOB), timeout=T),
    "GetStatus": lambda s: s.GetStatus(cpb.JobRef(job_id="m1"), timeout=T),
    "Watch": lambda s: list(s.Watch(cpb.WatchRequest(job_id="m1"), timeout=T)),
    "Cancel": lambda s: s.Cancel(cpb.CancelRequest(job_id="m1"), timeout=T),
    "ListJobs": lambda s: s.ListJobs(cpb.ListRequest(), timeout=T),
    "GetResult": lambda s: list(s.GetResult(cpb.ResultRequest(job_id="m1"), timeout=T)),
    "GetEndpoint": lambda s: s.GetEndpoint(cpb.EndpointRequest(job_id="m1"), timeout=T),
    "Health": lambda s: s.Health(cpb.HealthRequest(), timeout=T),
}
COORDINATOR_ONLY = ("SubmitJob", "GetStatus", "Watch", "Cancel", "ListJobs", "GetResult")


def _message(table: PartyTable, src: int = 0, seq: int = 0) -> pb.Chunk:
    h = pb.Header(key=pb.MessageKey(job_id=table.job_id, src=src, dst=1, seq=seq), op="p2p",
                  kind=pb.PAYLOAD_KIND_TENSOR, total_bytes=len(SHARE))
    h.tensor.CopyFrom(pb.TensorHeader(dtype="uint8", shape=[len(SHARE)]))
    return pb.Chunk(header=h, data=SHARE)


TRANSPORT_CALLS: dict[str, Callable[[pb_grpc.ShareTransportStub, PartyTable], object]] = {
    "DeliverOne": lambda s, t: s.DeliverOne(_message(t, seq=10**6), timeout=T),
    "Deliver": lambda s, t: s.Deliver(iter([_message(t, seq=10**6)]), timeout=T),
    "Ping": lambda s, t: s.Ping(pb.PingRequest(job_id=t.job_id, src=0), timeout=T),
}


def _serial(m: Matrix, who: str) -> str:
    return f"{m.revoked[who]:#x}"


# (service, caller, method, status, expected fragment of the reason: a function of the matrix, or None)
Row = tuple[str, str, str, grpc.StatusCode, Callable[[Matrix], str] | None]
ROWS: dict[str, Row] = {
    # ---- the daemon's control service
    "control/no-client-cert": ("control", "no-cert", "Health", UNAVAILABLE, None),
    "control/other-ca": ("control", "coord:other-ca", "ListJobs", UNAVAILABLE, None),
    "control/expired": ("control", "coord:expired", "ListJobs", UNAVAILABLE, None),
    "control/not-yet-valid": ("control", "coord:not-yet-valid", "ListJobs", UNAVAILABLE, None),
    "control/revoked-coordinator": ("control", "coord:revoked", "ListJobs", DENIED, lambda m: (
        f"coordinator/coord certificate serial {_serial(m, 'coord')} is revoked; refused {CONTROL}/ListJobs")),
    "control/revoked-coordinator-health": ("control", "coord:revoked", "Health", DENIED, lambda m: (
        f"coordinator/coord certificate serial {_serial(m, 'coord')} is revoked; refused {CONTROL}/Health")),
    "control/revoked-party-endpoint": ("control", "bob:revoked", "GetEndpoint", DENIED, lambda m: (
        f"party/bob certificate serial {_serial(m, 'bob')} is revoked; refused {CONTROL}/GetEndpoint")),
    "control/coordinator-not-in-policy": ("control", "intruder", "SubmitJob", DENIED,
                                          lambda m: f"coordinator/intruder may not call {CONTROL}/SubmitJob"),
    "control/right-name-wrong-role": ("control", "party/coord", "SubmitJob", DENIED,
                                      lambda m: f"party/coord may not call {CONTROL}/SubmitJob"),
    "control/coordinator-calls-GetEndpoint": ("control", "coord", "GetEndpoint", DENIED,
                                              lambda m: f"coordinator/coord may not call {CONTROL}/GetEndpoint"),
    **{f"control/party-calls-{meth}": ("control", "bob", meth, DENIED,
                                       lambda m, meth=meth: f"party/bob may not call {CONTROL}/{meth}")  # type: ignore[misc]
       for meth in COORDINATOR_ONLY},
    **{f"control/dealer-calls-{meth}": ("control", "dealer", meth, DENIED,
                                        lambda m, meth=meth: f"dealer/dealer may not call {CONTROL}/{meth}")  # type: ignore[misc]
       for meth in COORDINATOR_ONLY},
    # ---- bob's share transport (job member: alice, rank 0)
    "transport/no-client-cert": ("transport", "no-cert", "Ping", UNAVAILABLE, None),
    "transport/other-ca": ("transport", "alice:other-ca", "DeliverOne", UNAVAILABLE, None),
    "transport/expired": ("transport", "alice:expired", "DeliverOne", UNAVAILABLE, None),
    "transport/not-yet-valid": ("transport", "alice:not-yet-valid", "DeliverOne", UNAVAILABLE, None),
    "transport/revoked-member": ("transport", "alice:revoked", "DeliverOne", DENIED, lambda m: (
        f"party/alice certificate serial {_serial(m, 'alice')} is revoked; refused {TRANSPORT}/DeliverOne")),
    "transport/revoked-member-ping": ("transport", "alice:revoked", "Ping", DENIED, lambda m: (
        f"party/alice certificate serial {_serial(m, 'alice')} is revoked; refused {TRANSPORT}/Ping")),
    **{f"transport/coordinator-calls-{meth}": (
        "transport", "coord", meth, DENIED,
        lambda m, meth=meth: f"coordinator/coord may not call {TRANSPORT}/{meth}")  # type: ignore[misc]
       for meth in TRANSPORT_CALLS},
    "transport/party-not-in-job": ("transport", "dave", "DeliverOne", DENIED,
                                   lambda m: "job matrix-job: party/dave is not a member of the job"),
    "transport/member-name-wrong-role": ("transport", "dealer/alice", "DeliverOne", DENIED,
                                         lambda m: "job matrix-job: dealer/alice is not a member of the job"),
}


def _legit_control(m: Matrix) -> None:
    assert m.daemon.alive(), "the daemon died"
    _, stub = _stub(m, "coord")
    assert stub.Health(cpb.HealthRequest(), timeout=T).name == "alice"
    stub.ListJobs(cpb.ListRequest(), timeout=T)


_seq = iter(range(10**9))


def _legit_transport(m: Matrix) -> None:
    ch = _channel(m, f"127.0.0.1:{m.transport.port}", "bob", "alice")
    try:
        seq = next(_seq)
        pb_grpc.ShareTransportStub(ch).DeliverOne(_message(m.table, seq=seq), timeout=T)
    finally:
        ch.close()
    box = m.transport.job(m.table.job_id)
    assert box is not None
    msg = box.take(0, seq, 1.0)
    assert msg is not None and bytes(msg.data) == SHARE


def _stub(m: Matrix, who: str) -> tuple[grpc.Channel, cpb_grpc.PartyControlStub]:
    ch = _channel(m, m.daemon.target, "alice", who)
    return ch, cpb_grpc.PartyControlStub(ch)


@pytest.mark.parametrize("row", list(ROWS))
def test_identity_matrix(matrix: Matrix, row: str, caplog: pytest.LogCaptureFixture) -> None:
    service, who, method, code, fragment = ROWS[row]
    caplog.set_level(logging.INFO, logger="mpc_erm.mpc")
    m = matrix
    mark = m.daemon.stderr_path.stat().st_size
    if service == "control":
        ch, stub = _stub(m, who)
        call: Callable[[], object] = lambda: CONTROL_CALLS[method](stub)
    else:
        ch = _channel(m, f"127.0.0.1:{m.transport.port}", "bob", who)
        tstub = pb_grpc.ShareTransportStub(ch)
        call = lambda: TRANSPORT_CALLS[method](tstub, m.table)
    try:
        with pytest.raises(grpc.RpcError) as info:
            call()
    finally:
        ch.close()
    err = info.value
    assert err.code() == code, (err.code(), err.details())
    new_log = m.daemon.stderr_path.read_bytes()[mark:].decode(errors="replace")
    app_log = new_log if service == "control" else caplog.text
    if fragment is None:
        # refused in the handshake: no handler ran, so nothing about the call reached the logs
        assert f"/{method}" not in app_log, app_log
    else:
        want = fragment(m)
        assert want in (err.details() or ""), err.details()
        if service == "control":
            from tests.reliability.test_wire import wait_logged

            wait_logged(lambda: m.daemon.stderr_path.read_bytes()[mark:].decode(errors="replace"), want)
        else:
            assert want in caplog.text, caplog.text
    box = m.transport.job(m.table.job_id)
    assert box is not None and box.pending() == 0, "a refused caller's message was stored"
    _legit_control(m) if service == "control" else _legit_transport(m)


def test_health_is_open_to_every_identity_of_the_ca(matrix: Matrix) -> None:
    """The contrast to the table: the same certificates that are refused above, when valid, are
    served where the policy lets them (Health: anyone of the CA; GetEndpoint: a party)."""
    for who in ("bob", "dealer", "intruder", "party/coord", "dave"):
        ch, stub = _stub(matrix, who)
        try:
            assert stub.Health(cpb.HealthRequest(), timeout=T).role == "party"
        finally:
            ch.close()
    ch, stub = _stub(matrix, "bob")
    try:
        err = pytest.raises(grpc.RpcError, stub.GetEndpoint, cpb.EndpointRequest(job_id="m1"), timeout=T).value
        assert err.code() == grpc.StatusCode.NOT_FOUND  # past authorisation: the job does not exist
    finally:
        ch.close()


def test_a_stale_or_foreign_crl_is_refused_at_start(matrix: Matrix, tmp_path: Path) -> None:
    """Fail closed: a daemon (or a job's transport) given a CRL past its next_update, or signed by
    another CA, does not start, rather than silently honouring an outdated revocation list."""
    now = dt.datetime.now(UTC)
    stale = tmp_path / "stale.crl"
    stale.write_bytes(pki.create_crl(matrix.ca, matrix.revoked.values(), last_update=now - dt.timedelta(days=40),
                                     next_update=now - dt.timedelta(days=10)))
    foreign = tmp_path / "foreign.crl"
    foreign.write_bytes(pki.create_crl(pki.create_ca("matrix CA"), matrix.revoked.values()))
    for crl, reason in ((stale, "stale since"), (foreign, "not signed by this CA")):
        with pytest.raises(ValueError, match=reason):
            CallerPolicy(matrix.ca.cert_pem, crl=crl)
        text = matrix.daemon.config_text().replace(str(matrix.daemon.crl), str(crl))
        cfg = tmp_path / "alice" / "party.toml"
        cfg.parent.mkdir(exist_ok=True)
        (cfg.parent / "rows.npz").write_bytes(b"stand-in")
        cfg.write_text(text)
        with pytest.raises(ValueError, match=f"identity.crl: crl: {reason}"):
            PartyDaemon(load_party_config(cfg), log_to_stderr=False).start()


def test_sighup_reloads_the_crl_and_keeps_the_old_one_when_the_new_one_is_bad(matrix: Matrix, tmp_path: Path) -> None:
    """Revocation without a restart: the operator revokes bob (``certs revoke``) and sends SIGHUP;
    bob's otherwise valid certificate is refused from the next call on. A list that does not
    verify is not applied (the old one stays: nobody is un-revoked by a mistake); restoring the
    list and another SIGHUP let bob in again."""
    daemon, crl = matrix.daemon, matrix.daemon.crl
    assert daemon.proc is not None and crl is not None
    original = crl.read_bytes()
    bob = pki.certificate_serial(matrix.ids["bob"].cert_pem)

    def bob_health() -> grpc.StatusCode | None:
        ch, stub = _stub(matrix, "bob")
        try:
            stub.Health(cpb.HealthRequest(), timeout=T)
            return None
        except grpc.RpcError as exc:
            return exc.code()
        finally:
            ch.close()

    def hup(fragment: str) -> None:
        seen = daemon.log_text().count(fragment)
        os.kill(daemon.proc.pid, signal.SIGHUP)  # type: ignore[union-attr]
        wait_logged(lambda: "\n".join([fragment] * (daemon.log_text().count(fragment) > seen)), fragment)

    assert bob_health() is None
    try:
        crl.write_bytes(pki.create_crl(matrix.ca, [*matrix.revoked.values(), bob]))
        hup(f"CRL reloaded: {len(matrix.revoked) + 1} revoked serial(s)")
        assert bob_health() == DENIED
        wait_logged(daemon.log_text, f"certificate serial {bob:#x} is revoked")
        crl.write_bytes(pki.create_crl(pki.create_ca("matrix CA"), []))  # same name, another CA: not ours
        hup("CRL not reloaded, the previous list stays in force")
        assert bob_health() == DENIED
        assert daemon.alive()
    finally:
        crl.write_bytes(original)
        hup(f"CRL reloaded: {len(matrix.revoked)} revoked serial(s)")
    assert bob_health() is None
