"""The daemon's durable job store: one SQLite file (WAL) in the daemon's state_dir.

Why durable: a coordinator may ask about a job long after it ran, and a daemon that restarts must
know which jobs it left behind. A job's life (:class:`mpc_erm.jobs.JobStatus`)::

    prepared ──► queued ──► running ──► succeeded | failed | cancelled
       │            └──────────────────► failed | cancelled
       └───────────────────────────────► refused | failed | cancelled

``prepared``: admitted and its budget reserved here, waiting for the job's other members
(:mod:`parties.agreement`); ``queued``: every member prepared it, waiting for a worker slot;
``refused``: a member refused it (the reason names the member), so it started nowhere.
Terminal states never change. On start-up the daemon ends every job still prepared, queued or
running (it died under them) ``failed`` with a reason, after the ledger's ``recover`` released their budget
unless they had revealed; a job that revealed and whose worker wrote its result manifest
(:func:`write_result_manifest`) ends ``succeeded`` instead. Events (progress, phases) are
kept per job with a sequence number so ``job watch`` can replay them and then follow live ones.

A terminal status the file cannot take (disk full, I/O error: :meth:`JobStore.finish` raises) is
still served: the store keeps it in memory and shows it in :meth:`~JobStore.get` and
:meth:`~JobStore.list` (and refuses to start the job) until a retried ``finish`` writes it, so a
job whose daemon cannot write its state does not show ``running`` for ever. A daemon that stops
first leaves the job live on disk, and its next start ends it as for any interrupted job.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mpc_erm.jobs.status import LIVE, TERMINAL, JobStatus

from .sqlite_store import SqliteStore, state_file

__all__ = ["JOBS_FILE", "LIVE", "RESULT_MANIFEST", "TERMINAL", "JobEvent", "JobExists", "JobRecord", "JobStore",
           "content_digest", "read_result_manifest", "result_files", "write_result_manifest"]

JOBS_FILE = "jobs.sqlite3"
RESULT_MANIFEST = ".complete.json"  # in the job's directory; a dot file, so never served as a result
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, status TEXT NOT NULL
        CHECK (status IN ('prepared', 'queued', 'running', 'succeeded', 'failed', 'cancelled', 'refused')),
    reason TEXT, job_toml TEXT NOT NULL, digest TEXT NOT NULL, dataset TEXT, method TEXT,
    parties TEXT NOT NULL, dealer TEXT, coordinator TEXT,
    created_at REAL NOT NULL, started_at REAL, ended_at REAL, summary TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL REFERENCES jobs(id), seq INTEGER NOT NULL, time REAL NOT NULL,
    phase TEXT NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (job_id, seq));
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, created_at);
"""


class JobExists(Exception):
    """A job with this id is already in the store."""

    def __init__(self, record: JobRecord) -> None:
        super().__init__(f"job {record.id!r} already exists ({record.status})")
        self.record = record


@dataclass(frozen=True)
class JobRecord:
    id: str
    name: str
    status: str
    reason: str | None
    job_toml: str
    digest: str
    dataset: str | None
    method: str | None
    parties: tuple[str, ...]
    dealer: str | None
    coordinator: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    summary: dict[str, Any] | None
    cancel_requested: bool

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class JobEvent:
    job_id: str
    seq: int
    time: float
    phase: str
    payload: dict[str, Any] = field(default_factory=dict)


