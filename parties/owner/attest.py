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
release the others did not sign. What a party says about *this* owner alone (whether its
contribution was refused) is not signed: it changes no release.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = ["KEY_BYTES", "SIGNATURE_BYTES", "ReleaseSigner", "UnsignedRelease", "check_release", "statement",
           "unsigned"]

KEY_BYTES = 32
SIGNATURE_BYTES = 64
_DOMAIN = b"mpc-erm owner release v1"


class UnsignedRelease(RuntimeError):
    """A release that not every compute party signed: a compute party deviated, or the release was
    altered on its way; the owner does not use it. Names the parties whose signature is missing."""


def statement(job_id: str, round_: int, state: torch.Tensor, owners_counted: int) -> bytes:
    """What each compute party signs for round ``round_``: SHA-256 over the job, the round, the
    owners counted, the shape and the state's float64 little-endian bytes."""
    s = state.detach().to("cpu", torch.float64).contiguous()
    h = hashlib.sha256(_DOMAIN)
    for part in (job_id.encode(), str(int(round_)).encode(), str(int(owners_counted)).encode(),
                 repr(tuple(int(n) for n in s.shape)).encode()):
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
                  owners_counted: int, signatures: Sequence[bytes], where: str) -> None:
    """Raise :class:`UnsignedRelease` unless every compute party (``keys`` and ``names`` in rank
    order) signed round ``round_``'s release as an owner read it; ``where`` says where it was read
    ("read from bob", "kept at bob"), for the message."""
    bad = unsigned(keys, statement(job_id, round_, state, owners_counted), signatures)
    if bad:
        raise UnsignedRelease(f"job {job_id}: round {round_}'s release {where} lacks a valid signature of "
                              f"{', '.join(names[j] for j in bad)}: a compute party deviated or the release was "
                              "altered; this owner does not use it")
