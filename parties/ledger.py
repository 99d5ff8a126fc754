"""The party's durable privacy-budget ledger: one SQLite file (WAL) in the daemon's state_dir.

Why a reservation protocol: once one share of a job's output has been revealed, the privacy cost
is paid whether or not the job finishes. So a job's full (ε, δ) is *reserved* before any share
leaves the party, in one ``BEGIN IMMEDIATE`` transaction that re-checks the budget (two daemons or
threads cannot both take the last ε). The job's states::

    reserve ──► reserved ──mark_revealed──► revealed ──commit──► committed
                   │  └──────────────commit──────────────────────────┘
                   └──release──► released      (the only way back; refused once revealed)

The daemon calls :meth:`Ledger.mark_revealed` *before* it sends the first reveal message, so a crash
between the two errs on the side of counting the spend. **Restart:** :meth:`Ledger.recover` (or
:meth:`open_reservations` and a decision per job) releases every reservation that was never revealed
(no output left the party, nothing was spent) and keeps every revealed one as spent for good. Call
it at start-up, before accepting jobs; one daemon per state_dir.

Composition across jobs of a data set: every job carries its plan's typed privacy event
(:mod:`mpc_erm.privacy.events`: Gaussian rounds with a noise multiplier, pure-ε releases, or a
non-private release; each with its adjacency and its sampler's total-variation budget), made once
by the job's :class:`~mpc_erm.privacy.plan.PrivacyPlan` *before* the reservation. Admission,
``spent`` and ``show`` are one computation: :func:`mpc_erm.privacy.events.compose` of the live
jobs' events at the data set's δ under the relation its budget is stated in (``replace`` by
default: add/remove events are converted, replace-one events are refused on an ``add_remove``
budget). The samplers' terms enter once, at the composed ε: (1 + e^ε_total)·Στ.

What a job is charged: its planned event while it runs (reserved or revealing: it may still
reveal every round); once it ends, the event of the rounds it revealed (``mark_revealed`` records
the round count *before* each reveal, so a crash errs towards counting). A non-private release
(test-only zero-noise job) is admitted only on an untouched data set and then exhausts it.
Rows written before typed events existed are composed by basic composition of their (ε, δ).
"""

from __future__ import annotations

import functools
import json
import math
import sqlite3
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpc_erm.privacy.events import (
    ADJACENCIES,
    AdjacencyError,
    ApproxDp,
    Composition,
    DpEvent,
    GaussianRounds,
    NonPrivate,
    PureDp,
    compose,
    event_from_dict,
    event_from_json,
)

from .sqlite_store import SqliteStore, state_file

if TYPE_CHECKING:
    from .config import PartyConfig

__all__ = ["LEDGER_FILE", "SLACK", "AdjacencyMismatch", "AlreadyRevealed", "BudgetExceeded", "BudgetRow",
           "JobConflict", "Ledger", "LedgerError", "Reservation", "UnknownDataset", "UnknownJob", "delta_used",
           "normalise_dp_event"]

LEDGER_FILE = "ledger.sqlite3"
SLACK = 1e-9  # relative: absorbs decimal→binary rounding (3 × 0.1 vs 0.3), far below any meaningful ε
_LIVE = ("reserved", "revealed", "committed")
_COLUMNS = ("job_id, dataset, epsilon, delta, spec_digest, dp_event, state, reserved_at, revealed_at, finished_at, "
            "reason, revealed_rounds")  # in _row's order
_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (dataset TEXT PRIMARY KEY, epsilon REAL NOT NULL CHECK (epsilon > 0),
    delta REAL NOT NULL CHECK (delta >= 0 AND delta < 1), updated_at REAL NOT NULL,
    adjacency TEXT NOT NULL DEFAULT 'replace' CHECK (adjacency IN ('replace', 'add_remove')));
CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, dataset TEXT NOT NULL REFERENCES budgets(dataset),
    epsilon REAL NOT NULL, delta REAL NOT NULL, spec_digest TEXT NOT NULL, dp_event TEXT,
    state TEXT NOT NULL CHECK (state IN ('reserved', 'revealed', 'committed', 'released')),
    reserved_at REAL NOT NULL, revealed_at REAL, finished_at REAL, reason TEXT, revealed_rounds INTEGER);
