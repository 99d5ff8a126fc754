"""The ledger checked against the audit log, before a daemon serves and in ``mpc-erm budget show``.

Why: the budget ledger (``ledger.sqlite3``) is the only thing that refuses a job once a data set's
ε is spent, and SQLite creates a fresh, empty file wherever the old one is missing. Deleting the
file (an admin moving the state directory, restoring an old backup, a damaged disk) would grant
the whole budget again. The hash-chained audit log (``audit.jsonl``, :mod:`parties.audit`) in the
same state directory holds every charge independently: the worker marks the ledger row revealed
*before* it appends the job's ``charge`` record, and appends ``release`` records only after it.
So at any instant every job the log charged must already be spent in the ledger.

:func:`check_ledger` verifies the audit chain and then requires, for every job the log charged
(``charge``: job_id, dataset, ε, δ, spec digest, dp_event) or released rounds of:

* a ledger row in state ``revealed`` or ``committed`` (not missing, not ``reserved``/``released``);
* on the same data set;
* with ε ≥ the ε the log charged (per job; so each data set's spent ε is never below the log's).

It also detects a ledger that is missing while the log has charges, and one SQLite cannot read
(truncated, garbage, "file is not a database", "database disk image is malformed", a failed
``PRAGMA quick_check``). Any of these raises :class:`LedgerDamaged` (a :class:`ValueError`), whose
message is one line naming the file, what is wrong and what to do; a log that does not verify
raises :class:`AuditDamaged`. The daemon runs the check in ``start()`` before it creates or opens
anything and refuses to start; ``budget show`` refuses to print. Nothing is repaired silently.

One thing is repaired first, with a log line: a *torn tail* of the audit log (a final line without
its newline or not JSON, what a crash or a full disk in the middle of an append leaves) is moved
aside to ``audit.jsonl.torn-<UTC time>`` (:func:`parties.audit.repair_tail`), so that a party
whose disk filled up mid-job serves again once space is freed. The ledger was
marked before any record was appended, so dropping a torn record never makes the ledger hold less
than the log. A torn line anywhere before the last one is damage, and still refused.

The repair is explicit, with the daemon stopped: ``mpc-erm budget rebuild --state-dir DIR`` (or
``--config``) runs :func:`rebuild_ledger`: it verifies the log, moves the damaged file (and its
``-wal``/``-shm``) aside as ``ledger.sqlite3.damaged-<UTC time>``, creates a fresh ledger and
inserts every charged job as ``committed`` with the log's dataset, ε, δ, spec digest and dp_event
(:meth:`parties.ledger.Ledger.restore_charge`). Rows the old file still holds as spent but the log
lacks (a crash between the ledger's reveal mark and the log's charge) are kept as well when the old
file can still be read: a rebuild never spends less than either source. Budget totals come from
the party config as always (the daemon and ``budget show`` write them when they open the ledger); a
data set the rebuild meets with no configured total gets total = what it has spent, so nothing
remains until the config says otherwise.

What protects against rolling back *both* files together (the whole state directory restored from
an old backup, or edited consistently): **nothing local can.** An older ledger with the older log
that matches it passes every check here, and the chain verifies. The anchor has to be outside the
party: every privacy report carries ``parameters.audit_head``, the party's chain head after that
job's last release. The coordinator keeps the report it downloads, any member or auditor can keep
any member's copy, and ``mpc-erm audit verify --config party.toml --expect-head H`` fails when ``H``
is not in the chain (the log was rolled back past that job, or is another log). A head older than
the current one is accepted and the number of records after it is printed (later jobs append to
the same chain), so the newest report one holds is the strongest anchor; a rollback to a point
after the newest anchor cannot be detected.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .audit import AUDIT_FILE, AuditError, TornTail, repair_tail, verify
from .ledger import LEDGER_FILE, SLACK, Ledger

__all__ = ["AuditDamaged", "LedgerCheck", "LedgerDamaged", "Rebuild", "StateDamaged", "check_ledger",
           "logged_charges", "rebuild_ledger"]

_SPENT = ("revealed", "committed")
_SIDECARS = ("-wal", "-shm", "-journal")


class StateDamaged(ValueError):
    """A party's privacy state cannot be trusted; ``str()`` is one line: file, problem, what to do."""

    def __init__(self, path: Path, problem: str, advice: str) -> None:
        self.path, self.problem, self.advice = path, problem, advice
        super().__init__(" ".join(f"{path}: {problem}; {advice}".split()))


