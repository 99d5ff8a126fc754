"""What one owner round costs a compute party in gRPC alone, by transport: the ceiling under any
owner intake built on it (the design question of the intake's per-owner cost).

    python -m benchmarks.intake_transport --owners 300 --rounds 8 --out benchmarks/results/intake_transport.json

A bare server with mutual TLS and nothing else (no authorisation policy, no validation, no MPC):
each of N owners, a client with its own TLS connection, sends a round's share (d int64) and reads
the round's release (d float64) once all N shares are in, R times. Three transports, one run:

* ``unary_threads`` — two unary calls a round (Contribute, then GetRound parked until the release)
  on grpcio's thread-pool server: the intake's transport today;
* ``unary_asyncio`` — the same two calls on ``grpc.aio``'s server (coroutines, no thread a call);
* ``stream_asyncio`` — one bidirectional stream per owner for the whole job, a share up and the
  release down each round, on ``grpc.aio``.

The figure is the server process's CPU (user + system) per owner-round from the end of round 0
(which pays the TLS handshakes, reported apart) until every owner has read the last release, the
clients in another process on the same cores.
The crypto floor beside it: what a deriving party's arithmetic costs per owner (AES-CTR
expansion of d words from the owner's key, and the add), measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import resource
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from benchmarks.aggregate import jsonable, machine_info
from mpc_erm.mpc import pki, tls

TRANSPORTS = ("unary_threads", "unary_asyncio", "stream_asyncio")
_OPTIONS = [("grpc.max_receive_message_length", 1 << 24), ("grpc.max_send_message_length", 1 << 24)]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Rounds:
    """The server's round state: shares summed, the release made once all N are in."""

    def __init__(self, owners: int, dim: int) -> None:
        self.owners, self.total = owners, np.zeros(dim, np.int64)
        self.t, self.n, self.released = 0, 0, {}

    def add(self, share: bytes) -> int | None:
        """Add one share; the round it closed, if it was the last."""
        np.add(self.total, np.frombuffer(share, dtype="<i8"), out=self.total)
        self.n += 1
        if self.n < self.owners:
            return None
        t, self.n, self.t = self.t, 0, self.t + 1
        self.released[t] = self.total.astype(np.float64).tobytes()
        return t


