"""Hostile wire input against a real share transport server and a real party daemon process.

Every case sends what a buggy or malicious peer could put on the wire (with a valid certificate
of the deployment: the TLS matrix is tests/reliability/test_identity_matrix.py) and asserts

* the exact gRPC status and a reason that names what was wrong;
* one log line saying so, which never contains payload bytes (every payload here carries MARK);
* the server survives: a legitimate exchange works right after (a real Endpoint send/receive for
  the transport; a real coordinator call, and the process still alive, for the daemon).

What tests/mpc/test_transport.py already covers is not repeated here (unknown job on Deliver,
a party sending as another party, a coordinator on the transport, a header whose size does
not match its dtype and shape, a full mailbox).

Transport: an in-process ``TransportServer`` per identity (real gRPC + mTLS on 127.0.0.1), as the
job workers run it. Daemon: ``mpc-erm party serve`` in its own process group, with this module as
its (stand-in) job worker so that a job can be kept open without data or peers.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from mpc_erm.mpc import pki, tls
from mpc_erm.mpc._proto import party_pb2 as cpb
from mpc_erm.mpc._proto import party_pb2_grpc as cpb_grpc
from mpc_erm.mpc._proto import transport_pb2 as pb
from mpc_erm.mpc._proto import transport_pb2_grpc as pb_grpc
from mpc_erm.mpc.ratelimit import RateLimit
from mpc_erm.mpc.transport import Endpoint, PartyTable, TransportOptions, TransportServer
from mpc_erm.mpc.transport.mailbox import MESSAGE_OVERHEAD

from .faults import stop_process_group

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
MARK = b"SHARE-BYTES-d41d8c"  # every hostile payload is made of this: it must never reach a log
TENSOR, OBJECT, TOKEN = pb.PAYLOAD_KIND_TENSOR, pb.PAYLOAD_KIND_OBJECT, pb.PAYLOAD_KIND_TOKEN
TRANSPORT = "/mpc_erm.v1.ShareTransport"
CONTROL = "/mpc_erm.v1.PartyControl"
BIG_OPTIONS = [("grpc.max_send_message_length", 80 << 20), ("grpc.max_receive_message_length", 80 << 20)]
T = 20.0  # per-call timeout: generous for a loaded 2-core CI machine, still bounded


def payload(n: int) -> bytes:
    return (MARK * (n // len(MARK) + 1))[:n]


def refused(fn: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value


# =============================================================================== the stand-in job worker


def run_party_job(ctx: Any) -> dict[str, Any]:
    """Runs in the daemon's worker process: publish an endpoint, then wait to be cancelled."""
    from parties.context import JobCancelled

    ctx.publish_endpoint("127.0.0.1:9")
    while not ctx.cancelled():
        time.sleep(0.05)
    raise JobCancelled("stopped on request")


# =============================================================================== a daemon process


def make_pki(root: Path, extra: list[tuple[str, str]] = ()) -> tuple[pki.CertificateAuthority, Path]:  # type: ignore[assignment]
    """CA + the identities the daemon tests use, saved as the daemons and the CLI expect them."""
    ca = pki.create_ca("wire test CA", valid_days=30)
    d = root / "pki"
    for name, role in [("alice", "party"), ("bob", "party"), ("carol", "party"), ("dealer", "dealer"),
                       ("coord", "coordinator"), ("flood", "coordinator"), *extra]:
        pki.save_identity(pki.issue_identity(ca, name, role), d)  # type: ignore[arg-type]
    return ca, d


@dataclass
class DaemonProcess:
    """``mpc-erm party serve`` for alice, in its own process group; stderr kept for the log checks."""

    root: Path
    pki_dir: Path
    limits: str = ""
    crl: Path | None = None
    worker_module: str | None = None
    # name -> (address, role); default: addresses nothing listens on (jobs here are refused, or
    # prepared and never agreed: a job starts only once every member prepared it)
    peers: dict[str, tuple[str, str]] | None = None
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.dir = self.root / "alice"

    @property
    def stderr_path(self) -> Path:
        return self.dir / "stderr.log"

    def config_text(self) -> str:
        p = self.pki_dir
        lines = ['listen = "127.0.0.1:0"', 'state_dir = "state"', "", "[identity]", 'name = "alice"',
                 f'cert = "{p / "alice.crt"}"', f'key = "{p / "alice.key"}"', f'ca = "{p / "ca.crt"}"']
        if self.crl is not None:
            lines.append(f'crl = "{self.crl}"')
        peers = self.peers or {"bob": ("127.0.0.1:1", "party"), "carol": ("127.0.0.1:2", "party"),
                               "dealer": ("127.0.0.1:3", "dealer")}
        for peer, (address, role) in peers.items():
            lines += ["", f"[peers.{peer}]", f'address = "{address}"', f'role = "{role}"']
        lines += ["", "[datasets.adult]", 'format = "npz"', 'path = "rows.npz"', "epsilon = 50.0", "delta = 1e-3",
                  "", "[policy]", 'allowed_coordinators = ["coord", "flood"]', "max_epsilon_per_job = 1.0",
                  "max_iterations = 50"]
        if self.limits:
            lines += ["", "[limits]", self.limits]
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 90.0) -> DaemonProcess:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "rows.npz").write_bytes(b"stand-in")
        cfg = self.dir / "party.toml"
        cfg.write_text(self.config_text())
        cmd = [sys.executable, "-m", "coordinator.cli", "party", "serve", "--config", str(cfg)]
        if self.worker_module:
            cmd += ["--worker-module", self.worker_module]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   PYTHONUNBUFFERED="1")
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                         cwd=self.dir, start_new_session=True, env=env)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline and self.proc.poll() is None:
            line = self.proc.stdout.readline()
            if line:
                break
        if not line:
            self.stop()
            raise AssertionError(f"daemon did not start:\n{self.stderr_path.read_text(errors='replace')[-3000:]}")
        event = json.loads(line)
        assert event["event"] == "listening", event
        self.port = int(event["port"])
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        """What the daemon logged: its stderr (library warnings + its own lines) and daemon.log."""
        text = self.stderr_path.read_text(errors="replace")
        own = self.dir / "state" / "daemon.log"
        return text + (own.read_text(errors="replace") if own.exists() else "")

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        stop_process_group(proc, 30)  # our own process group: the daemon and its workers


