"""Data owners' contributions in the malicious-secure mode (``job.security = "malicious"``):
replicated shares in F_p with a proof of the ℓ2 bound, which the compute parties check with
openings that a deviating compute party cannot falsify (:mod:`mpc_erm.mpc.verified_aggregator`).

The layout is the replicated intake's (:mod:`.shares`): owner o's *explicit* share is share
e = o mod 3, sent to compute party e once a round, which forwards it to party e − 1 (the share's
second holder); every other share j is drawn from the key the owner gave share j's two holders
(parties j and j − 1) at enrolment. What changes is what a share is: in place of an int64 ring
share of the encoded contribution, three F_p parts — of x = round(v·2^g), of the proof's auxiliary
bits, and of the proof itself (:func:`mpc_erm.mpc.norm_proof.prove_seeded`) — and a 32-byte salt,
so each holder can commit to its copy without the third party being able to test guesses.

A derived share of round t is the norm proof's seeded share (AES-256-CTR) of a per-round seed,
``SHA-256(domain | "seed" | key | t)``, its salt ``SHA-256(domain | "salt" | key | t)``; the
explicit share's salt is fresh each round. The rows of the proof are keyed by Fiat–Shamir over
the shares' commitments and a context naming the job, the round and the owner
(:func:`owner_context`), so a proof made for one round or owner does not pass for another.

What a deviating party can do here, and what it cannot:

- an owner may deal its two holders different copies of a derived share (different keys): their
  commitments differ, and the owner is left out of the round (neither holder can prove which of
  the two, the owner or the other holder, lied; either way the owner's contribution is not used);
- an owner whose contribution is outside its bound, or whose proof is false, is refused: left out
  of the sum, named to the compute parties and told when it reads the release;
- the explicit share reaches its second holder through its first, so two copies that differ mean
  one of those two compute parties deviated: the job stops, naming both;
- a compute party can always claim an owner's message never arrived (so can the network): the
  owner is then left out. The release's roster, signed by every compute party, says which
  owners it counted, so an owner whose acknowledged share was left out sees it and stops
  (:func:`.attest.uncounted`).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping

import numpy as np
from threadpoolctl import threadpool_limits

from mpc_erm.mpc import norm_proof as N

__all__ = ["SALT_WORDS", "derived_share", "explicit_payload", "owner_context", "payload_words",
           "prove_contribution", "round_salt", "round_seed"]

_DOMAIN = b"mpc-erm owner share v1"
SALT_WORDS = N.SALT_BYTES // 8
_BLAS_LIMITED = False


def round_seed(key: bytes, t: int) -> bytes:
    """The seed of round ``t``'s share drawn from an owner's enrolment key."""
    return hashlib.sha256(_DOMAIN + b"|seed|" + key + int(t).to_bytes(8, "big")).digest()


def round_salt(key: bytes, t: int) -> bytes:
    """The salt of round ``t``'s share drawn from an owner's enrolment key."""
    return hashlib.sha256(_DOMAIN + b"|salt|" + key + int(t).to_bytes(8, "big")).digest()


def owner_context(job_id: str, t: int, owner: int) -> bytes:
    """What an owner's proof is bound to: the job, the round and the owner's index."""
    return _DOMAIN + b"|" + job_id.encode() + f"|round {int(t)}|owner {int(owner)}".encode()


def payload_words(spec: N.NormSpec) -> int:
    """64-bit words of one share as its holders keep it (and as the explicit one travels): salt,
    x, aux, proof."""
    return SALT_WORDS + spec.submission_length


def _one_blas_thread() -> None:
    """The proof's products are small (a few thousand square at most); numpy's BLAS threads beside
    the owner's other threads, or other owners' processes on the same cores, made each proof
    several times slower (1,000 owners in 8 processes on 2 cores: a round's shares in 40 s
    instead of 4 s). An owner process proves with one BLAS thread from its first proof on; the
    owner's training runs on torch's own threads, which this does not touch."""
    global _BLAS_LIMITED
    if not _BLAS_LIMITED:
        threadpool_limits(limits=1, user_api="blas")
        _BLAS_LIMITED = True


def prove_contribution(units: np.ndarray, keys: Mapping[int, bytes], t: int, spec: N.NormSpec,
                       context: bytes) -> tuple[int, np.ndarray]:
    """An owner's round: its contribution in grid units (int64, ‖·‖₂ ≤ M), shared with the shares
    of ``keys`` (share index → enrolment key, every share but the explicit one) drawn from the
    keys, and proved. Returns (the explicit share's index, its payload words: salt, x, aux, proof)."""
    _one_blas_thread()
    e = ({0, 1, 2} - set(keys)).pop() if len(keys) == N.SHARES - 1 else None
    if e is None:
        raise ValueError(f"keys: {N.SHARES - 1} of the {N.SHARES} shares' keys expected, got {sorted(keys)}")
    salts = [round_salt(keys[j], t) if j != e else secrets.token_bytes(N.SALT_BYTES) for j in range(N.SHARES)]
    sub = N.prove_seeded(units, spec, context, {j: round_seed(k, t) for j, k in keys.items()}, salts)
    return e, explicit_payload(sub, e)


def explicit_payload(sub: N.Submission, share: int) -> np.ndarray:
    """Share ``share`` of a submission as its holders keep it: salt, x, aux, proof (uint64 words)."""
    return np.concatenate([np.frombuffer(sub.salts[share], dtype=np.uint64), sub.x[share], sub.aux[share],
                           sub.proof[share]]).astype(np.uint64)


def derived_share(key: bytes, t: int, spec: N.NormSpec) -> np.ndarray:
    """A holder's copy of a derived share of round ``t`` (as :func:`explicit_payload` lays it out)."""
    seed = round_seed(key, t)
    return np.concatenate([np.frombuffer(round_salt(key, t), dtype=np.uint64), N.seeded_share(seed, 0, spec.dim),
                           N.seeded_share(seed, 1, spec.aux_length), N.seeded_share(seed, 2, spec.proof_length)])
