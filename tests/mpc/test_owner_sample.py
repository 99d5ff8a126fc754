"""Uniform owner sampling by the compute parties' secret shuffle (parties.owner.sample).

What must hold, measured on what each party holds:

* every round draws exactly s of N owners, and the draws are uniform over the s-subsets;
* no single compute party's view says anything of the sample: with the keys A holds fixed (K_AB,
  K_CA), the sample over fresh K_BC is uniform; likewise for B (K_AB, K_BC fixed, K_CA fresh); C
  holds K_BC, K_CA and B's message c, and (c, sample) are independent over fresh K_AB. A positive
  control fixes all three keys: the sample is then one subset (so the tests can see dependence);
* through real processes (three compute parties on gRPC + mTLS) A and C hold the shares, B none,
  and each owner's two packed shares give its bits.

The statistical tests draw their keys from a seeded numpy generator (:func:`_keys`) and the
functions under test are deterministic in their keys, so their p-values are the same every run.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from scipy import stats

from mpc_erm.mpc.keystream import new_key
from mpc_erm.mpc.local import run_local
from parties.owner.sample import (
    a_share,
    b_message,
    c_share,
    owner_bits,
    pack_owner_bits,
    uniform_sample_shares,
)

N, S = 5, 2
SUBSETS = [frozenset(c) for c in itertools.combinations(range(N), S)]  # 10


def _keys(seed: int) -> Callable[[], bytes]:
    """A stand-in for new_key: 32-byte keys from a seeded generator (fixed p-values)."""
    rng = np.random.default_rng(seed)
    return lambda: rng.bytes(32)


def _sample(k_ab: bytes, k_bc: bytes, k_ca: bytes, rounds: int = 1, owners: int = N,
            size: int = S) -> tuple[np.ndarray, np.ndarray]:
    c = b_message(k_ab, k_bc, owners, size, rounds)
    return a_share(k_ab, k_ca, owners, rounds) ^ c_share(k_ca, c), c


def _uniform_p(draws: list[frozenset[int]]) -> float:
    counts = Counter(draws)
    return float(stats.chisquare([counts.get(s, 0) for s in SUBSETS]).pvalue)


def test_every_round_draws_exactly_s_owners_uniformly() -> None:
    key = _keys(1)
    bits, _ = _sample(key(), key(), key(), rounds=3000)
    assert bits.dtype == np.uint8 and set(np.unique(bits)) <= {0, 1}
    assert (bits.sum(1) == S).all()
    assert _uniform_p([frozenset(np.nonzero(r)[0].tolist()) for r in bits]) > 1e-3
    big, _ = _sample(key(), key(), key(), rounds=4, owners=1000, size=50)
    assert (big.sum(1) == 50).all() and len({tuple(np.nonzero(r)[0]) for r in big}) == 4


@pytest.mark.parametrize("party", ["A", "B"])
def test_what_a_or_b_holds_leaves_the_sample_uniform(party: str) -> None:
    key = _keys(2 if party == "A" else 3)
    fixed = {"ab": key(), "bc": key(), "ca": key()}
    fresh = "bc" if party == "A" else "ca"  # the one permutation the party does not know
    draws = []
    for _ in range(2000):
        keys = {**fixed, fresh: key()}
        bits, _ = _sample(keys["ab"], keys["bc"], keys["ca"])
        draws.append(frozenset(np.nonzero(bits[0])[0].tolist()))
    assert _uniform_p(draws) > 1e-3
    # positive control: with every key fixed the sample is one subset (what knowing all three would give)
    again = {frozenset(np.nonzero(_sample(fixed["ab"], fixed["bc"], fixed["ca"])[0][0])[0].tolist())
             for _ in range(20)}
    assert len(again) == 1


def test_what_c_holds_and_receives_is_independent_of_the_sample() -> None:
    key = _keys(4)
    k_bc, k_ca = key(), key()
    table = np.zeros((2**N, len(SUBSETS)))
    for _ in range(3000):
        bits, c = _sample(key(), k_bc, k_ca)
        table[int("".join(map(str, c[0])), 2), SUBSETS.index(frozenset(np.nonzero(bits[0])[0].tolist()))] += 1
    assert table.sum(1).min() > 0  # c takes every value (uniform: it is masked)
    assert stats.chi2_contingency(table).pvalue > 1e-3
    assert stats.chisquare(table.sum(1)).pvalue > 1e-3


def test_an_owners_packed_shares_give_its_bits() -> None:
    bits, _ = _sample(new_key(), new_key(), new_key(), rounds=13, owners=7, size=3)
    share_a = np.random.default_rng(0).integers(0, 2, (13, 7), dtype=np.uint8)  # any split works
    packed_a, packed_c = pack_owner_bits(share_a), pack_owner_bits(share_a ^ bits)
    for o in range(7):
        assert owner_bits(packed_a[o], packed_c[o], 13) == [bool(b) for b in bits[:, o]]
    with pytest.raises(ValueError, match="sample_shares"):
        owner_bits(packed_a[0], packed_c[0][:1], 13)
    with pytest.raises(ValueError, match="sample"):
        b_message(new_key(), new_key(), 5, 5, 1)


def _shuffle(ctx: Any, owners: int, size: int, rounds: int) -> Any:
    return uniform_sample_shares(ctx.comm, owners, size, rounds)


def test_the_shuffle_through_three_compute_processes() -> None:
    owners, size, rounds = 40, 6, 9
    a, b, c = run_local(_shuffle, parties=3, trust="replicated", args=(owners, size, rounds), timeout_s=300)
    assert b is None and a.shape == c.shape == (rounds, owners)
    bits = a ^ c
    assert (bits.sum(1) == size).all()
    assert not (a.sum(1) == size).all() or not (c.sum(1) == size).all()  # neither share is the sample
    pa, pc = pack_owner_bits(a), pack_owner_bits(c)
    assert [owner_bits(pa[o], pc[o], rounds) for o in range(owners)] == [[bool(x) for x in bits[:, o]]
                                                                        for o in range(owners)]
