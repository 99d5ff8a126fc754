"""The three compute parties of the malicious-secure mode end each release unanimously: both
honest parties release it, or both stop.

Why: the parties agree on a release by exchanging digests (:func:`~.agreement.agree_on`). A party
that deviates in that very last message (a wrong digest to one party only) used to make one honest
party stop while the other released the correct value: security with *selective* abort. Three
parties with one corrupt cannot reach agreement over authenticated channels alone (n ≤ 3t); with
signatures they can, in t + 1 = 2 rounds (Dolev–Strong 1983), which is what this module runs.

At the first call each party makes a fresh Ed25519 key (never written down), and the public keys
are all-gathered and agreed by digest: a party that sent two parties different keys stops both
before any release. Then, for each value, at party i with digest d_i:

1. **Verdicts.** i signs (job, what, i, d_i) and sends it to both others.
2. **Relays.** For each verdict it accepted in step 1 (a valid signature of its sender), i adds its
   own signature over it and sends it to the party that is neither the sender nor i.

Party i accepts a verdict of sender k if it arrived directly in step 1 with k's signature, or in
step 2 signed by k and by the relaying party (two distinct signers, neither i). Each step waits
until a common deadline (one peer timeout from the start, then two), and a message that does not
come, or comes garbled, is simply not accepted: nothing a deviating party sends or withholds can
stop an honest party's verdict from reaching the other. So both honest parties accept the same
verdicts of every sender (Dolev–Strong's consistency for t = 1), and each releases iff every
party's accepted verdicts are exactly its own digest. A party that equivocated (two signed
digests), stayed silent, or holds another value stops both honest parties, named.

Cost: two 96- and 162-byte messages per peer and six signatures checked, against a release's
hundreds of milliseconds; a party that withholds its verdict makes the others wait one deadline.
"""

from __future__ import annotations

import time
from concurrent.futures import Future

import torch
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .agreement import IntegrityError, agree_on, hash_parts, member_name, value_digest
from .communicator import TENSOR
from .transport.endpoint import Endpoint
from .transport.errors import TransportError

__all__ = ["UnanimityFailed", "UnanimousRelease"]

_DOMAIN = b"mpc-erm unanimous release v1"
_PARTIES = 3
_KEY, _SIG, _DIGEST = 32, 64, 32
_VERDICT = _DIGEST + _SIG  # step 1: digest, sender's signature
_RELAY = 2 + _DIGEST + 2 * _SIG  # step 2: a present flag, the sender's rank, digest, its and the relayer's signatures


class UnanimityFailed(IntegrityError):
    """The parties' signed verdicts on a value do not all name the same digest: both honest
    parties stop, neither releases."""


def _statement(*parts: bytes | int | str) -> bytes:
    """What a party signs: the parts (ranks as 8 bytes, text as UTF-8) hashed in this module's domain."""
    def raw(p: bytes | int | str) -> bytes:
        return p.to_bytes(8, "little") if isinstance(p, int) else p.encode() if isinstance(p, str) else p

    return hash_parts(_DOMAIN, [raw(p) for p in parts])


