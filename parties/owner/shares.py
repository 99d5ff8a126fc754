"""Data owners' contributions as additive shares for k compute parties (the thesis's
two-server model after Tian et al.).

A data owner never runs CrypTen. Each round it encodes its contribution ``v`` (float64, already
clipped by the protocol) on the job's public grid, ``enc(v) = round(v·2^g)`` in the int64 ring,
and splits it into k additive shares, one per compute party. The compute parties sum the shares
of the round's agreed owners into their input of :meth:`MpcAggregator.aggregate_shares`, which
adds the in-MPC noise and reveals only ``Σ_owners v + z``.

Seed-compressed shares: at the start of a job the owner sends compute party j (j ≠ e, e = the
owner's *explicit* party, ``owner_index mod k`` so the bytes spread evenly) a fresh 32-byte AES
key; party j's share of round t is then the AES-256-CTR keystream of that key at nonce t
(:class:`~mpc_erm.mpc.keystream.KeyedMasks`, each nonce its own 2^64 blocks), which party j
computes itself, and party e gets ``enc(v) − Σ_{j≠e} PRG(key_j, t)`` explicitly. Per round the
owner sends p words to one party and nothing to the others, instead of p words to each: they
derive theirs, and its explicit party alone says whether it was in the round
(:mod:`.intake`). Security (semi-honest compute parties that do
not all collude): a coalition missing party j lacks ``key_j`` and sees shares that are uniform in
the ring up to AES's pseudo-randomness; all k together learn ``v`` — the trust model the job
report states.

Range: an owner refuses to share a contribution outside ``|v| < 2^(63−g−margin)``; the margin
leaves room for the sum over owners and the noise (``owner_margin_bits``). No single share says
anything (each is uniform): the compute parties check every contribution against its public ℓ2
bound on the shares, together (:mod:`mpc_erm.mpc.validation`, :class:`OwnerShareSum`'s rows).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from mpc_erm.mpc.keystream import KEY_BYTES, KeyedMasks, new_key

__all__ = ["UNCHECKED_ENV", "OwnerRangeError", "OwnerShareSum", "OwnerSharer", "contributions_checked",
           "encode_on_grid", "explicit_party", "owner_margin_bits"]

RING_BITS = 64
#: Set to "1" in a compute party's environment, the members' contributions are NOT checked against
#: their bounds (mpc_erm.mpc.validation) — a test build's positive control, which the job's trust
#: model then names; never in production.
UNCHECKED_ENV = "MPC_ERM_TEST_UNCHECKED_CONTRIBUTIONS"


def contributions_checked() -> bool:
    """Whether this compute party checks the members' contributions (always, but in a test build
    that set :data:`UNCHECKED_ENV`)."""
    return os.environ.get(UNCHECKED_ENV) != "1"


class OwnerRangeError(ValueError):
    """An owner's contribution does not fit the ring at the job's grid: not shared, not sent."""


def owner_margin_bits(owners: int, extra_bits: int = 8) -> int:
    """Bits of headroom so that the sum over ``owners`` contributions plus the noise stays inside
    int64: ⌈log2(owners)⌉ plus ``extra_bits`` for the noise and rounding."""
    if owners < 1:
        raise ValueError(f"owners must be >= 1, got {owners}")
    return max(1, math.ceil(math.log2(owners))) + extra_bits


def encode_on_grid(v: torch.Tensor, grid_bits: int, margin_bits: int) -> torch.Tensor:
    """``round(v·2^g)`` as int64; :class:`OwnerRangeError` if a value is not finite or
    ``|v| ≥ 2^(63−g−margin)`` (the message names the bound, never a value)."""
    if not 0 <= grid_bits <= 52:
        raise ValueError(f"grid_bits must be in [0, 52], got {grid_bits}")
    x = v.detach().to("cpu", torch.float64).reshape(-1)
    limit = 2.0 ** (RING_BITS - 1 - grid_bits - margin_bits)
    if x.numel():
        lo, hi = torch.aminmax(x)
        if not (bool(hi < limit) and bool(lo > -limit)):  # NaN fails both
            bits = RING_BITS - 1 - grid_bits - margin_bits
            raise OwnerRangeError(f"a contribution is not finite or reaches |v| >= 2^{bits} (grid 2^-{grid_bits}, "
                                  f"{margin_bits} bits of headroom): not shared")
    return (x * float(2**grid_bits)).round_().to(torch.long)


def explicit_party(owner_index: int, compute_parties: int) -> int:
    """The compute party that receives this owner's explicit share (the others derive theirs)."""
    return owner_index % compute_parties


