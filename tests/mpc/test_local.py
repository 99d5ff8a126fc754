"""run_local: real party processes (and the dealer) over gRPC + mTLS on loopback, in one call.

Two short sessions: 3 parties + dealer computing the sum of their ranks with MpcAggregator, and
2 TFP parties where one raises, to check the child's traceback reaches the caller and nothing
is left running.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import pytest

from mpc_erm.mpc.local import LocalContext, LocalRunError, run_local, run_local_full


def _sum_of_ranks(ctx: LocalContext, scale: float) -> dict[str, Any]:
    import torch

    from mpc_erm.mpc.aggregator import MpcAggregator, ZeroNoise
    from mpc_erm.protocols.aggregation import NO_NOISE

    agg = MpcAggregator(ZeroNoise(), allow_test_only=True)
    row = torch.full((1, 4), float(ctx.rank) * scale, dtype=torch.float64)
    out = agg.aggregate(row, torch.ones(1, dtype=torch.float64), NO_NOISE)
    return {"rank": ctx.rank, "world_size": ctx.world_size, "name": ctx.name, "trust": ctx.trust,
            "trust_model": ctx.trust_model, "sum": out.tolist(), "comm_rank": ctx.comm.get_rank()}


def _fails_at_rank_1(ctx: LocalContext) -> int:
    if ctx.rank == 1:
        raise ArithmeticError("party 1 gives up on purpose")
    return ctx.rank


def test_three_parties_with_dealer_sum_their_ranks() -> None:
    tic = time.monotonic()
    run = run_local_full(_sum_of_ranks, parties=3, trust="dealer", args=(0.5,), timeout_s=120)
    assert [r["rank"] for r in run.results] == [0, 1, 2]
    for r in run.results:
        assert r["sum"] == [1.5] * 4  # (0 + 1 + 2) * 0.5, exactly
        assert r["world_size"] == 3 and r["comm_rank"] == r["rank"] and r["name"] == f"party{r['rank']}"
        assert r["trust"] == "dealer" and "dealer 'dealer' (non-colluding third party)" in r["trust_model"]
    assert run.dealer is not None and run.dealer["ended_by"] == "terminate"
    print(f"\nrun_local 3 parties + dealer: {run.seconds:.1f} s wall ({time.monotonic() - tic:.1f} s with checks)")


def test_a_failing_party_raises_with_its_traceback_and_nothing_is_left() -> None:
    before = {p.pid for p in mp.active_children()}
    with pytest.raises(LocalRunError) as err:
        run_local(_fails_at_rank_1, parties=2, trust="tfp", timeout_s=120, deadline_s=20)
    exc = err.value
    assert exc.member == "party 1 'party1'"
    assert "ArithmeticError: party 1 gives up on purpose" in exc.summary
    assert "_fails_at_rank_1" in str(exc) and "Traceback" in str(exc)
    assert {p.pid for p in mp.active_children()} <= before


def test_bad_arguments_are_refused_before_spawning() -> None:
    with pytest.raises(ValueError, match="trust must be one of"):
        run_local(_fails_at_rank_1, trust="ttp")
    with pytest.raises(ValueError, match="parties must be 3"):
        run_local(_fails_at_rank_1, parties=2, trust="replicated")
