"""What the parties' agreement on a revealed value costs: a reveal alone against a reveal followed
by :func:`mpc_erm.mpc.agreement.agree_on` (SHA-256 of the words, digests all-gathered), round by
round interleaved in the same processes, for a few sizes.

    python -m benchmarks.reveal_agreement --dims 7851,100001,1000001 --rounds 30 \\
        --out benchmarks/results/reveal_agreement.json

Three compute processes (gRPC + mTLS, 3-party replicated sharing) on this machine. A reveal is one
``all_reduce`` of a d-word int64 tensor, as ``MpcAggregator`` reveals an aggregate (its range
check's count word included in d). Latency of a round = this party's time from a barrier to the
end; the slowest party's p50 over the counted rounds (the first 3 are warm-up).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.aggregate import jsonable, machine_info

WARMUP = 3


def _party(ctx: Any, dims: list[int], rounds: int) -> dict[str, Any]:
    import torch

    from mpc_erm.mpc.agreement import agree_on

    out: dict[str, Any] = {}
    for d in dims:
        x = torch.randint(-(2**40), 2**40, (d,), dtype=torch.long)
        alone, agreed = [], []
        for r in range(rounds + WARMUP):
            ctx.comm.barrier()
            tic = time.perf_counter()
            ctx.comm.all_reduce(x.clone())
            a = time.perf_counter() - tic
            ctx.comm.barrier()
            tic = time.perf_counter()
            ring = ctx.comm.all_reduce(x.clone())
            agree_on(ctx.comm, f"aggregate #{r}", ring)
            b = time.perf_counter() - tic
            if r >= WARMUP:
                alone.append(a)
                agreed.append(b)
        out[str(d)] = {"reveal_s": alone, "reveal_and_agreement_s": agreed}
    return out


def main(argv: list[str] | None = None) -> None:
    import numpy as np

    from mpc_erm.mpc.local import run_local

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default="7851,100001,1000001")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    dims = [int(x) for x in a.dims.split(",")]
    reps = run_local(_party, parties=3, trust="replicated", args=(dims, a.rounds), timeout_s=3600)
    rows = []
    for d in dims:
        alone = np.max([r[str(d)]["reveal_s"] for r in reps], axis=0)  # per round, the slowest party
        both = np.max([r[str(d)]["reveal_and_agreement_s"] for r in reps], axis=0)
        row = {"dim": d, "reveal_p50_s": float(np.median(alone)), "reveal_and_agreement_p50_s": float(np.median(both)),
               "ratio_p50": float(np.median(both) / np.median(alone)),
               "agreement_p50_s": float(np.median(both) - np.median(alone))}
        rows.append(row)
        print(f"d = {d}: reveal {row['reveal_p50_s'] * 1e3:.2f} ms, with agreement "
              f"{row['reveal_and_agreement_p50_s'] * 1e3:.2f} ms ({row['ratio_p50']:.2f}×)", flush=True)
    command = "python -m benchmarks.reveal_agreement " + " ".join(sys.argv[1:] if argv is None else argv)
    out = jsonable({"benchmark": "reveal_agreement", "machine": machine_info(),
                    "what": "a reveal (all_reduce of d int64 words, 3 replicated compute processes over gRPC + mTLS) "
                            "alone and followed by the parties' agreement on it (SHA-256, digests all-gathered), "
                            "interleaved round by round; per round the slowest party, p50 over the counted rounds",
                    "command": command,
                    "rounds": a.rounds, "results": rows})
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