class JobStore(SqliteStore):
    """Thread-safe; one per daemon (one daemon per state_dir)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, _SCHEMA)
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise
        self._changed = threading.Condition(self._lock)
        # terminal statuses a failed write could not store yet: job id -> (the statuses it may end
        # from, the record's new fields); shown by get/list until a retried finish() stores them
        self._unsaved: dict[str, tuple[frozenset[str], dict[str, Any]]] = {}

    def _migrate(self) -> None:
        """A table written before a status existed (``prepared``, ``refused``): rebuilt with the
        current CHECK (SQLite cannot alter a constraint in place), rows and events kept."""
        with self._lock:
            row = self._conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone()
            if row is None or all(f"'{st}'" in row[0] for st in JobStatus):
                return
            table = _SCHEMA.split(";")[0].strip().replace("CREATE TABLE IF NOT EXISTS jobs", "CREATE TABLE jobs_new")
            self._conn.execute("PRAGMA foreign_keys = OFF")  # events reference jobs: keep them through the swap
            try:
                with self._tx() as c:
                    c.execute(table)
                    c.execute("INSERT INTO jobs_new SELECT * FROM jobs")
                    c.execute("DROP TABLE jobs")
                    c.execute("ALTER TABLE jobs_new RENAME TO jobs")
                    c.execute("CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, created_at)")
            finally:
                self._conn.execute("PRAGMA foreign_keys = ON")

    @classmethod
    def in_state_dir(cls, state_dir: str | Path) -> JobStore:
        return cls(state_file(state_dir, JOBS_FILE))

    # ---- jobs

    def create(self, job_id: str, *, name: str, job_toml: str, digest: str, dataset: str | None,
               method: str | None, parties: tuple[str, ...] | list[str], dealer: str | None,
               coordinator: str | None, status: str = "queued") -> JobRecord:
        """A new job, ``queued`` or ``prepared`` (and its event of that name); JobExists if the id is taken."""
        if status not in ("queued", "prepared"):
            raise ValueError(f"a new job is queued or prepared, not {status!r}")
        now = time.time()
        message = (f"queued (submitted by {coordinator})" if status == "queued" else
                   f"prepared (submitted by {coordinator}): budget reserved; it starts once every member has "
                   "prepared it")
        with self._tx() as c:
            old = self._get(c, job_id)
            if old is not None:
                raise JobExists(old)
            c.execute("INSERT INTO jobs (id, name, status, job_toml, digest, dataset, method, parties, dealer, "
                      "coordinator, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (job_id, name, status, job_toml, digest, dataset, method, json.dumps(list(parties)), dealer,
                       coordinator, now))
            self._add_event(c, job_id, status, {"message": message}, now)
            rec = self._get(c, job_id)
            self._changed.notify_all()
        assert rec is not None
        return rec

    def set_queued(self, job_id: str, message: str) -> bool:
        """prepared → queued (its ``queued`` event says why); False if the job is no longer prepared."""
        now = time.time()
        with self._tx() as c:
            n = c.execute("UPDATE jobs SET status = 'queued' WHERE id = ? AND status = 'prepared'", (job_id,)).rowcount
            if n:
                self._add_event(c, job_id, "queued", {"message": message}, now)
                self._changed.notify_all()
        return bool(n)

    def get(self, job_id: str) -> JobRecord | None:
        with self._tx("DEFERRED") as c:
            return self._shown(self._get(c, job_id))

    def unsaved(self, job_id: str) -> bool:
        """True while the job's terminal status is held in memory only (its write failed)."""
        with self._lock:
            return job_id in self._unsaved

    def _shown(self, rec: JobRecord | None) -> JobRecord | None:
        """``rec`` with the terminal status whose write failed, if there is one (call under the lock)."""
        if rec is None or rec.id not in self._unsaved:
            return rec
        only_from, fields = self._unsaved[rec.id]
        return replace(rec, **fields) if rec.status in only_from else rec

    def list(self, limit: int = 0, statuses: Collection[str] | None = None) -> list[JobRecord]:
        """Newest first."""
        q = "SELECT * FROM jobs"
        args: list[Any] = []
        if statuses:
            q += f" WHERE status IN ({', '.join('?' * len(statuses))})"
            args += [str(x) for x in statuses]  # a JobStatus binds as its stored value
        q += " ORDER BY created_at DESC, id"
        if limit > 0:
            q += " LIMIT ?"
            args.append(limit)
        with self._tx("DEFERRED") as c:
            recs = [self._shown(_record(r)) for r in c.execute(q, args).fetchall()]
        return [r for r in recs if r is not None and (not statuses or r.status in statuses)]

    def queued(self) -> list[JobRecord]:
        """Queued jobs, oldest first (the order they run in)."""
        return sorted(self.list(statuses=("queued",)), key=lambda r: (r.created_at, r.id))

    def set_running(self, job_id: str) -> bool:
        """queued → running; False if the job is no longer queued (cancelled meanwhile, also when
        that cancel could not be written yet)."""
        now = time.time()
        with self._tx() as c:
            if job_id in self._unsaved:
                return False
            n = c.execute("UPDATE jobs SET status = 'running', started_at = ? WHERE id = ? AND status = 'queued'",
                          (now, job_id)).rowcount
            if n:
                self._add_event(c, job_id, "running", {"message": "worker starting"}, now)
                self._changed.notify_all()
        return bool(n)

    def request_cancel(self, job_id: str) -> None:
        with self._tx() as c:
            c.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))

    def finish(self, job_id: str, status: str, reason: str | None = None,
               summary: dict[str, Any] | None = None, *, only_from: Collection[str] = LIVE) -> bool:
        """Move a live job to a terminal status (and log its terminal event); False if it was not
        in one of ``only_from`` (e.g. already finished).

        If the write fails (``sqlite3.Error``: disk full, I/O error, locked), the status is kept in
        memory and served from there (see the module's docstring) and the error is raised: the
        caller retries with the same arguments (the retry keeps the first attempt's end time)."""
        if status not in TERMINAL:
            raise ValueError(f"not a terminal status: {status!r}")
        with self._lock:
            held = self._unsaved.get(job_id)
            now = held[1]["ended_at"] if held is not None else time.time()
            try:
                with self._tx() as c:
                    cur = c.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
                    if cur is None or cur[0] not in only_from:
                        self._unsaved.pop(job_id, None)
                        return False
                    c.execute("UPDATE jobs SET status = ?, reason = ?, summary = ?, ended_at = ? WHERE id = ?",
                              (status, reason, None if summary is None else json.dumps(summary, default=str), now,
                               job_id))
                    payload: dict[str, Any] = {"message": reason or status}
                    if summary is not None:
                        payload["summary"] = summary
                    self._add_event(c, job_id, status, payload, now)
            except sqlite3.Error:
                self._unsaved[job_id] = (frozenset(only_from), {"status": status, "reason": reason,
                                                                "summary": summary, "ended_at": now})
                self._changed.notify_all()  # Watch streams: the job has ended (in memory)
                raise
            self._unsaved.pop(job_id, None)
            self._changed.notify_all()
        return True

    # ---- events

    def add_event(self, job_id: str, phase: str, payload: dict[str, Any] | None = None) -> int:
        with self._tx() as c:
            seq = self._add_event(c, job_id, phase, payload or {}, time.time())
            self._changed.notify_all()
        return seq

    def events(self, job_id: str, after_seq: int = 0) -> list[JobEvent]:
        with self._tx("DEFERRED") as c:
            rows = c.execute("SELECT job_id, seq, time, phase, payload FROM events WHERE job_id = ? AND seq > ? "
                             "ORDER BY seq", (job_id, after_seq)).fetchall()
        return [JobEvent(j, s, t, p, json.loads(pl)) for j, s, t, p, pl in rows]

    def last_event(self, job_id: str, phases: tuple[str, ...] | None = None,
                   with_key: str | None = None) -> JobEvent | None:
        """The newest event of the job (restricted to ``phases``, or to payloads holding ``with_key``)."""
        q = "SELECT job_id, seq, time, phase, payload FROM events WHERE job_id = ?"
        args: list[Any] = [job_id]
        if phases:
            q += f" AND phase IN ({', '.join('?' * len(phases))})"
            args += phases
        if with_key:  # a text pre-filter, checked below: SQLite's JSON functions refuse a payload holding
            q += " AND instr(payload, ?) > 0"  # Infinity (ε of a test-only zero-noise job), which json.loads reads
            args.append(json.dumps(with_key) + ":")
        with self._tx("DEFERRED") as c:
            for r in c.execute(q + " ORDER BY seq DESC", args):
                payload = json.loads(r[4])
                if not with_key or payload.get(with_key) is not None:
                    return JobEvent(r[0], r[1], r[2], r[3], payload)
        return None

    def wait(self, timeout: float) -> None:
        """Block until any job or event changes (or ``timeout`` seconds): for Watch streams."""
        with self._changed:
            self._changed.wait(timeout)

    @staticmethod
    def _add_event(c: sqlite3.Connection, job_id: str, phase: str, payload: dict[str, Any], now: float) -> int:
        seq = c.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job_id = ?", (job_id,)).fetchone()[0]
        c.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                  (job_id, seq, now, phase, json.dumps(payload, default=str, allow_nan=True)))
        return int(seq)

    @staticmethod
    def _get(c: sqlite3.Connection, job_id: str) -> JobRecord | None:
        r = c.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if r is None else _record(r)


