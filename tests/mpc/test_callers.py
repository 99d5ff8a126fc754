"""One identity policy for every server of a member (mpc_erm.mpc.callers), in one process.

- The CRL file is followed: replaced whole, the new list holds at the next look (at once through
  ``refresh``, within a second on the call path); a file that does not verify (another CA, garbage)
  leaves the previous list in force and says why.
- An owner intake built on the policy refuses a revoked owner (enrolment, and a contribution after
  a CRL published mid-job, from the round opened after it), and an owner over the policy's owner
  rate (RESOURCE_EXHAUSTED); a share transport built on the same policy refuses a revoked party
  on the same reload.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest
import torch

from mpc_erm.mpc import pki
from mpc_erm.mpc._proto import transport_pb2 as tpb
from mpc_erm.mpc._proto import transport_pb2_grpc as tpb_grpc
from mpc_erm.mpc.callers import CallerPolicy, RevocationList
from mpc_erm.mpc.ratelimit import RateLimit
from mpc_erm.mpc.tls import secure_channel
from mpc_erm.mpc.transport import TransportServer
from parties.owner.intake import IntakeError, OwnerClient, OwnerIntake, RoundFrame
from parties.owner.shares import owner_margin_bits

OWNERS = ("clinic-00", "clinic-01", "clinic-02", "clinic-03")
DIM, GRID = 8, 16


def publish(ca: pki.CertificateAuthority, path: Path, serials: list[int]) -> None:
    """What ``mpc-erm certs revoke`` does: a fresh CA-signed list replaces the file whole."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pki.create_crl(ca, serials))
    os.replace(tmp, path)


def serial(ident: pki.Identity) -> int:
    return pki.certificate_serial(ident.cert_pem)


def test_the_crl_file_is_followed_and_a_bad_one_leaves_the_list_in_force(tmp_path: Path) -> None:
    ca = pki.create_ca("callers CA")
    crl = tmp_path / "crl.pem"
    publish(ca, crl, [11])
    rev = RevocationList(crl, ca.cert_pem, check_every_s=0.2)
    assert rev.serials() == {11}
    publish(ca, crl, [11, 12])
    rev.refresh()
    assert rev.serials() == {11, 12}
    publish(ca, crl, [11, 12, 13])  # the call path looks again once check_every_s has passed
    deadline = time.monotonic() + 5
    while rev.serials() != {11, 12, 13} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rev.serials() == {11, 12, 13}
    publish(pki.create_ca("callers CA"), crl, [])  # same name, another CA: nobody is un-revoked by it
    rev.refresh()
    assert rev.serials() == {11, 12, 13} and rev.last_error is not None and "not signed by this CA" in rev.last_error
    crl.write_bytes(b"garbage")
    assert not rev.reload() and rev.serials() == {11, 12, 13}
    publish(ca, crl, [12])
    assert rev.reload() and rev.serials() == {12} and rev.last_error is None
    crl.unlink()  # deleted: the list in force stays
    rev.refresh()
    assert rev.serials() == {12}
    with pytest.raises(ValueError, match="crl: cannot read"):
        RevocationList(crl, ca.cert_pem)
    with pytest.raises(ValueError, match="rates: unknown server kind"):
        CallerPolicy(ca.cert_pem, rates={"dealer": RateLimit(1, 1)})


def _frame(rank: int) -> RoundFrame:
    return RoundFrame("job-c", OWNERS, 2, rank, GRID, owner_margin_bits(len(OWNERS)), DIM)


def test_every_server_on_the_policy_refuses_the_revoked_and_the_flooding(tmp_path: Path) -> None:
    ca = pki.create_ca("callers CA")
    crl = tmp_path / "crl.pem"
    owners = {name: pki.issue_identity(ca, name, "owner") for name in OWNERS}
    parties = [pki.issue_identity(ca, f"compute-{r}", "party") for r in range(2)]
    stranger_party = pki.issue_identity(ca, "compute-9", "party")
    publish(ca, crl, [serial(owners["clinic-03"])])  # revoked before the job
    callers = [CallerPolicy(ca.cert_pem, crl=crl, rates={"owners": RateLimit(rate_per_s=5.0, burst=30.0)})
               for _ in range(2)]
    intakes = [OwnerIntake(parties[r], _frame(r), callers=callers[r]).start() for r in range(2)]
    transport = TransportServer.configured(parties[1], "127.0.0.1:0", callers=callers[1])
    port = transport.start()
    compute = [(f"compute-{r}", i.address) for r, i in enumerate(intakes)]
    clients = {o: OwnerClient(owners[name], "job-c", o, compute) for o, name in enumerate(OWNERS)}
    try:
        for o in range(3):
            clients[o].enroll(timeout_s=10)
        with pytest.raises(IntakeError) as info:  # a revoked owner that knows the intake's address
            clients[3].enroll(timeout_s=10)
        assert info.value.code == grpc.StatusCode.PERMISSION_DENIED and "is revoked" in info.value.details
        assert all(3 not in i.enrolled for i in intakes)
        for i in intakes:
            i.open_round(0)
        v = torch.full((DIM,), 0.25, dtype=torch.float64)
        for o in range(3):
            clients[o].contribute(0, v)
        assert all(i.wait_for(3, 5) == 3 for i in intakes)
        for i in intakes:
            i.close_round()
        # mid-job: the CA revokes clinic-01 (and a compute party); the next round refuses its share
        publish(ca, crl, [serial(owners["clinic-03"]), serial(owners["clinic-01"]), serial(stranger_party)])
        for i in intakes:
            i.open_round(1)  # each looks at the file as the round opens
        clients[0].contribute(1, v)
        clients[2].contribute(1, v)
        with pytest.raises(grpc.RpcError) as rpc:
            clients[1].contribute(1, v)
        assert rpc.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
        assert f"serial {serial(owners['clinic-01']):#x} is revoked" in rpc.value.details()  # type: ignore[attr-defined]
        present, _ = intakes[1].close_round()
        intakes[0].close_round()
        assert 1 not in present and {0, 2} <= set(present) | set(intakes[0].enrolled)
        # the transport on the same policy took the same list (no restart, no signal)
        with secure_channel(f"127.0.0.1:{port}", stranger_party, "party/compute-1") as ch:
            with pytest.raises(grpc.RpcError) as rpc:
                tpb_grpc.ShareTransportStub(ch).Ping(tpb.PingRequest(job_id="job-c", src=0), timeout=10)
        assert rpc.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
        # an owner flooding its explicit party is cut off at the policy's owner rate
        codes = []
        for _ in range(60):
            try:
                clients[0].released(7, wait_s=0.0)
            except grpc.RpcError as exc:
                codes.append(exc.code())  # type: ignore[attr-defined]
        assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes and grpc.StatusCode.DEADLINE_EXCEEDED in codes
    finally:
        for c in clients.values():
            c.close()
        for i in intakes:
            i.stop()
        transport.stop(0)
