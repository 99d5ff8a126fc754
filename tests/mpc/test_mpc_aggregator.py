"""MpcAggregator in real processes over real gRPC + mTLS on loopback.

Sessions (module fixtures; spawning CrypTen processes costs seconds on 2 cores):
* m = 2 and m = 3: one CrypTen party per process (init_crypten), TFP allowed as tests-only, zero
  noise through the NoiseSource path. The m = 3 session ends with carol vanishing mid-aggregate.
* m = 5: five parties in two processes (3 + 2 threads, each party with its own TransportServer,
  mailbox, certificate and GrpcCommunicator), so that no more than 4 processes run at once on the
  CI box; the aggregator only needs the communicator, not CrypTen's global state, for "none" noise.

Inputs are positive and negative (CrypTen's decode is off by one for negatives; we decode exactly).
"""

from __future__ import annotations

import os
import queue
import statistics
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch

from mpc_erm.mpc import pki
from tests.mpc.harness import collect_reports
from tests.procs import preloaded_context

NAMES = ("alice", "bob", "carol", "dave", "erin")
SIZES = (1, 100_000)
BIG = 10**6


# ---------------------------------------------------------------------- harness (shared with test_dealer)


_OUT_Q: Any = None  # the hosting process's report queue (a vanishing member reports before dying)


def report_and_die(rank: int, report: dict[str, Any]) -> None:
    """Put this member's report on the queue, then vanish without any goodbye (no uninit)."""
    _OUT_Q.put(_plain({**report, "rank": rank}))
    _OUT_Q.close()
    _OUT_Q.join_thread()
    os._exit(0)


def _plain(report: dict[str, Any]) -> dict[str, Any]:
    """Plain numpy for the queue: torch tensors would travel as shared memory that dies with us."""
    return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in report.items()}


def _host(
    worker: Callable[..., dict[str, Any]],
    ranks: list[int],
    identities: list[pki.Identity],
    port_q: Any,
    table_q: Any,
    out_q: Any,
    kwargs: dict[str, Any],
) -> None:
    """One OS process hosting one or more members (threads), each with its own mailbox server."""
    global _OUT_Q
    _OUT_Q = out_q
    try:
        torch.set_num_threads(1)
        from mpc_erm.mpc.transport import TransportServer

        servers = {}
        for r in ranks:
            servers[r] = TransportServer(identities[r], "127.0.0.1:0")
            port_q.put((r, servers[r].start()))
        table = table_q.get(timeout=120)

        def one(r: int) -> None:
            try:
                rep = worker(r, table, identities[r], servers[r], **kwargs)
                rep["rank"] = r
                out_q.put(_plain(rep))
            except BaseException:
                out_q.put({"rank": r, "error": traceback.format_exc()})

        if len(ranks) == 1:
            one(ranks[0])
        else:
            threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        for s in servers.values():
            s.stop(1.0)
    except BaseException:
        for r in ranks:
            out_q.put({"rank": r, "error": traceback.format_exc()})


def run_job(
    worker: Callable[..., dict[str, Any]],
    parties: int,
    *,
    dealer: bool = False,
    hosts: list[list[int]] | None = None,
    timeout: float = 80.0,
    ca: pki.CertificateAuthority | None = None,
    **kwargs: Any,
) -> dict[int, dict[str, Any]]:
    """Run ``worker(rank, table, identity, server, **kwargs)`` for every member; return reports by
    rank. ``ca``: the members' CA (a test that issues other identities of the same deployment)."""
    from mpc_erm.mpc.transport import Member, PartyTable

    ca = ca or pki.create_ca("test CA")
    names = list(NAMES[:parties]) + (["dealer"] if dealer else [])
    identities = [pki.issue_identity(ca, n, "dealer" if n == "dealer" else "party") for n in names]
    members = len(names)
    hosts = hosts or [[r] for r in range(members)]
    ctx = preloaded_context()
    port_q, out_q = ctx.Queue(), ctx.Queue()
    table_qs = [ctx.Queue() for _ in hosts]
    procs = [
        ctx.Process(target=_host, args=(worker, h, identities, port_q, table_qs[i], out_q, kwargs), daemon=True)
        for i, h in enumerate(hosts)
    ]
    for p in procs:
        p.start()
    try:
        ports = dict(port_q.get(timeout=90) for _ in range(members))
        table = PartyTable(
            job_id=f"agg-test-{os.getpid()}-{time.monotonic_ns()}",
            parties=tuple(Member(names[r], f"127.0.0.1:{ports[r]}", "party") for r in range(parties)),
            dealer=Member("dealer", f"127.0.0.1:{ports[parties]}", "dealer") if dealer else None,
        )
        for q in table_qs:
            q.put(table)
    except queue.Empty:
        for p in procs:
            p.kill()
        pytest.fail("a member did not announce its port within the deadline")
    return collect_reports(procs, out_q, members, timeout=timeout)