@dataclass
class OwnerSharer:
    """An owner's side: its keys for the compute parties that derive their shares, and the split."""

    owner_index: int
    compute_parties: int
    keys: dict[int, bytes]  # compute party → AES key (every party but the explicit one)

    @classmethod
    def new(cls, owner_index: int, compute_parties: int) -> OwnerSharer:
        """Fresh keys for a new job (send ``keys[j]`` to compute party j over mTLS, once)."""
        if compute_parties < 2:
            raise ValueError(f"an owner shares among >= 2 compute parties, got {compute_parties}")
        e = explicit_party(owner_index, compute_parties)
        return cls(owner_index, compute_parties, {j: new_key() for j in range(compute_parties) if j != e})

    def __post_init__(self) -> None:
        e = explicit_party(self.owner_index, self.compute_parties)
        if set(self.keys) != set(range(self.compute_parties)) - {e}:
            raise ValueError(f"owner {self.owner_index}: keys for compute parties {sorted(self.keys)}, expected every "
                             f"party but {e}")
        if any(len(k) != KEY_BYTES for k in self.keys.values()):
            raise ValueError(f"owner keys have {KEY_BYTES} bytes")
        self._masks = KeyedMasks()

    @property
    def explicit(self) -> int:
        return explicit_party(self.owner_index, self.compute_parties)

    def split(self, ring: torch.Tensor, round_: int) -> torch.Tensor:
        """The explicit party's share of round ``round_``: ``ring − Σ_{j≠e} PRG(key_j, round_)``
        (int64, wrapping). ``ring`` is :func:`encode_on_grid`'s output."""
        if ring.dtype != torch.long or ring.ndim != 1:
            raise ValueError(f"ring contribution: int64 vector expected, got {ring.dtype} of shape {tuple(ring.shape)}")
        out = ring.clone()
        for key in self.keys.values():
            out.sub_(self._masks.words(key, round_, out.numel()))
        return out


