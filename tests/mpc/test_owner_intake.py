"""Issue 17: data owners as real gRPC clients (their own certificates, role ``owner``) of the
compute parties' owner intake (parties.owner.intake), over mutual TLS.

In one process: three intakes (compute ranks 0–2) and several owners — enrolment, a round's
shares, an owner that reaches only two compute parties left out by the agreement, the released
state read back, and every refusal naming its field. Through real processes: three compute
parties (CrypTen, dealer, in-MPC noise off and on) each hosting its intake, 30 owners in this
process, each with its own identity and channels, 3 rounds with dropouts; the released sums
equal the agreed owners' contributions exactly (no noise) and differ by the planned noise (noise).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from mpc_erm.mpc import pki
from mpc_erm.mpc._proto import owner_pb2 as pb
from mpc_erm.mpc._proto import owner_pb2_grpc as pb_grpc
from mpc_erm.mpc.tls import secure_channel
from parties.owner.intake import IntakeError, OwnerClient, OwnerIntake, RoundFrame, round_state
from parties.owner.shares import encode_on_grid, explicit_party, owner_margin_bits
from tests.mpc.test_mpc_aggregator import NAMES
from tests.procs import preloaded_context

K, DIM, GRID = 3, 40, 16
OWNERS = tuple(f"clinic-{i:02d}" for i in range(6))


def _value(o: int, t: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * t + o)
    return torch.rand(DIM, generator=g, dtype=torch.float64) - 0.5


@pytest.fixture(scope="module")
def ca() -> Any:
    return pki.create_ca("owner intake test CA")


@pytest.fixture()
def intakes(ca: Any) -> Any:
    margin = owner_margin_bits(len(OWNERS))
    out = [OwnerIntake(pki.issue_identity(ca, f"compute-{r}", "party"),
                       RoundFrame("job-1", OWNERS, K, r, GRID, margin, DIM)).start() for r in range(K)]
    yield out
    for i in out:
        i.stop()


def _publish(intakes: list[OwnerIntake], t: int, state: torch.Tensor, counted: Iterable[int]) -> None:
    """Round ``t``'s release at every (in-process) intake, counting owners ``counted``, with every
    intake's signature, as the compute parties' ReleaseSignatures exchange them."""
    from parties.owner.attest import Roster, statement

    roster = Roster.of(len(intakes[0].frame.owners), counted)
    sigs = [i.signer.sign(statement(i.frame.job_id, t, state, roster)) for i in intakes]
    for i in intakes:
        i.publish(t, state, roster, signatures=sigs)


def _client(ca: Any, o: int, intakes: list[OwnerIntake], name: str | None = None) -> OwnerClient:
    ident = pki.issue_identity(ca, name or OWNERS[o], "owner")
    return OwnerClient(ident, "job-1", o, [(f"compute-{r}", i.address) for r, i in enumerate(intakes)])


def _connections_to(address: str) -> int:
    """Established TCP connections whose local end is ``address``'s port (a server's side of them)."""
    port = int(address.rsplit(":", 1)[1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            rows = [line.split() for line in f.readlines()[1:]]
            n += sum(int(r[1].rsplit(":", 1)[1], 16) == port and r[3] == "01" for r in rows)
    return n


@contextlib.contextmanager
def _as_owner(c: OwnerClient, intakes: list[OwnerIntake], j: int) -> Iterator[Any]:
    """A stub to compute party ``j`` under owner ``c``'s identity, on a connection of its own:
    once enrolled, the client keeps only its explicit party's."""
    with secure_channel(intakes[j].address, c.identity, f"party/compute-{j}") as ch:
        yield pb_grpc.OwnerIntakeStub(ch)