def control_stub(pki_dir: Path, target: str, who: str, options: list[tuple[str, Any]] | None = None,
                 ) -> tuple[grpc.Channel, cpb_grpc.PartyControlStub]:
    ch = tls.secure_channel(target, pki.load_identity(pki_dir, who), "alice", options or [], expected_role="party")
    return ch, cpb_grpc.PartyControlStub(ch)


def wait_logged(source: Callable[[], str], *fragments: str, timeout: float = 10.0) -> str:
    """The first log line containing every fragment (log lines may land just after the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        for line in source().splitlines():
            if all(f in line for f in fragments):
                return line
        if time.monotonic() > deadline:
            raise AssertionError(f"no log line with {fragments!r}; log tail:\n{source()[-2000:]}")
        time.sleep(0.05)


# =============================================================================== transport fixture


class Wire:
    """alice's and bob's transport servers in this process; hostile calls go to bob's mailbox."""

    def __init__(self) -> None:
        self.ca = pki.create_ca("wire transport CA")
        roles = {"alice": "party", "bob": "party", "carol": "party", "dave": "party", "dealer1": "dealer",
                 "coord": "coordinator"}
        self.ids = {n: pki.issue_identity(self.ca, n, r) for n, r in roles.items()}  # type: ignore[arg-type]
        self.servers = {n: TransportServer(self.ids[n], "127.0.0.1:0") for n in ("alice", "bob")}
        self.ports = {n: s.start() for n, s in self.servers.items()}
        self.bob = self.servers["bob"]
        self._n = 0
        self._channels: dict[str, grpc.Channel] = {}

    def addr(self, name: str) -> str:
        return f"127.0.0.1:{self.ports.get(name, 1)}"

    def register(self, *, dealer: bool = True, server: TransportServer | None = None) -> PartyTable:
        """A fresh job at bob's mailbox (rank 1): alice 0, bob 1, carol 2 (+ dealer1 3)."""
        self._n += 1
        server = server or self.bob
        addrs = {n: self.addr(n) for n in ("alice", "carol", "dealer1")} | {"bob": f"127.0.0.1:{server.port}"}
        table = PartyTable.from_pairs(f"hostile-{self._n}", [(n, addrs[n]) for n in ("alice", "bob", "carol")],
                                      dealer=("dealer1", addrs["dealer1"]) if dealer else None)
        server.register_job(table, 1)
        return table

    def channel(self, who: str, port: int | None = None) -> grpc.Channel:
        key = f"{who}:{port}"
        if key not in self._channels:
            self._channels[key] = tls.secure_channel(f"127.0.0.1:{port or self.ports['bob']}", self.ids[who], "bob",
                                                     BIG_OPTIONS, expected_role="party")
        return self._channels[key]

    def stub(self, who: str = "alice", port: int | None = None) -> pb_grpc.ShareTransportStub:
        return pb_grpc.ShareTransportStub(self.channel(who, port))

    def raw_unary(self, who: str, method: str) -> Any:
        return self.channel(who).unary_unary(f"{TRANSPORT}/{method}")

    def raw_stream(self, who: str, method: str) -> Any:
        return self.channel(who).stream_unary(f"{TRANSPORT}/{method}")

    def legit_exchange(self) -> None:
        """A real two-member job between alice's and bob's servers: connect, send both ways, receive."""
        self._n += 1
        table = PartyTable.from_pairs(f"legit-{self._n}", [("alice", self.addr("alice")), ("bob", self.addr("bob"))])
        opts = TransportOptions(deadline_s=T, connect_timeout_s=T)
        eps = [Endpoint(table, r, self.ids[m.name], server=self.servers[m.name], options=opts)
               for r, m in enumerate(table.members)]
        try:
            for ep in eps:
                ep.connect()
            x = torch.arange(1000, dtype=torch.int64)
            eps[0].send(1, "p2p", x, kind=TENSOR, deadline=eps[0].deadline())
            assert torch.equal(eps[1].recv_tensor(0, "p2p", eps[1].deadline()), x)
            eps[1].send(0, "obj", {"ok": True}, kind=OBJECT, deadline=eps[1].deadline())
            assert eps[0].recv_object(1, "obj", eps[0].deadline()) == {"ok": True}
        finally:
            for ep in eps:
                ep.close()

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        for s in self.servers.values():
            s.stop(0)