CREATE INDEX IF NOT EXISTS jobs_by_dataset ON jobs (dataset, state);
"""
# columns added since the first schema: (table, column, declaration) — applied to older files
_MIGRATIONS = (
    ("budgets", "adjacency", "TEXT NOT NULL DEFAULT 'replace' CHECK (adjacency IN ('replace', 'add_remove'))"),
    ("jobs", "revealed_rounds", "INTEGER"),
)


def _covers(reserved: DpEvent | None, ev: DpEvent) -> bool:
    """A job reserved by its target alone ((ε, δ) with no event of its own) may reveal under a
    worker's event only if that event is within it: (ε, δ)-DP at the reserved δ, the sampler's TV
    counted. Otherwise the ledger would keep charging (ε, δ) for a release that costs more (a
    sampler TV against δ = 0, say) — "a different plan must not reveal"."""
    if not isinstance(reserved, ApproxDp) or reserved.delta >= 1.0:
        return False
    try:
        got = compose([ev], reserved.delta, reserved.adjacency)
    except (ValueError, AdjacencyError):
        return False
    return got.epsilon <= reserved.epsilon * (1 + 1e-12) and got.delta <= reserved.delta


class LedgerError(Exception):
    """A ledger operation that was refused (the ledger is unchanged)."""


class UnknownJob(LedgerError):
    """No reservation has this job id."""


class UnknownDataset(LedgerError):
    """The ledger has no budget for this dataset (it is not in the config)."""


class JobConflict(LedgerError):
    """Same job id, different numbers (or a job id reused after release: ids are single-use)."""


class AlreadyRevealed(LedgerError):
    """A release after the first reveal: that budget is spent for good."""


class BudgetExceeded(LedgerError):
    def __init__(self, dataset: str, job_id: str, requested: tuple[float, float], spent: float,
                 reserved: float, total: tuple[float, float], delta_used: float,
                 composed: Composition | None = None) -> None:
        self.dataset, self.job_id, self.requested = dataset, job_id, requested
        self.spent, self.reserved, self.total = spent, reserved, total
        with_it = "" if composed is None else f"; with it the data set would be at ε={composed.epsilon:g}"
        super().__init__(
            f"dataset {dataset!r}: job {job_id!r} requests ε={requested[0]:g}, δ={requested[1]:g}; "
            f"spent ε={spent:g}, reserved ε={reserved:g}, total ε={total[0]:g} "
            f"(δ: {delta_used:g} in use of {total[1]:g}){with_it}; refused, nothing reserved")


@dataclass(frozen=True)
class Reservation:
    job_id: str
    dataset: str
    epsilon: float
    delta: float
    spec_digest: str
    dp_event: DpEvent | None
    state: str
    reserved_at: float
    revealed_at: float | None = None
    finished_at: float | None = None
    reason: str | None = None
    revealed_rounds: int | None = None  # rounds marked revealed (None: all planned, once finished)

    @property
    def revealed(self) -> bool:
        return self.state in ("revealed", "committed")


@dataclass(frozen=True)
class BudgetRow:
    dataset: str
    epsilon_total: float
    delta_total: float
    epsilon_spent: float      # revealed + committed jobs
    epsilon_reserved: float   # what the open, unrevealed reservations add on top
    epsilon_remaining: float
    # δ, the same compositions seen from the other side: the least δ at which they stay within the
    # lifetime ε (ε_spent is their ε at the lifetime δ). Why not the composition's own δ: stated at
    # the lifetime δ, one Gaussian job "uses" all of it, and δ would read as gone after one job while
    # admission (ε at the lifetime δ) still has room; this δ runs out exactly when ε does.
    delta_spent: float        # of the revealed + committed jobs (0 when nothing is spent)
    delta_reserved: float     # what the open reservations add on top
    jobs: int                 # live jobs (not released)
    accountant: str           # the composition route of spent + reserved: rdp | pure | pure+rdp | basic… | none
    adjacency: str = "replace"  # the relation the budget (and every composition) is stated under
    delta_remaining: float = 0.0  # lifetime δ − δ spent − δ reserved (0 once ε is gone)


def _positive(name: str, x: float) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {x!r}")
    return float(x)


def _unit(name: str, x: float) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {x!r}")
    return float(x)


def normalise_dp_event(ev: DpEvent | Mapping[str, Any] | None) -> DpEvent | None:
    """A typed event from an event or its dict form (:func:`mpc_erm.privacy.events.event_from_dict`)."""
    if ev is None or isinstance(ev, (GaussianRounds, PureDp, ApproxDp, NonPrivate)):
        return ev
    return event_from_dict(ev)


def _stored_event(ev_json: str | None, epsilon: float, delta: float) -> DpEvent:
    """The event of a ledger row; rows from before typed events compose by their (ε, δ) alone."""
    if ev_json is not None:
        try:
            return event_from_json(ev_json)
        except (ValueError, TypeError):
            pass  # an older event format: fall through to the row's own numbers
    return ApproxDp(rounds=1, adjacency="replace", epsilon=epsilon, delta=delta)


def _charged(ev: DpEvent, state: str, revealed_rounds: int | None) -> DpEvent:
    """What a live job counts: its whole planned event while it may still reveal, the rounds it
    revealed once it has ended (NULL: all of them — a finished job, or a row restored from the log)."""
    if state == "committed" and revealed_rounds is not None:
        return ev.with_rounds(min(revealed_rounds, ev.rounds))
    return ev


_DELTA_RATIO = 1.001  # δ used is found to within 0.1 % (from above: never understated)
_DELTA_FLOOR = 1e-15  # ... and down to this fraction of the lifetime δ (below: reported as that bound)


def delta_used(events: list[DpEvent], epsilon_total: float, delta_total: float, adjacency: str) -> float:
    """The least δ ≤ ``delta_total`` at which ``events`` compose within ``epsilon_total`` (an upper
    bound within 0.1 %; exact where ε does not depend on δ: pure or basic composition); 0 for none,
    or pure ε-DP events without sampler terms; ``delta_total`` when they do not fit even there.

    The composed ε only falls as δ grows, so this is the dual of admission's figure: a job fits
    the budget iff the live jobs with it use at most the lifetime δ."""
    if not any(e.rounds for e in events):
        return 0.0
    fits = functools.partial(_fits_at, events, epsilon_total * (1 + SLACK), adjacency)
    if not fits(delta_total):
        return delta_total
    if fits(0.0):
        return 0.0
    hi = delta_total
    own = compose(events, delta_total, adjacency).delta  # basic composition's Σδ: where it becomes feasible
    if 0.0 < own < hi and fits(own):
        hi = own
    lo = delta_total * _DELTA_FLOOR
    if fits(lo):
        return lo
    while hi > lo * _DELTA_RATIO:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def _fits_at(events: list[DpEvent], epsilon: float, adjacency: str, delta: float) -> bool:
    return compose(events, delta, adjacency).epsilon <= epsilon  # type: ignore[arg-type]


def _admits(live: list[DpEvent], ev: DpEvent, total: tuple[float, float, str]) -> tuple[Composition, bool]:
    """The admission rule, for ``reserve`` and ``fits`` alike: the live jobs' events with ``ev``,
    composed at the budget's δ under its adjacency, within its ε — or a non-private job on an
    untouched data set. Raises AdjacencyError when ``ev`` cannot be stated under the budget's."""
    both = compose([*live, ev], total[1], total[2])  # type: ignore[arg-type]
    untouched = not any(e.rounds for e in live)
    return both, both.epsilon <= total[0] * (1 + SLACK) or (isinstance(ev, NonPrivate) and untouched)


