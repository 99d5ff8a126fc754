"""The compute parties agree on what they reveal and on how they started, and no protocol loops on.

Why: a reveal is an all-to-all exchange of shares. One wrong share sent to one party (a deviating
party, a corrupted message) gives the parties *different* "public" values. Before this module,
every party then carried on: one party's model was 10⁴–10¹¹ run-to-run spreads from the others',
some owners read one model and some another, and every party reported success. Likewise a set-up
message altered at the start (a pairwise seed, a pairwise key) left the parties with shares that
no longer add up, and the noise sampler, whose acceptance test then sees uniform ring values,
rejected every candidate for ever, in lock step, its messages arriving on time.

Three checks, in every trust mode, the semi-honest default included:

* :func:`agree_on` — a value each party believes public (a release, the opened verdicts of the
  input check, the set of members a round counts) is hashed (SHA-256 with the job's context and
  what the value is) together with the digest of every value opened before it (the
  communicator's log of all_reduce results: the samplers' coins and acceptance bits, the
  comparisons' and Beaver products' openings), and the digests are all-gathered before the value
  is used; any difference raises :class:`RevealMismatch` at every party whose view differs from
  another's, naming who holds what. One round of 32-byte messages; hashing the openings costs
  ≈ 1 ms per MB opened.
* :func:`check_setup` — once per session, after the randomness is set up: the digests of a few
  words from CrypTen's joint generator, its pairwise generators and the replicated provider's
  pairwise AES streams are all-gathered; a pair that does not draw the same words raises
  :class:`SetupMismatch` naming the two parties. The words drawn are thrown away (all parties
  draw them, so the streams stay in step).
* :class:`SamplerStall` — raised by a rejection sampler that has drawn, since its last accepted
  candidate, more candidates than an honest run rejects in a row with probability 2^-64.

What this does not do: a party that deviates *consistently* — the same wrong share to everyone,
or a wrong share of an intermediate value — makes every party hold the same wrong value, and
digests cannot see that. Catching those is the malicious-secure mode's subject. Here the honest
parties never act on *different* values, and a corrupted set-up or a stalled sampler ends the job
with a reason instead of a hang.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch

from .crypten_compat import import_crypten

crypten = import_crypten()

__all__ = ["IntegrityError", "RevealMismatch", "SamplerStall", "SetupMismatch", "agree_on", "check_setup",
           "hash_parts", "member_name", "stall_limit", "value_digest"]

_DOMAIN = b"mpc-erm agreement v1"
_SETUP_WORDS = 4
#: An honest rejection sampler rejects this many candidates in a row with probability ≤ 2^-STALL_BITS.
STALL_BITS = 64


class IntegrityError(RuntimeError):
    """The compute parties' views of the protocol differ (a deviating party or a corrupted
    message): the job stops before anything that depends on the differing value is revealed or
    used. The message names only members, what disagreed, and digest prefixes (public)."""


class RevealMismatch(IntegrityError):
    """Parties hold different values of something they revealed (:func:`agree_on`)."""


class SetupMismatch(IntegrityError):
    """Two parties that should share a random stream do not (:func:`check_setup`)."""


class SamplerStall(IntegrityError):
    """A rejection sampler rejected far more candidates in a row than an honest run can."""


def member_name(comm: object, rank: int) -> str:
    """A member's name for messages (its rank where the communicator has no table)."""
    table = getattr(getattr(comm, "endpoint", None), "table", None)
    try:
        return str(table.member(rank).name) if table is not None else f"rank {rank}"
    except (IndexError, KeyError, ValueError):
        return f"rank {rank}"


def hash_parts(domain: bytes, parts: Sequence[bytes]) -> bytes:
    """SHA-256 of ``domain`` and the length-prefixed parts (no two part lists hash alike)."""
    h = hashlib.sha256(domain)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.digest()


def _digest(parts: list[bytes]) -> torch.Tensor:
    """:func:`hash_parts` in this module's domain, as 4 int64 words."""
    return torch.frombuffer(bytearray(hash_parts(_DOMAIN, parts)), dtype=torch.long).clone()


def value_digest(comm: object, what: str, value: torch.Tensor) -> torch.Tensor:
    """What the parties compare for a value they believe public: its description, dtype, shape and
    bytes, and the communicator's digest of every value opened before it (its log of openings)."""
    v = value.detach().to("cpu").contiguous()
    opened = getattr(comm, "openings_digest", None)
    return _digest([what.encode(), str(v.dtype).encode(), repr(tuple(v.shape)).encode(), v.numpy().tobytes(),
                    b"" if opened is None else opened()])


