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

Composition across jobs of a data set: basic composition (Σε at Σδ) by default. A job may carry a
``dp_event`` (JSON) describing its mechanism; when *every* live job of the data set has one, the
ledger also composes them with ``dp_accounting``'s RDP accountant at the data set's δ and uses
min(basic, RDP). Each bound is used only where valid: basic needs Σδ ≤ δ_total, RDP needs all events.
Events (all keys required except ``delta_extra``, a sampler's failure probability, default 0):

* ``{"kind": "gaussian", "noise_multiplier": z, "rounds": T}`` — T full-batch Gaussian rounds,
  z = σ/Δ (``GaussianDpEvent`` self-composed, the convention of ``mpc_erm.privacy.accountants``);
* ``{"kind": "laplace", "epsilon": e}`` — any pure e-DP release (per-coordinate or ℓ2-Laplace),
  accounted as binary randomized response with e, the worst case of every e-DP mechanism
  (Kairouz–Oh–Viswanath 2015); ``LaplaceDpEvent`` would be exact only for 1-D ℓ1-Laplace.
"""

from __future__ import annotations

import functools
import json
import math
import sqlite3
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .sqlite_store import SqliteStore, state_file

if TYPE_CHECKING:
    from .config import PartyConfig

__all__ = ["LEDGER_FILE", "SLACK", "AlreadyRevealed", "BudgetExceeded", "BudgetRow", "JobConflict", "Ledger",
           "LedgerError", "Reservation", "UnknownDataset", "UnknownJob", "normalise_dp_event"]

LEDGER_FILE = "ledger.sqlite3"
SLACK = 1e-9  # relative: absorbs decimal→binary rounding (3 × 0.1 vs 0.3), far below any meaningful ε
_LIVE = ("reserved", "revealed", "committed")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (dataset TEXT PRIMARY KEY, epsilon REAL NOT NULL CHECK (epsilon > 0),
    delta REAL NOT NULL CHECK (delta >= 0 AND delta < 1), updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, dataset TEXT NOT NULL REFERENCES budgets(dataset),
    epsilon REAL NOT NULL, delta REAL NOT NULL, spec_digest TEXT NOT NULL, dp_event TEXT,
    state TEXT NOT NULL CHECK (state IN ('reserved', 'revealed', 'committed', 'released')),
    reserved_at REAL NOT NULL, revealed_at REAL, finished_at REAL, reason TEXT);
CREATE INDEX IF NOT EXISTS jobs_by_dataset ON jobs (dataset, state);
"""


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
                 reserved: float, total: tuple[float, float], delta_used: float) -> None:
        self.dataset, self.job_id, self.requested = dataset, job_id, requested
        self.spent, self.reserved, self.total = spent, reserved, total
        super().__init__(
            f"dataset {dataset!r}: job {job_id!r} requests ε={requested[0]:g}, δ={requested[1]:g}; "
            f"spent ε={spent:g}, reserved ε={reserved:g}, total ε={total[0]:g} "
            f"(δ: {delta_used:g} in use of {total[1]:g}); refused, nothing reserved")


@dataclass(frozen=True)
class Reservation:
    job_id: str
    dataset: str
    epsilon: float
    delta: float
    spec_digest: str
    dp_event: dict[str, Any] | None
    state: str
    reserved_at: float
    revealed_at: float | None = None
    finished_at: float | None = None
    reason: str | None = None

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
    delta_spent: float        # Σδ (basic), for the record
    delta_reserved: float
    jobs: int                 # live jobs (not released)
    accountant: str           # which bound gave epsilon_spent + epsilon_reserved: basic | rdp | none


def _positive(name: str, x: float) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {x!r}")
    return float(x)


def _unit(name: str, x: float) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {x!r}")
    return float(x)


