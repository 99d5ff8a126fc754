"""Uniform owner sampling without replacement, hidden from every single compute party.

DP-Fed-LS with uniform sampling (paper 002, Algorithm 1) draws exactly s = τ·N of the job's N
listed owners each round. The amplification by subsampling holds only against someone who does
not know the sample, so no compute party may learn it: under 3-party replicated sharing (honest
majority) the three compute parties A, B, C (ranks 0, 1, 2) shuffle the public bit vector
v = (1^s, 0^(N−s)) by three permutations, each known to one *pair* of them:

1. Every pair shares a fresh AES key for the job (A draws K_AB and sends it to B, B draws K_BC
   for C, C draws K_CA for A, over the compute parties' mutual-TLS channels). Round t's
   permutation of a pair is the argsort of N keystream words of its key (nonce 2t); A and B also
   draw a mask r_t of N bits from K_AB (nonce 2t + 1).
2. B computes v₂ = π_BC(π_AB(v)) and sends C the masked c = v₂ ⊕ r (one message for all rounds).
3. A's share is π_CA(r), C's is π_CA(c): their XOR is π_CA(v₂), a uniform s-subset.

Each owner reads its two bits of each round, from A and C, at enrolment (:class:`OwnerClient`),
and learns only whether it was drawn. What each compute party holds says nothing of the sample:
A misses π_BC, B misses π_CA, and C sees c, which is v₂ masked by r it does not know
(``tests/mpc/test_owner_sample.py`` checks all three statistically). Two colluding compute
parties learn it: the trust model of a replicated job excludes that coalition anyway. Every owner
still sends shares each round (a zero update when not drawn), so arrival does not tell either.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from mpc_erm.mpc.keystream import KEY_BYTES, KeyedMasks, new_key

__all__ = ["OWNER_SAMPLE_PARTIES", "a_share", "b_message", "c_share", "key_bits", "owner_bits", "pack_owner_bits",
           "pair_keys", "uniform_sample_shares"]

#: The shuffle's parties: exactly three compute parties (replicated sharing, no dealer).
OWNER_SAMPLE_PARTIES = 3
#: Ranks that hold the output's XOR shares (A and C): each owner reads its bits from both.
SHARE_RANKS = (0, 2)


def _words(masks: KeyedMasks, key: bytes, nonce: int, n: int) -> np.ndarray:
    return masks.words(key, nonce, n).numpy().copy()


def _permutations(key: bytes, rounds: int, n: int, first: int = 0) -> np.ndarray:
    """(rounds, n): round t's permutation of a pair's key, t = first … first + rounds − 1 (argsort
    of n uniform words, nonce 2t; a tie has probability < n²/2^65)."""
    masks = KeyedMasks()
    return np.stack([np.argsort(_words(masks, key, 2 * t, n), kind="stable")
                     for t in range(first, first + rounds)])


def key_bits(key: bytes, rounds: int, n: int, nonce: Callable[[int], int]) -> np.ndarray:
    """(rounds, n) bits of ``key``'s keystream, round t's (0-based) at ``nonce(t)``."""
    masks = KeyedMasks()
    return np.stack([(_words(masks, key, nonce(t), n) & 1).astype(np.uint8) for t in range(rounds)])


def _masks(key: bytes, rounds: int, n: int, first: int = 0) -> np.ndarray:
    """(rounds, n) bits r_t of K_AB (nonce 2t + 1), t = first … first + rounds − 1."""
    return key_bits(key, rounds, n, lambda t: 2 * (first + t) + 1)


def _apply(perm: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.take_along_axis(v, perm, axis=1)


def _check(owners: int, sample: int, rounds: int) -> None:
    if not 1 <= sample < owners:
        raise ValueError(f"sample: 1 to owners − 1 owners a round, got {sample} of {owners}")
    if rounds < 1:
        raise ValueError(f"rounds: at least 1, got {rounds}")


def b_message(k_ab: bytes, k_bc: bytes, owners: int, sample: int, rounds: int, first: int = 0) -> np.ndarray:
    """B's message to C: c = π_BC(π_AB(v)) ⊕ r, (rounds, owners) bits, for rounds first … (a
    pooled-rows draw runs the same shuffle a chunk of rounds at a time: parties.row_sample)."""
    _check(owners, sample, rounds)
    v = np.zeros((rounds, owners), dtype=np.uint8)
    v[:, :sample] = 1
    v2 = _apply(_permutations(k_bc, rounds, owners, first), _apply(_permutations(k_ab, rounds, owners, first), v))
    return v2 ^ _masks(k_ab, rounds, owners, first)


def a_share(k_ab: bytes, k_ca: bytes, owners: int, rounds: int, first: int = 0) -> np.ndarray:
    """A's XOR share of the sample: π_CA(r)."""
    return _apply(_permutations(k_ca, rounds, owners, first), _masks(k_ab, rounds, owners, first))


