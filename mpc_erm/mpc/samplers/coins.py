"""Biased coins [U < c] inside the MPC, bit-sliced: U jointly random k-bit uniforms, c public.

For coin j, U_j < c_j with U_j a jointly random k-bit uniform, so P(coin = 1) = c_j/2^k exactly.
64 samples share a word (bit plane i of 64 different U's). Two circuits (:data:`COMPARISON`): a
chain LSB → MSB with k − 1 ANDs (:func:`less_than_public_chain`, default), or a ⌈log2 k⌉-round
tree MSB first with ≈ 2k ANDs (:func:`less_than_public_tree`): leaf lt = ¬u ∧ c,
eq = ¬(u ⊕ c) (local: c is public); merge lt = lt_hi ⊕ (eq_hi ∧ lt_lo), eq = eq_hi ∧ eq_lo
(⊕ suffices: lt_hi and eq_hi exclude each other). Every AND is a binary Beaver AND on whole
64-lane words (:func:`.bits.and_many`). The chain draws each bit plane of the U's when it needs
it (planes are independent, so U is still uniform), which keeps k − 1 planes out of memory.

Where the chain's planes come from (:data:`COIN_PLANES`). "local": XOR of the parties' local
words (:func:`.bits.local_words`). "triple" (default): the LSB plane likewise, every other plane
U_i = a ⊕ s with a the first component of the Beaver triple of the round that consumes U_i and s
public words from CrypTen's ``global`` generator (seeded by the computing parties; the dealer does
not take part). The AND's opening ε = (U_i ⊕ ¬c_i) ⊕ a = s ⊕ ¬c_i is then known without a
message, so a round opens only δ: half the bytes of the chain, the cost that dominates the
samplers. The law is the same (a is uniform, independent of the opened δ's and used nowhere
else), and so is who can know U_i: not a party (a is XOR-shared), not the provider alone (it
lacks s), but the provider together with any one party — exactly as with local planes, where
that coalition gets U_i = ε ⊕ a ⊕ ¬c_i from the opened ε. (A malicious provider could choose a;
it can already flip any AND's output through c.) Under replicated sharing the planes come from
the provider's pair keystreams instead (:func:`_chain_replicated_planes`).

:func:`random_coins` is the entry point of :mod:`.discrete_laplace` and :mod:`.discrete_gaussian`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..crypten_compat import import_crypten, plain
from .bits import and_many, and_words, local_words, open_words, party_rank, public_words, public_xor

crypten = import_crypten()

__all__ = ["COIN_PLANES", "COMPARISON", "less_than_public_chain", "less_than_public_tree", "random_coins",
           "threshold_masks"]

COMPARISON = "chain"  # "chain": k − 1 ANDs, k − 1 rounds; "tree": ≈ 2k ANDs, ⌈log2 k⌉ rounds
# Where the chain's bit planes of U come from (module docstring): "local": XOR of the parties'
# local words (each AND opens ε and δ); "triple": the round's triple's a ⊕ public words (opens δ
# only; the same law, the same who-can-know-what).
COIN_PLANES = "triple"


def threshold_masks(thresholds: tuple[int, ...], k: int, device: torch.device) -> torch.Tensor:
    """(k, J, 1) int64: plane i (MSB first) is all-ones where bit k−1−i of c_j is set."""
    planes = [[-1 if (c >> (k - 1 - i)) & 1 else 0 for c in thresholds] for i in range(k)]
    return torch.tensor(planes, dtype=torch.long, device=device).view(k, len(thresholds), 1)


def less_than_public_chain(u: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """[U < c] with k − 1 ANDs in k − 1 rounds (half the ANDs of the tree; the default, since
    batches are large and a round costs little next to the triples).

    LSB first, r = [U mod 2^i < c mod 2^i]: r_0 = ¬u_0 ∧ c_0 (local);
    r_i = c_i ? ¬u_i ∨ r : ¬u_i ∧ r, which is (α ∧ β) ⊕ c_i with α = u_i ⊕ ¬c_i, β = r ⊕ c_i.
    """
    k = u.size(0)
    return _chain(lambda i: u[i], masks, k)


def _chain(plane: Any, masks: torch.Tensor, k: int) -> torch.Tensor:
    """The chain of :func:`less_than_public_chain` on bit planes ``plane(i)`` (i = 0 is the MSB),
    asked for LSB first; rank 0 applies the public constants (in place on fresh tensors)."""
    rank0 = party_rank() == 0
    u = plane(k - 1)
    r = (~u if rank0 else u) & masks[k - 1]
    for i in range(k - 2, -1, -1):
        u = plane(i)
        if rank0:
            alpha = u ^ ~masks[i]
            r ^= masks[i]
        else:
            alpha = u
        r = and_words(alpha, r)
        if rank0:
            r ^= masks[i]
    return r


def _chain_triple_planes(masks: torch.Tensor, words: int, device: torch.device) -> torch.Tensor:
    """The chain of :func:`less_than_public_chain` where plane i < k − 1 of U is a ⊕ s: a the
    first component of the round's Beaver triple (uniform; its XOR shares are held by the
    parties, its value known to the provider only) and s public words (:func:`.bits.public_words`,
    known to the parties only). Then α = U_i ⊕ ¬c_i has ε = α ⊕ a = s ⊕ ¬c_i: public without any
    message, and each round opens δ = β ⊕ b only (half the bytes, no local words drawn).

    The law is unchanged: a is uniform and used nowhere else, so U_i = a ⊕ s is uniform and
    independent of everything opened (the δ's, masked by the b's). The knowledge is unchanged
    too: U_i is known to a coalition holding a and s (the provider with a party) and to no one
    alone — as with local planes, whose opened ε = U_i ⊕ ¬c_i ⊕ a gives U_i to the same
    coalition. The LSB plane needs no AND and stays a local-words plane.
    """
    k, j = masks.size(0), masks.size(1)
    rank0 = party_rank() == 0
    provider = crypten.mpc.get_default_provider()
    u = local_words((j, words), device)
    r = (~u if rank0 else u) & masks[k - 1]
    size = torch.Size((j, words))
    for i in range(k - 2, -1, -1):
        a, b, c = (plain(t.share) for t in provider.generate_binary_triple(size, size, device=device))
        eps = public_words((j, words), device)
        eps ^= ~masks[i]
        if rank0:
            r ^= masks[i]  # β = r ⊕ c_i
        b ^= r
        delta = open_words(b)
        z = torch.bitwise_and(eps, r, out=eps)  # ε ∧ β_p
        z ^= c
        z ^= torch.bitwise_and(a, delta, out=a)
        if rank0:
            z ^= masks[i]
        r = z
    return r


def _chain_replicated_planes(masks: torch.Tensor, words: int, device: torch.device, provider: Any) -> torch.Tensor:
    """The chain of :func:`less_than_public_chain` under replicated sharing: each round's plane
    U_i comes replicated from the pair keystreams inside ``provider.and_random``, which
    returns (U_i ⊕ ¬c_i) ∧ β with only β sent, to one party (rss_provider, native ANDs): half the
    bytes of :func:`_chain_triple_planes`, and no triple. Same law: every U_i is exactly uniform,
    independent of the other planes and of everything sent (β under the zero sharing); no party
    holds all three components of any U_i (honest majority, the RSS trust model). The LSB plane
    needs no AND and stays a local-words plane."""
    k, j = masks.size(0), masks.size(1)
    rank0 = party_rank() == 0
    u = local_words((j, words), device)
    r = (~u if rank0 else u) & masks[k - 1]
    for i in range(k - 2, -1, -1):
        if rank0:
            r ^= masks[i]  # β = r ⊕ c_i
        r = provider.and_random(r, ~masks[i])  # α = U_i ⊕ ¬c_i
        if rank0:
            r ^= masks[i]
    return r


def random_coins(masks: torch.Tensor, words: int, device: torch.device) -> torch.Tensor:
    """XOR shares (J, words) of bit-sliced coins [U < c_j], U fresh jointly random k-bit uniforms
    (k = masks.size(0)), with the configured circuit; the chain draws each plane when it needs it."""
    k, j = masks.size(0), masks.size(1)
    if COMPARISON == "tree":
        return less_than_public_tree(local_words((k, j, words), device), masks)
    provider = crypten.mpc.get_default_provider()
    if hasattr(provider, "and_random"):  # replicated sharing: planes made without a message
        return _chain_replicated_planes(masks, words, device, provider)
    if COIN_PLANES == "triple":
        return _chain_triple_planes(masks, words, device)
    return _chain(lambda i: local_words((j, words), device), masks, k)


def less_than_public_tree(u: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """XOR shares of the 64-lane words [U < c] from bit planes u (k, J, W) of U (MSB first):
    ⌈log2 k⌉ rounds, ≈ 2k ANDs (for high-latency links)."""
    lt = public_xor(u, -1) & masks  # ¬u ∧ c: AND with a public value is local on XOR shares
    eq = public_xor(u, ~masks)  # ¬(u ⊕ c) = u ⊕ ¬c
    while lt.size(0) > 1:
        n = lt.size(0)
        h = n // 2
        lt_hi, lt_lo = lt[0 : 2 * h : 2], lt[1 : 2 * h : 2]
        eq_hi, eq_lo = eq[0 : 2 * h : 2], eq[1 : 2 * h : 2]
        if n == 2:  # last merge: eq no longer needed
            new_lt = lt_hi ^ and_words(eq_hi, lt_lo)
            new_eq = eq_hi
        else:
            p_lt, p_eq = and_many([(eq_hi, lt_lo), (eq_hi, eq_lo)])
            new_lt, new_eq = lt_hi ^ p_lt, p_eq
        if n % 2:
            new_lt = torch.cat([new_lt, lt[-1:]])
            new_eq = torch.cat([new_eq, eq[-1:]])
        lt, eq = new_lt, new_eq
    return lt[0]
