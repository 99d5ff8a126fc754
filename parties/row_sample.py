"""A batch of exactly b of the three parties' pooled rows each round, hidden from every single party.

With ``training.batch_size`` each round's batch is b of the N = n_A + n_B + n_C rows the parties
(ranks 0, 1, 2: A, B, C) hold, drawn uniformly without replacement. Party j's rows are the pooled
positions offset_j … offset_j + n_j − 1 (rank order). The draw is the owners' shuffle
(:mod:`parties.owner.sample`) run over the N positions, in chunks of rounds:

1. The pair keys K_AB, K_BC, K_CA (fresh per job); round t's permutation of a pair is the argsort
   of N keystream words of its key (nonce 2t), and A and B draw mask bits r_t (nonce 2t + 1).
2. B computes v₂ = π_BC(π_AB(v)), v = (1^b, 0^(N−b)), and sends C the masked c = v₂ ⊕ r.
3. A's XOR share of the sample is π_CA(r), C's is π_CA(c).

Each party then gets its own rows' bits and nothing else:

- A sends C its share of C's positions; C sends A its share of A's positions. What A receives,
  π_CA(c) at A's positions, A can read back through π_CA (which it holds) only as v₂ at the
  positions that π_CA sends to its own rows: its own bits. Likewise for C.
- A and C each send B their share of B's positions, each XORed with the same bits m of K_CA
  (nonce 2^40 + t), which B does not hold: each message alone is uniform to B, and their XOR is
  B's bits.

So each party learns which of its own rows are drawn in each round (hence how many of the
others' were: the plan accounts that view, :mod:`mpc_erm.privacy.member_view`), and nothing of
which of another's. Two parties together learn the whole sample, which the replicated trust model
excludes. Two messages per party per chunk besides the shuffle's one (B → C); bytes: N/8 a round
for B → C and n_j/8 a round for each slice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mpc_erm.protocols.row_draws import RowDraws
from parties.owner import sample as owner_sample

__all__ = ["CHUNK_ROUNDS", "a_side", "b_message", "c_side", "pooled_row_draws"]

#: Rounds drawn per exchange: bounds the permutations held at once (CHUNK_ROUNDS × N int64).
CHUNK_ROUNDS = 64
#: The nonces of the masks that hide B's slices (K_CA), above every permutation and mask nonce.
_SLICE_NONCE = 2**40


def _send(comm: object, bits: np.ndarray, dst: int) -> None:
    comm.send(torch.from_numpy(np.ascontiguousarray(np.packbits(bits, axis=1))), dst)  # type: ignore[attr-defined]


def _recv(comm: object, rounds: int, n: int, src: int) -> np.ndarray:
    buf = torch.zeros((rounds, (n + 7) // 8), dtype=torch.uint8)
    got = comm.recv(buf, src)  # type: ignore[attr-defined]
    return np.unpackbits(got.numpy(), axis=1, count=n)


def _check(counts: Sequence[int], batch: int, rounds: int) -> int:
    if len(counts) != 3:
        raise ValueError("training.batch_size: a batch of the pooled rows is drawn by exactly 3 parties "
                         "(trust = 'replicated')")
    n_all = int(sum(counts))
    if not 1 <= batch < n_all:
        raise ValueError(f"training.batch_size: 1 to {n_all - 1} of the {n_all} pooled rows, got {batch}")
    if rounds < 1:
        raise ValueError(f"training.iterations: at least 1 round, got {rounds}")
    return n_all


def b_message(k_ab: bytes, k_bc: bytes, n_all: int, batch: int, t0: int, t1: int) -> np.ndarray:
    """B's message to C for rounds t0 … t1 − 1: the owners' shuffle's, over the N positions."""
    return owner_sample.b_message(k_ab, k_bc, n_all, batch, t1 - t0, first=t0)


def _slice_masks(k_ca: bytes, t0: int, t1: int, n: int) -> np.ndarray:
    """The bits that hide B's slices: K_CA's keystream at nonce 2^40 + t."""
    return owner_sample.key_bits(k_ca, t1 - t0, n, lambda t: _SLICE_NONCE + t0 + t)


def a_side(k_ab: bytes, k_ca: bytes, counts: Sequence[int], t0: int,
           t1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A's XOR share π_CA(r) of the sample, its message to C (its share of C's rows) and to B (its
    share of B's rows, masked by K_CA's bits)."""
    at = _slices(counts)
    share = owner_sample.a_share(k_ab, k_ca, sum(counts), t1 - t0, first=t0)
    return share, share[:, at[2]], share[:, at[1]] ^ _slice_masks(k_ca, t0, t1, counts[1])


def c_side(k_ca: bytes, c: np.ndarray, counts: Sequence[int], t0: int,
           t1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """C's XOR share π_CA(c) of the sample, its message to A (its share of A's rows) and to B (its
    share of B's rows, masked by the same K_CA bits as A's)."""
    at = _slices(counts)
    share = owner_sample.c_share(k_ca, c, first=t0)
    return share, share[:, at[0]], share[:, at[1]] ^ _slice_masks(k_ca, t0, t1, counts[1])


def _slices(counts: Sequence[int]) -> list[slice]:
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    return [slice(offsets[j], offsets[j + 1]) for j in range(len(counts))]


def pooled_row_draws(comm: object, counts: Sequence[int], batch: int, rounds: int) -> RowDraws:
    """Run the draw among the three parties (module docstring): this party's bits of its own
    rows, every round. ``counts``: the parties' agreed row counts, in rank order."""
    n_all = _check(counts, batch, rounds)
    rank = comm.get_rank()  # type: ignore[attr-defined]
    mine = _slices(counts)[rank]
    k_prev, k_next = owner_sample.pair_keys(comm, rank)  # A: (K_CA, K_AB); B: (K_AB, K_BC); C: (K_BC, K_CA)
    out = []
    for t0 in range(0, rounds, CHUNK_ROUNDS):
        t1 = min(rounds, t0 + CHUNK_ROUNDS)
        c = t1 - t0
        if rank == 1:  # B: the shuffled, masked vector to C; then its two masked slices
            _send(comm, b_message(k_prev, k_next, n_all, batch, t0, t1), 2)
            own = _recv(comm, c, counts[1], 0) ^ _recv(comm, c, counts[1], 2)
        elif rank == 0:  # A: C's slice to C, B's masked slice to B; C's share of A's slice back
            share, to_c, to_b = a_side(k_next, k_prev, counts, t0, t1)
            _send(comm, to_c, 2)
            _send(comm, to_b, 1)
            own = share[:, mine] ^ _recv(comm, c, counts[0], 2)
        else:  # C: B's vector, A's share of C's slice; its slices to A and (masked) to B
            share, to_a, to_b = c_side(k_next, _recv(comm, c, n_all, 1), counts, t0, t1)
            theirs = _recv(comm, c, counts[2], 0)
            _send(comm, to_a, 0)
            _send(comm, to_b, 1)
            own = share[:, mine] ^ theirs
        out.append(np.packbits(own, axis=1))
    return RowDraws(np.concatenate(out), int(counts[rank]))