# ---------------------------------------------------------------------- inputs and the bound


def contribution(rank: int, n: int, seed: int = 0) -> torch.Tensor:
    """Party ``rank``'s row: positive and negative values, magnitudes up to 1000."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 2000.0


def weight(rank: int) -> float:
    return [0.37, 1.0, -2.5, 0.125, 3.3][rank]


def expected_and_bound(parties: int, n: int, seed: int = 0) -> tuple[torch.Tensor, float]:
    from mpc_erm.mpc.aggregator import error_bound

    rows = [weight(r) * contribution(r, n, seed) for r in range(parties)]
    exact = torch.stack(rows).sum(0)
    bound = error_bound([float(x.abs().max()) for x in rows], 1, float(exact.abs().max()))
    # The reference sum itself is a float64 sum of `parties` terms: add its own rounding.
    bound += parties * 2.0**-53 * sum(float(x.abs().max()) for x in rows)
    return exact, bound


# ---------------------------------------------------------------------- workers


def _crypten_party(rank: int, table: Any, identity: Any, server: Any, *, sizes: tuple[int, ...],
                   vanish: bool = False, latency_dims: tuple[int, ...] = (), latency_rounds: int = 0,
                   ) -> dict[str, Any]:
    from mpc_erm.mpc.aggregator import FixedPointRangeError, MpcAggregator, NotForProductionError, ZeroNoise
    from mpc_erm.mpc.communicator import init_crypten, uninit_crypten
    from mpc_erm.mpc.transport import TransportOptions
    from mpc_erm.protocols.aggregation import NoiseSpec, SecureAggregator

    comm = init_crypten(table, identity.name, identity, server=server, options=TransportOptions(deadline_s=30))
    rep: dict[str, Any] = {}
    try:
        MpcAggregator(ZeroNoise())
        rep["zero_noise_refused"] = False
    except NotForProductionError as exc:
        rep["zero_noise_refused"] = str(exc)
    agg = MpcAggregator(ZeroNoise(), allow_test_only=True)
    rep["is_secure_aggregator"] = isinstance(agg, SecureAggregator)
    rep["trust_model"] = agg.trust_model
    noise = NoiseSpec("gaussian", 1.0)  # ZeroNoise ignores it: the NoiseSource path is exercised
    for n in sizes:
        c = contribution(rank, n).reshape(1, -1)
        rep[f"sum_{n}"] = agg.aggregate(c, torch.tensor([weight(rank)], dtype=torch.float64), noise)
        rep[f"stats_{n}"] = vars(agg.last)
    # Out of range at one party only: every party refuses, nothing revealed.
    bad = contribution(rank, 4).reshape(1, -1)
    if rank == 1:
        bad[0, 2] = 2.0**45
    seen: list[list[int]] = []
    real_all_reduce = comm.all_reduce

    def recording_all_reduce(*a: Any, **kw: Any) -> Any:
        out = real_all_reduce(*a, **kw)
        seen.append([int(v) for v in out])  # plain ints: the report crosses a process boundary
        return out

    comm.all_reduce = recording_all_reduce  # type: ignore[method-assign]
    try:
        agg.aggregate(bad, torch.ones(1, dtype=torch.float64), noise)
        rep["range"] = "not refused"
    except FixedPointRangeError as exc:
        rep["range"] = str(exc)
    finally:
        del comm.all_reduce  # the class's method again
    rep["range_revealed"] = seen
    # Latency (zero noise) for the benchmark figures (docs/how-to/benchmarks.md).
    for d in latency_dims:
        c = contribution(rank, d, seed=7).reshape(1, -1)
        w = torch.tensor([weight(rank)], dtype=torch.float64)
        agg.aggregate(c, w, noise)  # warm-up
        times = []
        for _ in range(latency_rounds):
            comm.barrier()
            tic = time.perf_counter()
            out = agg.aggregate(c, w, noise)
            times.append(time.perf_counter() - tic)
        rep[f"latency_{d}"] = times
        rep[f"latency_sum_head_{d}"] = out[:1000]
        rep[f"latency_stats_{d}"] = vars(agg.last)
    if vanish:
        c = contribution(rank, 1000, seed=3).reshape(1, -1)
        if rank == 2:  # die at the reveal (the range check rides in the same message)
            real = comm.all_reduce
            calls = []

            def dying_all_reduce(*a: Any, **kw: Any) -> Any:
                calls.append(1)
                if len(calls) == 1:
                    report_and_die(rank, rep)
                return real(*a, **kw)

            comm.all_reduce = dying_all_reduce  # type: ignore[method-assign]
            time.sleep(0.2)
        tic = time.monotonic()
        try:
            agg.aggregate(c, torch.ones(1, dtype=torch.float64), noise)
            rep["vanished"] = "no error"
        except Exception as exc:
            rep["vanished"] = f"{type(exc).__name__}: {exc}"
        rep["vanished_seconds"] = time.monotonic() - tic
    rep["describe"] = agg.describe()
    uninit_crypten()
    return rep


def _thread_party(rank: int, table: Any, identity: Any, server: Any, *, sizes: tuple[int, ...]) -> dict[str, Any]:
    """A party without CrypTen's global state: its own GrpcCommunicator on its own endpoint."""
    from mpc_erm.mpc.aggregator import MpcAggregator, ZeroNoise
    from mpc_erm.mpc.communicator import GrpcCommunicator
    from mpc_erm.mpc.transport import Endpoint, TransportOptions
    from mpc_erm.protocols.aggregation import NO_NOISE

    ep = Endpoint(table, rank, identity, server=server, options=TransportOptions(deadline_s=30))
    ep.connect()
    comm = GrpcCommunicator(ep)
    agg = MpcAggregator(ZeroNoise(), comm=comm, allow_test_only=True)
    rep: dict[str, Any] = {}
    for n in sizes:
        c = contribution(rank, n).reshape(1, -1)
        rep[f"sum_{n}"] = agg.aggregate(c, torch.tensor([weight(rank)], dtype=torch.float64), NO_NOISE)
        rep[f"stats_{n}"] = vars(agg.last)
    ep.close()
    return rep


