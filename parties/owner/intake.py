"""Data owners' intake at a compute party, over gRPC with mutual TLS.

One :class:`OwnerIntake` per job at each compute party (its worker hosts it): the owners the job
lists (certificates with role ``owner``, the caller being the TLS peer) enrol once — their AES
key for the shares this party derives, nothing at their explicit party — then contribute once per
round (:mod:`.shares`) with one call: the explicit share, at their explicit party only (the
others derive their shares from the keys, so a notice to them would carry nothing). The worker
opens a round, waits until its deadline, closes it, and agrees with the other compute parties on
the owners *ready* everywhere (:func:`agree_present`: an all-gather of bitmaps, ANDed): at an
owner's explicit party, that its share of the round arrived; at the others, that its key did
(enrolment). So an owner's presence is decided by its explicit party alone, every party sums the
same set, and an owner absent from its explicit party is left out of the round by all of them.
Then the worker publishes the round's public state, which each owner reads with ``GetRound`` from
its explicit party too (every party publishes the same; the owners' reads are spread over them,
and that party is the one that waits for an owner's read of the last release). Once enrolled, an
owner keeps only its explicit party's connection open.

Who may call is the compute party's :class:`~.callers.CallerPolicy`, the one its other servers
use: a caller whose certificate the party's CRL revokes (the file is looked at again as each round
opens, so a CRL published mid-job holds from the next round), or over the party's owner rate
(RESOURCE_EXHAUSTED), is refused before the servicer runs.

Refused, naming the field: a caller the job does not list, or not an owner (PERMISSION_DENIED);
a second enrolment, or a second contribution in a round (ALREADY_EXISTS); a contribution before
enrolling, for a round that is not open, at a party that derives the owner's share, or a share of
the wrong size (FAILED_PRECONDITION / INVALID_ARGUMENT). Nothing an owner sends is logged.
:class:`OwnerClient` is the owner's side.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
import numpy as np
import torch

from mpc_erm.mpc import tls
from mpc_erm.mpc.callers import CallerPolicy
from mpc_erm.mpc.keystream import KEY_BYTES
from mpc_erm.mpc.norm_proof import NormSpec
from mpc_erm.mpc.owner_api import owner_pb2 as pb
from mpc_erm.mpc.owner_api import owner_pb2_grpc as pb_grpc
from mpc_erm.mpc.pki import Identity
from mpc_erm.mpc.transport.chunking import grpc_message_options

from .attest import KEY_BYTES as ATTEST_KEY_BYTES
from .attest import ReleaseSigner, Roster, check_release
from .shares import OwnerShareSum, explicit_party
from .verified_shares import owner_context, payload_words, prove_contribution

__all__ = ["IntakeError", "OwnerClient", "OwnerIntake", "RoundFrame", "agree_present", "intake_threads",
           "on_trouble", "pauses", "state_bytes", "state_from_bytes"]

SERVICE = "/mpc_erm.v1.OwnerIntake"
MAX_WAIT_S = 300.0
#: How long one owner asks its read of a release to wait at a compute party (it re-asks until its own
#: deadline). The intake grants it while a thread stays free for the shares (``OwnerIntake``).
RELEASE_WAIT_S = 30.0
#: The wait an intake grants a read instead once its parked reads would take the threads the
#: owners' shares need: short, so a read never holds up the next round's shares for long.
RELEASE_POLL_S = 2.0
#: Threads of an intake's pool kept for contributions and enrolments, never parked by a read.
CONTRIBUTE_THREADS = 32
#: The most threads an intake's pool has (each holds a stack; past it, reads wait RELEASE_POLL_S).
MAX_INTAKE_THREADS = 1024
#: The longest one enrolment attempt waits for its answer (an owner asks again until its own deadline).
ENROLL_ATTEMPT_S = 10.0
ENROLL_RETRY_FIRST_S, ENROLL_RETRY_MAX_S = 0.2, 2.0  # its pauses between attempts (jittered: pauses)
#: A compute party that is slow (a deadline passed) rather than unreachable: an owner asks whether the
#: job ended (its client's ``check``) at most this often, so that thousands of owners of a loaded
#: party do not turn its slowness into a flood of questions to the daemons.
SLOW_CHECK_S = 30.0
#: Releases an intake keeps for owners still reading them (an owner more rounds behind has missed them).
KEEP_RELEASES = 64
#: Trailing metadata of a contribution refused because its round is not open: the round open here
#: ("" if none yet) and whether it has closed ("1"/"0"). :func:`round_state` reads them.
ROUND_KEY, CLOSED_KEY = "mpc-erm-open-round", "mpc-erm-round-closed"


class IntakeError(RuntimeError):
    """An owner's call to compute party ``party``'s intake that failed for good: its gRPC status
    ``code`` and the party's ``details`` (the owner's process turns it into one line)."""

    def __init__(self, party: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"compute party {party}: {code.name}: {details}")
        self.party, self.code, self.details = party, code, details

    @classmethod
    def of(cls, party: str, exc: grpc.RpcError) -> IntakeError:
        return cls(party, exc.code(), exc.details() or "")  # type: ignore[attr-defined]


@dataclass(frozen=True)
class RoundFrame:
    """The public frame of a job's owner rounds, the same at every compute party."""

    job_id: str
    owners: tuple[str, ...]  # the job's owner list: an owner's index is its position
    compute_parties: int
    rank: int  # this compute party
    grid_bits: int
    margin_bits: int
    dim: int
    spec_digest: str = ""  # the job's digest (JobFile.spec_digest), stated to every owner at enrolment
    # uniform owner sampling: this party's XOR share of each owner's sampling bits (.sample),
    # one bytes per owner in list order; empty where the owners sample themselves or at rank 1
    sample_shares: tuple[bytes, ...] = ()
    # M: the public ℓ2 bound (grid units) every owner's contribution is checked against on its
    # shares before it enters a sum (mpc_erm.mpc.validation); None: not checked (test builds only)
    bound_units: int | None = None
    # 3-party replicated sharing: each owner also gives this party the key of the next party's
    # share (when that share is derived), and the explicit party forwards the explicit share to
    # the previous party, so every party holds two of the three shares and the check's squares are
    # local (no per-coordinate message); honest majority, as the replicated trust model already is
    replicated: bool = False
    # job.security = "malicious": each round's share is a replicated F_p share with a proof of the
    # bound (.verified_shares), checked by openings a deviating compute party cannot falsify
    verified: bool = False

    def __post_init__(self) -> None:
        if self.verified and not (self.replicated and self.compute_parties == 3 and self.bound_units is not None):
            raise ValueError("verified owner shares need 3-party replicated sharing and a checked bound")

    @property
    def statement(self) -> NormSpec:
        """Every owner's proof statement, ‖x‖₂ ≤ M over the model's coordinates (verified shares
        only; :func:`mpc_erm.mpc.verified_grid.owner_statement` from the real bound and grid)."""
        if not self.verified or self.bound_units is None:
            raise ValueError("no proof statement: the owners' shares are not verified in this job")
        return NormSpec(self.dim, self.bound_units)

    @property
    def share_words(self) -> int:
        """64-bit words of one explicit share on the wire."""
        return payload_words(self.statement) if self.verified else self.dim