class OwnerShareSum:
    """A compute party's side: the keys its owners gave it, and the round's sum of their shares
    (derived from a key, or the explicit share received), over the agreed set of owners only."""

    def __init__(self, rank: int, compute_parties: int, keys: Mapping[int, bytes] | None = None) -> None:
        if not 0 <= rank < compute_parties:
            raise ValueError(f"rank {rank} is not one of {compute_parties} compute parties")
        self.rank = rank
        self.compute_parties = compute_parties
        self.keys: dict[int, bytes] = dict(keys or {})
        self.next_keys: dict[int, bytes] = {}  # replicated check: owner → key of the next party's share
        self._masks = KeyedMasks()

    @property
    def following(self) -> int:
        """The next compute party (replicated check: this party also derives its shares)."""
        return (self.rank + 1) % self.compute_parties

    def add_key(self, owner_index: int, key: bytes) -> None:
        """Record the key owner ``owner_index`` sent this party (once per job); refused when this
        party is that owner's explicit party or already holds a key from it."""
        self._record(self.keys, self.rank, owner_index, key, "its key")

    def add_next_key(self, owner_index: int, key: bytes) -> None:
        """Record the key of the next compute party's share of owner ``owner_index`` (replicated
        check: this party then holds two of the three shares); refused when that share is the
        owner's explicit one, or a second time."""
        self._record(self.next_keys, self.following, owner_index, key, "its next key")

    def _record(self, keys: dict[int, bytes], party: int, owner_index: int, key: bytes, what: str) -> None:
        """``keys[owner_index] = key``, the key of compute party ``party``'s share of that owner."""
        if explicit_party(owner_index, self.compute_parties) == party:
            raise ValueError(f"owner {owner_index} sends compute party {party} explicit shares, not a key")
        if owner_index in keys:
            raise ValueError(f"owner {owner_index} already gave compute party {self.rank} {what}")
        if len(key) != KEY_BYTES:
            raise ValueError(f"an owner key has {KEY_BYTES} bytes, got {len(key)}")
        keys[owner_index] = bytes(key)

    def total(self, owners: Iterable[int], round_: int, dim: int,
              explicit: Mapping[int, torch.Tensor]) -> torch.Tensor:
        """Σ over ``owners`` (the round's agreed set) of this party's share, int64 of shape (dim,).
        ``explicit`` holds the shares received this round from the owners whose explicit party
        this is; every owner in the set must have one here or a key. Summed one owner at a time
        (a round may count tens of thousands)."""
        out = torch.zeros(dim, dtype=torch.long)
        for o in owners:
            out.add_(self._share(o, self.rank, self.keys, round_, dim, explicit))
        return out

    def shares(self, owners: Sequence[int], round_: int, dim: int,
               explicit: Mapping[int, torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        """This party's share of each of ``owners``' contributions, int64 of shape (len(owners),
        dim), in that order (what :mod:`mpc_erm.mpc.validation` checks); written into ``out`` if
        given (a buffer reused round after round: a fresh one of this size costs more in page
        faults than the keystreams written into it)."""
        return self._rows(owners, self.rank, self.keys, round_, dim, explicit, out)

    def next_shares(self, owners: Sequence[int], round_: int, dim: int, forwarded: torch.Tensor,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """The next party's share of each of ``owners``' contributions, int64 (len(owners), dim):
        derived from the next keys, or taken in order from ``forwarded``, the explicit shares the
        next party sent for the owners whose explicit party it is; into ``out`` as :meth:`shares`."""
        theirs = [o for o in owners if explicit_party(o, self.compute_parties) == self.following]
        if len(theirs) != int(forwarded.shape[0]):
            raise ValueError(f"forwarded: {int(forwarded.shape[0])} explicit shares for {len(theirs)} owners")
        return self._rows(owners, self.following, self.next_keys, round_, dim, dict(zip(theirs, forwarded)), out)

    def _rows(self, owners: Sequence[int], party: int, keys: Mapping[int, bytes], round_: int, dim: int,
              explicit: Mapping[int, torch.Tensor], out: torch.Tensor | None) -> torch.Tensor:
        if out is None:
            out = torch.empty(len(owners), dim, dtype=torch.long)
        elif out.dtype != torch.long or tuple(out.shape) != (len(owners), dim):
            raise ValueError(f"out: int64 ({len(owners)}, {dim}) expected, got {out.dtype} {tuple(out.shape)}")
        for row, o in enumerate(owners):
            out[row] = self._share(o, party, keys, round_, dim, explicit)
        return out

    def _share(self, o: int, party: int, keys: Mapping[int, bytes], round_: int, dim: int,
               explicit: Mapping[int, torch.Tensor]) -> torch.Tensor:
        """Compute party ``party``'s share of owner ``o``'s round-``round_`` contribution: its
        explicit share (received) if ``party`` is its explicit party, else derived from ``keys``."""
        if explicit_party(o, self.compute_parties) == party:
            share = explicit.get(o)
            if share is None:
                raise KeyError(f"owner {o}: no share of round {round_} for compute party {party}")
            if share.dtype != torch.long or tuple(share.shape) != (dim,):
                raise ValueError(f"owner {o}: share of {share.dtype} shape {tuple(share.shape)}, expected int64 "
                                 f"({dim},)")
            return share
        key = keys.get(o)
        if key is None:
            raise KeyError(f"owner {o}: no key for compute party {party}'s share at compute party {self.rank}")
        return self._masks.words(key, round_, dim)