@pytest.fixture(scope="module")
def wire() -> Iterator[Wire]:
    w = Wire()
    yield w
    w.close()


def header(table: PartyTable, *, src: int = 0, dst: int = 1, seq: int = 0, kind: int = TENSOR,
           dtype: str = "uint8", shape: tuple[int, ...] | None = None, total: int | None = None) -> pb.Header:
    h = pb.Header(key=pb.MessageKey(job_id=table.job_id, src=src, dst=dst, seq=seq), op="p2p", kind=kind)  # type: ignore[arg-type]
    if kind == TENSOR:
        h.tensor.CopyFrom(pb.TensorHeader(dtype=dtype, shape=list(shape if shape is not None else (8,))))
    h.total_bytes = total if total is not None else (8 if kind == TENSOR else 0)
    return h


def one(h: pb.Header, data: bytes = b"") -> pb.Chunk:
    return pb.Chunk(header=h, data=data)


# ------------------------------------------------------------------------------- the hostile table

# Each case: who sends, a function (wire, table) doing the call, the status, a fragment of the
# reason, and a fragment of the log line (None: refused by gRPC's core before any Python runs, so
# no application log exists; the client still gets the status).
Case = tuple[str, Callable[[Wire, PartyTable], object], grpc.StatusCode, str, str | None]
INVALID, DENIED = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED
MiB = 1 << 20