def _valid(key: bytes, signature: bytes, statement: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(key).verify(signature, statement)
        return True
    except (InvalidSignature, ValueError):
        return False


class UnanimousRelease:
    """One party's side of the unanimous end of each release (module docstring), for a job's three
    compute parties. ``job``: the job's identifier, bound into every signature."""

    def __init__(self, job: bytes) -> None:
        self.job = job
        self._key = Ed25519PrivateKey.generate()
        self._public = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self._keys: list[bytes] | None = None

    # ------------------------------------------------------------------ set-up
    def setup(self, comm: object) -> list[bytes]:
        """All-gather the public keys and agree on the list (a party that sent two parties
        different keys stops both here, before any release)."""
        if self._keys is None:
            got = comm.all_gather(torch.frombuffer(bytearray(self._public), dtype=torch.uint8))  # type: ignore[attr-defined]
            keys = [bytes(t.numpy().tobytes()) for t in got]
            if any(len(k) != _KEY for k in keys):
                bad = [member_name(comm, r) for r, k in enumerate(keys) if len(k) != _KEY]
                raise UnanimityFailed(f"the release keys: {', '.join(bad)} sent no valid key; nothing is released")
            agree_on(comm, "the release keys", torch.frombuffer(bytearray(b"".join(keys)), dtype=torch.uint8))
            self._keys = keys
        return self._keys

    # ------------------------------------------------------------------ messages
    def _verdict(self, what: str, sender: int, digest: bytes) -> bytes:
        return _statement(self.job, what, b"verdict", sender, digest)

    def _relay_statement(self, what: str, relayer: int, sender: int, digest: bytes, signature: bytes) -> bytes:
        return _statement(self.job, what, b"relay", relayer, sender, digest, signature)

    def verdict_for(self, dst: int, what: str, me: int, digest: bytes) -> bytes:
        """Step 1's message to ``dst``: the digest and this party's signature (the same for both)."""
        return digest + self._key.sign(self._verdict(what, me, digest))

    @staticmethod
    def _post(ep: Endpoint, dst: int, op: str, payload: bytes, deadline: float) -> Future[None] | None:
        try:
            return ep.post(dst, op, torch.frombuffer(bytearray(payload), dtype=torch.uint8), kind=TENSOR,
                           deadline=deadline)
        except TransportError:
            return None  # a peer that left: the other honest party still hears everything it must

    @staticmethod
    def _take(ep: Endpoint, src: int, op: str, deadline: float, size: int) -> bytes | None:
        """The next step message from ``src`` by ``deadline``; None when it does not come or is garbled."""
        try:
            msg = ep.collect(ep.expect(src, op, TENSOR), deadline)
            data = bytes(ep.tensor_of(msg).numpy().tobytes())
        except TransportError:
            return None
        return data if len(data) == size else None

    # ------------------------------------------------------------------ the decision
    def decide(self, comm: object, what: str, value: torch.Tensor) -> None:
        """Return at every honest party, or raise :class:`UnanimityFailed` at every honest party
        (``what`` names the release; every party calls this at the same point of its program)."""
        keys = self.setup(comm)
        me: int = comm.get_rank()  # type: ignore[attr-defined]
        ep: Endpoint = comm.endpoint  # type: ignore[attr-defined]
        if comm.get_world_size() != _PARTIES:  # type: ignore[attr-defined]
            raise ValueError("a unanimous release runs among exactly 3 compute parties")
        mine = value_digest(comm, what, value).numpy().tobytes()  # the digest agree_on compares
        step = float(ep.options.deadline_s)
        first, second = ep.deadline(step), ep.deadline(2.0 * step)
        others = [k for k in range(_PARTIES) if k != me]
        op1, op2 = f"unanimous verdict: {what}", f"unanimous relay: {what}"

        sends = [self._post(ep, k, op1, self.verdict_for(k, what, me, mine), first) for k in others]
        accepted: dict[int, dict[bytes, bytes]] = {k: {} for k in others}  # sender → digest → its signature
        for k in others:
            got = self._take(ep, k, op1, first, _VERDICT)
            if got is not None:
                digest, sig = got[:_DIGEST], got[_DIGEST:]
                if _valid(keys[k], sig, self._verdict(what, k, digest)):
                    accepted[k][digest] = sig
        direct = {k: dict(v) for k, v in accepted.items()}
        for dst in others:  # relay the third party's verdict (step 1 accepts at most one per sender)
            third = next(k for k in others if k != dst)
            relay = bytes(_RELAY)
            for d, s in direct[third].items():
                relay = bytes([1, third]) + d + s + self._key.sign(self._relay_statement(what, me, third, d, s))
            sends.append(self._post(ep, dst, op2, relay, second))
        for relayer in others:
            item = self._take(ep, relayer, op2, second, _RELAY)
            if item is None or item[0] != 1:
                continue
            sender, digest = item[1], item[2: 2 + _DIGEST]
            sig, relayed = item[2 + _DIGEST: 2 + _DIGEST + _SIG], item[2 + _DIGEST + _SIG:]
            if sender in (relayer, me) or sender >= _PARTIES:
                continue
            if _valid(keys[sender], sig, self._verdict(what, sender, digest)) and _valid(
                    keys[relayer], relayed, self._relay_statement(what, relayer, sender, digest, sig)):
                accepted[sender][digest] = sig
        for fut in sends:  # let the relays leave before the verdict ends this party's job
            if fut is not None:
                try:
                    fut.result(timeout=max(0.0, second - time.monotonic()) + 5.0)
                except (TransportError, TimeoutError):
                    pass
        self._judge(comm, what, me, mine, accepted)

    @staticmethod
    def _judge(comm: object, what: str, me: int, mine: bytes, accepted: dict[int, dict[bytes, bytes]]) -> None:
        silent = [k for k, v in accepted.items() if not v]
        split = [k for k, v in accepted.items() if len(v) > 1]
        other = [k for k, v in accepted.items() if len(v) == 1 and mine not in v]
        if not (silent or split or other):
            return
        def name(ranks: list[int]) -> str:
            return ", ".join(member_name(comm, k) for k in ranks)

        why = "; ".join(part for part in (
            f"{name(split)} signed two different verdicts" if split else "",
            f"no verdict of {name(silent)} reached this party, directly or relayed" if silent else "",
            f"{name(other)} signed another value than this party holds" if other else "") if part)
        raise UnanimityFailed(f"{what}: the compute parties' signed verdicts do not all name the value this party "
                              f"holds ({why}; this party is {member_name(comm, me)}): both honest parties stop; "
                              "nothing is released")

