"""Per-round cost of a round with many data owners against their number.

Three compute parties (real processes, CrypTen over gRPC + mTLS, 3-party replicated sharing, no
dealer) each host an :class:`~parties.owner.intake.OwnerIntake`; N owners are real gRPC clients
with their own certificates, channels and keys — **all in this one process** (threads), or dealt to
``--owner-procs`` spawned processes (threads there) — so the owners' CPU competes with the compute
parties' on the same cores. Each round: every owner encodes a d-dimensional contribution (‖v‖ ≤ 1)
on the noise's grid and sends its shares; each compute party runs the daemon's own round
(:class:`~parties.owner.rounds.IntakeAggregator`, its intake's pool sized as the worker sizes
it: a parked read per owner): it waits for all of them, agrees on the set with the others, adds
in-MPC discrete Gaussian noise and reveals; every owner reads the release. Measured per N:
the round's wall time at a compute party (open → published) split into *intake* (open → everyone
in) and *online* (agree + reveal + publish), the compute parties' CPU seconds per round, bytes per
owner per round, and, as the baseline in the same run, the simulator's round (the same N vectors
summed in plaintext + noise, one process).

    python -m benchmarks.many_owners --owners 10,100,1000 --dim 7850 --rounds 3 \\
        --out benchmarks/results/many_owners_round_cost.json
    python -m benchmarks.many_owners --owners 10,100,1000,10000 --owner-procs 4 --rounds 3 \\
        --out benchmarks/results/many_owners_round_cost_procs4.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.aggregate import jsonable, machine_info
from benchmarks.owners_common import MemoryPeak, in_spawned_processes, owners_process_setup

SIGMA, SENSITIVITY = 1.0, 1.0


def _compute(ctx: Any, owners: tuple[str, ...], dim: int, rounds: int, addr_q: Any, checked: bool = True,
             noise: str = "mpc", security: str = "semi-honest") -> dict[str, Any]:
    """One compute party: the daemon's own round (``IntakeAggregator``, the intake sized as the
    worker sizes it), ``rounds`` times over, with the MPC bytes of each round; ``checked``: every
    owner's contribution checked against its bound (‖v‖ ≤ 1) on the shares, as the daemons do;
    ``noise``: "mpc" (in-MPC sampler) or "distributed" (each party's own share); ``security``:
    "malicious" runs the verified round (every owner's proof, distributed noise)."""
    import torch

    from mpc_erm.mpc.aggregator import MpcAggregator
    from mpc_erm.mpc.local_noise import DistributedNoise
    from mpc_erm.mpc.noise import InMpcNoise
    from mpc_erm.mpc.verified_aggregator import VerifiedAggregator
    from parties.owner.intake import OwnerIntake, RoundFrame, intake_threads
    from parties.owner.rounds import IntakeAggregator
    from parties.owner.shares import owner_margin_bits

    verified = security == "malicious"
    src: Any = DistributedNoise() if noise == "distributed" or verified else InMpcNoise()
    spec = _spec(dim, distributed=isinstance(src, DistributedNoise))
    src.prepare(spec, dim, releases=rounds)
    from mpc_erm.mpc.validation import bound_units

    grid = src.precision_bits(spec, dim)
    frame = RoundFrame("bench", owners, 3, ctx.rank, grid, owner_margin_bits(len(owners)), dim,
                       bound_units=bound_units(1.0, grid, dim) if checked or verified else None,
                       replicated=checked or verified, verified=verified)
    intake = OwnerIntake(ctx.identity, frame, max_workers=intake_threads(len(owners), 3)).start()
    addr_q.put((ctx.rank, intake.address))
    mpc: Any = VerifiedAggregator(src, (0.0,) * 3, ctx.comm) if verified else MpcAggregator(src)
    agg = IntakeAggregator(intake, ctx.comm, mpc, deadline_s=600.0, first_wait_s=600.0,
                           while_owners_compute=lambda: src.top_up(spec, dim))
    mpc_bytes = []
    try:
        for _ in range(rounds):
            before = ctx.comm.get_communication_stats().get("bytes", 0)
            agg.aggregate(torch.zeros(0, dim, dtype=torch.float64), torch.zeros(0, dtype=torch.float64), spec)
            mpc_bytes.append(ctx.comm.get_communication_stats().get("bytes", 0) - before)
        # the intake stays up until every owner that reads from this party has read the last release
        agg.wait_last_read(600.0)
    finally:
        intake.stop()
    return {"rank": ctx.rank, "grid": frame.grid_bits,
            "rounds": [{"round_s": w + m, "intake_s": w, "online_s": m, "cpu_s": c, "agreed": n, "mpc_bytes": b}
                       for w, m, c, n, b in zip(agg.wait_seconds, agg.mpc_seconds, agg.cpu_seconds, agg.counted,
                                                mpc_bytes, strict=True)]}


def _value(o: int, t: int, dim: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(1_000_003 * t + o)
    v = torch.randn(dim, generator=g, dtype=torch.float64)
    return v / v.norm()  # ‖v‖ = 1: a clipped contribution


def _owners(ca: Any, names: tuple[str, ...], first: int, dim: int, rounds: int, compute: list[tuple[str, str]],
            threads: int, checked: bool = True, verified: bool = False) -> dict[str, Any]:
    """Owners ``first`` … ``first + len(names) - 1`` of the job, driven by ``threads`` threads here."""
    from mpc_erm.mpc import pki
    from parties.owner.intake import OwnerClient
    from parties.owner.rounds import OwnerAggregator

    tic = time.perf_counter()
    idents = [pki.issue_identity(ca, n, "owner") for n in names]
    issue_s = time.perf_counter() - tic
    clients = [OwnerClient(i, "bench", first + o, compute, replicated=checked or verified)
               for o, i in enumerate(idents)]
    senders = [OwnerAggregator(c, round_wait_s=1800) for c in clients]
    pool = ThreadPoolExecutor(max_workers=threads)
    try:
        tic = time.perf_counter()
        list(pool.map(lambda c: c.enroll(timeout_s=1800), clients))
        enrol_s = time.perf_counter() - tic
        per_round = []
        for t in range(rounds):
            tic = time.perf_counter()

            def one(s: OwnerAggregator, t: int = t) -> None:  # as an owner sends: waits for the round to open
                if not s.send(t, _value(s.client.owner_index, t, dim)):
                    raise RuntimeError(f"round {t} closed before owner {s.client.owner_index} sent its share")

            list(pool.map(one, senders))  # all shares sent (a thread blocked on a release would starve the rest)
            list(pool.map(lambda c, t=t: c.released(t, wait_s=1800), clients))
            per_round.append(time.perf_counter() - tic)
    finally:
        pool.shutdown()
        for c in clients:
            c.close()
    return {"owners": len(names), "issue_certificates_s": issue_s, "enrol_s": enrol_s, "owner_round_s": per_round}


def _owners_process(ca: Any, names: tuple[str, ...], first: int, dim: int, rounds: int,
                    compute: list[tuple[str, str]], threads: int, checked: bool, verified: bool, q: Any) -> None:
    owners_process_setup()
    try:
        q.put(_owners(ca, names, first, dim, rounds, compute, threads, checked, verified))
    except Exception as exc:  # the parent reports it
        q.put({"error": repr(exc)})


def _all_owners(ca: Any, names: tuple[str, ...], dim: int, rounds: int, addr_q: Any, threads: int,
                procs: int, checked: bool = True, verified: bool = False) -> dict[str, Any]:
    """Every owner: in this process (``procs`` = 1) or dealt in contiguous blocks to ``procs``
    spawned processes, each with ``threads`` threads; per round, the slowest process's time."""
    addrs = dict(addr_q.get(timeout=600) for _ in range(3))
    compute = [(f"party{r}", addrs[r]) for r in range(3)]
    if procs <= 1:
        return _owners(ca, names, 0, dim, rounds, compute, threads, checked, verified) | {"owner_processes": 1}
    size = -(-len(names) // procs)
    parts = in_spawned_processes(_owners_process, [(ca, names[i:i + size], i, dim, rounds, compute, threads, checked,
                                                    verified)
                                                   for i in range(0, len(names), size)], timeout_s=7200)
    errors = [p["error"] for p in parts if "error" in p]
    if errors:
        raise RuntimeError(f"owner processes failed: {errors[:3]}")
    return {"owner_processes": len(parts), "threads_per_process": threads,
            "issue_certificates_s": max(p["issue_certificates_s"] for p in parts),
            "enrol_s": max(p["enrol_s"] for p in parts),
            "owner_round_s": [max(p["owner_round_s"][t] for p in parts) for t in range(rounds)]}


def _simulator_round(owners: int, dim: int) -> float:
    """The baseline: the same contributions summed in plaintext with Gaussian noise, in process."""
    import torch

    tic = time.perf_counter()
    total = torch.zeros(dim, dtype=torch.float64)
    for o in range(owners):
        total += _value(o, 0, dim)
    total += torch.randn(dim, dtype=torch.float64) * SIGMA
    return time.perf_counter() - tic


def _share_words(dim: int, verified: bool) -> int:
    """Words of one owner's explicit share: d, or with verified shares its salt, x, aux and proof."""
    if not verified:
        return dim
    from mpc_erm.mpc.norm_proof import NormSpec
    from mpc_erm.mpc.validation import bound_units
    from parties.owner.verified_shares import payload_words

    grid = int(_spec(dim, distributed=True).grid_bits)  # distributed noise's grid is the spec's
    return payload_words(NormSpec(dim, bound_units(1.0, grid, dim)))


def _spec(dim: int, distributed: bool) -> Any:
    """The round's noise: the in-MPC sampler's grid is its own choice; distributed noise takes the
    same grid, fixed (what the worker's realisation gives it)."""
    from dataclasses import replace

    from mpc_erm.mpc.noise import plan_noise
    from mpc_erm.protocols.aggregation import NoiseSpec

    spec = NoiseSpec("gaussian", SIGMA, sensitivity=SENSITIVITY)
    return replace(spec, grid_bits=plan_noise(spec, dim, 3).grid_bits) if distributed else spec


def run_one(owners: int, dim: int, rounds: int, threads: int, procs: int = 1, checked: bool = True,
            noise: str = "mpc", security: str = "semi-honest") -> dict[str, Any]:
    from mpc_erm.mpc import pki
    from mpc_erm.mpc.local import run_local_full

    names = tuple(f"owner-{i:05d}" for i in range(owners))
    ca = pki.create_ca("many owners bench CA")
    addr_q = mp.get_context("spawn").Queue()
    box: dict[str, Any] = {}
    verified = security == "malicious"
    th = threading.Thread(target=lambda: box.update(_all_owners(ca, names, dim, rounds, addr_q, threads, procs,
                                                                         checked, verified)))
    mem = MemoryPeak().start()
    th.start()
    run = run_local_full(_compute, parties=3, trust="replicated",
                         args=(names, dim, rounds, addr_q, checked, noise, security),
                         timeout_s=7200, deadline_s=600, ca=ca)
    th.join(600)
    mem.stop()
    if "owner_round_s" not in box:
        raise RuntimeError("the owners did not finish")
    reps = run.results
    def worst(key: str) -> list[float]:  # per round, the slowest compute party
        return [max(r["rounds"][t][key] for r in reps) for t in range(rounds)]

    per = worst("round_s")
    sim = min(_simulator_round(owners, dim) for _ in range(3))
    mid = _p50(per)
    return {
        "owners": owners, "dim": dim, "rounds": rounds, "contributions_checked": checked or verified,
        "security": security, "noise": "distributed" if verified else noise,
        "round_s_per_round": per,
        "round_s_p50": mid,
        "intake_s_p50": _p50(worst("intake_s")),
        "online_s_p50": _p50(worst("online_s")),
        "compute_cpu_s_per_round_sum_over_parties": sum(r["rounds"][-1]["cpu_s"] for r in reps),
        "compute_cpu_s_per_round_p50_sum_over_parties": _p50([sum(r["rounds"][t]["cpu_s"] for r in reps)
                                                             for t in range(rounds)]),
        "mpc_bytes_per_round_per_party": reps[0]["rounds"][-1]["mpc_bytes"],
        "bytes_per_owner_per_round": {"sent": 8 * _share_words(dim, verified), "received": 8 * dim,
                                      "note": "one call a round: the explicit share (d int64) to the owner's "
                                              "explicit compute party (the others derive theirs from its keys); "
                                              "the release (d float64) read back from the same party"},
        "owner_side": box,
        "simulator_round_s": sim,
        "ratio_round_to_simulator": mid / sim,
        "agreed": [r["rounds"][-1]["agreed"] for r in reps],
        "machine_memory_gib": mem.gib("MemTotal - MemAvailable of the whole machine (compute parties and owners), "
                                      "sampled every 0.5 s from the owners' start to their end"),
    }


def _p50(xs: list[float]) -> float:
    steady = xs[1:] or xs  # round 0 includes warm-up
    return sorted(steady)[len(steady) // 2]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--owners", default="10,100,1000")
    ap.add_argument("--dim", type=int, default=7850)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=32, help="threads driving the owners in each owner process")
    ap.add_argument("--owner-procs", type=int, default=1,
                    help="spread the owners over this many spawned processes (each owner holds 3 TLS channels: "
                         "10,000 in one process exceed the usual 20,000 open files)")
    ap.add_argument("--checks", default="on", help="on, off, or off,on: each N with and without the bound "
                                                   "check of every contribution, and their ratios (one run)")
    ap.add_argument("--security", default="semi-honest",
                    help="semi-honest, malicious, or semi-honest,malicious: each N in each mode (malicious: every "
                         "owner's proof checked, distributed noise) and their ratios (one run)")
    ap.add_argument("--noise", default="mpc", choices=["mpc", "distributed"],
                    help="the semi-honest runs' noise (the malicious mode's is always distributed)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    results = []
    ratios = []
    for n in (int(x) for x in a.owners.split(",")):
        pair = {}
        modes = [("semi-honest", c) for c in a.checks.split(",")] if "semi-honest" in a.security else []
        modes += [("malicious", "on")] if "malicious" in a.security else []
        for security, check in modes:
            print(f"many owners: N = {n}, d = {a.dim}, {a.rounds} rounds, {security}, check {check} …", flush=True)
            r = run_one(n, a.dim, a.rounds, a.threads, a.owner_procs, checked=check == "on", noise=a.noise,
                        security=security)
            print(f"  round p50 {r['round_s_p50']:.3f} s (intake {r['intake_s_p50']:.3f}, online "
                  f"{r['online_s_p50']:.3f}); cpu {r['compute_cpu_s_per_round_p50_sum_over_parties']:.3f} s; "
                  f"simulator {r['simulator_round_s'] * 1e3:.2f} ms", flush=True)
            results.append(r)
            pair["malicious" if security == "malicious" else check] = r
        if {"on", "off"} <= set(pair):
            on, off = pair["on"], pair["off"]
            ratios.append({"owners": n, "dim": a.dim,
                           "wall_round_checked_over_unchecked": on["round_s_p50"] / off["round_s_p50"],
                           "online_checked_over_unchecked": on["online_s_p50"] / off["online_s_p50"],
                           "compute_cpu_checked_over_unchecked": on["compute_cpu_s_per_round_p50_sum_over_parties"]
                           / off["compute_cpu_s_per_round_p50_sum_over_parties"],
                           "owner_bytes_checked_over_unchecked": 1.0,
                           "mpc_bytes_per_round_checked_over_unchecked": on["mpc_bytes_per_round_per_party"]
                           / max(1, off["mpc_bytes_per_round_per_party"])})
            print(f"  checked / unchecked: {ratios[-1]}", flush=True)
        if {"on", "malicious"} <= set(pair):
            on, mal = pair["on"], pair["malicious"]
            ratios.append({"owners": n, "dim": a.dim, "semi_honest_noise": a.noise,
                           "wall_round_malicious_over_semi_honest": mal["round_s_p50"] / on["round_s_p50"],
                           "online_malicious_over_semi_honest": mal["online_s_p50"] / on["online_s_p50"],
                           "compute_cpu_malicious_over_semi_honest":
                               mal["compute_cpu_s_per_round_p50_sum_over_parties"]
                               / on["compute_cpu_s_per_round_p50_sum_over_parties"],
                           "owner_round_malicious_over_semi_honest":
                               _p50(mal["owner_side"]["owner_round_s"]) / _p50(on["owner_side"]["owner_round_s"]),
                           "owner_bytes_malicious_over_semi_honest":
                               mal["bytes_per_owner_per_round"]["sent"] / on["bytes_per_owner_per_round"]["sent"]})
            print(f"  malicious / semi-honest: {ratios[-1]}", flush=True)
    out = jsonable({"benchmark": "many_owners_round_cost", "machine": machine_info(),
                    "what": "per-round cost against the number of data owners: 3 replicated compute processes with "
                            "in-MPC Gaussian noise; the owners are real gRPC clients with their own certificates, all "
                            "in the benchmark's process or its --owner-procs spawned processes (threads), on the "
                            "same cores as the compute parties",
                    "command": "python -m benchmarks.many_owners " + " ".join(sys.argv[1:] if argv is None else argv),
                    "results": results, "check_ratios": ratios})
    text = json.dumps(out, indent=2)
    if a.out:
        a.out.write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