TRANSPORT_CASES: dict[str, Case] = {
    # --- malformed chunks and streams
    "no-header-unary": ("alice", lambda w, t: w.stub().DeliverOne(pb.Chunk(data=payload(64)), timeout=T),
                        INVALID, "must start with a header chunk", "must start with a header chunk"),
    "no-header-stream": ("alice", lambda w, t: w.stub().Deliver(iter([pb.Chunk(data=payload(64))]), timeout=T),
                         INVALID, "must start with a header chunk", "must start with a header chunk"),
    "empty-stream": ("alice", lambda w, t: w.stub().Deliver(iter([]), timeout=T),
                     INVALID, "must start with a header chunk", "must start with a header chunk"),
    "not-protobuf-unary": ("alice", lambda w, t: w.raw_unary("alice", "DeliverOne")(b"\xff\xff\xff" + payload(64),
                                                                                    timeout=T),
                           INVALID, "party/alice: malformed request to /mpc_erm.v1.ShareTransport/DeliverOne",
                           "malformed request"),
    "not-protobuf-in-stream": ("alice", lambda w, t: w.raw_stream("alice", "Deliver")(
        iter([one(header(t, shape=(128,), total=128), payload(64)).SerializeToString(), b"\xff\xff" + payload(64)]),
        timeout=T), INVALID, "party/alice: malformed request to /mpc_erm.v1.ShareTransport/Deliver",
        "malformed request"),
    "not-utf8-job-id": ("alice", lambda w, t: w.raw_unary("alice", "Ping")(b"\x0a\x03\xff\xfe\xfd", timeout=T),
                        INVALID, "malformed request to /mpc_erm.v1.ShareTransport/Ping", "malformed request"),
    "over-grpc-max": ("alice", lambda w, t: w.stub().DeliverOne(one(header(t, shape=(5 * MiB,), total=5 * MiB),
                                                                    payload(5 * MiB)), timeout=T),
                      grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max", None),
    "longer-than-announced-unary": ("alice", lambda w, t: w.stub().DeliverOne(one(header(t), payload(16)), timeout=T),
                                    INVALID, "message longer than its announced 8 bytes", "longer than its announced"),
    "extra-chunk": ("alice", lambda w, t: w.stub().Deliver(iter([one(header(t), payload(8)),
                                                                 pb.Chunk(data=payload(1))]), timeout=T),
                    INVALID, "message longer than its announced 8 bytes", "longer than its announced"),
    "truncated-stream": ("alice", lambda w, t: w.stub().Deliver(iter([one(header(t, shape=(3 * MiB,), total=3 * MiB),
                                                                          payload(MiB))]), timeout=T),
                         INVALID, f"message ended after {MiB} of {3 * MiB} announced bytes", "ended after"),
    "header-repeated": ("alice", lambda w, t: w.stub().Deliver(iter([one(header(t), payload(4)),
                                                                     one(header(t), payload(4))]), timeout=T),
                        INVALID, "header repeated inside a message", "header repeated"),
    "chunk-over-max": ("alice", lambda w, t: w.stub().Deliver(iter([one(header(t, shape=(8 * MiB,), total=8 * MiB),
                                                                        payload(4 * MiB + 1))]), timeout=T),
                       INVALID, f"chunk of {4 * MiB + 1} bytes exceeds {4 * MiB}", "exceeds"),
    # --- headers that lie about the payload
    "unknown-dtype": ("alice", lambda w, t: w.stub().DeliverOne(one(header(t, dtype="object", shape=(1,), total=1),
                                                                    payload(1)), timeout=T),
                      INVALID, "unknown dtype 'object'", "unknown dtype"),
    "negative-dimension": ("alice", lambda w, t: w.stub().DeliverOne(one(header(t, shape=(-8,))), timeout=T),
                           INVALID, "negative dimension in shape [-8]", "negative dimension"),
    "shape-overflow": ("alice", lambda w, t: w.stub().DeliverOne(one(header(t, dtype="float64",
                                                                            shape=(2**31, 2**31, 2**31)),
                                                                     payload(8)), timeout=T),
                       INVALID, "announced size does not match dtype and shape", "does not match"),
    "announced-over-limit": ("alice", lambda w, t: w.stub().DeliverOne(one(header(t, shape=(3 << 30,),
                                                                                  total=3 << 30)), timeout=T),
                             INVALID, f"message of {3 << 30} bytes exceeds {2 << 30}", "exceeds"),
    "unspecified-kind": ("alice", lambda w, t: w.stub().DeliverOne(one(header(t, kind=0)), timeout=T),
                         INVALID, "unknown payload kind 0", "unknown payload kind"),
    "token-with-data": ("alice", lambda w, t: w.stub().DeliverOne(one(header(t, kind=TOKEN, total=4), payload(4)),
                                                                  timeout=T),
                        INVALID, "a token carries no data", "a token carries no data"),
    "object-over-limit": ("alice", lambda w, t: w.stub().DeliverOne(one(header(t, kind=OBJECT, total=65 * MiB)),
                                                                    timeout=T),
                          INVALID, f"object of {65 * MiB} bytes exceeds {64 * MiB}", "object of"),
    # --- keys: wrong destination, unknown job, sequence numbers, replays
    "wrong-dst": ("alice", lambda w, t: w.stub().DeliverOne(one(header(t, dst=2), payload(8)), timeout=T),
                  INVALID, "this mailbox serves rank 1, not 2", "serves rank 1, not 2"),
    "dst-out-of-range": ("alice", lambda w, t: w.stub().DeliverOne(one(header(t, dst=4000), payload(8)), timeout=T),
                         INVALID, "this mailbox serves rank 1, not 4000", "not 4000"),
    "ping-unknown-job": ("alice", lambda w, t: w.stub().Ping(pb.PingRequest(job_id="no-such-job", src=0), timeout=T),
                         grpc.StatusCode.NOT_FOUND, "job 'no-such-job' is not registered", "no-such-job"),
    "huge-unknown-job-id": ("alice", lambda w, t: w.stub().DeliverOne(one(pb.Header(
        key=pb.MessageKey(job_id="j" * (2 * MiB), src=0, dst=1), kind=TOKEN)), timeout=T),
        grpc.StatusCode.NOT_FOUND, "is not registered", "...' is not registered"),
    "duplicate-key": ("alice", lambda w, t: [w.stub().DeliverOne(one(header(t, seq=7), payload(8)), timeout=T)
                                             for _ in range(2)],
                      grpc.StatusCode.ALREADY_EXISTS, "message src=0 seq=7 already delivered", "seq=7 already"),
    # --- identities of the job: not a member, sending as another member
    "not-a-member": ("dave", lambda w, t: w.stub("dave").DeliverOne(one(header(t), payload(8)), timeout=T),
                     DENIED, "party/dave is not a member of the job", "party/dave is not a member"),
    "not-a-member-ping": ("dave", lambda w, t: w.stub("dave").Ping(pb.PingRequest(job_id=t.job_id, src=0), timeout=T),
                          DENIED, "party/dave is not a member of the job", "party/dave is not a member"),
    "dealer-as-party": ("dealer1", lambda w, t: w.stub("dealer1").DeliverOne(one(header(t, src=0), payload(8)),
                                                                             timeout=T),
                        DENIED, "caller dealer/dealer1 may not send as party 0 'alice'", "may not send as party 0"),
    "src-out-of-range": ("alice", lambda w, t: w.stub().DeliverOne(one(header(t, src=9), payload(8)), timeout=T),
                         DENIED, "party/alice: no member with rank 9", "no member with rank 9"),
    "ping-as-other-rank": ("carol", lambda w, t: w.stub("carol").Ping(pb.PingRequest(job_id=t.job_id, src=0),
                                                                      timeout=T),
                           DENIED, "caller party/carol may not send as party 0 'alice'", "party/carol may not send"),
}


@pytest.mark.parametrize("case", sorted(TRANSPORT_CASES))
def test_hostile_transport_message_is_refused_logged_and_harmless(wire: Wire, case: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    who, call, code, fragment, logged = TRANSPORT_CASES[case]
    caplog.set_level(logging.DEBUG, logger="mpc_erm.mpc")
    table = wire.register()
    box = wire.bob.job(table.job_id)
    assert box is not None
    err = refused(lambda: call(wire, table))
    assert err.code() == code, (err.code(), err.details())
    assert fragment in (err.details() or ""), err.details()
    assert MARK.decode() not in (err.details() or "")
    if logged is not None:
        lines = [r.getMessage() for r in caplog.records if logged in r.getMessage()]
        assert lines, f"no log line with {logged!r}: {[r.getMessage() for r in caplog.records]}"
        assert any(who in line for line in lines), lines  # the line names the caller
        assert all(len(line) < 2000 for line in lines), "a log line echoes attacker-sized input"
    assert MARK.decode() not in caplog.text
    # nothing half-stored: only the accepted first copy of a duplicate sits in the box
    assert box.pending() == (1 if case == "duplicate-key" else 0)
    wire.bob.unregister_job(table.job_id)
    wire.legit_exchange()


def test_replays_within_a_job_and_from_a_finished_job_are_refused(wire: Wire,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mpc_erm.mpc")
    old = wire.register()
    chunk = one(header(old, seq=0, shape=(len(MARK),), total=len(MARK)), MARK)
    wire.stub().DeliverOne(chunk, timeout=T)
    box = wire.bob.job(old.job_id)
    assert box is not None and bytes(box.take(0, 0, 1.0).data) == MARK  # type: ignore[union-attr]
    # the same key again, after the receiver consumed it: a replay, not a new message
    err = refused(lambda: wire.stub().DeliverOne(chunk, timeout=T))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS and "src=0 seq=0 already delivered" in err.details()
    assert box.pending() == 0
    # the job ends; a new job starts; the old message replayed is for a job that is gone
    wire.bob.unregister_job(old.job_id)
    new = wire.register()
    err = refused(lambda: wire.stub().DeliverOne(chunk, timeout=T))
    assert err.code() == grpc.StatusCode.NOT_FOUND and f"job {old.job_id!r} is not registered" in err.details()
    new_box = wire.bob.job(new.job_id)
    assert new_box is not None and new_box.pending() == 0
    assert "party/alice" in caplog.text and old.job_id in caplog.text and MARK.decode() not in caplog.text
    wire.bob.unregister_job(new.job_id)
    wire.legit_exchange()


def test_out_of_order_and_far_future_sequence_numbers_are_bounded_by_the_mailbox(wire: Wire) -> None:
    """Sequence numbers may arrive in any order (concurrent streams): they are keys, not a counter.
    A member cannot use that to store unbounded numbers of empty messages: each stored message is
    charged MESSAGE_OVERHEAD bytes (before the fix, tokens and empty tensors were free)."""
    small = TransportServer(wire.ids["bob"], "127.0.0.1:0", max_pending_bytes=64 * MESSAGE_OVERHEAD)
    port = small.start()
    try:
        table = wire.register(server=small)
        stub = wire.stub("alice", port)
        for seq in (2, 0, 1):  # out of order: all stored, taken in key order
            stub.DeliverOne(one(header(table, kind=TOKEN, seq=seq)), timeout=T)
        box = small.job(table.job_id)
        assert box is not None
        assert [box.take(0, s, 1.0) is not None for s in (0, 1, 2)] == [True, True, True]
        accepted = 0
        with pytest.raises(grpc.RpcError) as info:
            for k in range(1000):
                stub.DeliverOne(one(header(table, kind=TOKEN, seq=2**63 + k)), timeout=T)
                accepted += 1
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "mailbox full" in info.value.details()
        assert accepted == 64 and box.pending() == 64
        # the receiver taking messages frees their room again
        box.take(0, 2**63, 1.0)
        stub.DeliverOne(one(header(table, kind=TOKEN, seq=5)), timeout=T)
    finally:
        small.stop(0)
    wire.legit_exchange()


def test_a_stream_cut_off_mid_message_releases_its_reservation(wire: Wire) -> None:
    """A sender that disappears half-way through a message (cancelled call) must not leave the
    bytes it announced reserved: otherwise every cut-off stream shrinks the mailbox for good."""
    small = TransportServer(wire.ids["bob"], "127.0.0.1:0", max_pending_bytes=4 * MiB)
    port = small.start()
    try:
        table = wire.register(server=small)
        box = small.job(table.job_id)
        assert box is not None
        sent_first = __import__("threading").Event()

        def chunks() -> Iterator[pb.Chunk]:
            yield one(header(table, shape=(3 * MiB,), total=3 * MiB), payload(MiB))
            sent_first.set()
            time.sleep(T)  # never sends the rest

        for _ in range(3):  # each cut-off stream would leak 3 MiB of a 4 MiB mailbox
            sent_first.clear()
            fut = wire.stub("alice", port).Deliver.future(chunks(), timeout=T)
            assert sent_first.wait(T)
            deadline = time.monotonic() + T
            while box._reserved == 0:  # the server read the header and reserved the announced size
                assert time.monotonic() < deadline, "the server never reserved room for the message"
                time.sleep(0.01)
            fut.cancel()
            deadline = time.monotonic() + T
            while box._reserved and time.monotonic() < deadline:
                time.sleep(0.05)
            assert box._reserved == 0, "a cancelled stream kept its reservation"
        x = torch.zeros(3 * MiB, dtype=torch.uint8)
        sender = Endpoint(table, 0, wire.ids["alice"], server=wire.servers["alice"],
                          options=TransportOptions(deadline_s=T))
        try:
            sender.send(1, "p2p", x, kind=TENSOR, deadline=sender.deadline())
        finally:
            sender.close()
        assert box.pending() == 1
    finally:
        small.stop(0)
    wire.legit_exchange()


def test_transport_rate_limit_is_per_peer_and_answers_resource_exhausted(wire: Wire,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mpc_erm.mpc")
    # 0.5 calls/s: the burst is what a flooder gets; refills are too slow to matter while it floods
    limited = TransportServer(wire.ids["bob"], "127.0.0.1:0", rate_limit=RateLimit(rate_per_s=0.5, burst=20))
    port = limited.start()
    try:
        table = wire.register(server=limited)
        flooder, other = wire.stub("alice", port), wire.stub("carol", port)
        ok = 0
        with pytest.raises(grpc.RpcError) as info:
            for _ in range(200):
                flooder.Ping(pb.PingRequest(job_id=table.job_id, src=0), timeout=T)
                ok += 1
        err = info.value
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
        assert "party/alice exceeded its rate limit of 0.5 calls/s (burst 20)" in err.details()
        assert 20 <= ok <= 25  # the burst, plus what refilled meanwhile on a slow machine
        for _ in range(10):  # still refused while flooding; each refusal is cheap
            assert refused(lambda: flooder.Ping(pb.PingRequest(job_id=table.job_id, src=0), timeout=T)).code() \
                == grpc.StatusCode.RESOURCE_EXHAUSTED
        # another peer is not affected
        assert other.Ping(pb.PingRequest(job_id=table.job_id, src=2), timeout=T).rank == 1
        lines = [r.getMessage() for r in caplog.records if "rate limit" in r.getMessage()]
        assert 1 <= len(lines) <= 3, lines  # one line per peer per 10 s, not one per refusal
        time.sleep(2.5)  # refilled: the flooder may send again
        assert flooder.Ping(pb.PingRequest(job_id=table.job_id, src=0), timeout=T).rank == 1
    finally:
        limited.stop(0)
    wire.legit_exchange()


# =============================================================================== the daemon's control service


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    from tests.parties.test_daemon import stand_in_members

    root = tmp_path_factory.mktemp("wire-daemon")
    _, pki_dir = make_pki(root)
    # bob, carol and the dealer: stand-ins that have agreed to every job, so that alice's jobs start
    with stand_in_members(pki_dir, {"bob": "party", "carol": "party", "dealer": "dealer"}) as peers:
        d = DaemonProcess(root, pki_dir, limits="control_calls_per_s = 10.0\ncontrol_burst = 300",
                          worker_module=__name__, peers=peers).start()
        yield d
        d.stop()


def _ctl(daemon: DaemonProcess, who: str = "coord", big: bool = False) -> cpb_grpc.PartyControlStub:
    return control_stub(daemon.pki_dir, daemon.target, who, BIG_OPTIONS if big else None)[1]


def _raw(daemon: DaemonProcess, method: str, stream: bool = False) -> Any:
    ch, _ = control_stub(daemon.pki_dir, daemon.target, "coord")
    return (ch.unary_stream if stream else ch.unary_unary)(f"{CONTROL}/{method}")


def _job_toml(name: str = "block") -> str:
    return (f'method = "output"\n\n[job]\nname = "{name}"\ndataset = "adult"\nparties = ["alice", "bob", "carol"]\n'
            'trust = "replicated"\n\n[privacy]\nepsilon = 0.5\ndelta = 1e-5\nmechanism = "gaussian"\n'
            '\n[training]\niterations = 10\n')


CONTROL_CASES: dict[str, tuple[str, Callable[[DaemonProcess], object], grpc.StatusCode, str, str | None]] = {
    "submit-over-grpc-max": ("coord", lambda d: _ctl(d, big=True).SubmitJob(
        cpb.SubmitRequest(job_id="j1", job_toml=payload(65 * MiB).decode()), timeout=60),
        grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max", None),
    "submit-oversized-toml": ("coord", lambda d: _ctl(d).SubmitJob(  # over the job file's bound (8 MiB)
        cpb.SubmitRequest(job_id="j1", job_toml=payload(9 * MiB).decode()), timeout=T),
        INVALID, f"job_toml: {9 * MiB} bytes, longer than the {8 * MiB} allowed", f"job_toml: {9 * MiB} bytes"),
    "submit-not-protobuf": ("coord", lambda d: _raw(d, "SubmitJob")(b"\xff\xff" + payload(100), timeout=T),
                            INVALID, "coordinator/coord: malformed request to /mpc_erm.v1.PartyControl/SubmitJob",
                            "malformed request"),
    "submit-not-utf8": ("coord", lambda d: _raw(d, "SubmitJob")(b"\x0a\x02j1\x12\x03\xff\xfe\xfd", timeout=T),
                        INVALID, "malformed request to /mpc_erm.v1.PartyControl/SubmitJob", "malformed request"),
    "watch-not-protobuf": ("coord", lambda d: list(_raw(d, "Watch", stream=True)(b"\xff" + payload(50), timeout=T)),
                           INVALID, "malformed request to /mpc_erm.v1.PartyControl/Watch", "malformed request"),
    "status-unknown-job": ("coord", lambda d: _ctl(d).GetStatus(cpb.JobRef(job_id="nope"), timeout=T),
                           grpc.StatusCode.NOT_FOUND, "no job 'nope' at alice", "GetStatus answered NOT_FOUND"),
    "submit-huge-bad-job-id": ("coord", lambda d: _ctl(d).SubmitJob(
        cpb.SubmitRequest(job_id="/" * (4 * MiB), job_toml=_job_toml()), timeout=T),
        INVALID, f"job_id: {4 * MiB} bytes, longer than the 1024 allowed", "job_id: 4194304"),
    # ids are echoed in refusals: a 4 MiB one would not even fit in the answer's trailer (gRPC then
    # fails the call with RESOURCE_EXHAUSTED, or never answers: DEADLINE_EXCEEDED) nor in a log line
    "status-huge-job-id": ("coord", lambda d: _ctl(d).GetStatus(cpb.JobRef(job_id="n" * (4 * MiB)), timeout=T),
                           INVALID, f"job_id: {4 * MiB} bytes, longer than the 1024 allowed", "job_id: 4194304"),
    "watch-unknown-job": ("coord", lambda d: list(_ctl(d).Watch(cpb.WatchRequest(job_id="nope"), timeout=T)),
                          grpc.StatusCode.NOT_FOUND, "no job 'nope' at alice", "Watch answered NOT_FOUND"),
    "cancel-unknown-job": ("coord", lambda d: _ctl(d).Cancel(cpb.CancelRequest(job_id="nope"), timeout=T),
                           grpc.StatusCode.NOT_FOUND, "nope", "Cancel answered NOT_FOUND"),
    "result-unknown-job": ("coord", lambda d: list(_ctl(d).GetResult(cpb.ResultRequest(job_id="nope"), timeout=T)),
                           grpc.StatusCode.NOT_FOUND, "no job 'nope' at alice", "GetResult answered NOT_FOUND"),
    "endpoint-unknown-job": ("bob", lambda d: _ctl(d, "bob").GetEndpoint(cpb.EndpointRequest(job_id="nope"),
                                                                         timeout=T),
                             grpc.StatusCode.NOT_FOUND, "no job 'nope' at alice", "GetEndpoint answered NOT_FOUND"),
}


@pytest.mark.parametrize("case", sorted(CONTROL_CASES))
def test_hostile_control_call_is_refused_logged_and_harmless(daemon: DaemonProcess, case: str) -> None:
    who, call, code, fragment, logged = CONTROL_CASES[case]
    mark = daemon.stderr_path.stat().st_size
    err = refused(lambda: call(daemon))
    assert err.code() == code, (err.code(), err.details())
    assert fragment in (err.details() or ""), err.details()
    assert len(err.details() or "") < 64 << 10, "the answer echoes attacker-sized input"
    if logged is not None:  # a line of this call: written after mark
        line = wait_logged(lambda: daemon.stderr_path.read_bytes()[mark:].decode(errors="replace"), logged)
        assert who in line and len(line) < 4000, line
    assert daemon.alive()
    assert MARK.decode() not in daemon.log_text()
    ctl = _ctl(daemon)
    assert ctl.Health(cpb.HealthRequest(), timeout=T).name == "alice"
    ctl.ListJobs(cpb.ListRequest(), timeout=T)


@pytest.mark.slow  # a real worker process per run: ~15-30 s on a loaded 2-core machine
def test_a_job_is_only_for_its_members_and_refusals_leave_it_running(daemon: DaemonProcess) -> None:
    """With a job open at the daemon (stand-in worker): a non-member's GetEndpoint, a job id reused
    for another job, a result asked of an unfinished job are refused; the job goes on."""
    ctl = _ctl(daemon)
    job_id = f"wire{int(time.time() * 1000)}"
    assert ctl.SubmitJob(cpb.SubmitRequest(job_id=job_id, job_toml=_job_toml()), timeout=60).accepted
    try:
        bob = _ctl(daemon, "bob")
        deadline = time.monotonic() + 60
        while True:  # wait for the worker to publish its endpoint
            try:
                assert bob.GetEndpoint(cpb.EndpointRequest(job_id=job_id, wait_s=5), timeout=T).address
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND and time.monotonic() < deadline, exc.details()
        # a non-member is answered as for a job that does not exist: it cannot even learn the id is in use
        unknown = refused(lambda: _ctl(daemon, "dealer").GetEndpoint(cpb.EndpointRequest(job_id="nosuchjob"),
                                                                     timeout=T))
        for who, code, fragment in (("dealer", grpc.StatusCode.NOT_FOUND, f"no job {job_id!r} at alice"),
                                    ("coord", DENIED, "coordinator/coord may not call")):
            err = refused(lambda who=who: _ctl(daemon, who).GetEndpoint(  # type: ignore[misc]
                cpb.EndpointRequest(job_id=job_id), timeout=T))
            assert err.code() == code and fragment in err.details(), err.details()
            if who == "dealer":
                assert (err.code(), err.details().replace(job_id, "nosuchjob")) == (unknown.code(), unknown.details())
        # the same job id with another job: refused, and the running one is untouched
        err = refused(lambda: ctl.SubmitJob(cpb.SubmitRequest(job_id=job_id, job_toml=_job_toml("other")), timeout=T))
        assert err.code() in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION, INVALID), \
            (err.code(), err.details())
        assert job_id in err.details()
        err = refused(lambda: list(ctl.GetResult(cpb.ResultRequest(job_id=job_id), timeout=T)))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "no result" in err.details()
        assert ctl.GetStatus(cpb.JobRef(job_id=job_id), timeout=T).status in ("queued", "running")
        wait_logged(daemon.log_text, "GetEndpoint", "dealer/dealer is not a member")
    finally:
        ctl.Cancel(cpb.CancelRequest(job_id=job_id, reason="test over"), timeout=T)
    deadline = time.monotonic() + 60
    while ctl.GetStatus(cpb.JobRef(job_id=job_id), timeout=T).status != "cancelled":
        assert time.monotonic() < deadline, "the job did not end after its cancel"
        time.sleep(0.1)
    assert daemon.alive()


def test_control_rate_limit_is_per_identity(daemon: DaemonProcess) -> None:
    """alice's daemon allows 10 calls/s, burst 300, per caller: a flooding coordinator (``flood``)
    gets RESOURCE_EXHAUSTED naming it and the limit; ``coord`` is served all along."""
    flood, coord = _ctl(daemon, "flood"), _ctl(daemon)
    ok = 0
    with pytest.raises(grpc.RpcError) as info:
        for _ in range(2000):
            flood.ListJobs(cpb.ListRequest(limit=1), timeout=T)
            ok += 1
    err = info.value
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    assert "coordinator/flood exceeded its rate limit of 10 calls/s (burst 300)" in err.details()
    assert 300 <= ok <= 1000, ok
    assert coord.ListJobs(cpb.ListRequest(limit=1), timeout=T) is not None
    assert coord.Health(cpb.HealthRequest(), timeout=T).name == "alice"
    line = wait_logged(daemon.log_text, "coordinator/flood exceeded its rate limit")
    assert daemon.log_text().count("coordinator/flood exceeded its rate limit") <= 2, line
    assert daemon.alive()


def test_a_flood_of_refused_messages_cannot_flood_the_log(wire: Wire, caplog: pytest.LogCaptureFixture) -> None:
    """Every refusal is logged, but at most a burst of lines and a few per second per caller; the
    next line after a pause says how many were not logged. The other callers' lines still come."""
    caplog.set_level(logging.INFO, logger="mpc_erm.mpc")
    fresh = TransportServer(wire.ids["bob"], "127.0.0.1:0")  # its log budget untouched by earlier tests
    port = fresh.start()
    try:
        table = wire.register(server=fresh)
        stub = wire.stub("alice", port)
        for _ in range(150):
            assert refused(lambda: stub.DeliverOne(pb.Chunk(data=payload(8)), timeout=T)).code() == INVALID
        lines = [r.getMessage() for r in caplog.records if "party/alice" in r.getMessage()]
        assert 50 <= len(lines) <= 80, len(lines)  # the burst (50) plus the refill while flooding
        refused(lambda: wire.stub("dave", port).DeliverOne(one(header(table)), timeout=T))
        assert any("party/dave is not a member" in r.getMessage() for r in caplog.records)
        time.sleep(0.5)
        refused(lambda: stub.DeliverOne(pb.Chunk(data=payload(8)), timeout=T))
        last = caplog.records[-1].getMessage()
        assert "party/alice" in last and "similar lines not logged" in last, last
    finally:
        fresh.stop(0)
    wire.legit_exchange()


def test_token_buckets_refill_are_per_key_and_stay_bounded() -> None:
    """The limiter itself, on a fake clock: burst, refill, per-key isolation, bounded key table."""
    from mpc_erm.mpc.ratelimit import LogThrottle, RateLimiter

    now = [0.0]
    rl = RateLimiter(RateLimit(rate_per_s=2.0, burst=3.0), max_keys=8, clock=lambda: now[0])
    assert [rl.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rl.take("a") == pytest.approx(0.5)  # one token back in 0.5 s at 2/s
    assert rl.take("b") == 0.0  # another key has its own bucket
    now[0] += 0.5
    assert rl.take("a") == 0.0 and rl.take("a") > 0
    for k in range(100):  # many identities: the table stays bounded
        rl.take(("party", f"p{k}"))
    assert len(rl._buckets) <= 8
    with pytest.raises(ValueError):
        RateLimit(rate_per_s=0, burst=1)
    throttle = LogThrottle(RateLimit(rate_per_s=1e-9, burst=2))
    assert [throttle.allow("x")[0] for _ in range(5)] == [True, True, False, False, False]
    assert throttle.allow("y") == (True, 0)
