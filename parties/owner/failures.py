"""How a data owner's run of a job ends when it does not end with the model: one line that names
the owner, the job and the reason, an exit code for each kind, and a watch that tells an owner in
trouble, within seconds, that the job it waits for has ended.

Why a watch: an owner talks to one compute party (its explicit party's owner intake). When a
compute party dies, the job fails at the others within their ``peer_timeout_s``, and their
intakes stop; an owner that can no longer reach its intake, or finds no release where the
compute parties keep it, asks every compute party's daemon for the job's state
(``GetOwnerJob``) at most once a second, and ends as soon as

* one compute party says the job ended without success (failed, cancelled) and none still runs
  it or has it succeeded — its public reason is the owner's line, with each party's state, so the
  party lost is named; or
* a majority of the compute parties cannot be reached for this owner's ``peer_timeout_s``.

The owner never asks while its rounds go well: the daemons see these calls only from owners in
trouble. Exit codes (``mpc-erm owner join --help`` and docs/reference/errors.md list them):

== =========================================================================================
0  done: the model and the privacy report are written (``--leave``: the shares are sent)
1  an internal error (its type is named; a bug to report)
2  refused before anything was sent: a bad option, config or job file, or this owner's own
   policy or budget refuses the job (its field is named)
3  the job ended at the compute parties without this owner's model (a compute party lost,
   the job failed, was cancelled or refused there)
4  a compute party refuses this owner: its certificate is revoked, or the job does not list it
5  the compute parties could not be reached, or did not start the job or release a round, in time
6  this owner's own state directory (ledger, audit log, results) cannot be written
7  a release without every compute party's signature: a compute party deviated, or the
   release was altered on its way; this owner did not use it (``parties.owner.attest``)
8  a signed release left out this owner's share after its compute party acknowledged it (or
   counted a share it never sent): a compute party deviated, or this owner's certificate was
   revoked at another compute party during the round (``parties.owner.attest.uncounted``)
== =========================================================================================
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence

import grpc

from mpc_erm.mpc import tls
from mpc_erm.mpc.party_api import party_pb2 as pb
from mpc_erm.mpc.party_api import party_pb2_grpc as pb_grpc
from mpc_erm.mpc.pki import Identity

from ..public_errors import storage_problem
from .attest import UncountedContribution, UnsignedRelease
from .intake import IntakeError

__all__ = ["EXIT_CODES", "JobEnded", "JobWatch", "LeftOut", "OwnerDenied", "OwnerFailure", "OwnerStorage",
           "PartiesUnreachable", "ReleaseRefused", "denied", "owner_failure"]

#: How often an owner in trouble asks the compute parties' daemons for the job's state.
PROBE_EVERY_S = 1.0
#: How long one such question waits for its answer.
PROBE_TIMEOUT_S = 5.0
_ENDED = ("failed", "cancelled")
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_DENIED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


class OwnerFailure(RuntimeError):
    """An owner's run that ended without the model: ``str()`` is its one line; ``charged`` says
    what this owner's ledger was charged for the job, and why (set once the ledger is settled)."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
        self.charged = ""


class JobEnded(OwnerFailure):
    """The job ended at the compute parties without this owner's model."""

    exit_code = 3


class OwnerDenied(OwnerFailure):
    """A compute party refuses this owner (revoked certificate, not one of the job's owners)."""

    exit_code = 4


class PartiesUnreachable(OwnerFailure):
    """The compute parties could not be reached, or were not ready, in time."""

    exit_code = 5


class OwnerStorage(OwnerFailure):
    """This owner's own state directory cannot be written."""

    exit_code = 6


class ReleaseRefused(OwnerFailure):
    """A release without every compute party's signature (:mod:`.attest`): not used."""

    exit_code = 7


class LeftOut(OwnerFailure):
    """A signed release whose roster contradicts this owner's share (:func:`.attest.uncounted`)."""

    exit_code = 8


EXIT_CODES = {0: "done (with --leave: the shares are sent)", 1: "an internal error (its type is named)",
              2: "refused before anything was sent (an option, the config, the job file, this owner's own "
                 "policy or budget)", JobEnded.exit_code: "the job ended at the compute parties without this "
                                                          "owner's model (a compute party lost, failed, cancelled)",
              OwnerDenied.exit_code: "a compute party refuses this owner (revoked certificate, not a listed owner)",
              PartiesUnreachable.exit_code: "the compute parties could not be reached, or were not ready, in time",
              OwnerStorage.exit_code: "this owner's own state directory cannot be written",
              ReleaseRefused.exit_code: "a release without every compute party's signature (a compute party "
                                        "deviated, or the release was altered): not used",
              LeftOut.exit_code: "a signed release left out this owner's acknowledged share (a compute party "
                                 "deviated, or this owner was revoked during the round)"}


