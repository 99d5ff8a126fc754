"""Check, then reveal, then charge: the one place where a job's spend is ordered.

Every run (:mod:`mpc_erm.runs`) calls its guard around each reveal, whoever hosts it — a party
daemon's worker, a data owner's process, a compute party serving owners, or the simulator:

* :meth:`RevealGuard.before_reveal` — the host's cancel check; then the ledger marks the round
  revealed with the plan's event (the one reserved); then, once per job, the audit log charges the
  job. Either record failing raises, and the round is not revealed.
* :meth:`RevealGuard.defer_marks` — for an aggregator that checks every message of a round before
  it opens anything (the malicious-secure mode): ``before_reveal`` then only checks for a cancel
  and holds the round; the aggregator calls the returned mark just before it opens the release, so
  a round stopped by a failed check (nothing of it opened) is never charged.
* :meth:`RevealGuard.after_release` — the audit log records the released value (a digest, never
  the value itself: :mod:`parties.audit`).
* :meth:`RevealGuard.report` — progress: the public event and the curve point (whose private part,
  metrics on the member's own rows, stays with the member).

The run decides when a round is worth a curve point; the guard decides nothing about the model.

A host without a ledger or an audit log (the simulator; a compute party serving owners, whose owners
charge their own data) passes ``None`` for it: the order of what remains is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from mpc_erm.privacy.events import DpEvent
from mpc_erm.privacy.plan import PrivacyPlan

from .curve import CurvePoint

__all__ = ["AuditTrail", "ChargeFacts", "ProgressSink", "RevealGuard", "SpendLedger"]


class SpendLedger(Protocol):
    """A member's privacy ledger (:class:`parties.ledger.Ledger`): marks a reserved job's rounds
    revealed, refusing an event other than the one reserved."""

    def mark_revealed(self, job_id: str, dp_event: DpEvent, *, rounds: int) -> object: ...


class AuditTrail(Protocol):
    """A member's hash-chained audit log (:class:`parties.audit.AuditLog`)."""

    def charge(self, job_id: str, *, dataset: str, epsilon: float, delta: float, spec_digest: str,
               dp_event: dict[str, object]) -> object: ...

    def release(self, job_id: str, *, what: str, value: Tensor, round: int, rounds: int) -> object: ...


class ProgressSink(Protocol):
    """Where a host shows a run's progress: ``event`` is public (the job's status), ``point`` is
    the whole curve point, private part included, for the member's own eyes."""

    def event(self, event: dict[str, object]) -> None: ...

    def point(self, point: CurvePoint) -> None: ...


@dataclass(frozen=True)
class ChargeFacts:
    """What the audit log's charge states about the job: public, from its job file."""

    job_id: str
    dataset: str
    epsilon: float
    delta: float
    spec_digest: str


class RevealGuard:
    """Drives every reveal of one job run (module docstring). ``check`` raises to stop the run
    before a reveal (a cancelled job); ``ledger``, ``audit`` and ``progress`` may be ``None``;
    ``extra()`` gives the host's public counts for each curve point (the owners a round counted)."""

    def __init__(self, plan: PrivacyPlan, facts: ChargeFacts, *, check: Callable[[], None] | None = None,
                 ledger: SpendLedger | None = None, audit: AuditTrail | None = None,
                 progress: ProgressSink | None = None, extra: Callable[[], dict[str, float]] | None = None) -> None:
        self.plan, self.facts, self._extra = plan, facts, extra
        self._check, self._ledger, self._audit, self._progress = check, ledger, audit, progress
        self.charged = False  # the audit log charged the job: some round may be revealed
        self._deferred = False
        self._pending: int | None = None  # deferred: the round before_reveal announced, to mark at its opening
        self._marked = 0  # deferred: the last round marked

    @classmethod
    def unrecorded(cls, plan: PrivacyPlan) -> RevealGuard:
        """A guard with nothing to record (the simulator: no ledger, no audit log, no progress)."""
        return cls(plan, ChargeFacts("simulation", "", 0.0, 0.0, ""))

    @property
    def reports(self) -> bool:
        """Whether the host follows progress (a run then computes curve points)."""
        return self._progress is not None

    def check(self) -> None:
        """The host's cancel check alone (a run also checks while it computes, not only at reveals)."""
        if self._check is not None:
            self._check()

    def before_reveal(self, t: int) -> None:
        """Before round ``t`` is revealed: cancel check, ledger mark, the audit charge (once);
        deferred (:meth:`defer_marks`): the cancel check, and the round held for its opening."""
        self.check()
        if self._deferred:
            self._pending = t
            return
        self._mark(t)

    def defer_marks(self) -> Callable[[], None]:
        """Mark each round only when its aggregate is about to open (module docstring). Returns
        the mark, for the aggregator to call before every opening of a release: it marks the
        round ``before_reveal`` announced (once, however many openings the round makes) and
        raises if no round was announced (an opening no guard ordered)."""
        self._deferred = True
        return self._mark_pending

    def _mark_pending(self) -> None:
        if self._pending is None:
            raise RuntimeError("an aggregate is about to open with no round announced to the reveal guard")
        if self._pending != self._marked:
            self._mark(self._pending)
            self._marked = self._pending

    def _mark(self, t: int) -> None:
        if self._ledger is not None:
            self._ledger.mark_revealed(self.facts.job_id, self.plan.event, rounds=t)
        if not self.charged and self._audit is not None:
            f = self.facts
            self._audit.charge(f.job_id, dataset=f.dataset, epsilon=f.epsilon, delta=f.delta,
                               spec_digest=f.spec_digest, dp_event=self.plan.event.as_dict())
        self.charged = True

    def after_release(self, t: int, rounds: int, what: str, value: Tensor) -> None:
        """After round ``t`` of ``rounds`` was released: the audit log's release record."""
        if self._audit is not None:
            self._audit.release(self.facts.job_id, what=what, value=value, round=t, rounds=rounds)

    def epsilon_after(self, t: int) -> float:
        """ε spent once ``t`` rounds are revealed (the plan's accountant)."""
        return float(self.plan.guarantee(rounds=t).epsilon)

    def announce(self, phase: str, message: str, **fields: float) -> None:
        """A public event that is not a release (a phase starting)."""
        if self._progress is not None:
            self._progress.event({"phase": phase, "message": message, **fields})

    def report(self, t: int, rounds: int, *, test: dict[str, float] | None = None,
               own: dict[str, dict[str, float]] | None = None, extra: dict[str, float] | None = None) -> CurvePoint:
        """Progress after round ``t``'s release: the curve point (ε spent from the plan, the host's
        public counts added) as a public event and, whole, to the member's own progress file."""
        point = CurvePoint(t, self.epsilon_after(t), test=test, own=own or {},
                           extra={**(extra or {}), **(self._extra() if self._extra is not None else {})})
        if self._progress is not None:
            self._progress.event({"phase": "training", "round": t, "rounds": rounds,
                                  "epsilon_spent": point.epsilon_spent, **point.extra})
            self._progress.point(point)
        return point