def _record(r: tuple[Any, ...]) -> JobRecord:
    (job_id, name, status, reason, toml, digest, dataset, method, parties, dealer, coordinator,
     created, started, ended, summary, cancel) = r
    return JobRecord(job_id, name, status, reason, toml, digest, dataset, method, tuple(json.loads(parties)),
                     dealer, coordinator, created, started, ended, None if summary is None else json.loads(summary),
                     bool(cancel))


def content_digest(path: str | Path) -> str:
    """sha256 of a ``.safetensors`` file's content independent of its header's key order: the
    header JSON with sorted keys, then the tensor bytes. "" for other files or a malformed one.

    Why: safetensors writes ``__metadata__`` in hash-map order, so the same model saved by two
    parties can differ byte for byte; this digest does not."""
    p = Path(path)
    if p.suffix != ".safetensors":
        return ""
    h = hashlib.sha256()
    try:
        with p.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > 100 << 20:
                return ""
            header = json.loads(fh.read(n))
            h.update(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    except (OSError, ValueError, struct.error):
        return ""
    return h.hexdigest()


def result_files(job_dir: str | Path) -> list[tuple[str, Path]]:
    """What a job serves as its result: the regular files under its directory, by relative path,
    except symlinks and anything under a dot name (``.private/``, the manifest)."""
    root = Path(job_dir).resolve()
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_symlink() or not p.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        out.append((rel.as_posix(), p))
    return out


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def write_result_manifest(job_dir: str | Path, summary: dict[str, Any]) -> None:
    """The worker's last write: the job's summary and the sha256 of every result file, made
    durable and renamed into place, so that it exists only once every result does.

    Why: a daemon killed after its job revealed (ε spent) but before it heard the worker's result
    must not call the job failed if the model is on disk: the user would resubmit and pay twice.
    The restarted daemon marks such a job succeeded only if this manifest matches the files."""
    root = Path(job_dir)
    files = {name: _sha256(p) for name, p in result_files(root)}
    tmp = root / (RESULT_MANIFEST + ".tmp")
    with tmp.open("w") as fh:
        json.dump({"summary": summary, "files": files}, fh, default=float, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, root / RESULT_MANIFEST)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_result_manifest(job_dir: str | Path) -> dict[str, Any] | None:
    """The summary recorded by :func:`write_result_manifest`, or None unless the manifest is
    present, well formed, and every file it lists is served (:func:`result_files`) with the same
    sha256."""
    root = Path(job_dir)
    try:
        doc = json.loads((root / RESULT_MANIFEST).read_text())
        files, summary = doc["files"], doc["summary"]
        if not isinstance(files, dict) or not files or not isinstance(summary, dict):
            return None
        served = dict(result_files(root))
        for name, digest in files.items():
            if name not in served or _sha256(served[name]) != digest:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return summary