class LedgerDamaged(StateDamaged):
    """The ledger is missing, unreadable, or holds less than the audit log charged."""


class AuditDamaged(StateDamaged):
    """The audit log does not verify, so the ledger cannot be checked against it (or rebuilt)."""


@dataclass(frozen=True)
class Charge:
    """A job's ``charge`` record in the audit log (the last one, should a job have several)."""

    job_id: str
    seq: int
    time: float
    dataset: str
    epsilon: float
    delta: float
    spec_digest: str
    dp_event: dict[str, Any] | None


@dataclass(frozen=True)
class LoggedCharges:
    """What a verified audit log charged: ``charges`` by job id (log order) and the jobs it
    released rounds of (``released``)."""

    path: Path
    records: int
    head: str
    charges: dict[str, Charge] = field(default_factory=dict)
    released: frozenset[str] = frozenset()


@dataclass(frozen=True)
class LedgerCheck:
    """A check that passed: how many jobs the log charged and the ledger holds as spent."""

    ledger: Path
    audit: Path
    ledger_exists: bool
    audit_records: int
    audit_head: str
    charged_jobs: int
    torn_tail: TornTail | None = None  # a torn last line of the audit log, repaired before the check


@dataclass(frozen=True)
class Rebuild:
    ledger: Path
    audit: Path
    moved_to: Path | None            # the damaged file, moved aside (None: there was none)
    restored: tuple[str, ...]        # job ids inserted as committed from the audit log
    kept: tuple[str, ...]            # spent rows of the old file the log lacks, kept as committed
    placeholder_totals: tuple[str, ...]  # data sets given total = spent (no configured total)
    audit_head: str


def _advice(state_dir: Path) -> str:
    return ("stop here and restore the right ledger file, or rebuild it from the verified audit log "
            f"with `mpc-erm budget rebuild --state-dir {state_dir}`")


def logged_charges(audit_path: str | os.PathLike[str]) -> LoggedCharges:
    """Verify the chain at ``audit_path`` and return its charges; no log: nothing charged.
    Raises :class:`AuditDamaged` when the chain does not verify."""
    p = Path(audit_path)
    if not p.exists():
        return LoggedCharges(p, 0, "0" * 64)
    try:
        v = verify(p)
    except (AuditError, OSError) as exc:
        why = re.sub(r"^(\d+): ", r"line \1: ", str(exc).removeprefix(f"{p}:").strip())
        raise AuditDamaged(p, f"does not verify ({why})",
                           "the ledger cannot be checked against it: restore the log from a copy whose head "
                           "matches the newest privacy report's audit_head (`mpc-erm audit verify --expect-head`)"
                           ) from None
    charges: dict[str, Charge] = {}
    released: set[str] = set()
    with p.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if n > v.records:  # appended after verify() read the file: checked next time
                break
            rec = json.loads(raw)
            if rec["event"] == "charge":
                try:
                    charges.pop(rec["job_id"], None)  # re-insert: keep log order of the last charge
                    charges[rec["job_id"]] = Charge(
                        str(rec["job_id"]), int(rec["seq"]), float(rec.get("time", 0.0)), str(rec["dataset"]),
                        float(rec["epsilon"]), float(rec["delta"]), str(rec["spec_digest"]), rec.get("dp_event"))
                except (KeyError, TypeError, ValueError):
                    raise AuditDamaged(p, f"line {n}: a charge record without its dataset, epsilon, delta or "
                                       "spec_digest", "restore the log from a good copy") from None
            elif rec["event"] == "release":
                released.add(str(rec["job_id"]))
    return LoggedCharges(p, v.records, v.head, charges, frozenset(released))


def _repair_audit_tail(audit_path: Path) -> TornTail | None:
    """Move a torn last line of the audit log aside (:func:`parties.audit.repair_tail`); one line
    naming the file when that cannot be done (the disk still full, say)."""
    try:
        return repair_tail(audit_path)
    except (PermissionError, NotADirectoryError, IsADirectoryError) as exc:  # not a torn record: no access
        raise AuditDamaged(audit_path, f"cannot be opened for reading and writing ({exc.strerror or exc})",
                           "give the daemon's user access to its state directory (state_dir) and start again"
                           ) from None
    except OSError as exc:
        raise AuditDamaged(audit_path, f"its last line is a torn record that cannot be moved aside "
                           f"({exc.strerror or exc})", "free space in (or repair) the state directory and start "
                           "again; the torn bytes are moved to audit.jsonl.torn-<UTC time>") from None