class _Round:
    def __init__(self, t: int) -> None:
        self.t = t
        self.present: set[int] = set()
        self.explicit: dict[int, torch.Tensor] = {}
        self.closed = False


class OwnerIntake(pb_grpc.OwnerIntakeServicer):
    """The intake of one job at one compute party: a gRPC server of its own (mTLS, owners only)."""

    def __init__(self, identity: Identity, frame: RoundFrame, bind: str = "127.0.0.1:0", *,
                 max_workers: int = 32, callers: CallerPolicy | None = None) -> None:
        """``callers``: the compute party's identity policy (None: this CA, no CRL, default rates)."""
        if identity.role != "party":
            raise ValueError("an owner intake runs at a compute party")
        self.frame = frame
        self._index = {name: i for i, name in enumerate(frame.owners)}
        if len(self._index) != len(frame.owners):
            raise ValueError("owners: the job lists an owner twice")
        if frame.sample_shares and len(frame.sample_shares) != len(frame.owners):
            raise ValueError("sample_shares: one per listed owner")
        self.shares = OwnerShareSum(frame.rank, frame.compute_parties)
        self._share_words = frame.share_words
        self.signer = ReleaseSigner()  # this job's release signatures (.attest), stated at enrolment
        # the owners whose explicit share this party receives; of the others it needs only the key
        self._mine = frozenset(o for o in range(len(frame.owners))
                               if explicit_party(o, frame.compute_parties) == frame.rank)
        self._enrolled: set[int] = set()
        self._enrolled_others = 0  # enrolled owners whose share this party derives: ready every round
        self._round: _Round | None = None
        self._published: dict[int, tuple[torch.Tensor, Roster, tuple[bytes, ...]]] = {}
        self._readers: dict[int, set[int]] = {}  # round → owners that read its release here
        self._leaving: set[int] = set()  # owners that read the release later from the daemon (--leave)
        # one lock, one condition per kind of wait: a contribution wakes only the round loop, not the
        # hundreds of reads parked for the release (every contribution woke every parked read before:
        # m²/k wake-ups a round), a release only the reads, a read only the worker's last-read wait
        self._lock = threading.Lock()
        self._contributed = threading.Condition(self._lock)
        self._released = threading.Condition(self._lock)
        self._read = threading.Condition(self._lock)
        # reads parked for a release: each holds a pool thread; past this many they wait only briefly
        self._parked, self._park_slots = 0, max(max_workers - CONTRIBUTE_THREADS, 0)
        self._stopping = False
        self.callers = callers if callers is not None else CallerPolicy(identity.ca_pem)
        policy = {f"{SERVICE}/*": [("owner", name) for name in frame.owners]}
        auth = self.callers.authorizer(policy, "owners", log_refusals=False,
                                       field_limits={"job_id": 128, "key": KEY_BYTES})
        self._server = grpc.server(ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="owner-intake"),
                                   interceptors=[auth],
                                   options=[*grpc_message_options(), ("grpc.so_reuseport", 0)])
        pb_grpc.add_OwnerIntakeServicer_to_server(self, self._server)
        self.port = self._server.add_secure_port(bind, tls.server_credentials(identity))
        if not self.port:
            raise OSError(f"owner intake: cannot listen on {bind}")
        host = bind.rsplit(":", 1)[0]
        self.address = f"{host}:{self.port}"

    # ------------------------------------------------------------------ lifecycle (the worker)

    def start(self) -> OwnerIntake:
        self._server.start()
        return self

    def stop(self, grace_s: float = 1.0) -> None:
        with self._lock:  # parked reads end now, not when their wait runs out (their threads would
            self._stopping = True  # hold the worker's exit: the pool's threads are joined at exit)
            self._released.notify_all()
        self._server.stop(grace_s).wait()

    @property
    def enrolled(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._enrolled)

    @property
    def explicit_owners(self) -> frozenset[int]:
        """The owners whose explicit share this party receives (it is their explicit party): the
        ones that call it each round and read its releases."""
        return self._mine

    def open_round(self, t: int) -> None:
        self.callers.refresh()  # a CRL replaced since the last round holds from this one on
        with self._lock:
            if self._round is not None and not self._round.closed:
                raise RuntimeError(f"round {self._round.t} is still open")
            self._round = _Round(t)
            self._contributed.notify_all()

    def wait_for(self, expected: int, deadline_s: float) -> int:
        """Wait until ``expected`` owners are ready here for the open round (see the module: their
        share arrived, or this party derives it and has their key) or ``deadline_s`` passed; how
        many are."""
        end = time.monotonic() + deadline_s
        with self._lock:
            r = self._round
            if r is None:
                raise RuntimeError("no round is open")
            while len(r.present) + self._enrolled_others < expected and (left := end - time.monotonic()) > 0:
                self._contributed.wait(left)
            return len(r.present) + self._enrolled_others

    def close_round(self) -> tuple[frozenset[int], dict[int, torch.Tensor]]:
        """Close the open round (later contributions are refused): (the owners ready here — their
        share in, or derived here from their key — and the explicit shares received here)."""
        with self._lock:
            r = self._round
            if r is None or r.closed:
                raise RuntimeError("no round is open")
            r.closed = True
            return frozenset(r.present | (self._enrolled - self._mine)), dict(r.explicit)

    def total(self, t: int, agreed: Sequence[int], explicit: dict[int, torch.Tensor]) -> torch.Tensor:
        """This party's input to :meth:`MpcAggregator.aggregate_shares` for round ``t``."""
        return self.shares.total(agreed, t, self.frame.dim, explicit)

    def shares_of(self, t: int, owners: Sequence[int], explicit: dict[int, torch.Tensor],
                  out: torch.Tensor | None = None) -> torch.Tensor:
        """This party's share of each of ``owners``' round-``t`` contributions (rows, in order;
        into ``out`` if given)."""
        return self.shares.shares(owners, t, self.frame.dim, explicit, out)

    def next_shares_of(self, t: int, owners: Sequence[int], forwarded: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor:
        """The next compute party's share of each of ``owners``' round-``t`` contributions (a
        replicated check): derived from the next keys, or the explicit shares ``forwarded`` by the
        next party (rows in the order of its owners in ``owners``; into ``out`` if given)."""
        return self.shares.next_shares(owners, t, self.frame.dim, forwarded, out)

    def publish(self, t: int, state: torch.Tensor, roster: Roster, signatures: Sequence[bytes] = ()) -> None:
        """The round's public state (what the compute parties revealed, or the model after it), its
        roster (the owners counted and those whose contribution failed the check: each owner reads
        its own bits) and every compute party's signature over both (:mod:`.attest`)."""
        with self._lock:
            self._published[t] = (state.detach().to("cpu", torch.float64).contiguous().clone(), roster,
                                  tuple(signatures))
            self._published.pop(t - KEEP_RELEASES, None)
            self._readers.pop(t - KEEP_RELEASES, None)
            self._released.notify_all()

    def wait_read(self, t: int, owners: Sequence[int], deadline_s: float) -> list[int]:
        """Wait until each of ``owners`` has read round ``t``'s release here, or ``deadline_s``
        passed: the ones that have not (a worker stops its intake after the last release only then,
        so that few owners that were counted need to read it from the daemon). Owners that said they
        leave once their shares are in are not waited for."""
        end = time.monotonic() + deadline_s
        with self._lock:
            wanted = set(owners) - self._leaving
            while (left := end - time.monotonic()) > 0 and not wanted <= self._readers.get(t, set()):
                self._read.wait(min(left, 1.0))
            return sorted(wanted - self._readers.get(t, set()))

    # ------------------------------------------------------------------ the service

    def _caller(self, context: grpc.ServicerContext, job_id: str) -> int:
        if job_id != self.frame.job_id:
            _abort(context, grpc.StatusCode.NOT_FOUND, f"job_id: no job {job_id!r} here")
        who = tls.peer(context)  # the Authorizer admitted only the job's owners
        return self._index[who.name]

    def Enroll(self, request: Any, context: grpc.ServicerContext) -> Any:
        o = self._caller(context, request.job_id)
        f = self.frame
        explicit = o in self._mine
        with self._lock:
            if o in self._enrolled:
                # the same enrolment again (its reply was lost, e.g. a deadline on a loaded machine): the
                # same answer; another key would change this party's shares mid-job: refused
                if bytes(request.key) != self.shares.keys.get(o, b"") or \
                        bytes(request.next_key) != self.shares.next_keys.get(o, b""):
                    _abort(context, grpc.StatusCode.ALREADY_EXISTS, f"owner {f.owners[o]!r} is already enrolled "
                                                                    "here with another key")
                return self._enroll_reply(o)
            if explicit and request.key:
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                       f"key: compute party {f.rank} receives owner {f.owners[o]!r}'s explicit shares, not a key")
            nxt = self.shares.following
            wants_next = f.replicated and explicit_party(o, f.compute_parties) != nxt
            if wants_next != bool(request.next_key) or (wants_next and len(request.next_key) != KEY_BYTES):
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                       f"next_key: {KEY_BYTES} bytes expected (the key of compute party {nxt}'s share: this job's "
                       "replicated check)" if wants_next else "next_key: not expected here")
            if not explicit:
                if len(request.key) != KEY_BYTES:
                    _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"key: {KEY_BYTES} bytes expected, got "
                                                                      f"{len(request.key)}")
                self.shares.add_key(o, bytes(request.key))
                self._enrolled_others += 1
            if wants_next:
                self.shares.add_next_key(o, bytes(request.next_key))
            self._enrolled.add(o)
            self._contributed.notify_all()  # ready here from now on if this party derives its share
        return self._enroll_reply(o)

    def _enroll_reply(self, o: int) -> Any:
        f = self.frame
        return pb.EnrollReply(owner_index=o, compute_parties=f.compute_parties, rank=f.rank, grid_bits=f.grid_bits,
                              margin_bits=f.margin_bits, dim=f.dim, spec_digest=f.spec_digest,
                              sample_shares=f.sample_shares[o] if f.sample_shares else b"",
                              release_key=self.signer.public, bound_units=f.bound_units or 0, verified=f.verified)

    def Contribute(self, request: Any, context: grpc.ServicerContext) -> Any:
        o = self._caller(context, request.job_id)
        f = self.frame
        if o not in self._mine:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                   f"share: compute party {f.rank} derives its share of owner {f.owners[o]!r} from the owner's key; "
                   f"the round's share goes to compute party {explicit_party(o, f.compute_parties)}")
        if len(request.share) != 8 * self._share_words:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                   f"share: {8 * self._share_words} bytes expected at compute party {f.rank}, got {len(request.share)}")
        with self._lock:
            if o not in self._enrolled:
                _abort(context, grpc.StatusCode.FAILED_PRECONDITION, "round: enrol first")
            r = self._round
            if r is None or r.closed or r.t != request.round:
                now = "none" if r is None else f"{r.t}{' (closed)' if r.closed else ''}"
                # the same, machine-readable, for the owner's client: which round, and whether it closed
                context.set_trailing_metadata(((ROUND_KEY, "" if r is None else str(r.t)),
                                               (CLOSED_KEY, "1" if r is not None and r.closed else "0")))
                _abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                       f"round: {request.round} is not open here (open: {now})")
            if o in r.present:
                _abort(context, grpc.StatusCode.ALREADY_EXISTS, f"round: owner {f.owners[o]!r} already contributed to "
                                                                f"round {r.t}")
            r.explicit[o] = torch.from_numpy(np.frombuffer(request.share, dtype="<i8").copy())
            r.present.add(o)
            if request.leaving:  # read by wait_read when it starts, after the last round closed
                self._leaving.add(o)
            self._contributed.notify_all()
        return pb.ContributeReply()

    def GetRound(self, request: Any, context: grpc.ServicerContext) -> Any:
        o = self._caller(context, request.job_id)
        with self._lock:
            # a long wait only while threads stay free for the shares that the release waits for
            # (else reads could hold every thread and the round would wait out its deadline)
            wait = min(max(request.wait_s, 0.0), MAX_WAIT_S if self._parked < self._park_slots else RELEASE_POLL_S)
            end = time.monotonic() + wait
            self._parked += 1
            try:
                while request.round not in self._published and not self._stopping and \
                        (left := end - time.monotonic()) > 0:
                    self._released.wait(left)
            finally:
                self._parked -= 1
            got = self._published.get(request.round)
            if got is not None:
                self._readers.setdefault(request.round, set()).add(o)
                self._read.notify_all()
        if got is None:
            if self._stopping:  # the owner reads it from the daemon, if it is the last (OwnerAggregator)
                _abort(context, grpc.StatusCode.UNAVAILABLE, "round: the intake is stopping")
            _abort(context, grpc.StatusCode.DEADLINE_EXCEEDED, f"round: {request.round} not released yet")
        state, roster, signatures = got
        return pb.RoundReply(round=request.round, state=state_bytes(state), shape=list(state.shape),
                             owners_counted=roster.count, refused=roster.refuses(o),
                             owners_refused=roster.refused_count, signatures=list(signatures),
                             counted=roster.counted, refused_owners=roster.refused)