def agree_on(comm: object, what: str, value: torch.Tensor) -> None:
    """Raise :class:`RevealMismatch` unless every party holds the same ``value`` (dtype, shape
    and bytes) for ``what`` (a description that names the round: it is hashed with the value, so
    parties at different points of their programs disagree too). Every party calls it at the
    same point of its program, before it uses or publishes ``value``."""
    mine = value_digest(comm, what, value)
    every = comm.all_gather(mine)  # type: ignore[attr-defined]
    me = comm.get_rank()  # type: ignore[attr-defined]
    groups: dict[bytes, list[str]] = {}  # by the whole digest; a prefix only names it in the message
    for r, d in enumerate(every):
        groups.setdefault(d.numpy().tobytes(), []).append(member_name(comm, r))
    if len(groups) > 1:
        views = "; ".join(f"{', '.join(names)} hold{'s' if len(names) == 1 else ''} {h.hex()[:12]}…"
                          for h, names in groups.items())
        raise RevealMismatch(f"{what}: the compute parties do not hold the same value, or did not see the same "
                             f"values opened before it ({views}; this party is {member_name(comm, me)}): a party "
                             "deviated or a message was corrupted; the value is not used or released")


def _stream_words(generator: object) -> bytes:
    """``_SETUP_WORDS`` words from a torch generator or a keystream (:mod:`.keystream`)."""
    if isinstance(generator, torch.Generator):
        out = torch.empty(_SETUP_WORDS, dtype=torch.long).random_(-(2**63), None, generator=generator)
    else:
        out = generator.words((_SETUP_WORDS,))  # type: ignore[attr-defined]
    return out.numpy().tobytes()


def check_setup(comm: object) -> None:
    """Raise :class:`SetupMismatch` unless the session's shared randomness is shared: every party
    draws the same words from CrypTen's ``global`` generator, and each party's ``next`` stream
    (CrypTen's generator, and the replicated provider's AES ``ahead`` stream when it runs) draws
    what the next party's ``prev`` (``behind``) stream draws. Only digests travel. Every party
    calls it at the same point: after the trust set-up, before the first computation."""
    world, me = comm.get_world_size(), comm.get_rank()  # type: ignore[attr-defined]
    cpu = torch.device("cpu")
    gens = crypten.generators
    streams: list[tuple[bytes, bytes]] = [(_stream_words(gens["next"][cpu]), _stream_words(gens["prev"][cpu]))]
    pairs = getattr(crypten.mpc.get_default_provider(), "_pairs", None)  # the replicated provider's AES streams
    if pairs is not None:
        streams.append((_stream_words(pairs.ahead), _stream_words(pairs.behind)))
    joint = _digest([b"global", _stream_words(gens["global"][cpu])])
    ahead = [_digest([b"pair", i.to_bytes(1, "little"), a]) for i, (a, _) in enumerate(streams)]
    behind = [_digest([b"pair", i.to_bytes(1, "little"), b]) for i, (_, b) in enumerate(streams)]
    every = comm.all_gather(torch.cat([joint, *ahead, *behind]))  # type: ignore[attr-defined]
    k = len(streams)
    if any(not torch.equal(e[:4], joint) for e in every):
        raise SetupMismatch(f"the compute parties' joint random generator differs (this party: "
                            f"{member_name(comm, me)}): a set-up message was altered; nothing was computed")
    if world < 2:
        return
    for r in range(world):
        nxt = (r + 1) % world
        for i in range(k):
            if not torch.equal(every[r][4 + 4 * i:8 + 4 * i], every[nxt][4 + 4 * (k + i):8 + 4 * (k + i)]):
                what = "CrypTen generator" if i == 0 else "AES key"
                raise SetupMismatch(f"{member_name(comm, r)} and {member_name(comm, nxt)} do not share their pairwise "
                                    f"random stream ({what}): a set-up message was altered; nothing was computed")


def stall_limit(acceptance: float) -> int:
    """Candidates an honest rejection sampler with acceptance rate ≥ ``acceptance`` (per
    candidate, independent) rejects in a row with probability ≤ 2^-STALL_BITS."""
    if not 0.0 < acceptance <= 1.0:
        raise ValueError(f"acceptance: a rate in (0, 1], got {acceptance!r}")
    if acceptance == 1.0:
        return 1
    return math.ceil(STALL_BITS * math.log(2.0) / -math.log1p(-acceptance))
