"""The two sides of one owner round as :class:`~mpc_erm.protocols.aggregation.SecureAggregator`\\ s,
so that a protocol's own round loop (e.g. ``GradientPerturbation.train``) runs unchanged at a
compute party and at a data owner (docs/explanation/architecture.md §2):

- :class:`IntakeAggregator` (a compute party): its own contributions are empty; a call opens the
  round at its :class:`~.intake.OwnerIntake`, waits for the owners until the deadline
  (telling the other compute parties every second whether it is done, so that all stop together),
  agrees with them on the owners ready everywhere, reveals their sum plus
  the in-MPC noise (:meth:`~.aggregator.MpcAggregator.aggregate_shares`) and publishes it; in the
  malicious-secure mode it checks every owner's proof and reveals the sum of those that pass with
  the parties' noise shares
  (:meth:`~mpc_erm.mpc.verified_aggregator.VerifiedAggregator.aggregate_owners`).
- :class:`OwnerAggregator` (an owner): weights its own contribution (public weights), sends its
  shares (:class:`~.intake.OwnerClient`) and returns the released noisy sum. An owner late
  for a round is left out of it and still reads its release, so every member takes the same step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
import numpy as np
import torch

from mpc_erm.mpc.replicated_open import shares_of
from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.protocols.aggregation import NoiseSpec

from .attest import Roster, statement, uncounted, unsigned
from .intake import IntakeError, OwnerClient, OwnerIntake, agree_present, pauses, round_state
from .shares import OwnerRangeError, explicit_party
from .verified_shares import derived_share, owner_context

if TYPE_CHECKING:  # types only: a data owner, which imports this module, runs no CrypTen
    from mpc_erm.mpc.aggregator import MpcAggregator
    from mpc_erm.mpc.communicator import GrpcCommunicator
    from mpc_erm.mpc.norm_proof import NormSpec
    from mpc_erm.mpc.validation import CheckPlan, RoundCheck
    from mpc_erm.mpc.verified_aggregator import VerifiedAggregator

__all__ = ["IntakeAggregator", "LeftAfterSending", "OwnerAggregator", "ReleaseSignatures"]

#: An owner early for a round asks again after RETRY_FIRST_S, doubling to RETRY_MAX_S.
RETRY_FIRST_S, RETRY_MAX_S = 0.02, 0.5
#: While the owners send, the compute parties tell each other this often whether they are done.
READY_EVERY_S = 1.0
#: Coordinates of owners' shares checked at a time at a compute party (≈ 32 MiB of int64 a block).
CHECK_BLOCK_ELEMENTS = 1 << 22


def round_check(comm: GrpcCommunicator, dim: int) -> RoundCheck:
    """A :class:`mpc_erm.mpc.validation.RoundCheck` (its challenge drawn now), imported at a
    compute party only (it imports CrypTen, which a data owner never loads)."""
    from mpc_erm.mpc.validation import RoundCheck

    return RoundCheck(comm, dim)


def check_plan(dim: int, bound_units: int, owners: int) -> CheckPlan:
    """The check's public parameters for ``owners`` contributions of one bound (compute parties only)."""
    from mpc_erm.mpc.validation import CheckPlan

    return CheckPlan(dim, (bound_units,) * owners)


def _all_bytes(comm: GrpcCommunicator, mine: bytes) -> list[bytes]:
    """Every compute party's ``mine`` (the same length everywhere, a multiple of 8), rank order."""
    got = comm.all_gather(torch.frombuffer(bytearray(mine), dtype=torch.long).clone())
    return [t.numpy().tobytes() for t in got]