# ---------------------------------------------------------------------- sessions


@pytest.fixture(scope="module")
def two() -> dict[int, dict[str, Any]]:
    return run_job(_crypten_party, 2, sizes=SIZES)


@pytest.fixture(scope="module")
def three() -> dict[int, dict[str, Any]]:
    return run_job(_crypten_party, 3, sizes=SIZES, vanish=True, latency_dims=(122,), latency_rounds=30)


@pytest.fixture(scope="module")
def five() -> dict[int, dict[str, Any]]:
    return run_job(_thread_party, 5, hosts=[[0, 1, 2], [3, 4]], sizes=SIZES)


def _check_sums(reports: dict[int, dict[str, Any]], parties: int) -> None:
    for n in SIZES:
        exact, bound = expected_and_bound(parties, n)
        assert (exact < 0).any() or n == 1
        for rank in range(parties):
            got = reports[rank][f"sum_{n}"]
            assert got.dtype == torch.float64 and got.shape == (n,)
            err = (got - exact).abs().max().item()
            assert err <= bound, f"m={parties} n={n} rank {rank}: error {err} > bound {bound}"
            assert torch.equal(got, reports[0][f"sum_{n}"])  # bit-identical everywhere
            st = reports[rank][f"stats_{n}"]
            # 2 rounds: the reveal, with the range check's count as one more int64 (each party sends
            # (m-1) copies and receives m-1 below 256 KiB; above, the communicator's reduce-scatter
            # sends 2(m-1)/m·n), then the parties' agreement on it: a 32-byte digest each way.
            assert st["rounds"] == 2
            agreement = 2 * (parties - 1) * 32
            if 8 * n < 256 * 1024 or parties < 3:
                assert st["bytes"] == 2 * (parties - 1) * 8 * (n + 1) + agreement
            else:
                assert st["bytes"] <= 2 * (parties - 1) * 8 * (n + 1) + agreement


def test_two_parties_equal_the_plaintext_weighted_sum(two: dict[int, dict[str, Any]]) -> None:
    _check_sums(two, 2)


