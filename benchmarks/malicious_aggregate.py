"""The malicious-secure aggregate against the semi-honest one, in the same run on the same machine:
one noisy sum of three parties' own contributions, as a round of a job whose parties hold their
rows, with distributed noise.

    python -m benchmarks.malicious_aggregate --dims 122,7850,26010 --rounds 6 \
        --out benchmarks/results/malicious_aggregate.json

Three party processes (``run_local``, 3-party replicated sharing, gRPC + mTLS on loopback). Each
party's contribution has ℓ2 norm 0.9 under its bound C = 1; the noise is each party's own discrete
Gaussian share for σ = 1 (z = 1) with two honest shares, on the job's grid. Modes, in turn per
dimension (each one warm-up aggregate, then ``--rounds`` timed):

* ``semi_honest_checked`` — :class:`~mpc_erm.mpc.aggregator.MpcAggregator` with the parties'
  bounds: every contribution checked inside the MPC (what a semi-honest party-held job runs);
* ``semi_honest_unchecked`` — the same without the check (the bare sum and reveal);
* ``malicious`` — :class:`~mpc_erm.mpc.verified_aggregator.VerifiedAggregator`: proofs,
  replicated dealing, hashes, coins, verified openings.

Reported per mode: the median and spread of party 0's wall seconds per aggregate, bytes sent per
party per aggregate, message rounds, and for the malicious mode the seconds proving and verifying;
the ratios malicious ÷ each semi-honest mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.aggregate import jsonable, machine_info

CLIP, Z = 1.0, 1.0
MODES = ("semi_honest_checked", "semi_honest_unchecked", "malicious")


def _party(ctx: Any, dims: list[int], rounds: int) -> dict[str, Any]:
    import math

    import torch

    from mpc_erm.mpc.aggregator import MpcAggregator
    from mpc_erm.mpc.local_noise import DistributedNoise
    from mpc_erm.mpc.noise import plan_noise
    from mpc_erm.mpc.verified_aggregator import VerifiedAggregator
    from mpc_erm.protocols.aggregation import NoiseSpec

    out: dict[str, Any] = {}
    for d in dims:
        grid = plan_noise(NoiseSpec("gaussian", Z * CLIP, sensitivity=CLIP), d, 3).grid_bits
        spec = NoiseSpec("gaussian", Z * CLIP / math.sqrt(2.0), sensitivity=CLIP, grid_bits=grid)
        g = torch.Generator().manual_seed(7 + ctx.rank)
        v = torch.randn(d, generator=g, dtype=torch.float64)
        c = (v * (0.9 * CLIP / float(v.norm())))[None]
        w = torch.ones(1, dtype=torch.float64)
        for mode in MODES:
            pool = DistributedNoise()
            agg: Any
            if mode == "malicious":
                agg = VerifiedAggregator(pool, (CLIP,) * 3, ctx.comm)
            else:
                agg = MpcAggregator(pool, bounds=(CLIP,) * 3 if mode == "semi_honest_checked" else None)
            agg.aggregate(c, w, spec)  # warm-up: plans, caches, the first messages
            b0, r0 = agg.totals.bytes, agg.totals.rounds
            p0 = getattr(agg.totals, "prove_seconds", 0.0)
            v0 = getattr(agg.totals, "verify_seconds", 0.0)
            secs = []
            for _ in range(rounds):
                ctx.comm.barrier()
                tic = time.perf_counter()
                agg.aggregate(c, w, spec)
                secs.append(time.perf_counter() - tic)
            out[f"{d}/{mode}"] = {
                "seconds": secs, "bytes_per_aggregate": (agg.totals.bytes - b0) / rounds,
                "rounds_per_aggregate": (agg.totals.rounds - r0) / rounds,
                "prove_seconds": (getattr(agg.totals, "prove_seconds", 0.0) - p0) / rounds,
                "verify_seconds": (getattr(agg.totals, "verify_seconds", 0.0) - v0) / rounds,
                "grid_bits": grid,
                "phase_seconds": {k: v / (rounds + 1) for k, v in getattr(agg.totals, "phases", {}).items()},
            }
    return out


def main(argv: list[str] | None = None) -> None:
    from mpc_erm.mpc.local import run_local
    from mpc_erm.mpc.local_noise import gaussian_share_norm_bound
    from mpc_erm.mpc.norm_proof import NormSpec
    from mpc_erm.mpc.validation import bound_units

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default="122,7850,26010")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    dims = [int(x) for x in a.dims.split(",") if x]
    tic = time.perf_counter()
    reps = run_local(_party, parties=3, trust="replicated", args=(dims, a.rounds), timeout_s=3000, deadline_s=300)
    results: dict[str, Any] = {}
    for d in dims:
        row: dict[str, Any] = {}
        for mode in MODES:
            m = reps[0][f"{d}/{mode}"]
            row[mode] = {"seconds_p50": statistics.median(m["seconds"]), "seconds_min": min(m["seconds"]),
                         "seconds_max": max(m["seconds"]), "bytes_per_party": m["bytes_per_aggregate"],
                         "message_rounds": m["rounds_per_aggregate"]}
            if mode == "malicious":
                row[mode] |= {"prove_seconds": m["prove_seconds"], "verify_seconds": m["verify_seconds"],
                              "phase_seconds_per_aggregate": m["phase_seconds"]}
                g = m["grid_bits"]
                # the statement each party proves: its bound plus its noise share's (σ_p² in grid units)
                sigma_p = Z * CLIP / 2 ** 0.5 * 2.0 ** g
                spec = NormSpec(d, bound_units(CLIP, g, d) + gaussian_share_norm_bound(round(sigma_p ** 2), d))
                row[mode] |= {"field_elements_dealt_per_share": spec.submission_length,
                              "dealt_over_dim": spec.submission_length / d}
        mal = row["malicious"]["seconds_p50"]
        row["ratio_malicious_over_semi_honest_checked"] = mal / row["semi_honest_checked"]["seconds_p50"]
        row["ratio_malicious_over_semi_honest_unchecked"] = mal / row["semi_honest_unchecked"]["seconds_p50"]
        row["bytes_ratio_malicious_over_semi_honest_checked"] = (row["malicious"]["bytes_per_party"]
                                                                 / row["semi_honest_checked"]["bytes_per_party"])
        results[str(d)] = row
        print(d, json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                             if k.startswith("ratio")}), flush=True)
    command = "python -m benchmarks.malicious_aggregate " + " ".join(sys.argv[1:] if argv is None else argv)
    out = jsonable({"benchmark": "malicious_aggregate", "machine": machine_info(), "command": command,
                    "what": ("one noisy sum of three parties' own contributions (‖c‖ = 0.9, bound C = 1, distributed "
                             "noise z = 1), party 0's wall seconds per aggregate; semi-honest checked (the in-MPC "
                             "bound check), unchecked, and malicious-secure (proofs + verified openings), same run"),
                    "rounds": a.rounds, "wall_seconds": time.perf_counter() - tic, "results": results})
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