def _code(fn: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value.code(), info.value.details()  # type: ignore[attr-defined]


def test_owners_enrol_contribute_and_read_the_released_round(ca: Any, intakes: list[OwnerIntake]) -> None:
    clients = [_client(ca, o, intakes) for o in range(len(OWNERS))]
    try:
        frames = [c.enroll() for c in clients]
        assert [f.owner_index for f in frames] == list(range(len(OWNERS))) and frames[0].grid_bits == GRID
        assert all(i.enrolled == frozenset(range(len(OWNERS))) for i in intakes)
        # enrolled, each owner keeps one connection, to its explicit party: each compute party now
        # holds those of the owners whose shares it receives (2 of 6), not one per owner
        deadline = time.monotonic() + 10
        while [_connections_to(i.address) for i in intakes] != [2] * K and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [_connections_to(i.address) for i in intakes] == [2] * K
        for i in intakes:
            i.open_round(0)
        for o, c in enumerate(clients):
            if o != 5:
                c.contribute(0, _value(o, 0))
        # owner 5 sends nothing: its explicit party (2 = 5 mod 3) alone decides that it is out; the
        # others are ready to derive its share (they hold its key), and take nothing from it per round
        late = clients[5]
        assert late._stubs.count(None) == K - 1  # enrolled: its connections but to party 2 are closed
        with _as_owner(late, intakes, 0) as stub:
            code, why = _code(lambda: stub.Contribute(pb.ContributeRequest(job_id="job-1", round=0,
                                                                           share=bytes(8 * DIM)), timeout=10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert why == (f"share: compute party 0 derives its share of owner {OWNERS[5]!r} from the owner's key; the "
                       "round's share goes to compute party 2")
        assert intakes[0].wait_for(len(OWNERS), 0.2) == len(OWNERS)
        assert intakes[2].wait_for(len(OWNERS), 0.2) == len(OWNERS) - 1
        closed = [i.close_round() for i in intakes]
        assert [sorted(p) for p, _ in closed] == [[0, 1, 2, 3, 4, 5]] * 2 + [[0, 1, 2, 3, 4]]
        agreed = sorted(frozenset.intersection(*(p for p, _ in closed)))  # what agree_present computes
        assert agreed == [0, 1, 2, 3, 4]
        total = torch.stack([i.total(0, agreed, ex) for i, (_, ex) in zip(intakes, closed)]).sum(0)
        exact = torch.stack([encode_on_grid(_value(o, 0), GRID, late.frame.margin_bits) for o in agreed]).sum(0)
        assert torch.equal(total, exact)  # the agreed owners exactly, owner 5 left out everywhere
        # what a compute party received of an owner carries no word of its contribution's encoding
        # (as the int64 fixed point the owner shared, or negated), and its bits look uniform
        received = torch.cat([ex for _, ex_all in closed for ex in ex_all.values()])
        plain = torch.cat([encode_on_grid(_value(o, 0), GRID, late.frame.margin_bits) for o in agreed])
        assert not set(received.tolist()) & (set(plain.tolist()) | set((-plain).tolist()))
        bits = ((received.unsqueeze(1) >> torch.arange(64)) & 1).double().mean(0)
        assert (bits - 0.5).abs().max() < 5 * 0.5 / received.numel() ** 0.5  # 200 words: 5σ per bit
        def small(x: torch.Tensor) -> float:  # a fixed-point value's top 16 bits are all its sign
            top = x >> 48
            return float(((top == 0) | (top == -1)).double().mean())

        assert small(plain) == 1.0 and small(received) < 0.05  # uniform: 2·2^-16 of the words
        # a contribution after the close is refused; so is a second one, and one for another round
        again = pb.ContributeRequest(job_id="job-1", round=0, share=bytes(8 * DIM))  # owner 0 at its party 0
        code, why = _code(lambda: clients[0]._stubs[0].Contribute(again, timeout=10))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "round: 0 is not open here (open: 0 (closed))" in why
        with pytest.raises(grpc.RpcError) as info:  # the same for the owner's client, as trailing metadata
            clients[0]._stubs[0].Contribute(again, timeout=10)
        assert round_state(info.value) == (0, True)
        for i in intakes:
            i.open_round(1)
        clients[1].contribute(1, _value(1, 1))
        clients[1].contribute(1, _value(1, 1))  # a retry (its reply lost): ALREADY_EXISTS means taken, no error
        # at owner 1's explicit party 1: its share, once; the owners whose shares party 1 derives (0, 2,
        # 3, 5: their keys); not owner 4, the other whose share party 1 receives
        assert intakes[1].wait_for(len(OWNERS), 0.1) == len(OWNERS) - 1
        assert sorted(intakes[1]._round.explicit) == [1]
        twice = pb.ContributeRequest(job_id="job-1", round=1, share=bytes(8 * DIM))
        code, why = _code(lambda: clients[1]._stubs[1].Contribute(twice, timeout=10))
        assert code == grpc.StatusCode.ALREADY_EXISTS and "already contributed to round 1" in why
        code, why = _code(lambda: clients[2].contribute(7, _value(2, 1)))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "round: 7 is not open" in why
        with pytest.raises(grpc.RpcError) as info:
            clients[2].contribute(7, _value(2, 1))
        assert round_state(info.value) == (1, False)
        _publish(intakes, 0, exact.double() / 2**GRID, agreed)
        state, roster = clients[3].released(0, wait_s=5)
        assert roster.count == 5 and torch.equal(state, exact.double() / 2**GRID)
        assert [o for o in range(len(OWNERS)) if roster.counts(o)] == agreed and roster.refused_count == 0
        code, why = _code(lambda: clients[3].released(9, wait_s=0.2))
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "round: 9 not released yet" in why
        # a worker keeps its intake up after the last release until the counted owners that read
        # from it (index mod k = rank) have read it: owner 3 reads at compute party 0, owner 0 not yet
        tic = time.monotonic()
        assert intakes[0].wait_read(0, [0, 3], 0.5) == [0] and time.monotonic() - tic >= 0.5
        assert intakes[0].wait_read(9, [], 5.0) == []  # nobody to wait for: at once
        reader = threading.Thread(target=lambda: (time.sleep(0.3), clients[0].released(0, wait_s=5)))
        reader.start()
        tic = time.monotonic()
        assert intakes[0].wait_read(0, [0, 3], 10.0) == [] and time.monotonic() - tic < 5.0
        reader.join()
    finally:
        for c in clients:
            c.close()


def test_an_owner_uses_a_release_only_with_every_compute_partys_signature(ca: Any,
                                                                          intakes: list[OwnerIntake]) -> None:
    """A compute party that serves its owners another release than the one every party signed (one
    bit flipped), or a release without the others' signatures, is refused by the owner, which names
    whose signature is missing; the same release with every signature is used."""
    from parties.owner.attest import Roster, UnsignedRelease, statement

    clients = [_client(ca, o, intakes) for o in range(3)]  # explicit parties 0, 1, 2
    try:
        for c in clients:
            c.enroll()
        state = torch.arange(DIM, dtype=torch.float64)
        roster = Roster.of(len(OWNERS), [0, 1, 2])
        sigs = [i.signer.sign(statement("job-1", 0, state, roster)) for i in intakes]
        altered = state.clone()
        altered.view(torch.int64)[5] ^= 1
        intakes[0].publish(0, altered, roster, signatures=sigs)  # party 0: another value under the same signatures
        intakes[1].publish(0, state, roster, signatures=sigs[:1] + [b""] + sigs[2:])  # its own signature left out
        intakes[2].publish(0, state, roster, signatures=sigs)
        with pytest.raises(UnsignedRelease, match="read from compute-0 lacks a valid signature of compute-0, "
                                                  "compute-1, compute-2"):
            clients[0].released(0, wait_s=5)
        with pytest.raises(UnsignedRelease, match="read from compute-1 lacks a valid signature of compute-1:"):
            clients[1].released(0, wait_s=5)
        got, counted = clients[2].released(0, wait_s=5)
        assert counted == roster and torch.equal(got, state)
    finally:
        for c in clients:
            c.close()


def test_more_owners_waiting_for_a_release_than_the_intake_has_threads_do_not_block_the_round(ca: Any) -> None:
    """Each owner sends its shares and then waits for the release. With more owners than an
    intake has server threads, a read that waited at the server until the release would hold every
    thread, and the last owners' shares would queue until they timed out (a 40-owner job stalled
    so). Reads wait briefly and ask again, spread over the compute parties: the round completes."""
    import threading
    import time

    margin = owner_margin_bits(len(OWNERS))
    small = [OwnerIntake(pki.issue_identity(ca, f"compute-{r}", "party"),
                         RoundFrame("job-1", OWNERS, K, r, GRID, margin, DIM), max_workers=1).start() for r in range(K)]
    clients = [_client(ca, o, small) for o in range(len(OWNERS))]
    got: dict[int, Any] = {}
    try:
        for c in clients:
            c.enroll()
        for i in small:
            i.open_round(0)

        def owner(o: int) -> None:
            try:
                clients[o].contribute(0, _value(o, 0), timeout_s=20)
                got[o] = clients[o].released(0, wait_s=30)
            except Exception as exc:  # collected: asserted below
                got[o] = exc

        threads = [threading.Thread(target=owner, args=(o,)) for o in range(len(OWNERS))]
        threads[0].start()
        time.sleep(0.5)  # owner 0 is in and reading its release at compute party 0, whose one thread it holds
        for th in threads[1:]:
            th.start()
        assert all(i.wait_for(len(OWNERS), 25) == len(OWNERS) for i in small)  # every share got in
        closed = [i.close_round()[0] for i in small]
        _publish(small, 0, torch.zeros(DIM, dtype=torch.float64), closed[0])
        for th in threads:
            th.join(40)
        assert len(got) == len(OWNERS), got
        assert all(isinstance(v, tuple) and v[1].count == len(OWNERS) for v in got.values()), got
    finally:
        for c in clients:
            c.close()
        for i in small:
            i.stop()


def test_the_intake_refuses_strangers_and_malformed_requests_naming_the_field(ca: Any,
                                                                               intakes: list[OwnerIntake]) -> None:
    c0 = _client(ca, 0, intakes)
    try:
        first = c0.enroll()
        with pytest.raises(RuntimeError, match="enrolled already"):
            c0.enroll()
        stub = c0._stubs[0]  # its explicit party's, the connection it keeps
        # the same enrolment again (a lost reply): the same answer, at its explicit party and at one
        # that derives its share from the key it gave there
        assert stub.Enroll(pb.EnrollRequest(job_id="job-1"), timeout=10) == first
        with _as_owner(c0, intakes, 1) as party1:
            same = pb.EnrollRequest(job_id="job-1", key=c0.sharer.keys[1])
            again = party1.Enroll(same, timeout=10)
            assert again == party1.Enroll(same, timeout=10)
            assert (again.rank, again.spec_digest) == (1, first.spec_digest)
            other = pb.EnrollRequest(job_id="job-1", key=bytes(32))  # another key at a party that derives its share
            code, why = _code(lambda: party1.Enroll(other, timeout=10))
            assert code == grpc.StatusCode.ALREADY_EXISTS and "already enrolled here with another key" in why
            code, why = _code(lambda: party1.Contribute(pb.ContributeRequest(job_id="job-1", round=0,
                                                                              share=b"x" * 8), timeout=10))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "share: compute party 1 derives its share of" in why
        code, why = _code(lambda: stub.Enroll(pb.EnrollRequest(job_id="other-job"), timeout=10))
        assert code == grpc.StatusCode.NOT_FOUND and "job_id: no job 'other-job'" in why
        intakes[0].open_round(0)
        code, why = _code(lambda: stub.Contribute(pb.ContributeRequest(job_id="job-1", round=0, share=b"x" * 8),
                                                  timeout=10))  # owner 0's explicit party is 0: DIM words
        assert code == grpc.StatusCode.INVALID_ARGUMENT and f"share: {8 * DIM} bytes expected" in why
    finally:
        c0.close()
    c1 = _client(ca, 1, intakes)
    try:  # contributing before enrolling
        code, why = _code(lambda: c1._stubs[1].Contribute(pb.ContributeRequest(job_id="job-1", round=0,
                                                                               share=bytes(8 * DIM)), timeout=10))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "enrol first" in why
        code, why = _code(lambda: c1._stubs[0].Enroll(pb.EnrollRequest(job_id="job-1", key=b"k" * 5), timeout=10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "key: 32 bytes expected" in why
    finally:
        c1.close()
    # an owner the job does not list, and a party (not an owner) calling: refused before the servicer
    for ident in (pki.issue_identity(ca, "stranger", "owner"), pki.issue_identity(ca, "compute-9", "party")):
        ch = secure_channel(intakes[0].address, ident, "party/compute-0")
        try:
            code, _ = _code(lambda ch=ch: pb_grpc.OwnerIntakeStub(ch).Enroll(pb.EnrollRequest(job_id="job-1"),
                                                                              timeout=10))
            assert code == grpc.StatusCode.PERMISSION_DENIED
        finally:
            ch.close()


# ---------------------------------------------------------------------- real compute processes

MANY = tuple(f"owner-{i:03d}" for i in range(30))
ROUNDS = 3
ABSENT = {1: {3, 11}, 2: {20}}  # round → owners that send nothing that round
SIGMA = 0.05


def _serve_dealer(table: Any, identity: Any, server: Any) -> dict[str, Any]:
    from mpc_erm.mpc.dealer import run_dealer
    from mpc_erm.mpc.transport import TransportOptions

    run_dealer(table, identity, server=server, options=TransportOptions(deadline_s=120))
    return {}


@contextlib.contextmanager
def _compute_comm(table: Any, identity: Any, server: Any, deadline_s: float) -> Iterator[Any]:
    """A compute member's communicator (and its dealer client), each of its waits bounded by
    ``deadline_s``; torn down on the way out."""
    from mpc_erm.mpc.communicator import init_crypten, uninit_crypten
    from mpc_erm.mpc.dealer import start_dealer_client, stop_dealer_client
    from mpc_erm.mpc.transport import TransportOptions

    comm = init_crypten(table, identity.name, identity, server=server, options=TransportOptions(deadline_s=deadline_s))
    start_dealer_client()
    try:
        yield comm
    finally:
        stop_dealer_client()
        uninit_crypten()


def _compute_member(rank: int, table: Any, identity: Any, server: Any, *, addr_q: Any, noise: str) -> dict[str, Any]:
    if identity.role == "dealer":
        return _serve_dealer(table, identity, server)
    with _compute_comm(table, identity, server, 120.0) as comm:
        return _many_owner_rounds(rank, identity, comm, addr_q=addr_q, noise=noise)


def _many_owner_rounds(rank: int, identity: Any, comm: Any, *, addr_q: Any, noise: str) -> dict[str, Any]:
    from mpc_erm.mpc.aggregator import PRECISION_BITS, MpcAggregator, ZeroNoise
    from mpc_erm.mpc.local_noise import DistributedNoise
    from mpc_erm.mpc.noise import InMpcNoise, plan_noise
    from mpc_erm.protocols.aggregation import NO_NOISE, NoiseSpec
    from parties.owner.attest import Roster
    from parties.owner.intake import agree_present
    from parties.owner.rounds import ReleaseSignatures

    if noise != "none":
        spec = NoiseSpec("gaussian", SIGMA, sensitivity=0.01)
        src: Any = InMpcNoise()
        if noise == "distributed":  # each compute party's own share: σ/√2 (two honest of three carry σ)
            grid = plan_noise(spec, DIM, 3).grid_bits
            spec = NoiseSpec("gaussian", SIGMA / math.sqrt(2.0), sensitivity=0.01, grid_bits=grid)
            src = DistributedNoise()
        agg = MpcAggregator(src)
        src.prepare(spec, DIM, releases=ROUNDS)
        grid = src.precision_bits(spec, DIM)
    else:
        agg, spec, grid = MpcAggregator(ZeroNoise(), allow_test_only=True), NO_NOISE, PRECISION_BITS
    intake = OwnerIntake(identity, RoundFrame("many-owners", MANY, 3, rank, grid, owner_margin_bits(len(MANY)), DIM))
    intake.start()
    sign = ReleaseSignatures(comm, intake)
    addr_q.put((rank, intake.address))
    rep: dict[str, Any] = {"grid": grid}
    try:
        for t in range(ROUNDS):
            intake.open_round(t)
            # ready here: every owner whose share this party derives; of its own, all but the absent
            intake.wait_for(len(MANY) - sum(explicit_party(o, 3) == rank for o in ABSENT.get(t, ())), 60.0)
            intake.wait_for(len(MANY), 0.3)  # the round's deadline for the rest
            present, explicit = intake.close_round()
            agreed = agree_present(comm, present, len(MANY))
            out = agg.aggregate_shares(intake.total(t, agreed, explicit), grid, spec)
            roster = Roster.of(len(MANY), agreed)
            intake.publish(t, out, roster, signatures=sign(t, out, roster))
            rep[f"agreed_{t}"] = agreed
            rep[f"out_{t}"] = out.numpy()
        time.sleep(1.0)  # let the owners read the last round
    finally:
        intake.stop()
    return rep


def _owners_run(ca: Any, addr_q: Any, grid_of: dict[str, int]) -> dict[int, list[tuple[torch.Tensor, Any]]]:
    addrs = dict(addr_q.get(timeout=120) for _ in range(3))
    compute = [(n, addrs[r]) for r, n in enumerate(NAMES[:3])]
    seen: dict[int, list[tuple[torch.Tensor, Any]]] = {}
    errors: list[str] = []

    def owner(o: int) -> None:
        c = OwnerClient(pki.issue_identity(ca, MANY[o], "owner"), "many-owners", o, compute)
        try:
            grid_of[MANY[o]] = c.enroll(timeout_s=60).grid_bits
            got = []
            for t in range(ROUNDS):
                if o not in ABSENT.get(t, ()):
                    for attempt in range(200):  # the round opens when the compute parties get there
                        try:
                            c.contribute(t, _many_value(o, t))
                            break
                        except grpc.RpcError as exc:
                            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or attempt == 199:
                                raise
                            threading.Event().wait(0.05)
                got.append(c.released(t, wait_s=60))
            seen[o] = got
        except Exception as exc:  # reported below
            errors.append(f"{MANY[o]}: {exc!r}")
        finally:
            c.close()

    threads = [threading.Thread(target=owner, args=(o,)) for o in range(len(MANY))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    assert not errors, errors
    return seen


def _many_value(o: int, t: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * t + o)
    return (torch.rand(DIM, generator=g, dtype=torch.float64) - 0.5) * 0.2


@pytest.mark.parametrize("noise", ["none", "mpc", "distributed"], ids=["no-noise", "in-mpc-noise", "distributed-noise"])
def test_thirty_owners_through_three_compute_processes(noise: str) -> None:

    from tests.mpc.test_mpc_aggregator import run_job

    ca = pki.create_ca("owners CA")
    addr_q = preloaded_context().Queue()
    box: dict[str, Any] = {}
    grid_of: dict[str, int] = {}
    th = threading.Thread(target=lambda: box.update(seen=_owners_run(ca, addr_q, grid_of)))
    th.start()
    reports = run_job(_compute_member, 3, dealer=True, timeout=300, ca=ca, addr_q=addr_q, noise=noise)
    th.join(60)
    errors = {r: v["error"] for r, v in reports.items() if "error" in v}
    assert not errors, "\n".join(errors.values())
    seen = box["seen"]
    grid = reports[0]["grid"]
    assert set(grid_of.values()) == {grid}
    margin = owner_margin_bits(len(MANY))
    for t in range(ROUNDS):
        agreed = [o for o in range(len(MANY)) if o not in ABSENT.get(t, ())]
        assert [list(reports[r][f"agreed_{t}"]) for r in range(3)] == [agreed] * 3
        exact = torch.stack([encode_on_grid(_many_value(o, t), grid, margin) for o in agreed]).sum(0).double() / 2**grid
        out = torch.as_tensor(np.asarray(reports[0][f"out_{t}"]))
        for r in range(1, 3):
            assert np.array_equal(np.asarray(reports[r][f"out_{t}"]), np.asarray(reports[0][f"out_{t}"]))
        for o, got in seen.items():  # every owner read the same release, with its signed roster
            assert torch.equal(got[t][0], out) and got[t][1].count == len(agreed)
            assert got[t][1].counts(o) == (o in agreed)
        if noise != "none":  # the noise, once, at its scale (distributed: three shares of σ/√2, 1.22 σ)
            assert 0 < float((out - exact).abs().max()) < 8 * SIGMA
        else:
            assert torch.equal(out, exact)


def test_an_owner_asks_again_while_a_compute_party_is_not_up_yet(ca: Any) -> None:
    """Enrolment asks again while a compute party is unreachable (or too slow to answer), until the
    owner's own deadline: on a loaded machine 1,000 owners' first attempts timed out and those owners
    gave up (benchmarks.many_owners_thesis). Compute party 2 starts listening 1.5 s late here."""
    from coordinator.consortium import free_port

    margin = owner_margin_bits(len(OWNERS))
    frame = [RoundFrame("job-1", OWNERS, K, r, GRID, margin, DIM) for r in range(K)]
    up = [OwnerIntake(pki.issue_identity(ca, f"compute-{r}", "party"), frame[r]).start() for r in range(2)]
    port = free_port("127.0.0.1")
    late: list[OwnerIntake] = []
    starter = threading.Timer(1.5, lambda: late.append(OwnerIntake(
        pki.issue_identity(ca, "compute-2", "party"), frame[2], bind=f"127.0.0.1:{port}").start()))
    starter.start()
    c = OwnerClient(pki.issue_identity(ca, OWNERS[1], "owner"), "job-1", 1,
                    [("compute-0", up[0].address), ("compute-1", up[1].address), ("compute-2", f"127.0.0.1:{port}")])
    try:
        tic = time.monotonic()
        assert c.enroll(timeout_s=20).owner_index == 1
        assert time.monotonic() - tic >= 1.4 and late and late[0].enrolled == frozenset({1})
    finally:
        c.close()
        starter.join()
        for i in up + late:
            i.stop()


def test_an_owner_whose_intake_stopped_reads_the_release_where_it_is_kept_and_a_leaving_owner_only_sends(
        ca: Any) -> None:
    """The owner's side of ``parties.owner.release``: the compute parties publish round 0 and stop
    their intake before owner 0 reads it (a slow owner among thousands); its read fails
    (UNAVAILABLE) and ``fetch_later`` is asked instead, for round 0. An owner made with ``leave``
    returns from the round as soon as every compute party took its shares (LeftAfterSending),
    without reading anything, and the intakes do not wait for its read."""
    from mpc_erm.protocols.aggregation import NoiseSpec
    from parties.owner.attest import Roster, statement
    from parties.owner.rounds import LeftAfterSending, OwnerAggregator

    margin = owner_margin_bits(len(OWNERS))
    live = [OwnerIntake(pki.issue_identity(ca, f"compute-{r}", "party"),
                        RoundFrame("job-1", OWNERS, K, r, GRID, margin, DIM)).start() for r in range(K)]
    clients = [_client(ca, o, live) for o in (0, 1)]
    asked: list[tuple[int, float]] = []
    kept = torch.arange(DIM, dtype=torch.float64)

    def fetch_later(t: int, wait_s: float) -> tuple[torch.Tensor, Roster]:
        asked.append((t, wait_s))
        return kept, Roster.of(len(OWNERS), [0, 1])

    try:
        for c in clients:
            c.enroll()
        for i in live:
            i.open_round(0)
        one = torch.ones(1, dtype=torch.float64)
        leaving = OwnerAggregator(clients[1], round_wait_s=5, leave=True)
        with pytest.raises(LeftAfterSending) as info:
            leaving.aggregate(_value(1, 0)[None], one, NoiseSpec("gaussian", 1.0))
        assert info.value.round == 0 and info.value.sent and asked == []
        clients[0].contribute(0, _value(0, 0))
        zero = torch.zeros(DIM, dtype=torch.float64)
        roster = Roster.of(len(OWNERS), [0, 1])
        sigs = [i.signer.sign(statement(i.frame.job_id, 0, zero, roster)) for i in live]
        for r, i in enumerate(live):
            present, _ = i.close_round()
            assert present == {0, 1}
            i.publish(0, zero, roster, signatures=sigs)
            # each party waits for the reads of its own owners (0 at party 0, 1 at party 1), not for
            # the leaving owner's: it told its party that it reads elsewhere
            assert i.wait_read(0, [o for o in (0, 1) if explicit_party(o, K) == r], 0.2) == ([0] if r == 0 else [])
            i.stop(0)
        slow = OwnerAggregator(clients[0], round_wait_s=5, fetch_later=fetch_later)
        slow.t = 0
        slow.send = lambda t, v: True  # type: ignore[method-assign]  # its shares went in above
        state = slow.aggregate(_value(0, 0)[None], one, NoiseSpec("gaussian", 1.0))
        assert torch.equal(state, kept) and asked == [(0, 5)]
        without = OwnerAggregator(clients[0], round_wait_s=5)
        without.send = lambda t, v: True  # type: ignore[method-assign]
        with pytest.raises(IntakeError) as gone:  # the owner's one line names the party and the status
            without.aggregate(_value(0, 0)[None], one, NoiseSpec("gaussian", 1.0))
        assert gone.value.party == "compute-0" and gone.value.code in (grpc.StatusCode.UNAVAILABLE,
                                                                       grpc.StatusCode.CANCELLED)
    finally:
        for c in clients:
            c.close()
        for i in live:
            i.stop(0)


def test_reads_park_for_the_release_only_while_threads_stay_free_for_the_shares(ca: Any) -> None:
    """A read of a release holds an intake thread while it waits. The intake lets reads park for
    as long as they ask (the owner's RELEASE_WAIT_S) only up to its pool less CONTRIBUTE_THREADS;
    a read past that waits RELEASE_POLL_S and is answered DEADLINE_EXCEEDED (the owner asks
    again), so parked reads never take the threads that the round's shares need."""
    from parties.owner import intake as owner_intake

    margin = owner_margin_bits(len(OWNERS))
    intakes = [OwnerIntake(pki.issue_identity(ca, f"compute-{r}", "party"),
                           RoundFrame("job-1", OWNERS, K, r, GRID, margin, DIM),
                           max_workers=owner_intake.CONTRIBUTE_THREADS + 2).start() for r in range(K)]
    clients = [_client(ca, o, intakes) for o in range(len(OWNERS))]
    try:
        for c in clients:
            c.enroll()
        # owners 0 and 3 read at compute party 0 (index mod 3): both park there, for 20 s if need be
        ask = pb.RoundRequest(job_id="job-1", round=0, wait_s=20.0)
        parked = [threading.Thread(target=lambda o=o: clients[o]._stubs[0].GetRound(ask, timeout=30))
                  for o in (0, 3)]
        for th in parked:
            th.start()
        deadline = time.monotonic() + 10
        while intakes[0]._parked < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert intakes[0]._parked == 2
        # a third read asking as long gets the short wait: both slots are taken
        with _as_owner(clients[1], intakes, 0) as stub:  # owner 1 reads at party 0 (not its own) too
            tic = time.monotonic()
            code, why = _code(lambda: stub.GetRound(ask, timeout=30))
            took = time.monotonic() - tic
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "round: 0 not released yet" in why
        assert owner_intake.RELEASE_POLL_S - 0.1 <= took < owner_intake.RELEASE_POLL_S + 3
        # the shares still go in meanwhile, and the parked reads get the release as soon as it is out
        for i in intakes:
            i.open_round(0)
        for o, c in enumerate(clients):
            c.contribute(0, _value(o, 0))
        assert intakes[0].wait_for(len(OWNERS), 5.0) == len(OWNERS)
        tic = time.monotonic()
        _publish(intakes, 0, torch.zeros(DIM, dtype=torch.float64), range(len(OWNERS)))
        for th in parked:
            th.join(timeout=10)
        assert not any(th.is_alive() for th in parked) and time.monotonic() - tic < 5
        assert intakes[0]._parked == 0 and intakes[0].wait_read(0, [0, 3], 0.1) == []
        # a read parked for a round that never comes ends when the intake stops, not 20 s later
        # (the pool's threads are joined at the worker's exit)
        late: list[Any] = []
        nxt = pb.RoundRequest(job_id="job-1", round=1, wait_s=20.0)
        th = threading.Thread(target=lambda: late.append(_code(lambda: clients[0]._stubs[0].GetRound(nxt, timeout=30))))
        th.start()
        while intakes[0]._parked < 1 and th.is_alive():
            time.sleep(0.05)
        tic = time.monotonic()
        intakes[0].stop()
        th.join(timeout=10)
        assert not th.is_alive() and time.monotonic() - tic < 5
        assert intakes[0]._parked == 0  # its handler has left the wait too
        assert late[0][0] in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), late
    finally:
        for c in clients:
            c.close()
        for i in intakes:
            i.stop()


LATE_OWNER, LATE_S, TRANSPORT_S = 2, 4.0, 1.5  # owner 2's explicit party is compute party 2


def _late_owner_member(rank: int, table: Any, identity: Any, server: Any, *, addr_q: Any) -> dict[str, Any]:
    """A compute party running the daemon's round (IntakeAggregator) with a transport deadline
    shorter than the wait for one party's late owner."""
    from mpc_erm.mpc.aggregator import PRECISION_BITS, MpcAggregator, ZeroNoise
    from mpc_erm.protocols.aggregation import NO_NOISE
    from parties.owner.rounds import IntakeAggregator

    if identity.role == "dealer":
        return _serve_dealer(table, identity, server)
    with _compute_comm(table, identity, server, TRANSPORT_S) as comm:
        intake = OwnerIntake(identity, RoundFrame("late-owner", OWNERS, K, rank, PRECISION_BITS,
                                                  owner_margin_bits(len(OWNERS)), DIM)).start()
        addr_q.put((rank, intake.address))
        try:
            rounds = IntakeAggregator(intake, comm, MpcAggregator(ZeroNoise(), allow_test_only=True), deadline_s=60.0,
                                      first_wait_s=60.0)
            tic = time.monotonic()
            out = rounds.aggregate(torch.zeros(0, DIM, dtype=torch.float64), torch.zeros(0, dtype=torch.float64),
                                   NO_NOISE)
            took = time.monotonic() - tic
            rounds.wait_last_read(10.0)
            return {"agreed": list(rounds.agreed), "out": out.numpy(), "took": took}
        finally:
            intake.stop()


def test_compute_parties_done_early_wait_for_a_late_owner_of_another_without_hitting_the_transport_deadline() -> None:
    """An owner sends its share to its explicit party only, so compute parties 0 and 1 have all
    their owners in while party 2 still waits for its late owner. They keep telling each other
    whether they are done (owner_rounds.READY_EVERY_S), so the agreement that follows never waits
    on a peer past the transport's deadline (1.5 s here; the late owner comes after 4 s): the
    round counts every owner and reveals their exact sum at every party."""
    from tests.mpc.test_mpc_aggregator import run_job

    ca = pki.create_ca("late owner CA")
    addr_q = preloaded_context().Queue()
    got: dict[int, Any] = {}

    def owners() -> None:
        addrs = dict(addr_q.get(timeout=120) for _ in range(K))
        compute = [(n, addrs[r]) for r, n in enumerate(NAMES[:K])]
        clients = [OwnerClient(pki.issue_identity(ca, name, "owner"), "late-owner", o, compute)
                   for o, name in enumerate(OWNERS)]
        try:
            for c in clients:
                c.enroll(timeout_s=60)

            def one(o: int) -> None:
                if o == LATE_OWNER:
                    time.sleep(LATE_S)
                end = time.monotonic() + 60
                while True:  # the round opens when the compute parties get there
                    try:
                        clients[o].contribute(0, _value(o, 0))
                        break
                    except grpc.RpcError as exc:
                        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > end:
                            raise
                        time.sleep(0.05)
                got[o] = clients[o].released(0, wait_s=60)

            threads = [threading.Thread(target=one, args=(o,)) for o in range(len(OWNERS))]
            for th in threads:
                th.start()
            for th in threads:
                th.join(120)
        finally:
            for c in clients:
                c.close()

    th = threading.Thread(target=owners)
    th.start()
    from mpc_erm.mpc.aggregator import PRECISION_BITS

    reports = run_job(_late_owner_member, K, dealer=True, timeout=300, ca=ca, addr_q=addr_q)
    th.join(60)
    errors = {r: v["error"] for r, v in reports.items() if "error" in v}
    assert not errors, "\n".join(errors.values())
    margin = owner_margin_bits(len(OWNERS))
    exact = torch.stack([encode_on_grid(_value(o, 0), PRECISION_BITS, margin)
                         for o in range(len(OWNERS))]).sum(0).double() / 2**PRECISION_BITS
    for r in range(K):
        assert reports[r]["agreed"] == list(range(len(OWNERS)))
        assert torch.equal(torch.as_tensor(np.asarray(reports[r]["out"])), exact)
        assert reports[r]["took"] >= LATE_S - 0.5  # every party waited for the late owner
    assert sorted(got) == list(range(len(OWNERS))) and all(v[1].count == len(OWNERS) for v in got.values())