def c_share(k_ca: bytes, c: np.ndarray, first: int = 0) -> np.ndarray:
    """C's XOR share of the sample: π_CA(c)."""
    rounds, owners = c.shape
    return _apply(_permutations(k_ca, rounds, owners, first), c)


def _key_tensor(key: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(key), dtype=torch.uint8).clone()


def pair_keys(comm: object, rank: int) -> tuple[bytes, bytes]:
    """This party's two pair keys, (with the previous rank, with the next rank): rank r draws the
    key it shares with rank r + 1 (mod 3) and sends it there. The order (0 sends first, 1 and 2
    receive first) cannot deadlock even if a send waits for its receiver."""
    mine, got = new_key(), torch.zeros(KEY_BYTES, dtype=torch.uint8)
    nxt, prev = (rank + 1) % 3, (rank - 1) % 3
    if rank == 0:
        comm.send(_key_tensor(mine), nxt)  # type: ignore[attr-defined]
        got = comm.recv(got, prev)  # type: ignore[attr-defined]
    else:
        got = comm.recv(got, prev)  # type: ignore[attr-defined]
        comm.send(_key_tensor(mine), nxt)  # type: ignore[attr-defined]
    return bytes(got.numpy().tobytes()), mine


def uniform_sample_shares(comm: object, owners: int, sample: int, rounds: int) -> np.ndarray | None:
    """Run the shuffle among the three compute parties (module docstring): this party's XOR share
    of every round's sample, (rounds, owners) bits, at A and C; None at B."""
    _check(owners, sample, rounds)
    if comm.get_world_size() != OWNER_SAMPLE_PARTIES:  # type: ignore[attr-defined]
        raise ValueError("federated.sampling: uniform sampling of owners needs exactly 3 compute parties "
                         "(trust = 'replicated')")
    rank = comm.get_rank()  # type: ignore[attr-defined]
    k_prev, k_next = pair_keys(comm, rank)  # A: (K_CA, K_AB); B: (K_AB, K_BC); C: (K_BC, K_CA)
    if rank == 1:
        c = b_message(k_prev, k_next, owners, sample, rounds)
        comm.send(torch.from_numpy(np.packbits(c, axis=1)), 2)  # type: ignore[attr-defined]
        return None
    if rank == 2:
        packed = torch.zeros((rounds, (owners + 7) // 8), dtype=torch.uint8)
        packed = comm.recv(packed, 1)  # type: ignore[attr-defined]
        c = np.unpackbits(packed.numpy(), axis=1, count=owners)
        return c_share(k_next, c)
    return a_share(k_next, k_prev, owners, rounds)


def pack_owner_bits(shares: np.ndarray) -> tuple[bytes, ...]:
    """Per owner, its column of a (rounds, owners) share as bytes (round t = bit t, numpy's
    big-endian bit order): what its Enroll reply carries."""
    return tuple(np.packbits(shares[:, o]).tobytes() for o in range(shares.shape[1]))


def owner_bits(share_a: bytes, share_c: bytes, rounds: int) -> list[bool]:
    """An owner's sample, from its two shares: whether it is drawn in each round."""
    if len(share_a) != len(share_c) or len(share_a) != (rounds + 7) // 8:
        raise ValueError(f"sample_shares: {(rounds + 7) // 8} bytes from each of compute parties 0 and 2 expected, "
                         f"got {len(share_a)} and {len(share_c)}")
    a = np.unpackbits(np.frombuffer(share_a, dtype=np.uint8), count=rounds)
    c = np.unpackbits(np.frombuffer(share_c, dtype=np.uint8), count=rounds)
    return [bool(x) for x in a ^ c]
