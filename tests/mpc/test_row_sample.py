"""A batch of b of the three parties' pooled rows each round, drawn by their secret shuffle
(parties.row_sample), through three real processes on gRPC + mTLS: exactly b a round in all,
each party holding only its own rows' bits, uniform over the pooled rows (more rounds than one
chunk, so the chunks join up), and a party's count hypergeometric."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from mpc_erm.mpc.local import run_local
from parties.row_sample import CHUNK_ROUNDS, pooled_row_draws

COUNTS, BATCH, ROUNDS = (7, 5, 6), 4, 3 * CHUNK_ROUNDS + 11


def _draw(ctx: Any, counts: tuple[int, ...], batch: int, rounds: int) -> Any:
    d = pooled_row_draws(ctx.comm, counts, batch, rounds)
    return d.rows, d.packed


def test_three_parties_draw_b_uniform_pooled_rows_a_round_each_seeing_its_own() -> None:
    got = run_local(_draw, parties=3, trust="replicated", args=(COUNTS, BATCH, ROUNDS), timeout_s=300)
    bits = []
    for (rows, packed), n in zip(got, COUNTS, strict=True):
        assert rows == n and packed.shape == (ROUNDS, (n + 7) // 8)
        bits.append(np.unpackbits(packed, axis=1, count=n))
    pooled = np.concatenate(bits, axis=1)
    assert np.all(pooled.sum(axis=1) == BATCH)  # exactly b a round across the parties
    assert stats.chisquare(pooled.sum(axis=0)).pvalue > 1e-4  # every pooled row w.p. b/N
    # alice's count a round: hypergeometric(N, n_A, b), pooled over k ≥ 3 for the expected counts
    k = np.minimum(bits[0].sum(axis=1), 3)
    pmf = stats.hypergeom(sum(COUNTS), COUNTS[0], BATCH).pmf(np.arange(5))
    expected = np.append(pmf[:3], pmf[3:].sum()) * ROUNDS
    assert stats.chisquare(np.bincount(k, minlength=4), expected).pvalue > 1e-4
    # rounds differ (fresh permutations a round, chunk after chunk)
    assert len({pooled[t].tobytes() for t in range(ROUNDS)}) > ROUNDS // 2