def _short(text: str, n: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


class JobWatch:
    """Whether ``job_id`` can still release this owner's model (see the module); :meth:`check`
    raises the failure that ends the owner's run, or returns while it can."""

    def __init__(self, identity: Identity, compute: Sequence[tuple[str, str]], job_id: str, *,
                 peer_timeout_s: float, every_s: float = PROBE_EVERY_S) -> None:
        """``compute``: (name, daemon control address) of each compute party, in rank order."""
        self.identity, self.compute, self.job_id = identity, list(compute), job_id
        self.peer_timeout_s, self.every_s = peer_timeout_s, every_s
        self._next = 0.0
        self._lost_since: float | None = None

    def check(self, *, now: bool = False) -> None:
        """Ask the compute parties (at most once every ``every_s`` unless ``now``) and raise
        :class:`JobEnded`, :class:`OwnerDenied` or :class:`PartiesUnreachable` when the job cannot
        release this owner's model any more."""
        t = time.monotonic()
        if not now and t < self._next:
            return
        self._next = t + self.every_s
        states = {name: self._ask(name, address) for name, address in self.compute}
        denied = [f"{n}: {why}" for n, (s, why) in states.items() if s == "denied"]
        if denied:
            raise OwnerDenied(f"job {self.job_id}: the compute parties refuse {self.identity.name}: "
                              + "; ".join(denied))
        ended = [n for n, (s, _) in states.items() if s in _ENDED]
        going = [n for n, (s, _) in states.items() if s not in (*_ENDED, "unreachable", "absent")]
        if ended and not going:
            raise JobEnded(f"job {self.job_id} ended at the compute parties: "
                           + "; ".join(f"{n}: {s}" + (f" ({why})" if why else "") for n, (s, why) in states.items()))
        lost = [n for n, (s, _) in states.items() if s == "unreachable"]
        if 2 * len(lost) <= len(self.compute):
            self._lost_since = None
            return
        self._lost_since = self._lost_since or t
        if t - self._lost_since >= self.peer_timeout_s:
            raise PartiesUnreachable(f"job {self.job_id}: compute part{'ies' if len(lost) > 1 else 'y'} "
                                     f"{', '.join(lost)} unreachable for {t - self._lost_since:.0f} s (peer_timeout_s "
                                     f"{self.peer_timeout_s:g}): " + "; ".join(f"{n}: {states[n][1]}" for n in lost))

    def _ask(self, name: str, address: str) -> tuple[str, str]:
        """(the job's status at ``name`` or "unreachable"/"absent"/"denied", its public reason)."""
        from ..rendezvous import grpc_options

        try:
            with tls.secure_channel(address, self.identity, f"party/{name}", grpc_options()) as ch:
                r = pb_grpc.PartyControlStub(ch).GetOwnerJob(pb.JobRef(job_id=self.job_id), timeout=PROBE_TIMEOUT_S)
        except grpc.RpcError as exc:
            code, details = exc.code(), _short(exc.details() or "")  # type: ignore[attr-defined]
            if code in _UNREACHABLE:
                return "unreachable", code.name
            if code == grpc.StatusCode.NOT_FOUND:
                return "absent", "the job is not there"
            if code in _DENIED:
                return "denied", details
            return "unknown", f"{code.name}: {details}"
        return str(r.status), _short(r.reason)


def denied(party: str, owner: str, code: grpc.StatusCode, details: str) -> OwnerDenied | None:
    """:class:`OwnerDenied` if ``code`` is a compute party's refusal of this owner itself (its
    certificate revoked, or not one the job lists), else None."""
    if code not in _DENIED:
        return None
    return OwnerDenied(f"compute party {party} refuses {owner}: {_short(details)}")


def owner_failure(exc: BaseException, owner: str, watch: JobWatch | None = None) -> OwnerFailure | None:
    """The :class:`OwnerFailure` that ``exc`` is for this owner, or None for an exception that is
    not a failure of the run (a refusal before sending, a bug: the caller reports those). A lost
    intake asks ``watch`` first, so the line names why the job ended, not only the party lost."""
    if isinstance(exc, OwnerFailure):
        return exc
    if isinstance(exc, UnsignedRelease):
        return ReleaseRefused(str(exc))
    if isinstance(exc, UncountedContribution):
        return LeftOut(str(exc))
    if isinstance(exc, IntakeError):
        if (refused := denied(exc.party, owner, exc.code, exc.details)) is not None:
            return refused
        if exc.code in _UNREACHABLE:
            if watch is not None:
                try:
                    watch.check(now=True)
                except OwnerFailure as ended:
                    return ended
            return PartiesUnreachable(f"compute party {exc.party} unreachable ({exc.code.name}): {_short(exc.details)}")
        return JobEnded(f"compute party {exc.party} ended {owner}'s part in the job ({exc.code.name}): "
                        f"{_short(exc.details)}")
    if isinstance(exc, TimeoutError):
        return PartiesUnreachable(_short(str(exc)))
    if (disk := storage_problem(exc)) is not None or isinstance(exc, sqlite3.OperationalError):
        return OwnerStorage(f"{owner}'s state directory (ledger, audit log, results) cannot be written "
                            f"({disk or _short(str(exc), 120)})")
    return None
