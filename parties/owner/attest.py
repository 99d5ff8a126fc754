"""Releases a data owner can check: every compute party signs each round's release, and an owner
uses a release only with every compute party's signature over the bytes it read.

Why: an owner reads each release from one compute party, its explicit one. The compute parties
agree on the revealed value among themselves (:mod:`mpc_erm.mpc.agreement`), but a party that
deviated could still serve its owners another model than the one the parties agreed on: before
this, the owners that read from a party whose reveal went wrong received a model 10⁵ run-to-run
spreads off while the others received the right one, and nobody noticed. Reading the whole release
from every compute party would double an owner's bytes and a compute party's connections; a
signature is 64 bytes.

Each compute party makes a fresh Ed25519 key per job (:class:`ReleaseSigner`) and states its
public half at enrolment, over its own mutually authenticated channel (so the key is that party's,
whoever serves the release later). After the parties agreed on a round's value, each signs
:func:`statement` (the job, the round, the owners counted, the shape and the float64 bytes), the
signatures are all-gathered and checked, and they travel with the release: in the intake's
``RoundReply`` and in the daemon's kept copy. An owner checks every signature
(:func:`unsigned`); a release one of them does not cover raises :class:`UnsignedRelease` and is
not used. A deviating party can still stop a job (refuse to sign); it cannot hand owners a
release the others did not sign.

The statement also covers the release's :class:`Roster`: which owners it counted and which it
refused, as bitmaps by owner index. Why: a compute party can leave an owner out of a round by
claiming its share never arrived (as the network could), which changes the release; before the
roster was signed the release said only how many owners it counted, so an owner left out after
its explicit party had acknowledged its share could not tell. Now it checks its own bit
(:func:`uncounted`): a share acknowledged but neither counted nor refused, or counted though never
sent, raises :class:`UncountedContribution`. A bitmap is ⌈m/8⌉ bytes (125 at 1,000 owners), against
a release of 8·d.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = ["KEY_BYTES", "SIGNATURE_BYTES", "ReleaseSigner", "Roster", "UncountedContribution", "UnsignedRelease",
           "check_release", "statement", "uncounted", "unsigned"]

KEY_BYTES = 32
SIGNATURE_BYTES = 64
_DOMAIN = b"mpc-erm owner release v2"  # v2: the roster is signed


class UnsignedRelease(RuntimeError):
    """A release that not every compute party signed: a compute party deviated, or the release was
    altered on its way; the owner does not use it. Names the parties whose signature is missing."""


class UncountedContribution(RuntimeError):
    """A round whose signed roster contradicts what this owner did: its share was acknowledged by
    its explicit compute party but the release neither counted nor refused it, or the release
    counted a share this owner never sent. Either a compute party deviated, or (the first case)
    this owner's certificate was revoked at another compute party while the round was open."""


def _bitmap(indices: Iterable[int], owners: int) -> bytes:
    out = bytearray(-(-owners // 8))
    for i in indices:
        if not 0 <= i < owners:
            raise ValueError(f"owner index {i} outside the job's {owners} owners")
        out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def _bit(bitmap: bytes, i: int) -> bool:
    return 0 <= i < 8 * len(bitmap) and bool(bitmap[i // 8] >> (i % 8) & 1)


@dataclass(frozen=True)
class Roster:
    """Which owners a round's release counted and which it refused (their contribution failed the
    bound check or its proof, or their two holders of a derived share disagreed), as bitmaps by
    owner index: bit i of byte i // 8. Signed with the release (:func:`statement`)."""

    counted: bytes
    refused: bytes = b""

    @classmethod
    def of(cls, owners: int, counted: Iterable[int], refused: Iterable[int] = ()) -> Roster:
        return cls(_bitmap(counted, owners), _bitmap(refused, owners))

    @property
    def count(self) -> int:
        return sum(bin(b).count("1") for b in self.counted)

    @property
    def refused_count(self) -> int:
        return sum(bin(b).count("1") for b in self.refused)

    def counts(self, owner: int) -> bool:
        return _bit(self.counted, owner)

    def refuses(self, owner: int) -> bool:
        return _bit(self.refused, owner)


def statement(job_id: str, round_: int, state: torch.Tensor, roster: Roster) -> bytes:
    """What each compute party signs for round ``round_``: SHA-256 over the job, the round, the
    owners counted (their number and the roster's two bitmaps), the shape and the state's float64
    little-endian bytes."""
    s = state.detach().to("cpu", torch.float64).contiguous()
    h = hashlib.sha256(_DOMAIN)
    for part in (job_id.encode(), str(int(round_)).encode(), str(roster.count).encode(), roster.counted,
                 roster.refused, repr(tuple(int(n) for n in s.shape)).encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    h.update(s.numpy().astype("<f8", copy=False).tobytes())
    return h.digest()


class ReleaseSigner:
    """A compute party's signing key for one job's releases (fresh, never written down)."""

    def __init__(self) -> None:
        self._key = Ed25519PrivateKey.generate()
        self.public = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def sign(self, stmt: bytes) -> bytes:
        return self._key.sign(stmt)


def unsigned(keys: Sequence[bytes], stmt: bytes, signatures: Sequence[bytes]) -> list[int]:
    """The compute parties (indices into ``keys``) whose signature over ``stmt`` is missing or
    does not verify; empty when every one signed it."""
    bad = []
    for j, key in enumerate(keys):
        sig = signatures[j] if j < len(signatures) else b""
        try:
            if len(key) != KEY_BYTES or len(sig) != SIGNATURE_BYTES:
                raise InvalidSignature
            Ed25519PublicKey.from_public_bytes(bytes(key)).verify(bytes(sig), stmt)
        except (InvalidSignature, ValueError):
            bad.append(j)
    return bad


def check_release(keys: Sequence[bytes], names: Sequence[str], job_id: str, round_: int, state: torch.Tensor,
                  owners_counted: int, roster: Roster, signatures: Sequence[bytes], where: str) -> None:
    """Raise :class:`UnsignedRelease` unless every compute party (``keys`` and ``names`` in rank
    order) signed round ``round_``'s release and roster as an owner read them, and the count it
    was served with is the roster's; ``where`` says where it was read ("read from bob", "kept at
    bob"), for the message."""
    bad = unsigned(keys, statement(job_id, round_, state, roster), signatures)
    if bad:
        raise UnsignedRelease(f"job {job_id}: round {round_}'s release {where} lacks a valid signature of "
                              f"{', '.join(names[j] for j in bad)}: a compute party deviated or the release was "
                              "altered; this owner does not use it")
    if owners_counted != roster.count:
        raise UnsignedRelease(f"job {job_id}: round {round_}'s release {where} states {owners_counted} owners "
                              f"counted, its signed roster {roster.count}: this owner does not use it")


def uncounted(roster: Roster, owner: int, sent: bool, explicit: str, round_: int) -> None:
    """Raise :class:`UncountedContribution` when round ``round_``'s signed ``roster`` contradicts
    this owner: ``sent`` (its share acknowledged by ``explicit``, its explicit compute party) but
    neither counted nor refused, or counted though not sent."""
    if sent and not roster.counts(owner) and not roster.refuses(owner):
        raise UncountedContribution(
            f"round {round_}: {explicit} acknowledged this owner's share, but the release every compute party "
            "signed did not count it (nor refuse it): a compute party deviated by leaving it out, or this owner's "
            "certificate was revoked at another compute party during the round; this owner stops")
    if not sent and roster.counts(owner):
        raise UncountedContribution(
            f"round {round_}: the release every compute party signed counts a share of this owner, which sent "
            "none in that round: a compute party deviated; this owner stops")