def _sqlite_problem(exc: sqlite3.Error) -> str:
    name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
    what = "damaged or not a SQLite database" if name in ("SQLITE_NOTADB", "SQLITE_CORRUPT") else "cannot be read"
    return f"{what} (SQLite: {exc})"


def _ledger_rows(path: Path, advice: str) -> dict[str, tuple[str, float, str]] | None:
    """job_id → (dataset, ε, state) of the ledger at ``path``; None when it has no jobs table (a
    0-byte file is an empty SQLite database). Opens read-write without creating (the daemon
    opens it next anyway); raises :class:`LedgerDamaged` where SQLite cannot read it."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=30.0,
                               isolation_level=None)
    except sqlite3.Error as exc:
        raise LedgerDamaged(path, _sqlite_problem(exc), advice) from None
    try:
        check = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
        if check != ["ok"]:
            raise LedgerDamaged(path, f"damaged (SQLite's quick_check: {'; '.join(map(str, check[:3]))})", advice)
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone() is None:
            return None
        rows = conn.execute("SELECT job_id, dataset, epsilon, state FROM jobs").fetchall()
        return {str(j): (str(ds), float(e), str(s)) for j, ds, e, s in rows}
    except sqlite3.Error as exc:
        raise LedgerDamaged(path, _sqlite_problem(exc), advice) from None
    finally:
        conn.close()


def _g(x: float) -> str:
    return f"{x:.6g}"


def check_ledger(state_dir: str | os.PathLike[str]) -> LedgerCheck:
    """Verify ``state_dir``'s audit log and check its ledger against it (module docstring).
    Creates nothing and changes nothing, except that a torn last line of the audit log is moved
    aside first (``torn_tail`` says so). Raises :class:`LedgerDamaged` or :class:`AuditDamaged`."""
    sd = Path(state_dir)
    lpath, advice = sd / LEDGER_FILE, _advice(sd)
    torn = _repair_audit_tail(sd / AUDIT_FILE)
    log = logged_charges(sd / AUDIT_FILE)  # first: any charge in it was marked in the ledger before
    jobs = set(log.charges) | set(log.released)
    if not lpath.exists():
        if jobs:
            first = next(iter(log.charges.values()), None)
            detail = f" (first: job {first.job_id!r}, ε={_g(first.epsilon)} on {first.dataset!r})" if first else ""
            raise LedgerDamaged(lpath, f"missing, but {log.path.name} charges {len(jobs)} job(s){detail}: a fresh "
                                "ledger would grant that budget again", advice)
        return LedgerCheck(lpath, log.path, False, log.records, log.head, 0, torn)
    rows = _ledger_rows(lpath, advice)
    if rows is None:
        if jobs:
            raise LedgerDamaged(lpath, f"holds no ledger tables (empty or truncated), but {log.path.name} charges "
                                f"{len(jobs)} job(s): a fresh ledger would grant that budget again", advice)
        return LedgerCheck(lpath, log.path, True, log.records, log.head, 0, torn)
    missing, unspent, moved, lower = [], [], [], []
    for job_id in sorted(jobs, key=lambda j: log.charges[j].seq if j in log.charges else math.inf):
        row, ch = rows.get(job_id), log.charges.get(job_id)
        if row is None:
            missing.append(job_id)
        elif row[2] not in _SPENT:
            unspent.append(f"{job_id!r} is {row[2]}")
        elif ch is not None and row[0] != ch.dataset:
            moved.append(f"{job_id!r} on {row[0]!r}, charged on {ch.dataset!r}")
        elif ch is not None and row[1] < ch.epsilon * (1 - SLACK):
            lower.append(f"{job_id!r} holds ε={_g(row[1])}, charged ε={_g(ch.epsilon)}")
    problems = []
    if missing:
        ch = log.charges.get(missing[0])
        first = f"{missing[0]!r}" + (f", ε={_g(ch.epsilon)} on {ch.dataset!r}, audit record {ch.seq}" if ch else "")
        problems.append(f"{len(missing)} of the {len(jobs)} job(s) charged in {log.path.name} are not in it "
                        f"(first: {first})")
    for label, items in (("charged but not spent here", unspent), ("on another data set", moved),
                         ("with less ε than charged", lower)):
        if items:
            problems.append(f"{len(items)} job(s) {label} ({items[0]}{', …' if len(items) > 1 else ''})")
    if problems:
        raise LedgerDamaged(lpath, f"does not match {log.path}: {'; '.join(problems)}. The ledger was replaced, "
                            "rolled back or edited and would grant spent budget again", advice)
    return LedgerCheck(lpath, log.path, True, log.records, log.head, len(jobs), torn)


def _old_spent_rows(path: Path) -> list[tuple[Any, ...]]:
    """Best effort: the revealed/committed rows a damaged ledger still yields (none if unreadable)."""
    if not path.exists():
        return []
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
        try:
            return conn.execute("SELECT job_id, dataset, epsilon, delta, spec_digest, dp_event, "
                                "COALESCE(revealed_at, reserved_at) FROM jobs WHERE state IN (?, ?)",
                                _SPENT).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []


def rebuild_ledger(state_dir: str | os.PathLike[str], budgets: Mapping[str, tuple[float, float]] | None = None,
                   *, force: bool = False) -> Rebuild:
    """Rebuild ``state_dir``'s ledger from its verified audit log (module docstring). Run it with
    the daemon stopped. Refuses (ValueError) when there is no audit log, when the log does not
    verify, and, unless ``force``, when the ledger already passes :func:`check_ledger`."""
    sd = Path(state_dir)
    lpath = sd / LEDGER_FILE
    _repair_audit_tail(sd / AUDIT_FILE)
    log = logged_charges(sd / AUDIT_FILE)
    if not log.path.exists():
        raise ValueError(f"{log.path}: no audit log, nothing to rebuild the ledger from (a party that never "
                         "revealed anything has no log; then delete the damaged ledger by hand)")
    orphans = sorted(log.released - set(log.charges))
    if orphans:
        raise AuditDamaged(log.path, f"job {orphans[0]!r} has releases but no charge record", "the ledger cannot "
                           "be rebuilt from it: restore the log from a good copy")
    if not force:
        try:
            check_ledger(sd)
        except LedgerDamaged:
            pass
        else:
            raise ValueError(f"{lpath}: matches {log.path.name} ({len(log.charges)} charged job(s)); nothing to "
                             "rebuild (--force rebuilds it all the same)")
    old = _old_spent_rows(lpath)
    moved_to = None
    if lpath.exists():
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        moved_to, n = lpath.with_name(f"{lpath.name}.damaged-{stamp}"), 1
        while moved_to.exists():  # two rebuilds within a second
            n += 1
            moved_to = lpath.with_name(f"{lpath.name}.damaged-{stamp}-{n}")
        os.replace(lpath, moved_to)
        for suffix in _SIDECARS:  # keep the WAL with its file: the moved copy still opens as it was
            side = lpath.with_name(lpath.name + suffix)
            if side.exists():
                os.replace(side, moved_to.with_name(moved_to.name + suffix))
    kept_rows = [r for r in old if r[0] not in log.charges]
    totals = dict(budgets or {})
    spent: dict[str, tuple[float, float]] = {}
    for ds, eps, dl in [(c.dataset, c.epsilon, c.delta) for c in log.charges.values()] + [
            (r[1], float(r[2]), float(r[3])) for r in kept_rows]:
        e, d = spent.get(ds, (0.0, 0.0))
        spent[ds] = (e + eps, d + dl)
    placeholders = tuple(sorted(ds for ds in spent if ds not in totals))
    with Ledger.in_state_dir(sd, totals) as led:
        for ds in placeholders:  # fail closed: nothing remains until the config gives the total
            led.set_budget(ds, spent[ds][0], min(spent[ds][1], math.nextafter(1.0, 0.0)))
        for c in log.charges.values():
            led.restore_charge(c.job_id, c.dataset, c.epsilon, c.delta, c.spec_digest, c.dp_event, at=c.time,
                               reason=f"restored from {log.path.name} record {c.seq}")
        for job_id, ds, eps, dl, digest, ev, at in kept_rows:
            led.restore_charge(job_id, ds, eps, dl, digest, None if ev is None else json.loads(ev), at=at,
                               reason=f"kept from {moved_to.name if moved_to else lpath.name} (not in the log)")
    check_ledger(sd)
    return Rebuild(lpath, log.path, moved_to, tuple(log.charges), tuple(r[0] for r in kept_rows), placeholders,
                   log.head)