def normalise_dp_event(ev: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Validate a dp_event description (module docstring) and return it with canonical types."""
    if ev is None:
        return None
    keys = {"gaussian": {"kind", "noise_multiplier", "rounds"}, "laplace": {"kind", "epsilon"}}
    kind = ev.get("kind") if isinstance(ev, Mapping) else None
    if kind not in keys:
        raise ValueError(f"dp_event: kind must be 'gaussian' or 'laplace', got {kind!r}")
    if set(ev) - {"delta_extra"} != keys[kind]:
        raise ValueError(f"dp_event {kind!r} needs exactly the keys {sorted(keys[kind])} "
                         f"(+ optional delta_extra), got {sorted(ev)}")
    out: dict[str, Any] = {"kind": kind, "delta_extra": _unit("dp_event.delta_extra", ev.get("delta_extra", 0.0))}
    if kind == "gaussian":
        t = ev["rounds"]
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"dp_event.rounds must be an integer >= 1, got {t!r}")
        out.update(noise_multiplier=_positive("dp_event.noise_multiplier", ev["noise_multiplier"]), rounds=t)
    else:
        out["epsilon"] = _positive("dp_event.epsilon", ev["epsilon"])
    return out


@functools.lru_cache(maxsize=1024)
def _rdp_epsilon(counts: tuple[tuple[tuple[str, float | None, int, float | None], int], ...], delta: float) -> float:
    """RDP ε at ``delta`` of ((kind, z, rounds, e), how many jobs) — identical events are composed as
    one SelfComposedDpEvent and results are cached: RR's RDP costs dp_accounting ~0.1 s per event."""
    import dp_accounting  # lazy: ~2 s import, only needed when every job has an event
    from dp_accounting.rdp import RdpAccountant

    parts: list[dp_accounting.DpEvent] = []
    for (kind, z, rounds, eps), n in counts:
        if kind == "gaussian":
            one: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(z)
        else:  # binary RR with ε = e keeps the true bucket w.p. e^e/(1+e^e): p = 2/(1+e^e), stably
            one = dp_accounting.RandomizedResponseDpEvent(2.0 * math.exp(-eps) / (1.0 + math.exp(-eps)), 2)
        parts.append(dp_accounting.SelfComposedDpEvent(one, rounds * n))
    # REPLACE_ONE: required for RR; for GaussianDpEvent the RDP accountant gives the same as add/remove.
    acc = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.ComposedDpEvent(parts))
    return float(acc.get_epsilon(delta))


def _bound(jobs: list[tuple[float, float, str | None]], delta_total: float) -> tuple[float, str]:
    """A valid ε at δ_total for the composition of ``jobs`` (ε, δ, dp_event JSON), and its source."""
    if not jobs:
        return 0.0, "basic"
    best, how = math.inf, "none"
    if math.fsum(d for _, d, _ in jobs) <= delta_total * (1 + SLACK):
        best, how = math.fsum(e for e, _, _ in jobs), "basic"
    if all(ev is not None for _, _, ev in jobs):
        events = [json.loads(ev) for _, _, ev in jobs if ev is not None]
        d = delta_total - math.fsum(ev["delta_extra"] for ev in events)
        if d > 0:
            counts = Counter((ev["kind"], ev.get("noise_multiplier"), ev.get("rounds", 1), ev.get("epsilon"))
                             for ev in events)
            e = _rdp_epsilon(tuple(sorted(counts.items(), key=repr)), d)
            if e < best:
                best, how = e, "rdp"
    return best, how