def _serve_threads(ident: pki.Identity, q: Any, done: Any, owners: int, rounds: int, dim: int) -> None:
    st, cond = _Rounds(owners, dim), threading.Condition()

    def contribute(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        tls.peer(ctx)
        with cond:
            if st.add(req) is not None:
                cond.notify_all()
        return b""

    def get(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        tls.peer(ctx)
        t = int(req)
        with cond:
            cond.wait_for(lambda: t in st.released)
            return st.released[t]

    h = grpc.method_handlers_generic_handler("x.Intake", {"C": grpc.unary_unary_rpc_method_handler(contribute),
                                                          "G": grpc.unary_unary_rpc_method_handler(get)})
    s = grpc.server(ThreadPoolExecutor(max_workers=owners + 32), handlers=[h], options=_OPTIONS)
    q.put(s.add_secure_port("127.0.0.1:0", tls.server_credentials(ident)))
    s.start()
    start = _cpu()
    with cond:
        cond.wait_for(lambda: st.t >= 1)
    first = _cpu()
    done.wait()  # every owner read every release
    q.put((first - start, _cpu() - first))
    s.stop(0)


def _serve_asyncio(ident: pki.Identity, q: Any, done: Any, owners: int, rounds: int, dim: int,
                   stream: bool) -> None:
    async def main() -> None:
        st = _Rounds(owners, dim)
        events: dict[int, asyncio.Event] = {}

        def ev(t: int) -> asyncio.Event:
            return events.setdefault(t, asyncio.Event())

        def add(share: bytes) -> int:
            t = st.t
            closed = st.add(share)
            if closed is not None:
                ev(closed).set()
            return t

        async def contribute(req: bytes, ctx: grpc.aio.ServicerContext) -> bytes:
            tls.peer(ctx)
            add(req)
            return b""

        async def get(req: bytes, ctx: grpc.aio.ServicerContext) -> bytes:
            tls.peer(ctx)
            t = int(req)
            await ev(t).wait()
            return st.released[t]

        async def talk(requests: Any, ctx: grpc.aio.ServicerContext) -> Any:
            tls.peer(ctx)
            async for req in requests:
                t = add(req)
                await ev(t).wait()
                yield st.released[t]

        unary = grpc.unary_unary_rpc_method_handler
        methods = ({"T": grpc.stream_stream_rpc_method_handler(talk)} if stream else
                   {"C": unary(contribute), "G": unary(get)})
        s = grpc.aio.server(handlers=[grpc.method_handlers_generic_handler("x.Intake", methods)], options=_OPTIONS)
        q.put(s.add_secure_port("127.0.0.1:0", tls.server_credentials(ident)))
        await s.start()
        start = _cpu()
        await ev(0).wait()
        first = _cpu()
        await asyncio.get_running_loop().run_in_executor(None, done.wait)  # every owner read every release
        q.put((first - start, _cpu() - first))
        await s.stop(0)

    asyncio.run(main())


def _serve(transport: str, ident: pki.Identity, q: Any, done: Any, owners: int, rounds: int, dim: int) -> None:
    if transport == "unary_threads":
        _serve_threads(ident, q, done, owners, rounds, dim)
    else:
        _serve_asyncio(ident, q, done, owners, rounds, dim, stream=transport == "stream_asyncio")


def _owners(transport: str, ident: pki.Identity, port: int, owners: int, rounds: int, dim: int, q: Any) -> None:
    async def main() -> None:
        opts = [("grpc.ssl_target_name_override", pki.identity_hostname("alice", "party")),
                ("grpc.use_local_subchannel_pool", 1), *_OPTIONS]  # a connection per owner
        chans = [grpc.aio.secure_channel(f"127.0.0.1:{port}", tls.channel_credentials(ident), options=opts)
                 for _ in range(owners)]
        share = np.arange(dim, dtype=np.int64).tobytes()

        async def owner(ch: grpc.aio.Channel) -> None:
            if transport == "stream_asyncio":
                call = ch.stream_stream("/x.Intake/T")()
                for _ in range(rounds):
                    await call.write(share)
                    await call.read()
                await call.done_writing()
                return
            contribute, get = ch.unary_unary("/x.Intake/C"), ch.unary_unary("/x.Intake/G")
            for t in range(rounds):
                await contribute(share, timeout=300)
                await get(str(t).encode(), timeout=300)

        tic = time.perf_counter()
        await asyncio.gather(*(owner(ch) for ch in chans))
        q.put(time.perf_counter() - tic)
        for ch in chans:
            await ch.close()

    asyncio.run(main())


def run(transport: str, owners: int, rounds: int, dim: int) -> dict[str, float]:
    ca = pki.create_ca()
    party, owner = pki.issue_identity(ca, "alice", "party"), pki.issue_identity(ca, "owner-1", "owner")
    ctx = mp.get_context("spawn")
    qs, qc, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(transport, party, qs, done, owners, rounds, dim))
    server.start()
    port = qs.get(timeout=60)
    client = ctx.Process(target=_owners, args=(transport, owner, port, owners, rounds, dim, qc))
    client.start()
    wall = qc.get(timeout=1800)
    done.set()
    first, rest = qs.get(timeout=60)
    client.join()
    server.join()
    return {"wall_seconds": wall, "server_cpu_first_round_s": first,
            "server_cpu_ms_per_owner_round": 1e3 * rest / (owners * (rounds - 1))}


def crypto_floor(owners: int, dim: int) -> float:
    """ms per owner: a deriving party's share of one owner (AES-CTR words from its key) added to the sum."""
    import torch

    from mpc_erm.mpc.keystream import KeyedMasks, new_key

    masks, keys, total = KeyedMasks(), [new_key() for _ in range(owners)], torch.zeros(dim, dtype=torch.long)
    tic = time.perf_counter()
    for key in keys:
        total += masks.words(key, 1, dim)
    return 1e3 * (time.perf_counter() - tic) / owners


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--owners", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--dim", type=int, default=7850)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if a.rounds < 2:
        ap.error("--rounds: at least 2 (the first pays the handshakes)")
    results = {}
    for transport in TRANSPORTS:
        results[transport] = run(transport, a.owners, a.rounds, a.dim)
        print(transport, {k: round(v, 4) for k, v in results[transport].items()}, flush=True)
    floor = crypto_floor(a.owners, a.dim)
    base = results["unary_threads"]["server_cpu_ms_per_owner_round"]
    out = jsonable({
        "benchmark": "intake_transport", "machine": machine_info(),
        "command": "python -m benchmarks.intake_transport " + " ".join(sys.argv[1:] if argv is None else argv),
        "what": "a bare mTLS gRPC server's CPU per owner-round (a d-int64 share in, a d-float64 release out), "
                "by transport, rounds after the first; the clients in another process on the same cores",
        "owners": a.owners, "rounds": a.rounds, "dim": a.dim, "results": results,
        "crypto_floor_ms_per_owner": floor,
        "over_unary_threads": {t: r["server_cpu_ms_per_owner_round"] / base for t, r in results.items()},
        "over_crypto_floor": {t: r["server_cpu_ms_per_owner_round"] / floor for t, r in results.items()}})
    print(json.dumps({"over_unary_threads": out["over_unary_threads"], "crypto_floor_ms_per_owner": floor}))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