class ReleaseSignatures:
    """Every compute party's signature over each of a job's releases (:mod:`.attest`), exchanged
    and checked at the compute party: the owners use a release only with all of them. Called by
    every compute party with each release, in the same order; the parties' release keys (those
    each states to its owners at enrolment) are exchanged at the first call."""

    def __init__(self, comm: GrpcCommunicator, intake: OwnerIntake) -> None:
        self.comm, self.intake = comm, intake
        self._keys: list[bytes] | None = None

    def __call__(self, t: int, out: torch.Tensor, roster: Roster) -> list[bytes]:
        stmt = statement(self.intake.frame.job_id, t, out, roster)
        if self._keys is None:
            self._keys = _all_bytes(self.comm, self.intake.signer.public)
        sigs = _all_bytes(self.comm, self.intake.signer.sign(stmt))
        bad = unsigned(self._keys, stmt, sigs)
        if bad:
            from mpc_erm.mpc.agreement import RevealMismatch, member_name

            names = ", ".join(member_name(self.comm, j) for j in bad)
            raise RevealMismatch(f"round {t}'s release: no valid signature of {names} over the value this party "
                                 "holds: a party deviated; the release is not published")
        return sigs


def agree_counted(comm: GrpcCommunicator, t: int, owners: list[int]) -> None:
    """Every compute party sums the same owners of round ``t``, or none reveals (the set is built
    from messages: :func:`mpc_erm.mpc.agreement.agree_on`; compute parties only)."""
    from mpc_erm.mpc.agreement import agree_on

    agree_on(comm, f"owners counted in round {t}", torch.tensor(owners, dtype=torch.long))


