"""Profile the in-MPC discrete Gaussian (and discrete Laplace) sampler with 3 real CrypTen party
processes over the gRPC + mTLS transport on loopback, as tests/mpc/test_samplers.py runs them.

Usage (from the repository root):

    .venv/bin/python -m benchmarks.profile_gaussian --n 4096 16384 --profile
    .venv/bin/python -m benchmarks.profile_gaussian --provider dealer --n 16384

For every n it prints samples/s (the slowest party's wall time), the communicator's counters
(rounds, bytes moved by party 0, time party 0 spent inside communicator calls) and, with
``--profile``, a cProfile breakdown per party (cumulative time, top ``--top``) of the last rep.
``--provider dealer`` adds a 4th process, the Beaver-triple dealer (mpc_erm.mpc.dealer), as in
production; ``tfp`` is CrypTen's trusted-first-party provider used by the tests.

Parameters: DiscreteGaussianParams.for_sigma(σ, grid_bits=g, rounds=R, k=k); the defaults give
σ·2^g = 2^14 grid units, k = 56, oblivious rounds R = 26 (the regime before revealed rejection).
``--rounds 0`` takes for_sigma's default: revealed rejection, what jobs use now. ``--laplace``
times the discrete Laplace alone too.

The sampler module is imported from wherever ``mpc_erm`` resolves (PYTHONPATH first), so the same
script measures another checkout: ``PYTHONPATH=/tmp/base .venv/bin/python benchmarks/profile_gaussian.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import importlib.util
import io
import multiprocessing as mp
import os
import pstats
import queue
import sys
import time
import traceback
from typing import Any

NAMES = ("alice", "bob", "carol")


def _params(args: argparse.Namespace) -> Any:
    from mpc_erm.mpc.samplers.gaussian import DiscreteGaussianParams

    kw: dict[str, Any] = {"grid_bits": args.grid_bits, "k": args.k}
    if args.rounds > 0:
        kw["rounds"] = args.rounds
    return DiscreteGaussianParams.for_sigma(args.sigma, **kw)


def _describe(p: Any) -> str:
    sel = f"revealed rejection ({p.candidates_per_output():.2f} candidates/output)" if p.revealed else f"R={p.rounds}"
    return (f"t={p.t} mu={p.mu} sigma={p.sigma:.1f} grid units, {sel}, k={p.k}, Laplace B={p.laplace.bits} "
            f"(coins {len(p.laplace.thresholds)}), N bits {p.low_bit}..{p.n_bits - 1}, "
            f"compared acceptance coins {p.compared_coins}")


def _profile_text(prof: cProfile.Profile, top: int, sort: str) -> str:
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats(sort).print_stats(top)
    text = s.getvalue()
    # keep the table only (drop the header lines about the number of calls)
    return text[text.find("   ncalls"):] if "   ncalls" in text else text


def _sampler_module(name: str) -> Any:
    """The in-MPC sampler module that defines the constant ``name`` (the coin circuit, the bit
    layer or the discrete Laplace, in that order; older checkouts kept them all in the last),
    or None."""
    for mod in ("coins", "bits", "discrete_laplace"):
        full = f"mpc_erm.mpc.samplers.{mod}"
        if importlib.util.find_spec(full) is not None and hasattr(module := importlib.import_module(full), name):
            return module
    return None


def _party(rank: int, identity: Any, port_q: Any, table_q: Any, out_q: Any, args: argparse.Namespace) -> None:
    try:
        import torch

        torch.set_num_threads(args.threads)
        from mpc_erm.mpc.communicator import init_crypten, uninit_crypten
        from mpc_erm.mpc.crypten_compat import import_crypten
        from mpc_erm.mpc.transport import TransportOptions, TransportServer

        crypten = import_crypten()
        server = TransportServer(identity, "127.0.0.1:0")
        port_q.put((rank, server.start()))
        table = table_q.get(timeout=120)
        if identity.role == "dealer":
            from mpc_erm.mpc.dealer import run_dealer

            prof = cProfile.Profile() if args.profile else None
            if prof:
                prof.enable()
            rep = run_dealer(table, identity, server=server, options=TransportOptions(deadline_s=300))
            if prof:
                prof.disable()
            server.stop()
            out_q.put({"rank": rank, "dealer": {"requests": rep.requests, "by_function": rep.by_function,
                                                "elements": rep.elements_served},
                       "profile": _profile_text(prof, args.top, args.sort) if prof else ""})
            return
        comm = init_crypten(table, identity.name, identity, server=server, options=TransportOptions(deadline_s=300))
        if args.provider == "dealer":
            from mpc_erm.mpc.dealer import start_dealer_client

            start_dealer_client(comm)
        crypten.generators["local"][torch.device("cpu")].manual_seed(1000 + rank)
        from mpc_erm.mpc.samplers.discrete_gaussian import sample_discrete_gaussian_integers
        from mpc_erm.mpc.samplers.discrete_laplace import sample_discrete_laplace_integers

        if args.coin_planes:
            owner = _sampler_module("COIN_PLANES")
            if owner is None:
                raise SystemExit("this checkout has no COIN_PLANES switch")
            owner.COIN_PLANES = args.coin_planes
        for item in args.set:
            name, _, value = item.partition("=")
            owner = _sampler_module(name)
            if owner is None:
                raise SystemExit(f"no sampler module has {name}")
            old = getattr(owner, name)
            setattr(owner, name, type(old)(int(value)) if isinstance(old, bool | int) else value)

        params = _params(args)
        report: dict[str, Any] = {"rank": rank, "params": _describe(params), "runs": [], "profile": {}}
        # warm-up (imports, first-call costs, gRPC channels)
        sample_discrete_gaussian_integers(params, 256)
        for n in args.n:
            for rep_i in range(args.reps if not args.laplace_only else 0):
                prof = cProfile.Profile() if args.profile and rep_i == args.reps - 1 else None
                comm.barrier()
                crypten.reset_communication_stats()
                cpu0 = time.process_time()
                tic = time.perf_counter()
                if prof:
                    prof.enable()
                out = sample_discrete_gaussian_integers(params, n)
                if prof:
                    prof.disable()
                dt = time.perf_counter() - tic
                cpu = time.process_time() - cpu0
                st = comm.get_communication_stats()
                report["runs"].append(("gauss", n, dt, st["rounds"], st["bytes"], st["time"], cpu))
                if prof:
                    report["profile"][n] = _profile_text(prof, args.top, args.sort)
            if args.check and not args.laplace_only:
                vals = crypten.mpc.MPCTensor.from_shares(out.share, precision=0)._tensor.reveal()
                sd = float(vals.double().std())
                report.setdefault("check", []).append((n, sd, int(vals.abs().max())))
            if args.laplace or args.laplace_only:
                comm.barrier()
                crypten.reset_communication_stats()
                cpu0 = time.process_time()
                tic = time.perf_counter()
                sample_discrete_laplace_integers(params.laplace, n)
                dt = time.perf_counter() - tic
                cpu = time.process_time() - cpu0
                st = comm.get_communication_stats()
                report["runs"].append(("laplace", n, dt, st["rounds"], st["bytes"], st["time"], cpu))
        if args.comm_bench:
            report["comm"] = _comm_bench(comm, args.comm_bench)
        comm.barrier()
        if args.provider == "dealer":
            from mpc_erm.mpc.dealer import stop_dealer_client

            stop_dealer_client()
        uninit_crypten()
        server.stop()
        out_q.put(report)
    except BaseException:
        out_q.put({"rank": rank, "error": traceback.format_exc()})


def _comm_bench(comm: Any, words_list: list[int], reps: int = 10) -> list[tuple[str, int, float, float]]:
    """The transport alone: all-reduce (BXOR) of two int64 tensors of ``words`` each, as one
    Beaver AND round opens; (words, seconds per round, process CPU seconds per round)."""
    import torch

    out = []
    for words in words_list:
        for label, x, batched in (
            ("2 tensors", [torch.randint(0, 1 << 62, (words,)), torch.randint(0, 1 << 62, (words,))], True),
            ("1 tensor ", torch.randint(0, 1 << 62, (2 * words,)), False),
        ):
            comm.all_reduce(x, op=torch.distributed.ReduceOp.BXOR, batched=batched)
            comm.barrier()
            cpu0, tic = time.process_time(), time.perf_counter()
            for _ in range(reps):
                comm.all_reduce(x, op=torch.distributed.ReduceOp.BXOR, batched=batched)
            out.append((label, words, (time.perf_counter() - tic) / reps, (time.process_time() - cpu0) / reps))
    return out


def run(args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    from mpc_erm.mpc import pki
    from mpc_erm.mpc.transport import Member, PartyTable

    ca = pki.create_ca("profile CA")
    names = list(NAMES) + (["dealer"] if args.provider == "dealer" else [])
    identities = [pki.issue_identity(ca, n, "dealer" if n == "dealer" else "party") for n in names]
    ctx = mp.get_context("spawn")
    port_q, out_q = ctx.Queue(), ctx.Queue()
    table_qs = [ctx.Queue() for _ in names]
    procs = [ctx.Process(target=_party, args=(r, identities[r], port_q, table_qs[r], out_q, args), daemon=True)
             for r in range(len(names))]
    for p in procs:
        p.start()
    reports: dict[int, dict[str, Any]] = {}
    try:
        ports = dict(port_q.get(timeout=120) for _ in procs)
        table = PartyTable(
            job_id=f"profile-{os.getpid()}-{time.monotonic_ns()}",
            parties=tuple(Member(NAMES[r], f"127.0.0.1:{ports[r]}", "party") for r in range(3)),
            dealer=Member("dealer", f"127.0.0.1:{ports[3]}", "dealer") if args.provider == "dealer" else None,
        )
        for q in table_qs:
            q.put(table)
        while len(reports) < len(procs):
            rep = out_q.get(timeout=args.timeout)
            reports[rep["rank"]] = rep
    except queue.Empty:
        print(f"members {sorted(set(range(len(procs))) - set(reports))} did not report in time", file=sys.stderr)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    errors = [r["error"] for r in reports.values() if "error" in r]
    if errors:
        raise SystemExit("\n".join(errors))
    return reports


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[4096, 16384, 32768])
    ap.add_argument("--sigma", type=float, default=0.25, help="σ in real units (σ·2^g grid units)")
    ap.add_argument("--grid-bits", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=26, help="R; 0: for_sigma's choice")
    ap.add_argument("--k", type=int, default=56)
    ap.add_argument("--provider", choices=("tfp", "dealer"), default="tfp")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per party")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sort", default="cumulative")
    ap.add_argument("--ranks", type=int, nargs="+", default=[0, 1], help="whose profiles to print")
    ap.add_argument("--laplace", action="store_true", help="also time the discrete Laplace alone")
    ap.add_argument("--laplace-only", action="store_true", help="time the discrete Laplace only")
    ap.add_argument("--check", action="store_true", help="reveal the last batch and print its std (sanity only)")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="set a module constant of the in-MPC samplers (coins, bits or discrete_laplace; "
                         "e.g. B2A_CHUNK=65536)")
    ap.add_argument("--coin-planes", choices=("local", "triple"), default=None,
                    help="set COIN_PLANES of the coin circuit (where the chain's planes of U come from)")
    ap.add_argument("--comm-bench", type=int, nargs="*", default=[],
                    help="also time all-reduces of 2 × WORDS int64 (the transport alone)")
    args = ap.parse_args(argv)

    import mpc_erm

    reports = run(args)
    print(f"mpc_erm from {os.path.dirname(mpc_erm.__file__)}; provider {args.provider}; torch threads {args.threads}"
          + (f"; COIN_PLANES={args.coin_planes}" if args.coin_planes else "") + "".join(f"; {x}" for x in args.set))
    print(reports[0]["params"])
    by_rank = {r: reports[r]["runs"] for r in range(3)}
    print(f"{'what':8} {'n':>7} {'samples/s':>10} {'wall s':>8} {'rounds':>7} {'MB (p0)':>9} {'comm s (p0)':>11} "
          f"{'CPU s p0/p1/p2':>17} {'CPU us/sample':>13}")
    for i, (what, n, _dt, rounds, nbytes, ctime, _cpu) in enumerate(by_rank[0]):
        wall = max(by_rank[r][i][2] for r in range(3))
        cpus = [by_rank[r][i][6] for r in range(3)]
        print(f"{what:8} {n:7d} {n / wall:10,.0f} {wall:8.2f} {rounds:7d} {nbytes / 1e6:9.1f} {ctime:11.2f} "
              f"{'/'.join(f'{c:.1f}' for c in cpus):>17} {1e6 * sum(cpus) / n:13.0f}")
    for label, words, sec, cpu in reports[0].get("comm", []):
        print(f"transport: all-reduce of 2 x {words} int64 as {label}: {1e3 * sec:.1f} ms/round, party 0 CPU "
              f"{1e3 * cpu:.1f} ms/round ({2 * 8 * words / sec / 1e6:.0f} MB/s of opened data)")
    for n, sd, mx in reports[0].get("check", []):
        print(f"check n={n}: std {sd:.1f} grid units, max |x| {mx}")
    if 3 in reports:
        print("dealer:", reports[3]["dealer"])
    if args.profile:
        for r in args.ranks:
            if r not in reports or not isinstance(reports[r]["profile"], dict):
                continue
            for n, text in reports[r]["profile"].items():
                print(f"\n==== cProfile rank {r}, n = {n} (sorted by {args.sort}) ====")
                print(text)
        if 3 in reports and 3 in args.ranks:
            print("\n==== cProfile dealer ====")
            print(reports[3]["profile"])


if __name__ == "__main__":
    main()
