"""A batch of b of the three parties' pooled rows each round, drawn by their secret shuffle
(parties.row_sample).

- Through three real processes on gRPC + mTLS: exactly b a round in all, each party holding only
  its own rows' bits, uniform over the pooled rows (more rounds than one chunk, so the chunks join
  up), and a party's count hypergeometric.
- What each party holds and receives, on five rows: with the one pair key it does not hold fresh,
  the other parties' draws given its own bits are uniform and independent of its messages; a
  positive control (a view with another party's bit in it) is caught."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
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


# ---------------------------------------------------------------- what each party's view says
# Five pooled rows (A holds 0–1, B holds 2, C holds 3–4), two drawn a round. Each party's keys are
# fixed and the one pair key it does not hold is fresh each trial; what it holds and receives
# must say nothing of the others' rows beyond its own bits (so the others' pattern, given its own
# bits and its view, stays uniform). Keys from a seeded generator: fixed p-values.

SMALL, DRAWN = (2, 1, 2), 2
OWN = {"A": slice(0, 2), "B": slice(2, 3), "C": slice(3, 5)}


def _keys(seed: int) -> Any:
    rng = np.random.default_rng(seed)
    return lambda: rng.bytes(32)


def _one_round(k_ab: bytes, k_bc: bytes, k_ca: bytes) -> tuple[np.ndarray, dict[str, tuple[int, ...]]]:
    """The round's sample and what each party receives in it."""
    from parties.row_sample import a_side, b_message, c_side

    c = b_message(k_ab, k_bc, 5, DRAWN, 0, 1)
    share_a, a_to_c, a_to_b = a_side(k_ab, k_ca, SMALL, 0, 1)
    share_c, c_to_a, c_to_b = c_side(k_ca, c, SMALL, 0, 1)
    sample = (share_a ^ share_c)[0]
    views = {"A": tuple(c_to_a[0]), "B": tuple(a_to_b[0]), "C": (*c[0], *a_to_c[0])}
    assert tuple(sample[OWN["B"]]) == tuple(a_to_b[0] ^ c_to_b[0])  # B's two messages give its bit
    return sample, views


@pytest.mark.parametrize(("party", "fresh"), [("A", "bc"), ("B", "ca"), ("C", "ab")])
def test_no_party_learns_more_than_its_own_rows_draws(party: str, fresh: str) -> None:
    key = _keys({"A": 11, "B": 12, "C": 13}[party])
    fixed = {"ab": key(), "bc": key(), "ca": key()}
    table: dict[tuple[tuple[int, ...], tuple[int, ...]], dict[tuple[int, ...], int]] = {}
    for _ in range(3000):
        keys = {**fixed, fresh: key()}
        sample, views = _one_round(keys["ab"], keys["bc"], keys["ca"])
        own = tuple(sample[OWN[party]])
        others = tuple(np.delete(sample, np.arange(5)[OWN[party]]))
        cell = table.setdefault((own, views[party]), {})
        cell[others] = cell.get(others, 0) + 1
    assert all(sum(int(x) for x in sample) == DRAWN for sample in [_one_round(key(), key(), key())[0]])
    for own in {k[0] for k in table}:  # given its own bits, the others' pattern against its view
        rows = [v for (o, _), v in table.items() if o == own]
        patterns = sorted({p for r in rows for p in r})
        counts = np.array([[r.get(p, 0) for p in patterns] for r in rows], dtype=float)
        if counts.sum() < 200 or len(patterns) < 2:
            continue
        assert stats.chisquare(counts.sum(axis=0)).pvalue > 1e-3  # uniform over the consistent patterns
        if len(rows) > 1:
            assert stats.chi2_contingency(counts).pvalue > 1e-3  # and independent of what it received


def test_the_view_test_sees_a_leak_when_there_is_one() -> None:
    """Positive control: a view that also held another party's bit is caught."""
    key = _keys(14)
    fixed = {"ab": key(), "ca": key()}
    table: dict[tuple[int, ...], dict[tuple[int, ...], int]] = {}
    for _ in range(2000):
        sample, views = _one_round(fixed["ab"], key(), fixed["ca"])
        leaky = (*views["A"], int(sample[3]))  # A's view plus C's first row
        own = tuple(sample[OWN["A"]])
        if own != (0, 0):
            continue
        cell = table.setdefault(leaky, {})
        others = tuple(sample[2:])
        cell[others] = cell.get(others, 0) + 1
    patterns = sorted({p for r in table.values() for p in r})
    counts = np.array([[r.get(p, 0) for p in patterns] for r in table.values()], dtype=float)
    assert stats.chi2_contingency(counts).pvalue < 1e-6
