"""The noisy sum of ``security = "malicious"``: three compute parties, any one of whom may deviate,
and no release unless every step was checked (security with abort).

What one :meth:`VerifiedAggregator.aggregate` call does at party i (all three call it in step):

1. **Its own input, bounded and proved.** v_i = round(Σ w·c · 2^g) + z_i, its contribution on the
   noise's grid plus its own share z_i of the distributed noise (:class:`~.local_noise.DistributedNoise`).
   It proves ‖v_i‖₂ ≤ M_i + B_z (:mod:`.norm_proof`): M_i its public contribution bound, B_z the
   bound that a discrete Gaussian share of its σ exceeds with probability ≤ 2^-40
   (:meth:`~.local_noise.DistributedNoise.norm_bound`).
2. **Dealt as replicated shares** in F_p (:mod:`.field`): three additive shares of (v_i, aux,
   proof), party k receiving shares k and k + 1 (:mod:`.replicated_open`); shares 0 and 1 are
   drawn from 32-byte seeds and travel as the seeds, so only share 2 is sent whole (to its two
   holders).
3. **Each share's two holders compare its hash** (salted: the dealer sends each share's salt to its
   two holders only, so the third party cannot test guesses of the input against the hash of the
   share it lacks). A dealer that dealt two copies differently, or
   a holder that misreports, stops the job here, naming the share's dealer and holders.
4. **Challenge by commit-then-reveal coins.** Each party commits to 32 fresh bytes, then opens
   them: the FLP query point and the check's weights follow from all three, and no party can
   choose them after seeing the others' (a party that could would grind a bad proof through).
5. **Every proof checked by verified openings**: each party computes, from each share it holds,
   the linear parts of every dealer's check; each share's part comes from both its holders. A
   mismatch names the two holders; a proof that fails names its dealer. Either ends the job.
6. **The sum, opened from both holders of each share**, decoded from its centred representative,
   and ended unanimously (:mod:`.unanimous`: signed verdicts, relayed once, Dolev–Strong) before
   it is returned: both honest parties release it, or both stop. The round is marked in the
   ledger just before this opening (:attr:`VerifiedAggregator.before_open`), not before step 1:
   steps 1–5 open nothing but the proofs' checks (uniform or zero for an honest dealer), so a
   round a check stops is not charged; once the sum's shares are sent, the deviating party may
   reconstruct it from the honest holders' copies, so from then on it is.

What a deviating party can still do: choose its own input v_i within M_i + B_z — its data within
its bound (as in any MPC), and a noise share that is not Gaussian, moving the release by at most
B_z more (the honest parties' shares alone carry the privacy guarantee,
:mod:`mpc_erm.privacy.distributed`) — or stop the job. Every other deviation in what it sends
either raises here before the value is used, or is a lie in a share whose second holder is honest.
With data owners (:meth:`VerifiedAggregator.aggregate_owners`), each owner's input is proved and
dealt by the owner itself (:mod:`parties.owner.verified_shares`); its shares' copies are compared
and its proof checked in steps 3 and 5 beside the parties' own, an owner that fails is left out of
the sum rather than stopping the job, and a party's own input is its noise share alone.
Nothing in this protocol is a product of shares: the compute parties only add, scale by public
constants and open, which is why the openings are all that needs checking.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from threadpoolctl import ThreadpoolController

from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.protocols.aggregation import NoiseSpec

from . import field as F
from . import norm_proof as N
from .aggregator import AggregateStats, AggregateTotals
from .agreement import IntegrityError, member_name
from .crypten_compat import import_crypten
from .local_noise import DistributedNoise
from .noise import Realisation
from .replicated_open import OpeningMismatch, holders, open_verified, shares_of
from .unanimous import UnanimousRelease
from .verified_grid import MALICIOUS_GRID_SLACK, owner_statement, realise_verified, statements

crypten = import_crypten()
from crypten.communicator.communicator import Communicator  # noqa: E402  (after the compat shim)

__all__ = ["MALICIOUS_GRID_SLACK", "MALICIOUS_TRUST_MODEL", "DeviationDetected", "OwnerShares", "OwnerVerdicts",
           "VerifiedAggregator",
           "owner_statement", "realise_verified", "statements"]

MALICIOUS_TRUST_MODEL = ("MPC: 3-party replicated sharing in F_p, malicious security with abort (honest majority): "
                         "every party's input proved within its bound, every opening checked by both holders of "
                         "each share; noise: each party's own share")
_DOMAIN = b"mpc-erm verified aggregate v1"
_PARTIES = 3
_SALT_WORDS = N.SALT_BYTES // 8
_SEEDED = 2  # shares 0 and 1 are drawn from seeds: only share 2 travels whole
#: Owners whose proofs are checked in one stacked batch: with the compiled field arithmetic the
#: batch size barely matters (0.75–0.98 ms an owner from 1 to 64 at d = 7,850, one core); 16 keeps
#: a batch's shares (about 2.8 MB) in cache.
OWNER_BLOCK = 16


class DeviationDetected(IntegrityError):
    """A compute party sent something the protocol does not allow: nothing that depends on it is used."""


@dataclass
class _Totals(AggregateTotals):
    field_elements_dealt: int = 0
    phases: dict[str, float] = field(default_factory=dict)  # seconds by step, over every aggregate

    @property
    def prove_seconds(self) -> float:
        return self.phases.get("prove", 0.0)

    @property
    def verify_seconds(self) -> float:
        """Checking every dealer's proof: the local linear work and its verified opening."""
        return self.phases.get("verify (local)", 0.0) + self.phases.get("open the proofs", 0.0)