class IntakeAggregator:
    """A compute party's side: one :meth:`aggregate` call is one owner round (see the module)."""

    def __init__(self, intake: OwnerIntake, comm: GrpcCommunicator, mpc: MpcAggregator | VerifiedAggregator, *,
                 deadline_s: float,
                 first_wait_s: float,
                 while_owners_compute: Callable[[], None] | None = None,
                 check: Callable[[], None] | None = None,
                 on_refused: Callable[[int, list[str]], None] | None = None) -> None:
        """``deadline_s``: how long a round waits for the enrolled owners; ``first_wait_s``: how
        long the first round waits for every listed owner to enrol and contribute;
        ``while_owners_compute``: this party's own work for the round (e.g. topping up the noise
        pool); ``check``: raises to stop (a cancelled job) while waiting; ``on_refused(t, names)``:
        the owners of round ``t`` whose contribution failed the bound check (to log and announce)."""
        self.intake, self.comm, self.mpc = intake, comm, mpc
        self.deadline_s, self.first_wait_s = deadline_s, first_wait_s
        self.while_owners_compute, self.check, self.on_refused = while_owners_compute, check, on_refused
        self.trust_model = mpc.trust_model
        self.counted: list[int] = []  # owners summed per round (public to the compute parties and owners)
        self.refused: list[list[int]] = []  # per round, the owners whose contribution failed the bound check
        self.agreed: list[int] = []  # the owners summed in the latest round
        self.last: torch.Tensor | None = None  # the latest round's release
        # per round, seconds: waiting for the owners' shares (open to close), then the MPC (agreeing
        # on the owners, the noisy sum, publishing); the first round's wait includes the enrolment
        self.wait_seconds: list[float] = []
        self.mpc_seconds: list[float] = []
        self.cpu_seconds: list[float] = []  # this process's CPU per round (the intake's threads included)
        # the check's two share buffers (this party's, the next party's), kept between rounds
        self._buffers: torch.Tensor | None = None
        self._sign = ReleaseSignatures(comm, intake)
        self.signatures: list[bytes] = []  # the latest release's signatures (kept with it for late readers)
        self.roster = Roster(b"")  # the latest release's owners counted and refused (signed with it)

    def aggregate(self, contributions: torch.Tensor, weights: torch.Tensor, noise: NoiseSpec) -> torch.Tensor:
        if contributions.numel():
            raise ValueError("contributions: a compute party holds none of its own in a job with owners")
        f = self.intake.frame
        t = len(self.counted)
        tic, cpu = time.monotonic(), time.process_time()
        self.intake.open_round(t)
        if self.while_owners_compute is not None:
            self.while_owners_compute()
        ahead = self._derive_ahead(t) if f.verified else None
        self._wait_owners(t)
        present, explicit = self.intake.close_round()
        closed = time.monotonic()
        agreed = agree_present(self.comm, present, len(f.owners))
        if f.verified:
            out, agreed = self._verified(t, agreed, explicit, noise, ahead)
        else:
            agreed, total = self._checked(t, agreed, explicit)
            agree_counted(self.comm, t, agreed)
            out = self.mpc.aggregate_shares(total, f.grid_bits, noise)  # type: ignore[union-attr]
        self.roster = Roster.of(len(f.owners), agreed, self.refused[-1])
        self.signatures = self._sign(t, out, self.roster)
        self.intake.publish(t, out, self.roster, self.signatures)
        self.wait_seconds.append(closed - tic)
        self.mpc_seconds.append(time.monotonic() - closed)
        self.cpu_seconds.append(time.process_time() - cpu)
        self.counted.append(len(agreed))
        self.agreed, self.last = agreed, out
        return out

    def _derived(self, o: int, s: int, t: int, spec: NormSpec) -> np.ndarray:
        """Share ``s`` of owner ``o``'s round ``t``, which this party derives from the owner's key:
        its own (s = this party's rank) or the next party's (the share this party holds with it)."""
        shares = self.intake.shares
        return derived_share(shares.keys[o] if s == self.intake.frame.rank else shares.next_keys[o], t, spec)

    def _derive_ahead(self, t: int) -> dict[int, dict[int, tuple[np.ndarray, bytes]]]:
        """Round ``t``'s shares that this party derives for the owners enrolled now, with their
        hashes (:func:`~mpc_erm.mpc.verified_aggregator.share_hashes`), made while the owners prove
        and send: they need nothing from the owners but the keys of their enrolment. Owners that
        enrol later are derived when the round closes."""
        from mpc_erm.mpc.verified_aggregator import share_hashes

        f = self.intake.frame
        spec = f.statement
        out: dict[int, dict[int, tuple[np.ndarray, bytes]]] = {}
        for o in sorted(self.intake.enrolled):
            e = explicit_party(o, f.compute_parties)
            for s in shares_of(f.rank):
                if s != e:
                    words = self._derived(o, s, t, spec)
                    out.setdefault(o, {})[s] = (words, share_hashes(s, words, spec))
        return out

    def _verified(self, t: int, agreed: list[int], explicit: dict[int, torch.Tensor], noise: NoiseSpec,
                  ahead: dict[int, dict[int, tuple[np.ndarray, bytes]]] | None) -> tuple[torch.Tensor, list[int]]:
        """A malicious-secure round (``job.security = "malicious"``): every agreed owner's proof
        checked and its shares' copies compared, with the compute parties' own noise inputs, by
        :meth:`~mpc_erm.mpc.verified_aggregator.VerifiedAggregator.aggregate_owners`; the release
        and the owners it counted. Owners whose proof fails, or whose two holders of a derived share
        hold different copies, are recorded in :attr:`refused`."""
        from mpc_erm.mpc.verified_aggregator import OwnerShares, VerifiedAggregator

        f = self.intake.frame
        assert isinstance(self.mpc, VerifiedAggregator)
        spec, me = f.statement, f.rank
        nxt = (me + 1) % f.compute_parties
        theirs = [o for o in agreed if explicit_party(o, f.compute_parties) == nxt]
        forwarded = dict(zip(theirs, self._forwarded(agreed, explicit, f.share_words), strict=True))
        held: dict[int, dict[int, np.ndarray]] = {}
        hashes: dict[int, dict[int, bytes]] = {}
        made = ahead or {}
        for o in agreed:
            e = explicit_party(o, f.compute_parties)
            mine: dict[int, np.ndarray] = {}
            for s in shares_of(me):
                if s == e:
                    mine[s] = (explicit[o] if s == me else forwarded[o]).numpy().view(np.uint64)
                elif s in made.get(o, {}):
                    mine[s], hashes.setdefault(o, {})[s] = made[o][s]
                else:
                    mine[s] = self._derived(o, s, t, spec)
            held[o] = mine
        owners = OwnerShares(spec, tuple(agreed), held, context=lambda o: owner_context(f.job_id, t, o),
                             explicit=lambda o: explicit_party(o, f.compute_parties), hashes=hashes)
        out, verdicts = self.mpc.aggregate_owners(owners, f.dim, noise)
        refused = sorted(verdicts.refused + verdicts.left_out)
        self.refused.append(refused)
        if refused and self.on_refused is not None:
            self.on_refused(t, [f.owners[o] for o in refused])
        return out, verdicts.kept

    def _forwarded(self, owners: list[int], explicit: dict[int, torch.Tensor], words: int) -> torch.Tensor:
        """The explicit shares of the next compute party's owners among ``owners`` (this party is
        their second holder), rows in ``owners``' order: this party forwards the explicit shares it
        received to the previous party and takes the next party's, one message each way (``words``
        64-bit words a share)."""
        f = self.intake.frame
        k, me = f.compute_parties, f.rank
        mine = [explicit[o] for o in owners if explicit_party(o, k) == me]
        theirs = sum(explicit_party(o, k) == (me + 1) % k for o in owners)
        if mine:  # the previous party expects exactly these (it knows whose explicit party this is)
            self.comm.send(torch.stack(mine), (me - 1) % k)
        return self.comm.recv(torch.zeros(theirs, words, dtype=torch.long), (me + 1) % k) if theirs else \
            torch.zeros(0, words, dtype=torch.long)

    def _checked(self, t: int, agreed: list[int], explicit: dict[int, torch.Tensor]) -> tuple[list[int], torch.Tensor]:
        """The agreed owners whose contribution passes the bound check on its shares (the same list
        at every compute party: one opened bit each, :mod:`mpc_erm.mpc.validation`), and this
        party's share of their sum; the others are recorded in :attr:`refused`. A refused owner is
        a dropout: left out of the sum, which is still divided by the public count. The shares
        are derived once, in blocks of owners (:data:`CHECK_BLOCK_ELEMENTS`, in two buffers kept
        from round to round), each block's flags computed and its shares summed as it comes; one
        comparison batch decides them all; a refused owner's share is subtracted again."""
        f = self.intake.frame
        if f.bound_units is None:  # test builds only (the trust model says so)
            self.refused.append([])
            return agreed, self.intake.total(t, agreed, explicit)
        total = torch.zeros(f.dim, dtype=torch.long)
        check = round_check(self.comm, f.dim)
        step = max(1, CHECK_BLOCK_ELEMENTS // f.dim)
        if self._buffers is None:
            self._buffers = torch.empty(2, min(step, len(f.owners)), f.dim, dtype=torch.long)
        for a in range(0, len(agreed), step):
            block = agreed[a:a + step]
            mine, theirs = self._buffers[0, :len(block)], self._buffers[1, :len(block)]
            following = self._following(t, block, explicit, theirs) if f.replicated else None
            shares = self.intake.shares_of(t, block, explicit, mine)
            check.add(shares, check_plan(f.dim, f.bound_units, len(block)), following)
            total += shares.sum(0)
        ok = check.verdicts()
        kept = [o for o, good in zip(agreed, ok) if good]
        refused = [o for o, good in zip(agreed, ok) if not good]
        if refused:
            total -= self.intake.total(t, refused, explicit)
        self.refused.append(refused)
        if refused and self.on_refused is not None:
            self.on_refused(t, [f.owners[o] for o in refused])
        return kept, total

    def _following(self, t: int, block: list[int], explicit: dict[int, torch.Tensor],
                   out: torch.Tensor) -> torch.Tensor:
        """The next compute party's shares of ``block``'s contributions (replicated check): this
        party forwards the explicit shares it received to the previous party and takes the next
        party's (:meth:`_forwarded`); the other shares it derives from the owners' next keys
        (written into ``out``)."""
        return self.intake.next_shares_of(t, block, self._forwarded(block, explicit, self.intake.frame.dim), out)

    def _wait_owners(self, t: int) -> None:
        """Wait until every compute party has its owners of round ``t`` in, or its deadline has
        passed. An owner sends its share to one party only, so one party can be done long before
        another (a late owner of the other); the parties tell each other every
        :data:`READY_EVERY_S` (an all-gather of one flag) and all stop at the same exchange, so the
        agreement that follows never waits on a peer longer than that, however long the round's
        deadline (a communicator's wait is bounded by the daemons' ``peer_timeout_s``)."""
        f = self.intake.frame
        expected = len(f.owners) if t == 0 else len(self.intake.enrolled)
        end = time.monotonic() + (self.first_wait_s if t == 0 else self.deadline_s)
        while True:
            ready = self.intake.wait_for(expected, max(0.0, min(end - time.monotonic(), READY_EVERY_S)))
            if self.check is not None:
                self.check()
            done = ready >= expected or time.monotonic() >= end
            if all(int(x) for x in self.comm.all_gather(torch.tensor([int(done)], dtype=torch.long))):
                return

    def wait_last_read(self, deadline_s: float) -> list[int]:
        """After the last release: wait (up to ``deadline_s``) until every owner counted in it that
        reads from this compute party (those whose explicit party it is) has read it; the ones that
        did not."""
        if not self.counted:
            return []
        mine = [o for o in self.agreed if o in self.intake.explicit_owners]
        return self.intake.wait_read(len(self.counted) - 1, mine, deadline_s)


class LeftAfterSending(Exception):
    """Raised by an :class:`OwnerAggregator` made with ``leave=True`` once it has sent round
    ``round``'s shares (``sent``: False if the round closed first): the owner does not wait for
    the release, which the compute parties keep for it (``parties.owner.release``)."""

    def __init__(self, round: int, sent: bool) -> None:
        super().__init__(f"round {round}: shares {'sent' if sent else 'too late'}; not waiting for the release")
        self.round, self.sent = round, sent


class OwnerAggregator:
    """An owner's side: its weighted contribution in, the round's released noisy sum out."""

    trust_model = "data owner of a job run by compute parties"

    def __init__(self, client: OwnerClient, *, round_wait_s: float, on_round: Callable[[int, str, int], None]
                 | None = None, send_after_s: float | None = None, leave: bool = False,
                 fetch_later: Callable[[int, float], tuple[torch.Tensor, Roster]] | None = None,
                 bound: float | None = None) -> None:
        """``round_wait_s``: how long to wait for a round to open and for its release;
        ``on_round(t, mine, owners_counted)`` after each release (``mine``: "counted", "late" or
        "refused", this owner's contribution failing the compute parties' bound check); ``send_after_s``: send
        each round's shares this long after the previous release was read (the first round: after
        this object was made), whatever the owner computed meanwhile — a fixed send time, so the
        arrival of the shares says nothing of the work behind them; ``leave``: raise
        :class:`LeftAfterSending` once the first round's shares are sent; ``fetch_later(t,
        wait_s)``: round ``t``'s release and roster from where the compute parties keep them after
        their intake stopped (asked when the intake is gone before this owner read it); ``bound``: the
        job's public ℓ2 bound of one contribution (``PrivacyPlan.member_bound``), which the compute
        parties check on the shares: a contribution over it is refused here, before anything is sent."""
        self.client, self.round_wait_s, self.on_round = client, round_wait_s, on_round
        self.send_after_s, self.leave, self.fetch_later, self.bound = send_after_s, leave, fetch_later, bound
        self.t = 0
        self.received = 0  # releases that reached this owner
        self.missed: list[int] = []
        self.overran: list[int] = []  # rounds whose work took longer than send_after_s (sent late)
        self.last: torch.Tensor | None = None  # the latest release
        self._mark = time.monotonic()

    def aggregate(self, contributions: torch.Tensor, weights: torch.Tensor, noise: NoiseSpec) -> torch.Tensor:
        v = (weights.to(torch.float64).reshape(-1, 1) * contributions.to(torch.float64)).sum(0)
        room = None if self.bound is None else self.bound * (1 + PrivacyPlan.BOUND_SLACK)
        if room is not None and not float(torch.linalg.vector_norm(v)) <= room:
            raise OwnerRangeError(f"this owner's weighted contribution is outside the job's public bound "
                                  f"{self.bound:.6g} on its ℓ2 norm (more records than privacy.public_n, or not "
                                  "finite): the compute parties would leave it out; nothing was sent")
        t, self.t = self.t, self.t + 1
        if self.send_after_s is not None:
            wait = self._mark + self.send_after_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                self.overran.append(t)
        sent = self.send(t, v)
        if self.leave:
            raise LeftAfterSending(t, sent)
        state, roster = self._released(t)
        self._mark = time.monotonic()
        uncounted(roster, self.client.owner_index, sent, self.client.explicit_name, t)
        if not sent:
            self.missed.append(t)
        self.last, self.received = state, self.received + 1
        if self.on_round is not None:
            mine = "late" if not sent else "refused" if roster.refuses(self.client.owner_index) else "counted"
            self.on_round(t, mine, roster.count)
        return state

    def _released(self, t: int) -> tuple[torch.Tensor, Roster]:
        """Round ``t``'s release and its signed roster from the intake or, once the intake has
        stopped (the job's last release, which this owner was slow to read), from ``fetch_later``."""
        try:
            return self.client.released(t, wait_s=self.round_wait_s)
        except grpc.RpcError as exc:
            if self.fetch_later is None or exc.code() not in (grpc.StatusCode.UNAVAILABLE,  # type: ignore[attr-defined]
                                                              grpc.StatusCode.CANCELLED):
                raise IntakeError.of(self.client.explicit_name, exc) from None
            state, roster = self.fetch_later(t, self.round_wait_s)
            if roster.refuses(self.client.owner_index):  # as the intake's read records it
                self.client.refused.append(t)
            return state, roster

    def send(self, t: int, v: torch.Tensor) -> bool:
        """Send round ``t``'s shares, waiting for the round to open; False if it closed first.
        Asks again with a growing pause (to RETRY_MAX_S, jittered): a thousand owners asking every
        50 ms held the compute parties' intake busy refusing them (benchmarks.many_owners_thesis).
        While the party cannot be reached (or is slow), the client's ``check`` runs between tries
        (:meth:`~.intake.OwnerClient.trouble`; it raises once the job has ended); a refusal for
        good is an :class:`~.intake.IntakeError`."""
        end = time.monotonic() + self.round_wait_s
        pause = pauses(RETRY_FIRST_S, RETRY_MAX_S)
        trouble = self.client.trouble()
        while True:
            try:
                self.client.contribute(t, v, leaving=self.leave)
                return True
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE) and \
                        time.monotonic() < end:  # a loaded compute party: the same shares again
                    trouble(exc.code())
                    time.sleep(next(pause))
                    continue
                state = round_state(exc)
                if state is None:
                    raise IntakeError.of(self.client.explicit_name, exc) from None
                now, closed = state
                if now is not None and (now > t or (now == t and closed)):
                    return False  # the compute parties closed round t without this owner
                if time.monotonic() > end:
                    raise TimeoutError(f"round {t} did not open within {self.round_wait_s:g} s") from None
                time.sleep(next(pause))