class Ledger(SqliteStore):
    """Open (creating if needed) the ledger at ``path``; ``budgets`` maps dataset → (ε, δ) totals
    and is upserted (the config is the source of truth for totals). Thread-safe; open one Ledger
    per process (SQLite's locks and a busy timeout make processes safe against each other)."""

    def __init__(self, path: str | Path, budgets: Mapping[str, tuple[float, float]] | None = None,
                 *, timeout: float = 30.0) -> None:
        super().__init__(path, _SCHEMA, timeout=timeout)
        for ds, (eps, delta) in (budgets or {}).items():
            self.set_budget(ds, eps, delta)

    @classmethod
    def in_state_dir(cls, state_dir: str | Path, budgets: Mapping[str, tuple[float, float]] | None = None,
                     **kw: Any) -> Ledger:
        return cls(state_file(state_dir, LEDGER_FILE), budgets, **kw)

    @classmethod
    def for_config(cls, cfg: PartyConfig, **kw: Any) -> Ledger:
        return cls.in_state_dir(cfg.state_dir, {k: (d.epsilon, d.delta) for k, d in cfg.datasets.items()}, **kw)

    def set_budget(self, dataset: str, epsilon: float, delta: float) -> None:
        eps, dl = _positive("epsilon", epsilon), _unit("delta", delta)
        with self._tx() as c:
            c.execute("INSERT INTO budgets VALUES (?, ?, ?, ?) ON CONFLICT (dataset) DO UPDATE SET "
                      "epsilon = excluded.epsilon, delta = excluded.delta, updated_at = excluded.updated_at",
                      (dataset, eps, dl, time.time()))

    def reserve(self, job_id: str, dataset: str, epsilon: float, delta: float, spec_digest: str,
                dp_event: Mapping[str, Any] | None = None) -> Reservation:
        """Reserve a job's full (ε, δ), or raise BudgetExceeded; idempotent for identical numbers."""
        if not job_id or not isinstance(job_id, str) or not spec_digest or not isinstance(spec_digest, str):
            raise ValueError("job_id and spec_digest must be non-empty strings")
        eps, dl, ev = _positive("epsilon", epsilon), _unit("delta", delta), normalise_dp_event(dp_event)
        ev_json = None if ev is None else json.dumps(ev, sort_keys=True)
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
            total = c.execute("SELECT epsilon, delta FROM budgets WHERE dataset = ?", (dataset,)).fetchone()
            if total is None:
                raise UnknownDataset(f"no budget for dataset {dataset!r}")
            live = self._live(c, dataset)
            if _bound([(e, d, v) for e, d, v, _ in live] + [(eps, dl, ev_json)], total[1])[0] > total[0] * (1 + SLACK):
                spent, reserved, _ = self._split(live, total[1])
                raise BudgetExceeded(dataset, job_id, (eps, dl), spent, reserved, total,
                                     math.fsum(d for _, d, _, _ in live))
            now = time.time()
            c.execute("INSERT INTO jobs (job_id, dataset, epsilon, delta, spec_digest, dp_event, state, "
                      "reserved_at) VALUES (?, ?, ?, ?, ?, ?, 'reserved', ?)",
                      (job_id, dataset, eps, dl, spec_digest, ev_json, now))
        return Reservation(job_id, dataset, eps, dl, spec_digest, ev, "reserved", now)

    def mark_revealed(self, job_id: str, dp_event: Mapping[str, Any] | None = None) -> Reservation:
        """Call before the first reveal: from now on the job's budget can never be released.

        ``dp_event`` describes the mechanism the job actually runs (known only once the parties
        have agreed on n and calibrated the noise); with it, later jobs compose by RDP where that
        is tighter. The reserved (ε, δ) stays the job's charge under basic composition."""
        ev = normalise_dp_event(dp_event)
        r = self._move(job_id, {"reserved": "revealed"}, "revealed_at = ?")
        if ev is not None and r.dp_event is None and r.state in ("revealed", "committed"):
            with self._tx() as c:
                c.execute("UPDATE jobs SET dp_event = ? WHERE job_id = ? AND dp_event IS NULL",
                          (json.dumps(ev, sort_keys=True), job_id))
                r = self._get(c, job_id)  # type: ignore[assignment]
        return r

    def commit(self, job_id: str) -> Reservation:
        """The job finished; its budget is spent (a job that finished has revealed)."""
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
        q = "SELECT * FROM jobs WHERE state IN ('reserved', 'revealed')" + (" AND dataset = ?" if dataset else "")
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

    def spent(self, dataset: str, delta_budget: float | None = None, *, include_reserved: bool = False) -> float:
        """ε spent on ``dataset`` (revealed + committed jobs; with ``include_reserved`` also the open
        reservations) at δ = ``delta_budget`` (default: the dataset's δ total). inf if no bound is valid."""
        with self._tx("DEFERRED") as c:
            row = c.execute("SELECT delta FROM budgets WHERE dataset = ?", (dataset,)).fetchone()
            if row is None:
                raise UnknownDataset(f"no budget for dataset {dataset!r}")
            live = self._live(c, dataset)
        jobs = [(e, d, v) for e, d, v, s in live if include_reserved or s != "reserved"]
        return _bound(jobs, row[0] if delta_budget is None else _unit("delta_budget", delta_budget))[0]

    def show(self) -> list[BudgetRow]:
        """One row per dataset: totals, spent, reserved, remaining (all ε at the dataset's δ)."""
        out = []
        with self._tx("DEFERRED") as c:
            budgets = c.execute("SELECT dataset, epsilon, delta FROM budgets ORDER BY dataset").fetchall()
            lives = {ds: self._live(c, ds) for ds, _, _ in budgets}
        for ds, eps, dl in budgets:
            live = lives[ds]
            spent, reserved, how = self._split(live, dl)
            d_spent = math.fsum(d for _, d, _, s in live if s != "reserved")
            out.append(BudgetRow(ds, eps, dl, spent, reserved, max(0.0, eps - spent - reserved), d_spent,
                                 math.fsum(d for _, d, _, _ in live) - d_spent, len(live), how))
        return out

    @staticmethod
    def _split(live: list[tuple[float, float, str | None, str]], delta_total: float) -> tuple[float, float, str]:
        spent = _bound([(e, d, v) for e, d, v, s in live if s != "reserved"], delta_total)[0]
        both, how = _bound([(e, d, v) for e, d, v, _ in live], delta_total)
        return spent, both - spent if math.isfinite(both) else math.inf, how

    @staticmethod
    def _live(c: sqlite3.Connection, dataset: str) -> list[tuple[float, float, str | None, str]]:
        return c.execute("SELECT epsilon, delta, dp_event, state FROM jobs WHERE dataset = ? AND state IN "
                         "(?, ?, ?) ORDER BY reserved_at, job_id", (dataset, *_LIVE)).fetchall()

    @staticmethod
    def _get(c: sqlite3.Connection, job_id: str) -> Reservation | None:
        r = c.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return None if r is None else _row(r)


def _row(r: tuple[Any, ...]) -> Reservation:
    job_id, ds, eps, dl, digest, ev, state, t0, t1, t2, reason = r
    return Reservation(job_id, ds, eps, dl, digest, None if ev is None else json.loads(ev), state, t0, t1, t2, reason)