@dataclass(frozen=True)
class OwnerShares:
    """The round's data owners' inputs as one compute party holds them: for each owner ready at
    every compute party, the two of its three shares this party holds (salt, x, aux, proof), and
    what each owner's proof is bound to."""

    spec: N.NormSpec  # every owner's statement: ‖x‖₂ ≤ M over the model's coordinates
    owners: tuple[int, ...]  # the owners' indices, the same order at every compute party
    held: Mapping[int, Mapping[int, np.ndarray]]  # owner → share index → the share's words
    context: Callable[[int], bytes]  # owner → the context its proof is bound to
    explicit: Callable[[int], int]  # owner → the share that reached its second holder through its first
    # owner → share index → its share_hashes, where the holder made them ahead (a derived share is
    # known from the owner's key before the owner sends anything); the others are hashed here
    hashes: Mapping[int, Mapping[int, bytes]] = field(default_factory=dict)


def share_parts(whole: np.ndarray, spec: N.NormSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, aux, proof) of one dealt share (its salt, the first words, aside)."""
    body = whole[_SALT_WORDS:]
    return body[: spec.dim], body[spec.dim: spec.dim + spec.aux_length], body[spec.dim + spec.aux_length:]


def share_hashes(s: int, whole: np.ndarray, spec: N.NormSpec) -> bytes:
    """What a holder of share ``s`` (its words ``whole``: salt, x, aux, proof) reports of it: the
    64-byte commitments of its x and of its aux (:func:`~.norm_proof.commitment`), which the share's
    other holder must report too."""
    x, aux, _ = share_parts(whole, spec)
    salt = whole[:_SALT_WORDS].tobytes()
    return N.commitment(s, x, salt) + N.commitment(s, aux, salt, b"aux")


@dataclass(frozen=True)
class OwnerVerdicts:
    """Which owners a round summed, refused (their proof failed) and left out (dealt inconsistently)."""

    kept: list[int]
    refused: list[int]
    left_out: list[int]


def _as_tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint64).view(np.int64))


def _as_field(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").contiguous().numpy().view(np.uint64)


class VerifiedAggregator:
    """``SecureAggregator`` of the malicious-secure mode, for one of exactly three compute parties
    that hold their own rows (:meth:`aggregate`) or serve data owners (:meth:`aggregate_owners`),
    with distributed noise (module docstring)."""

    def __init__(self, noise: DistributedNoise, bounds: tuple[float, ...], comm: Communicator) -> None:
        """``bounds``: the public ℓ2 bound of each party's weighted contribution, by rank."""
        self.comm = comm
        self.rank: int = comm.get_rank()
        self.world_size: int = comm.get_world_size()
        if self.world_size != _PARTIES:
            raise ValueError(f'security = "malicious" runs on exactly 3 compute parties, not {self.world_size}')
        if len(bounds) != _PARTIES:
            raise ValueError(f"bounds: one per party ({_PARTIES}), got {len(bounds)}")
        self.noise = noise
        self.bounds = tuple(float(b) for b in bounds)
        self.trust_model = MALICIOUS_TRUST_MODEL
        self.refused: list[list[int]] = []  # a failing proof ends the job: never anything to leave out
        self.precision_bits = 0
        self.limit = 0.0
        self.totals = _Totals()
        table = getattr(comm, "table", None)
        self._job = str(getattr(table, "job_id", "")).encode()
        self._counter = 0
        self._unanimous = UnanimousRelease(self._job)
        #: Called just before the sum is opened, after every check passed: the reveal guard's
        #: deferred mark (:meth:`~mpc_erm.runs.guard.RevealGuard.defer_marks`), so that a round
        #: stopped by a check, which opened nothing of the sum, is not charged.
        self.before_open: Callable[[], None] | None = None
        self._spec_cache: dict[tuple[int, int, NoiseSpec], list[N.NormSpec]] = {}
        # One BLAS thread for the proofs' products: they are small (at most a few thousand square),
        # and OpenBLAS's spinning threads beside the party's torch threads (or, on one machine, the
        # other parties' processes) made an aggregate 2.8× slower at d = 7,850 on 2 cores.
        self._blas = ThreadpoolController()

    # ------------------------------------------------------------------ steps
    def _name(self, rank: int) -> str:
        return member_name(self.comm, rank)

    def _context(self, t: int, dealer: int) -> bytes:
        return _DOMAIN + b"|" + self._job + f"|aggregate {t}|dealer {dealer}".encode()

    def _specs(self, p: int, g: int, noise: NoiseSpec) -> list[N.NormSpec]:
        key = (p, g, noise)
        if key not in self._spec_cache:
            self._spec_cache[key] = statements(self.noise, self.bounds, p, g, noise)
        return self._spec_cache[key]

    def realise(self, plan: PrivacyPlan, owner_bound: float | None = None) -> Realisation:
        """:func:`realise_verified` for this aggregator's parties (and a job's data owners)."""
        return realise_verified(plan, self.noise, self.bounds, owner_bound)

    def prepare(self, p: int, noise: NoiseSpec) -> None:
        """Check, before anything is charged or revealed, that every party's statement for ``p``
        coordinates fits the proof (raises a ValueError naming ``job.security`` if not)."""
        self._specs(p, int(self.noise.precision_bits(noise, p)), noise)

    @staticmethod
    def _whole(sub: N.Submission, s: int) -> np.ndarray:
        """Share s as its holders keep it: salt, x, aux, proof."""
        return np.concatenate([np.frombuffer(sub.salts[s], dtype=np.uint64), sub.x[s], sub.aux[s], sub.proof[s]])

    @classmethod
    def _sent(cls, sub: N.Submission, s: int) -> np.ndarray:
        """Share s as it travels: its salt, then its seed when it was drawn from one (4 words in
        place of the whole share), else the whole share."""
        if s < len(sub.seeds):
            return np.frombuffer(sub.salts[s] + sub.seeds[s], dtype=np.uint64)
        return cls._whole(sub, s)

    @staticmethod
    def _received(got: np.ndarray, s: int, spec: N.NormSpec) -> np.ndarray:
        """The whole share (salt, x, aux, proof) from what travelled (:meth:`_sent`)."""
        if s >= _SEEDED:
            return got
        seed = got[_SALT_WORDS:].tobytes()
        return np.concatenate([got[:_SALT_WORDS], N.seeded_share(seed, 0, spec.dim),
                               N.seeded_share(seed, 1, spec.aux_length), N.seeded_share(seed, 2, spec.proof_length)])

    @staticmethod
    def _sent_length(s: int, spec: N.NormSpec) -> int:
        return _SALT_WORDS + (_SALT_WORDS if s < _SEEDED else spec.submission_length)

    def _deal(self, sub: N.Submission, specs: list[N.NormSpec]) -> dict[int, dict[int, np.ndarray]]:
        """Send each other party the two shares it holds (shares 0 and 1 as their seeds); receive
        ours of theirs. Returns held[dealer][share] = concat(salt, x, aux, proof)."""
        me = self.rank
        messages = {k: np.concatenate([self._sent(sub, s) for s in shares_of(k)]) for k in range(_PARTIES) if k != me}
        sends = [self.comm.isend(_as_tensor(m), k) for k, m in messages.items()]
        held: dict[int, dict[int, np.ndarray]] = {me: {s: self._whole(sub, s) for s in shares_of(me)}}
        a, b = shares_of(me)
        for k in range(_PARTIES):
            if k == me:
                continue
            na, nb = self._sent_length(a, specs[k]), self._sent_length(b, specs[k])
            got = _as_field(self.comm.recv(torch.empty(na + nb, dtype=torch.long), k))
            if got.size != na + nb:
                raise DeviationDetected(f"{self._name(k)} dealt {got.size} words, not {na + nb}")
            held[k] = {a: self._received(got[:na].copy(), a, specs[k]), b: self._received(got[na:].copy(), b, specs[k])}
        for req in sends:
            req.wait()
        self.totals.field_elements_dealt += sum(m.size for m in messages.values())
        return held

    def _share_copies(self, held: list[tuple[Mapping[int, np.ndarray], N.NormSpec]],
                      known: Sequence[Mapping[int, bytes]] = ()) -> list[list[tuple[bytes, ...]]]:
        """Exchange the hashes of every share held here: for each input in ``held`` (its shares held
        here by index, its statement), per share index, the 64-byte hash (x's, then aux's) as each
        of the share's two holders reports it, in :func:`holders` order. ``known``: per input, the
        hashes of some of its shares made ahead (:func:`share_hashes`), used as they are."""
        mine = bytearray()
        for i, (shares, spec) in enumerate(held):
            ahead = known[i] if known else {}
            for s in shares_of(self.rank):
                mine += ahead[s] if s in ahead else share_hashes(s, shares[s], spec)
        every = ([bytes(x.numpy().tobytes()) for x in self.comm.all_gather(torch.frombuffer(mine, dtype=torch.uint8))]
                 if mine else [b""] * _PARTIES)

        def copy(party: int, i: int, s: int) -> bytes:
            at = (i * 2 + shares_of(party).index(s)) * 64
            return every[party][at: at + 64]

        return [[tuple(copy(party, i, s) for party in holders(s)) for s in range(_PARTIES)] for i in range(len(held))]

    def _commitments(self, held: dict[int, dict[int, np.ndarray]], specs: list[N.NormSpec],
                     t: int) -> list[tuple[list[bytes], list[bytes]]]:
        """Exchange the hashes of every share held; each share's two holders must agree. Returns,
        per dealer, (x hashes, aux hashes) by share."""
        out = []
        for dealer, copies in enumerate(self._share_copies([(held[d], specs[d]) for d in range(_PARTIES)])):
            for s, (one, other) in enumerate(copies):
                if one != other:
                    a, b = holders(s)
                    raise DeviationDetected(
                        f"aggregate #{t}: share {s} of {self._name(dealer)}'s input: its holders {self._name(a)} "
                        f"and {self._name(b)} hold different copies (the dealer dealt them differently, or one "
                        "holder misreports); nothing is revealed")
            out.append(([one[:32] for one, _ in copies], [one[32:] for one, _ in copies]))
        return out

    def _challenge(self, t: int) -> bytes:
        """Commit-then-reveal coins: the key of the proofs' queries."""
        coin = secrets.token_bytes(32)
        promise = hashlib.sha256(_DOMAIN + b"coin" + coin).digest()
        promises = [bytes(x.numpy().tobytes()) for x in self.comm.all_gather(torch.frombuffer(bytearray(promise),
                                                                                              dtype=torch.uint8))]
        coins = [bytes(x.numpy().tobytes()) for x in self.comm.all_gather(torch.frombuffer(bytearray(coin),
                                                                                          dtype=torch.uint8))]
        for r, (c, h) in enumerate(zip(coins, promises, strict=True)):
            if hashlib.sha256(_DOMAIN + b"coin" + c).digest() != h:
                raise DeviationDetected(f"aggregate #{t}: {self._name(r)} opened a coin other than the one it "
                                        "committed to; nothing is revealed")
        return hashlib.sha256(_DOMAIN + b"query" + self._job + t.to_bytes(8, "big") + b"".join(coins)).digest()

    def _open(self, mine: dict[int, np.ndarray], what: str) -> np.ndarray:
        """Open a vector from every party's results per share it holds (both holders of each share)."""
        a, b = shares_of(self.rank)
        stacked = np.concatenate([mine[a], mine[b]])
        every = [_as_field(x) for x in self.comm.all_gather(_as_tensor(stacked))]
        n = mine[a].size
        reports = {}
        for party in range(_PARTIES):
            if every[party].size != 2 * n:
                raise DeviationDetected(f"{what}: {self._name(party)} sent {every[party].size} elements, not {2 * n}")
            pa, pb = shares_of(party)
            reports[party] = {pa: every[party][:n], pb: every[party][n:]}
        try:
            return open_verified(reports)
        except OpeningMismatch as exc:
            x, y = (self._name(r) for r in exc.parties)
            raise DeviationDetected(f"{what}: share {exc.share}'s holders {x} and {y} report different values "
                                    "(one of them deviated); nothing is revealed") from None

    # ------------------------------------------------------------------ the interface
    def aggregate(self, contributions: torch.Tensor, weights: torch.Tensor, noise: NoiseSpec) -> torch.Tensor:
        """Reveal ``Σ_parties Σ_rows w·c + z`` (float64, shape (p,)); see the module docstring."""
        with self._blas.limit(limits=1, user_api="blas"):
            return self._aggregate(contributions, weights, noise)

    def _aggregate(self, contributions: torch.Tensor, weights: torch.Tensor, noise: NoiseSpec) -> torch.Tensor:
        if contributions.ndim != 2 or weights.ndim != 1 or weights.shape[0] != contributions.shape[0]:
            raise ValueError(f"contributions (k, p) and weights (k,) expected, got {tuple(contributions.shape)} "
                             f"and {tuple(weights.shape)}")
        local = weights.detach().to("cpu", torch.float64) @ contributions.detach().to("cpu", torch.float64)
        result, _ = self._round(local, noise, None)
        return result.to(contributions.device)

    def aggregate_owners(self, owners: OwnerShares, p: int, noise: NoiseSpec) -> tuple[torch.Tensor, OwnerVerdicts]:
        """Reveal ``Σ_owners kept x + z`` (float64, shape (p,)) for a compute party of a job with data
        owners (its own contribution is zero; its input is its noise share alone), and which owners
        were kept, refused (a proof that fails) or left out (two holders of a share they derive
        from the owner's key hold different copies). See the module docstring and
        :mod:`parties.owner.verified_shares`."""
        with self._blas.limit(limits=1, user_api="blas"):
            return self._round(torch.zeros(p, dtype=torch.float64), noise, owners)

    def _round(self, local: torch.Tensor, noise: NoiseSpec,
               owners: OwnerShares | None) -> tuple[torch.Tensor, OwnerVerdicts]:
        if noise.mechanism != "gaussian":
            raise ValueError('security = "malicious" adds distributed Gaussian noise only')
        p = int(local.shape[0])
        tic = time.perf_counter()
        stats0 = self.comm.get_communication_stats()
        t = self._counter
        self._counter += 1
        g = int(self.noise.precision_bits(noise, p))
        specs = self._specs(p, g, noise)
        if owners is not None:
            if owners.spec.dim != p:
                raise ValueError(f"owners' statement over {owners.spec.dim} coordinates, not {p}")
            reach = sum(sp.bound for sp in specs) + len(owners.owners) * owners.spec.bound
            if reach >= F.P // 2:  # the sum's centred representative would wrap
                raise ValueError(f"job.owners: {len(owners.owners)} owners' contributions of bound {owners.spec.bound} "
                                 f"grid units and the noise can reach {reach}, beyond F_p's range; fewer owners per "
                                 'round, or security = "semi-honest"')
        if not bool(torch.isfinite(local).all()):
            raise ValueError(f"aggregate #{t}: this party's weighted contribution is NaN/inf; nothing revealed")
        mine = torch.round(local * float(2**g)).to(torch.long) + self.noise.take(p, noise)

        clock = [tic]
        phases = self.totals.phases

        def lap(name: str) -> None:
            clock.append(time.perf_counter())
            phases[name] = phases.get(name, 0.0) + clock[-1] - clock[-2]

        self._unanimous.setup(self.comm)  # the release keys, agreed once (a mismatch stops every party here)
        lap("encode and noise")
        sub = N.prove_norm(mine.numpy(), specs[self.rank], self._context(t, self.rank))
        lap("prove")
        held = self._deal(sub, specs)
        lap("deal")
        hashes = self._commitments(held, specs, t)
        candidates: list[int] = []
        left_out: list[int] = []
        owner_hashes: dict[int, tuple[list[bytes], list[bytes]]] = {}
        if owners is not None:
            owner_hashes, left_out = self._owner_commitments(owners, t)
            candidates = [o for o in owners.owners if o not in left_out]
        lap("share hashes")
        query_key = self._challenge(t)
        lap("challenge")
        parts: dict[int, list[np.ndarray]] = {s: [] for s in shares_of(self.rank)}
        for dealer in range(_PARTIES):
            spec = specs[dealer]
            keys = N.keys_for(self._context(t, dealer), *hashes[dealer])
            query = N.Query.from_key(query_key, spec)  # one point for every dealer: one set of Lagrange coefficients
            for s in shares_of(self.rank):
                x, aux, proof = share_parts(held[dealer][s], spec)
                parts[s].append(N.verifier_share(s, x, aux, proof, spec, keys, query))
        if owners is not None and candidates:
            self._owner_parts(owners, candidates, owner_hashes, N.Query.from_key(query_key, owners.spec), parts)
        widths = [part.size for part in parts[shares_of(self.rank)[0]]]
        lap("verify (local)")
        opened = self._open({s: np.concatenate(v) for s, v in parts.items()}, f"aggregate #{t}: the input proofs")
        at = 0
        kept: list[int] = []
        refused: list[int] = []
        for i, width in enumerate(widths):
            if i < _PARTIES:
                if not N.accept(opened[at: at + width], specs[i]):
                    raise DeviationDetected(f"aggregate #{t}: {self._name(i)}'s input fails its proof (outside its "
                                            "bound, or a false proof): the job stops; nothing is revealed")
            else:
                assert owners is not None
                o = candidates[i - _PARTIES]
                (kept if N.accept(opened[at: at + width], owners.spec) else refused).append(o)
            at += width
        lap("open the proofs")
        if self.before_open is not None:
            self.before_open()  # the ledger's mark: from here on the round may be revealed
        lap("mark")
        sums = {}
        for s in shares_of(self.rank):
            rows = [share_parts(held[d][s], specs[d])[0] for d in range(_PARTIES)]
            if owners is not None:
                rows += [share_parts(owners.held[o][s], owners.spec)[0] for o in kept]
            sums[s] = F.sum_along(np.stack(rows), axis=0)
        total = self._open(sums, f"aggregate #{t}: the sum")
        lap("open the sum")
        ring = torch.from_numpy(F.to_signed(total))
        self._unanimous.decide(self.comm, f"aggregate #{t}", ring)  # both honest parties release it, or neither
        lap("agree")
        result = ring.to(torch.float64).div_(float(2**g))

        self.precision_bits = g
        self.limit = float(F.P // 2) / 2.0**g
        stats1 = self.comm.get_communication_stats()
        self.totals.add(AggregateStats(rounds=stats1["rounds"] - stats0["rounds"],
                                       bytes=stats1["bytes"] - stats0["bytes"], seconds=time.perf_counter() - tic))
        return result, OwnerVerdicts(kept, refused, left_out)

    def _owner_parts(self, owners: OwnerShares, candidates: list[int],
                     hashes: Mapping[int, tuple[list[bytes], list[bytes]]], query: N.Query,
                     parts: dict[int, list[np.ndarray]]) -> None:
        """Each candidate owner's part of its proof's check, from both shares held here, appended to
        ``parts`` by share in ``candidates``' order: :data:`OWNER_BLOCK` owners at a time, stacked
        (each with its own rows, :func:`~.norm_proof.stacked_check_weights`): a few compiled passes
        per batch rather than per owner."""
        spec = owners.spec
        for lo in range(0, len(candidates), OWNER_BLOCK):
            block = candidates[lo: lo + OWNER_BLOCK]
            keys = [N.keys_for(owners.context(o), *hashes[o]) for o in block]
            check = N.stacked_check_weights([k[0] for k in keys], spec, query.key)
            rho = np.stack([N.rho.__wrapped__(k[1], spec) for k in keys])  # one use each: not cached
            for s in shares_of(self.rank):
                x, aux, proof = (np.stack(p) for p in zip(*(share_parts(owners.held[o][s], spec) for o in block)))
                parts[s].extend(N.verifier_shares(s, x, aux, proof, spec, b"", rho, query, check=check))

    def _owner_commitments(self, owners: OwnerShares,
                           t: int) -> tuple[dict[int, tuple[list[bytes], list[bytes]]], list[int]]:
        """Exchange the hashes of every owner's shares held here; returns, per owner whose two
        holders of each share agree, (x hashes, aux hashes) by share, and the owners left out
        because the two holders of a share derived from the owner's key disagree (the owner dealt
        them differently, or one of them misreports: neither can prove which). Two copies of the
        explicit share that differ stop the job: it reached its second holder through its first."""
        out: dict[int, tuple[list[bytes], list[bytes]]] = {}
        left_out: list[int] = []
        every = self._share_copies([(owners.held[o], owners.spec) for o in owners.owners],
                                   [owners.hashes.get(o, {}) for o in owners.owners])
        for o, copies in zip(owners.owners, every, strict=True):
            first = next((s for s, (one, other) in enumerate(copies) if one != other), None)
            if first is None:
                out[o] = ([one[:32] for one, _ in copies], [one[32:] for one, _ in copies])
            elif first == owners.explicit(o):
                a, b = holders(first)
                raise DeviationDetected(
                    f"aggregate #{t}: owner #{o}'s explicit share reached {self._name(a)} and "
                    f"{self._name(b)} as different copies (it goes to one of them, which forwards it: one of "
                    "the two deviated); nothing is revealed")
            else:
                left_out.append(o)
        return out, left_out

    def describe(self) -> dict[str, Any]:
        """Trust model and cumulative cost, for the job report."""
        tot = self.totals
        return {"trust_model": self.trust_model, "parties": self.world_size, "security": "malicious",
                "aggregates": tot.aggregates, "rounds": tot.rounds, "bytes": tot.bytes, "seconds": tot.seconds,
                "prove_seconds": tot.prove_seconds, "verify_seconds": tot.verify_seconds,
                "field_elements_dealt": tot.field_elements_dealt, "phase_seconds": dict(tot.phases),
                "limit_abs": self.limit, "resolution": 2.0**-self.precision_bits if self.precision_bits else None}