def intake_threads(owners: int, compute_parties: int) -> int:
    """The pool of a compute party's intake: a thread for every owner that reads its release here
    (parked until the release) plus :data:`CONTRIBUTE_THREADS` for the shares, at most
    :data:`MAX_INTAKE_THREADS`."""
    return min(owners // compute_parties + CONTRIBUTE_THREADS, MAX_INTAKE_THREADS)


def round_state(exc: grpc.RpcError) -> tuple[int | None, bool] | None:
    """(round open at the intake or None, whether it has closed) of a contribution refused because
    its round was not open; None for any other error."""
    if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:  # type: ignore[attr-defined]
        return None
    md = dict(exc.trailing_metadata() or ())  # type: ignore[attr-defined]
    if ROUND_KEY not in md:
        return None
    t = str(md[ROUND_KEY])
    return (int(t) if t.isdigit() else None), md.get(CLOSED_KEY) == "1"


def on_trouble(check: Callable[[], None]) -> Callable[[grpc.StatusCode], None]:
    """A fresh ``on(code)`` for one wait of an owner on a compute party: runs ``check`` (which
    raises once the job has ended) after each UNAVAILABLE (a party gone) and once every
    :data:`SLOW_CHECK_S` of other failed tries (a party slow, silent, or not there yet)."""
    last = [time.monotonic()]

    def on(code: grpc.StatusCode) -> None:
        now = time.monotonic()
        if code == grpc.StatusCode.UNAVAILABLE or now - last[0] >= SLOW_CHECK_S:
            last[0] = now
            check()

    return on


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("unreachable")  # context.abort raises


def pauses(first: float, cap: float) -> Iterator[float]:
    """How long an owner sleeps before asking a compute party again: ``first`` doubling to
    ``cap``, each scaled by a random factor in [0.5, 1] so that many owners do not ask together."""
    pause = first
    while True:
        yield pause * random.uniform(0.5, 1.0)
        pause = min(2 * pause, cap)


def state_bytes(state: torch.Tensor) -> bytes:
    """A released state on the wire (``RoundReply.state``, ``OwnerRelease.state``): float64,
    little-endian; its shape travels beside it."""
    return state.numpy().astype("<f8").tobytes()


def state_from_bytes(data: bytes, shape: Sequence[int]) -> torch.Tensor:
    """The released state :func:`state_bytes` sent, with its ``shape``."""
    return torch.from_numpy(np.frombuffer(data, dtype="<f8").copy()).reshape(tuple(shape))


def agree_present(comm: Any, present: frozenset[int], owners: int) -> list[int]:
    """The owners ready at every compute party (sorted; :meth:`OwnerIntake.close_round`): an
    all-gather of bitmaps over the compute parties' communicator, ANDed. Every party gets the same
    list."""
    bits = torch.zeros(owners, dtype=torch.long)
    if present:
        bits[torch.tensor(sorted(present), dtype=torch.long)] = 1
    every = torch.stack(comm.all_gather(bits)).prod(0)
    return [int(i) for i in torch.nonzero(every).reshape(-1)]


class OwnerClient:
    """An owner's side of one job: enrol at every compute party (its key where the party derives
    its share), then per round send its shares and read the released public state."""

    def __init__(self, identity: Identity, job_id: str, owner_index: int, compute: Sequence[tuple[str, str]], *,
                 check: Callable[[], None] | None = None, replicated: bool = False) -> None:
        """``owner_index``: this owner's position in the job's public owner list; ``compute``:
        (name, address) of each compute party, in rank order; ``check``: called while a compute
        party cannot be reached (or, every :data:`SLOW_CHECK_S`, is slow), between tries: raises to
        stop trying (the job ended); ``replicated``: the job's compute parties use 3-party
        replicated sharing, so each also gets the key of the next party's share (``next_key``:
        the bound check's squares are then local, see :class:`RoundFrame`)."""
        if identity.role != "owner":
            raise ValueError("an owner client needs an identity with role 'owner'")
        if len(compute) < 2:
            raise ValueError("compute: an owner shares among >= 2 compute parties")
        from .shares import OwnerSharer

        self.identity = identity
        self.job_id = job_id
        self.refused: list[int] = []  # rounds whose contribution the compute parties' bound check refused
        self.names = [name for name, _ in compute]
        self.check = check if check is not None else (lambda: None)
        self._channels = [tls.secure_channel(addr, identity, f"party/{name}", grpc_message_options())
                          for name, addr in compute]
        self._stubs: list[Any] = [pb_grpc.OwnerIntakeStub(ch) for ch in self._channels]
        self.sharer = OwnerSharer.new(owner_index, len(compute))  # fresh keys for this job
        self.replicated = replicated
        self.frame: Any = None
        self.release_keys: list[bytes] = []  # each compute party's release key, stated at enrolment
        self._sample_shares: list[bytes] = []

    @property
    def owner_index(self) -> int:
        return self.sharer.owner_index

    def trouble(self) -> Callable[[grpc.StatusCode], None]:
        """:func:`on_trouble` of this client's ``check``, for one wait."""
        return on_trouble(self.check)

    @property
    def explicit_name(self) -> str:
        """The compute party this owner sends its shares to and reads its releases from."""
        return self.names[self.sharer.explicit]

    def enroll(self, timeout_s: float = 30.0, spec_digest: str | None = None) -> Any:
        """Enrol at every compute party; the public frame they state (grid, margin, dimension,
        job digest), checked to be the same everywhere, to name this owner's index and, given
        ``spec_digest``, to be this owner's job. Once, and successful or not, it closes the
        connections to every compute party but this owner's explicit one (the one it calls from then
        on): a compute party holds a connection per owner whose share it receives, not one per
        owner of the job (at 50,000 owners and 3 compute parties, 16,667 instead of 50,000)."""
        if None in self._stubs:  # _keep_only ran: enrolled, or tried
            raise RuntimeError(f"job {self.job_id}: this owner client has enrolled already (or tried: once per "
                               "client, which then keeps one connection; a new client to try again)")
        try:
            replies = [self._enroll_at(j, stub, timeout_s) for j, stub in enumerate(self._stubs)]
        finally:
            self._keep_only(self.sharer.explicit)
        frames = {(r.owner_index, r.compute_parties, r.grid_bits, r.margin_bits, r.dim, r.spec_digest, r.bound_units,
                   r.verified) for r in replies}
        if len(frames) != 1 or replies[0].owner_index != self.owner_index or \
                [r.rank for r in replies] != list(range(len(replies))):
            raise ValueError(f"job {self.job_id}: the compute parties state different frames or another index for "
                             f"this owner ({sorted(frames)})")
        if spec_digest is not None and replies[0].spec_digest != spec_digest:
            raise ValueError(f"job {self.job_id}: the compute parties run another job (digest "
                             f"{replies[0].spec_digest[:12]}… vs this owner's {spec_digest[:12]}…); nothing sent")
        keys = [bytes(r.release_key) for r in replies]
        if any(len(k) != ATTEST_KEY_BYTES for k in keys):
            raise ValueError(f"job {self.job_id}: compute party "
                             f"{', '.join(n for n, k in zip(self.names, keys) if len(k) != ATTEST_KEY_BYTES)} states "
                             "no release key: its releases could not be checked; nothing sent")
        self.release_keys = keys
        self.frame = replies[0]
        self._sample_shares = [bytes(r.sample_shares) for r in replies]
        return self.frame

    def _keep_only(self, j: int) -> None:
        """Close every connection but the one to compute party ``j``."""
        for i, ch in enumerate(self._channels):
            if i != j and self._stubs[i] is not None:
                self._stubs[i] = None
                ch.close()

    def drawn(self, rounds: int) -> list[bool]:
        """Whether this owner is drawn in each of ``rounds`` rounds of a job whose owners are
        sampled uniformly (:mod:`.sample`): the XOR of the two shares compute parties 0 and 2
        stated at enrolment; refused if they did not state them where the shuffle puts them."""
        from .sample import SHARE_RANKS, owner_bits

        if self.frame is None:
            raise RuntimeError("enrol first")
        held = [j for j, b in enumerate(self._sample_shares) if b]
        if tuple(held) != SHARE_RANKS or len(self._sample_shares) != 3:
            raise ValueError(f"job {self.job_id}: uniform sampling needs sample shares from compute parties "
                             f"{list(SHARE_RANKS)} of 3; got them from {held} of {len(self._sample_shares)}")
        return owner_bits(self._sample_shares[0], self._sample_shares[2], rounds)

    def _enroll_at(self, j: int, stub: Any, timeout_s: float) -> Any:
        """Enrol at compute party ``j``, asking again (the same request: idempotent there) while it
        is unreachable or slow, until ``timeout_s`` has passed."""
        end = time.monotonic() + timeout_s
        trouble = self.trouble()
        for pause in pauses(ENROLL_RETRY_FIRST_S, ENROLL_RETRY_MAX_S):
            try:
                nxt = self.sharer.keys.get((j + 1) % len(self._stubs), b"") if self.replicated else b""
                return stub.Enroll(pb.EnrollRequest(job_id=self.job_id, key=self.sharer.keys.get(j, b""), next_key=nxt),
                                   timeout=max(1.0, min(ENROLL_ATTEMPT_S, end - time.monotonic())))
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or \
                        time.monotonic() + pause >= end:
                    raise IntakeError.of(self.names[j], exc) from None
                trouble(code)
            time.sleep(pause)
        raise AssertionError("unreachable")  # pauses() never ends

    def contribute(self, t: int, v: torch.Tensor, timeout_s: float = 30.0, *, leaving: bool = False) -> None:
        """Encode ``v`` on the job's grid (refused if out of range: nothing is sent) and send round
        ``t``'s explicit share to this owner's explicit party, the one call of its round (the other
        parties derive theirs from the keys given at enrolment; ``leaving``: this owner will not
        read the release there, see ``ContributeRequest``)."""
        from .shares import encode_on_grid

        if self.frame is None:
            raise RuntimeError("enrol first")
        if v.numel() != self.frame.dim:
            raise ValueError(f"contribution: {self.frame.dim} coordinates expected, got {v.numel()}")
        units = encode_on_grid(v, self.frame.grid_bits, self.frame.margin_bits)
        if self.frame.verified:  # replicated F_p shares with a proof of the bound (.verified_shares)
            f = self.frame
            _, words = prove_contribution(units.numpy(), self.sharer.keys, t, NormSpec(f.dim, f.bound_units),
                                          owner_context(self.job_id, t, self.owner_index))
            payload = words.astype("<u8").tobytes()
        else:
            payload = self.sharer.split(units, t).numpy().astype("<i8").tobytes()
        try:
            self._stubs[self.sharer.explicit].Contribute(
                pb.ContributeRequest(job_id=self.job_id, round=t, leaving=leaving, share=payload), timeout=timeout_s)
        except grpc.RpcError as exc:
            # a retry after a lost reply: the party took this round's share (the same bytes: the split
            # of round t is deterministic) before the deadline hit
            if exc.code() != grpc.StatusCode.ALREADY_EXISTS:  # type: ignore[attr-defined]
                raise

    def released(self, t: int, wait_s: float = 60.0) -> tuple[torch.Tensor, Roster]:
        """Round ``t``'s public state and its signed roster (which owners it counted and refused:
        :class:`~.attest.Roster`). Every compute party publishes
        the same, so owners spread their reads over them; each read waits at most
        :data:`RELEASE_WAIT_S` at the server, which holds one of its threads meanwhile and grants
        less (:data:`RELEASE_POLL_S`) once its parked reads would take the threads the next round's
        shares need. A release slow to come asks ``check`` every :data:`SLOW_CHECK_S`."""
        stub = self._stubs[self.sharer.explicit]
        end = time.monotonic() + wait_s
        trouble = self.trouble()
        while True:
            poll = max(0.0, min(end - time.monotonic(), RELEASE_WAIT_S))
            try:
                r = stub.GetRound(pb.RoundRequest(job_id=self.job_id, round=t, wait_s=poll), timeout=poll + 10)
                break
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED or time.monotonic() >= end:
                    raise
                trouble(exc.code())
        state, roster = state_from_bytes(r.state, r.shape), Roster(bytes(r.counted), bytes(r.refused_owners))
        check_release(self.release_keys, self.names, self.job_id, t, state, int(r.owners_counted), roster,
                      list(r.signatures), f"read from {self.explicit_name}")
        if roster.refuses(self.owner_index):  # the signed bit, not the reply's own flag
            self.refused.append(t)
        return state, roster

    def close(self) -> None:
        for ch in self._channels:
            ch.close()