def test_three_parties_equal_the_plaintext_weighted_sum(three: dict[int, dict[str, Any]]) -> None:
    _check_sums(three, 3)


def test_five_parties_equal_the_plaintext_weighted_sum(five: dict[int, dict[str, Any]]) -> None:
    _check_sums(five, 5)


def test_test_only_parts_say_so(three: dict[int, dict[str, Any]]) -> None:
    for rep in three.values():
        assert "tests only" in rep["zero_noise_refused"]
        assert rep["is_secure_aggregator"]
        assert "TFP" in rep["trust_model"] and "tests only" in rep["trust_model"]
        assert "zero noise" in rep["trust_model"]


def test_out_of_range_is_refused_by_every_party(
    two: dict[int, dict[str, Any]], three: dict[int, dict[str, Any]]
) -> None:
    for reports, m in ((two, 2), (three, 3)):
        for rank, rep in reports.items():
            assert rep["range"].startswith("aggregate #2: 1 of"), rep["range"]
            assert f"of {m} parties" in rep["range"] and "nothing revealed" in rep["range"]
            assert ("including this party" in rep["range"]) == (rank == 1)
            # what the refused aggregate opened: one message, the count 1 and a uniform vector (the
            # out-of-range party's share was random), nothing like the sum (|entries| < 2^46 here)
            (opened,) = rep["range_revealed"]
            assert len(opened) == 5 and opened[4] == 1
            assert sum(abs(v) > 2**50 for v in opened[:4]) >= 2  # a uniform int64 is below 2^50 w.p. 2^-13


def test_a_vanished_party_fails_the_others_naming_it(three: dict[int, dict[str, Any]]) -> None:
    for rank in (0, 1):
        rep = three[rank]
        assert rep["vanished"].startswith("PeerUnavailable"), rep["vanished"]
        assert "party 2 'carol'" in rep["vanished"]
        assert rep["vanished_seconds"] < 15.0  # deadline 30 s
        print(f"\nrank {rank}: failed {rep['vanished_seconds']:.1f} s after carol vanished")


def test_latency_d122_three_parties(three: dict[int, dict[str, Any]]) -> None:
    exact, bound = expected_and_bound(3, 122, seed=7)
    times = [t for r in (0, 1) for t in three[r]["latency_122"]]
    p50 = statistics.median(times)
    print(f"\naggregate D=122, 3 parties, zero noise: p50 {1e3 * p50:.2f} ms, "
          f"bytes/party {three[0]['latency_stats_122']['bytes']}")
    for r in (0, 1):
        assert (three[r]["latency_sum_head_122"] - exact).abs().max().item() <= bound
    assert p50 < 1.0  # generous for a loaded 2-core box; the figure is printed


def _big_party(rank: int, table: Any, identity: Any, server: Any, *, rounds: int) -> dict[str, Any]:
    from mpc_erm.mpc.aggregator import MpcAggregator, ZeroNoise
    from mpc_erm.mpc.communicator import init_crypten, uninit_crypten
    from mpc_erm.mpc.transport import TransportOptions
    from mpc_erm.protocols.aggregation import NoiseSpec

    comm = init_crypten(table, identity.name, identity, server=server, options=TransportOptions(deadline_s=60))
    agg = MpcAggregator(ZeroNoise(), allow_test_only=True)
    c = contribution(rank, BIG).reshape(1, -1)
    w = torch.tensor([weight(rank)], dtype=torch.float64)
    times = []
    for _ in range(rounds):
        comm.barrier()
        tic = time.perf_counter()
        out = agg.aggregate(c, w, NoiseSpec("laplace", 1.0))
        times.append(time.perf_counter() - tic)
    uninit_crypten()
    return {"times": times, "out": out, "stats": vars(agg.last)}


@pytest.mark.slow
def test_a_million_entries_three_parties() -> None:
    reports = run_job(_big_party, 3, rounds=5, timeout=170)
    exact, bound = expected_and_bound(3, BIG)
    for rep in reports.values():
        assert (rep["out"] - exact).abs().max().item() <= bound
    p50 = statistics.median(t for rep in reports.values() for t in rep["times"])
    print(f"\naggregate D=10^6, 3 parties, zero noise: p50 {p50:.3f} s, bytes/party {reports[0]['stats']['bytes']}")