class AdjacencyMismatch(LedgerError):
    """The job's adjacency cannot be composed under the data set's budget."""


class Ledger(SqliteStore):
    """Open (creating if needed) the ledger at ``path``; ``budgets`` maps dataset → (ε, δ) or
    (ε, δ, adjacency) totals and is upserted (the config is the source of truth for totals).
    Thread-safe; open one Ledger per process (SQLite's locks and a busy timeout make processes
    safe against each other)."""

    def __init__(self, path: str | Path, budgets: Mapping[str, tuple[Any, ...]] | None = None,
                 *, timeout: float = 30.0) -> None:
        super().__init__(path, _SCHEMA, timeout=timeout)
        try:
            self._migrate()
            for ds, total in (budgets or {}).items():
                self.set_budget(ds, *total)
        except BaseException:
            self.close()
            raise

    def _migrate(self) -> None:
        with self._tx() as c:
            for table, column, decl in _MIGRATIONS:
                cols = {r[1] for r in c.execute(f"PRAGMA table_info({table})").fetchall()}
                if column not in cols:
                    c.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")

    @classmethod
    def in_state_dir(cls, state_dir: str | Path, budgets: Mapping[str, tuple[Any, ...]] | None = None,
                     **kw: Any) -> Ledger:
        return cls(state_file(state_dir, LEDGER_FILE), budgets, **kw)

    @classmethod
    def for_config(cls, cfg: PartyConfig, **kw: Any) -> Ledger:
        return cls.in_state_dir(cfg.state_dir, {k: (d.epsilon, d.delta, getattr(d, "adjacency", "replace"))
                                                for k, d in cfg.datasets.items()}, **kw)

    def set_budget(self, dataset: str, epsilon: float, delta: float, adjacency: str = "replace") -> None:
        eps, dl = _positive("epsilon", epsilon), _unit("delta", delta)
        if adjacency not in ADJACENCIES:
            raise ValueError(f"adjacency must be one of {ADJACENCIES}, got {adjacency!r}")
        with self._tx() as c:
            if adjacency == "add_remove":
                # a replace-one charge has no add/remove bound: refuse, or every later composition of
                # the data set (show, spent, reserve) would raise
                stuck = []
                for ev, _ in self._live(c, dataset):
                    try:
                        ev.under("add_remove")
                    except AdjacencyError:
                        stuck.append(ev)
                if stuck:
                    raise AdjacencyMismatch(f"dataset {dataset!r}: its budget cannot be stated under 'add_remove' "
                                            f"adjacency: {len(stuck)} live job(s) on it were charged under 'replace', "
                                            "which has no add/remove guarantee; keep adjacency = 'replace' for it")
            c.execute("INSERT INTO budgets (dataset, epsilon, delta, updated_at, adjacency) VALUES (?, ?, ?, ?, ?) "
                      "ON CONFLICT (dataset) DO UPDATE SET epsilon = excluded.epsilon, delta = excluded.delta, "
                      "updated_at = excluded.updated_at, adjacency = excluded.adjacency",
                      (dataset, eps, dl, time.time(), adjacency))

    def reserve(self, job_id: str, dataset: str, epsilon: float, delta: float, spec_digest: str,
                dp_event: DpEvent | Mapping[str, Any] | None = None) -> Reservation:
        """Reserve a job by its planned event (the composed bound of every live job and this one
        must fit the data set's budget), or raise BudgetExceeded; idempotent for identical numbers.
        ``epsilon``/``delta`` are the job's own target, kept for the record; without an event the job
        is composed by basic composition of them."""
        if not job_id or not isinstance(job_id, str) or not spec_digest or not isinstance(spec_digest, str):
            raise ValueError("job_id and spec_digest must be non-empty strings")
        eps, dl = _positive("epsilon", epsilon), _unit("delta", delta)
        ev = normalise_dp_event(dp_event)
        if ev is None:
            ev = ApproxDp(rounds=1, adjacency="replace", epsilon=eps, delta=dl)
        ev_json = ev.to_json()
        with self._tx() as c:
            old = self._get(c, job_id)
            if old is not None:
                if old.state == "released":
                    raise JobConflict(f"job {job_id!r} was released ({old.reason}); job ids are single-use")
                if (old.dataset, old.epsilon, old.delta, old.spec_digest, old.dp_event) != (dataset, eps, dl,
                                                                                            spec_digest, ev):
                    raise JobConflict(f"job {job_id!r} is already reserved with different numbers: "
                                      f"{old.dataset}, ε={old.epsilon:g}, δ={old.delta:g}, {old.spec_digest}")
                return old
            total = c.execute("SELECT epsilon, delta, adjacency FROM budgets WHERE dataset = ?", (dataset,)).fetchone()
            if total is None:
                raise UnknownDataset(f"no budget for dataset {dataset!r}")
            live = self._live(c, dataset)
            try:
                both, fits = _admits([e for e, _ in live], ev, total)
            except AdjacencyError as exc:
                raise AdjacencyMismatch(f"dataset {dataset!r} has a budget stated under {total[2]!r} adjacency: "
                                        f"job {job_id!r} ({ev.adjacency}) refused: {exc}") from None
            if not fits:
                spent, reserved, _ = self._split(live, total[1], total[2])
                raise BudgetExceeded(dataset, job_id, (eps, dl), spent, reserved, (total[0], total[1]),
                                     math.fsum(e.delta for e, _ in live if isinstance(e, ApproxDp)),
                                     composed=both)
            now = time.time()
            c.execute("INSERT INTO jobs (job_id, dataset, epsilon, delta, spec_digest, dp_event, state, "
                      "reserved_at) VALUES (?, ?, ?, ?, ?, ?, 'reserved', ?)",
                      (job_id, dataset, eps, dl, spec_digest, ev_json, now))
        return Reservation(job_id, dataset, eps, dl, spec_digest, ev, "reserved", now)

    def fits(self, dataset: str, dp_event: DpEvent | Mapping[str, Any], *, excluding: Collection[str] = ()) -> bool:
        """Whether a job with this event would be admitted if the live jobs ``excluding`` were not
        there (the daemon's ordering of competing admissions asks: would it fit once the prepared
        jobs with larger ids gave way? ``parties.agreement``). Changes nothing."""
        try:
            return self.with_next(dataset, dp_event, excluding=excluding)[1]
        except AdjacencyError:
            return False

    def with_next(self, dataset: str, dp_event: DpEvent | Mapping[str, Any], *,
                  excluding: Collection[str] = ()) -> tuple[Composition, bool]:
        """What the data set's total would be with one more job of this event (every live job but
        ``excluding``, and it, composed at the lifetime δ as admission composes them), and whether
        admission would take it. Composition is not additive, so this — not lifetime minus spent —
        is what a further job costs; ``budget show`` states it. Raises AdjacencyError when the event
        cannot be stated under the budget's adjacency."""
        ev = normalise_dp_event(dp_event)
        if ev is None:
            raise ValueError("a job's event is needed")
        live, total = self._standing(dataset, excluding)
        return _admits(live, ev, total)

    def _standing(self, dataset: str,
                  excluding: Collection[str] = ()) -> tuple[list[DpEvent], tuple[float, float, str]]:
        """(what the live jobs but ``excluding`` count, the budget (ε, δ, adjacency)), read at once."""
        with self._tx("DEFERRED") as c:
            total = c.execute("SELECT epsilon, delta, adjacency FROM budgets WHERE dataset = ?", (dataset,)).fetchone()
            if total is None:
                raise UnknownDataset(f"no budget for dataset {dataset!r}")
            live = self._live(c, dataset, excluding)
        return [e for e, _ in live], total

    def largest_fitting(self, dataset: str, event_at: Callable[[float], DpEvent], upper: float, *,
                        rel_tol: float = 0.02, time_budget_s: float | None = None) -> float | None:
        """The largest target ε ≤ ``upper`` whose job, ``event_at(ε)`` (the same job calibrated for
        that ε: its δ, rounds and sampling unchanged), admission would take now — found from below
        to within ``rel_tol`` (a value that fits, never one that does not), or the best found when
        ``time_budget_s`` runs out (each step calibrates a plan; None: no limit, as ``budget show``
        asks; a daemon answering a refusal gives it a second or two). None: not even ``upper``/1000
        fits. The ledger is read once: every step is judged against the same jobs."""
        found = self.fitting_bracket(dataset, event_at, upper, rel_tol=rel_tol, time_budget_s=time_budget_s)
        return None if found is None else found[0]

    def fitting_bracket(self, dataset: str, event_at: Callable[[float], DpEvent], upper: float, *,
                        rel_tol: float = 0.02, time_budget_s: float | None = None) -> tuple[float, float] | None:
        """:meth:`largest_fitting`'s search with both ends: (an ε that fits, one above the largest
        that fits, or ``upper`` itself when it fits). The ends are within ``rel_tol`` unless the
        time budget ran out first — then a refusal must say "at least", not "the largest"."""
        live, total = self._standing(dataset)

        def fits(eps: float) -> bool:
            try:
                return _admits(live, event_at(eps), total)[1]
            except AdjacencyError:
                return False

        lo = upper / 1000.0
        if not fits(lo):
            return None
        if fits(upper):
            return upper, upper
        hi, stop = upper, time.monotonic() + (math.inf if time_budget_s is None else time_budget_s)
        while hi / lo > 1.0 + rel_tol and time.monotonic() < stop:
            mid = math.sqrt(lo * hi)
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo, hi

    def mark_revealed(self, job_id: str, dp_event: DpEvent | Mapping[str, Any] | None = None, *,
                      rounds: int | None = None) -> Reservation:
        """Call before a reveal: from now on the job's budget can never be released.

        ``rounds``: the number of rounds revealed once this reveal is done (call it before each
        round, or ahead of a batch; it only grows); None: all of the planned rounds. ``dp_event``:
        the worker's plan's event, which must be the one reserved (a different plan must not reveal)."""
        if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1):
            # checked before any change: a stored count < 0 would make every later composition of the
            # data set raise, and 0 would mark a job revealed that is then charged nothing
            raise ValueError(f"rounds must be an integer >= 1 (the rounds revealed once this reveal is done), "
                             f"got {rounds!r}")
        ev = normalise_dp_event(dp_event)
        # one transaction: a failed write (a full disk) leaves neither the state nor the count
        # changed, never a job marked revealed without its round count (it would then be charged
        # every planned round)
        with self._tx() as c:
            r = self._get(c, job_id)
            if r is None:
                raise UnknownJob(f"no reservation for job {job_id!r}")
            if ev is not None and r.dp_event != ev and not _covers(r.dp_event, ev):
                raise LedgerError(f"job {job_id!r}: the worker's privacy plan ({ev.to_json()}) is not the one reserved "
                                  f"({r.dp_event.to_json() if r.dp_event else None}); refusing to reveal")
            if r.state == "released":
                raise LedgerError(f"job {job_id!r} was released ({r.reason}); it must not reveal or commit")
            if r.state == "committed":
                return r  # repeated call: no-op
            if r.state == "reserved":
                c.execute("UPDATE jobs SET state = 'revealed', revealed_at = ? WHERE job_id = ?", (time.time(), job_id))
            planned = r.dp_event.rounds if r.dp_event is not None else 1
            want = planned if rounds is None else min(int(rounds), planned)
            c.execute("UPDATE jobs SET revealed_rounds = ? WHERE job_id = ? AND state = 'revealed' AND "
                      "(revealed_rounds IS NULL OR revealed_rounds < ?)", (want, job_id, want))
            return self._get(c, job_id)  # type: ignore[return-value]

    def commit(self, job_id: str) -> Reservation:
        """The job ended after revealing; it is charged the rounds it revealed (all of them when
        it was never marked round by round, e.g. it finished)."""
        return self._move(job_id, {"reserved": "committed", "revealed": "committed"},
                          "revealed_at = COALESCE(revealed_at, ?), finished_at = ?")

    def release(self, job_id: str, reason: str) -> Reservation:
        """Give a never-revealed reservation back (abort before the first reveal)."""
        return self._move(job_id, {"reserved": "released"}, "finished_at = ?, reason = ?", reason)

    def _move(self, job_id: str, moves: dict[str, str], sets: str, *extra: Any) -> Reservation:
        with self._tx() as c:
            r = self._get(c, job_id)
            if r is None:
                raise UnknownJob(f"no reservation for job {job_id!r}")
            target = next(iter(moves.values()))
            if r.state not in moves:
                if r.state == target or (target == "revealed" and r.state == "committed"):
                    return r  # repeated call: no-op
                if target == "released":
                    raise AlreadyRevealed(f"job {job_id!r} is {r.state}: its budget is spent and cannot be released")
                raise LedgerError(f"job {job_id!r} was released ({r.reason}); it must not reveal or commit")
            now = time.time()
            params = (now,) * (sets.count("?") - len(extra)) + extra
            c.execute(f"UPDATE jobs SET state = ?, {sets} WHERE job_id = ?", (moves[r.state], *params, job_id))
            return self._get(c, job_id)  # type: ignore[return-value]

    def get(self, job_id: str) -> Reservation | None:
        with self._tx("DEFERRED") as c:
            return self._get(c, job_id)

    def open_reservations(self, dataset: str | None = None) -> list[Reservation]:
        """Jobs neither committed nor released (``.revealed`` tells which must stay spent)."""
        q = f"SELECT {_COLUMNS} FROM jobs WHERE state IN ('reserved', 'revealed')"
        q += " AND dataset = ?" if dataset else ""
        with self._tx("DEFERRED") as c:
            rows = c.execute(q + " ORDER BY reserved_at, job_id", (dataset,) if dataset else ()).fetchall()
        return [_row(r) for r in rows]

    def recover(self, reason: str = "daemon restarted before the first reveal") -> tuple[list[Reservation],
                                                                                        list[Reservation]]:
        """At start-up: release the open reservations never revealed, keep the revealed ones.
        Returns (released, kept)."""
        released, kept = [], []
        for r in self.open_reservations():
            if r.revealed:
                kept.append(r)
            else:
                try:
                    released.append(self.release(r.job_id, reason))
                except AlreadyRevealed:  # revealed meanwhile (another daemon on this state_dir?)
                    kept.append(r)
        return released, kept

    def composition(self, dataset: str, *, include_reserved: bool = False,
                    delta: float | None = None) -> Composition:
        """The composed guarantee of the data set's jobs (spent; with ``include_reserved`` also
        the open reservations) at δ = ``delta`` (default: the data set's), under its budget's adjacency."""
        with self._tx("DEFERRED") as c:
            row = c.execute("SELECT delta, adjacency FROM budgets WHERE dataset = ?", (dataset,)).fetchone()
            if row is None:
                raise UnknownDataset(f"no budget for dataset {dataset!r}")
            live = self._live(c, dataset)
        d = row[0] if delta is None else _unit("delta_budget", delta)
        return compose([e for e, st in live if include_reserved or st != "reserved"], d, row[1])

    def spent(self, dataset: str, delta_budget: float | None = None, *, include_reserved: bool = False) -> float:
        """ε spent on ``dataset`` (revealed + committed jobs; with ``include_reserved`` also the open
        reservations) at δ = ``delta_budget`` (default: the data set's δ). inf if no bound is valid."""
        return self.composition(dataset, include_reserved=include_reserved, delta=delta_budget).epsilon

    def charges(self, dataset: str) -> list[tuple[Reservation, DpEvent]]:
        """The data set's live jobs, each with the event the ledger composes for it (its revealed
        rounds once it has ended), oldest first: what ``show`` and admission count, job by job."""
        with self._tx("DEFERRED") as c:
            return self._charges(c, dataset)

    def show(self) -> list[BudgetRow]:
        """One row per dataset: totals, spent, reserved, remaining (all ε at the dataset's δ), by
        the same composition admission uses."""
        out = []
        with self._tx("DEFERRED") as c:
            budgets = c.execute("SELECT dataset, epsilon, delta, adjacency FROM budgets ORDER BY dataset").fetchall()
            lives = {ds: self._live(c, ds) for ds, *_ in budgets}
        for ds, eps, dl, adj in budgets:
            live = lives[ds]
            spent, reserved, how = self._split(live, dl, adj)
            spent_evs = [e for e, st in live if st != "reserved"]
            d_spent = delta_used(spent_evs, eps, dl, adj)
            d_both = d_spent if len(spent_evs) == len(live) else delta_used([e for e, _ in live], eps, dl, adj)
            out.append(BudgetRow(ds, eps, dl, spent, reserved, max(0.0, eps - spent - reserved), d_spent,
                                 max(0.0, d_both - d_spent), len(live), how, adj, max(0.0, dl - d_both)))
        return out

    @staticmethod
    def _split(live: list[tuple[DpEvent, str]], delta_total: float, adjacency: str) -> tuple[float, float, str]:
        spent = compose([e for e, st in live if st != "reserved"], delta_total, adjacency).epsilon  # type: ignore[arg-type]
        both = compose([e for e, _ in live], delta_total, adjacency)  # type: ignore[arg-type]
        if not math.isfinite(both.epsilon):  # infinite reserved only if the reservations made it so
            return spent, 0.0 if not math.isfinite(spent) else math.inf, both.route
        return spent, both.epsilon - spent, both.route

    @staticmethod
    def _charges(c: sqlite3.Connection, dataset: str) -> list[tuple[Reservation, DpEvent]]:
        """Each live job of ``dataset``, oldest first, with what it counts — see :func:`_charged`."""
        rows = c.execute(f"SELECT {_COLUMNS} FROM jobs WHERE dataset = ? AND state IN (?, ?, ?) ORDER BY "
                         "reserved_at, job_id", (dataset, *_LIVE)).fetchall()
        return [(r, _charged(r.dp_event, r.state, r.revealed_rounds)) for r in map(_row, rows)]  # type: ignore[arg-type]

    @staticmethod
    def _live(c: sqlite3.Connection, dataset: str, excluding: Collection[str] = ()) -> list[tuple[DpEvent, str]]:
        """(what each live job but ``excluding`` counts, its state)."""
        skip = set(excluding)
        return [(ev, r.state) for r, ev in Ledger._charges(c, dataset) if r.job_id not in skip]

    @staticmethod
    def _get(c: sqlite3.Connection, job_id: str) -> Reservation | None:
        r = c.execute(f"SELECT {_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return None if r is None else _row(r)

    def restore_charge(self, job_id: str, dataset: str, epsilon: float, delta: float, spec_digest: str,
                       dp_event: Mapping[str, Any] | None, *, at: float | None = None,
                       reason: str = "restored from the audit log") -> Reservation:
        """Insert a job as spent (``committed``) exactly as the audit log charged it; only for
        rebuilding a lost or damaged ledger (``parties.ledger_check.rebuild_ledger``). No budget
        check (the spend happened), and ``dp_event`` is stored as the log holds it (opaque JSON).
        The data set needs a budget row; a job id the ledger already has is refused (JobConflict)."""
        if not job_id or not isinstance(job_id, str) or not spec_digest or not isinstance(spec_digest, str):
            raise ValueError("job_id and spec_digest must be non-empty strings")
        eps, dl = _positive("epsilon", epsilon), _unit("delta", delta)
        ev_json = None if dp_event is None else json.dumps(dp_event, sort_keys=True)
        t = time.time() if at is None else float(at)
        with self._tx() as c:
            if self._get(c, job_id) is not None:
                raise JobConflict(f"job {job_id!r} is already in the ledger")
            if c.execute("SELECT 1 FROM budgets WHERE dataset = ?", (dataset,)).fetchone() is None:
                raise UnknownDataset(f"no budget for dataset {dataset!r}")
            c.execute("INSERT INTO jobs (job_id, dataset, epsilon, delta, spec_digest, dp_event, state, reserved_at, "
                      "revealed_at, finished_at, reason) VALUES (?, ?, ?, ?, ?, ?, 'committed', ?, ?, ?, ?)",
                      (job_id, dataset, eps, dl, spec_digest, ev_json, t, t, t, reason))
            return self._get(c, job_id)  # type: ignore[return-value]


def _row(r: tuple[Any, ...]) -> Reservation:
    job_id, ds, eps, dl, digest, ev, state, t0, t1, t2, reason, *rest = r
    return Reservation(job_id, ds, eps, dl, digest, _stored_event(ev, eps, dl), state, t0, t1, t2, reason,
                       rest[0] if rest else None)
