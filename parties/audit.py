"""The party's tamper-evident audit log of releases: one JSON line per event, hash-chained.

Why: a party's operators (and its auditors) must be able to show, after the fact, every output
that left the MPC with this party's data in it and what it cost — and notice if anyone edited,
removed or reordered an entry. Each record carries ``prev`` (the previous record's hash) and
``hash`` = SHA-256 of its own canonical JSON without ``hash``; the first record's ``prev`` is 64
zeros. Changing any byte, dropping or swapping a record breaks the chain at that point; dropping
the *tail* is caught by comparing the head hash with one kept elsewhere (every job's privacy
report carries the head after its last release: ``audit_head``). Later jobs append to the same
chain, so a report's head is usually an *older* head of the log: :func:`verify` accepts a head
found anywhere in the chain and says how many records follow it; a head not in the chain means
the log was cut back past it (or is another party's log). The newest head one holds is the
strongest anchor: a rollback to a point after it cannot be seen (see ``parties.ledger_check``).

Events:

* ``charge`` — before the first reveal of a job: dataset, (ε, δ) charged, spec digest, the
  mechanism (the ledger's ``dp_event``);
* ``release`` — one per reveal: job, round t of T, what was revealed (kind, shape) and the
  SHA-256 of the revealed float64 bytes (the value itself is already in the job's result; the log
  holds no data, share, noise or key).

``mpc-erm audit verify --config party.toml [--expect-head H]`` checks a log (:func:`verify`).

Durability: an append writes the whole record, then fsyncs; when either fails
(ENOSPC, EIO, a quota) the file is truncated back to its length before the append, so a failed
append leaves no half record and the caller gets the error (:class:`AuditWriteError`, an
``OSError`` with the errno). A crash in the middle of a write can still leave a *torn tail*: a
final line without its newline, or one that is not JSON. :func:`repair_tail` (called by
:meth:`AuditLog.append` under the lock, and by ``parties.ledger_check.check_ledger`` before it
verifies the chain, i.e. at every daemon start) moves those bytes aside to
``audit.jsonl.torn-<UTC time>`` and truncates the log to its last complete record, logging one
line; a final record that is whole but lacks only its newline gets the newline instead. Only the
final line is ever repaired: a torn or edited line anywhere before it still fails :func:`verify`.
Moving a torn tail aside cannot hide more than dropping the tail already can (a report's
``audit_head`` catches both), and the bytes are kept.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["AUDIT_FILE", "GENESIS", "AuditError", "AuditLog", "AuditWriteError", "TornTail", "Verification",
           "normalise_head", "repair_tail", "verify"]

AUDIT_FILE = "audit.jsonl"
GENESIS = "0" * 64
TORN_SUFFIX = ".torn-"  # audit.jsonl.torn-<UTC time>: a torn last line, moved aside
_KEYS = frozenset({"seq", "hash", "prev", "event", "job_id"})

log = logging.getLogger(__name__)


class AuditError(ValueError):
    """The audit log is not a valid chain; the message names the line."""


class AuditWriteError(OSError):
    """An append failed (``errno`` says why: ENOSPC, EIO, ...); the log was truncated back to its
    last complete record, so it is exactly as it was before the append."""


@dataclass(frozen=True)
class TornTail:
    """What :func:`repair_tail` did to a log's final line."""

    path: Path
    offset: int                # where the torn line started (the log's length after the repair)
    size: int                  # bytes of the torn line
    moved_to: Path | None      # where its bytes went; None: a whole record that lacked only its newline (kept)


def _digest(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _final_line(fd: int, size: int) -> tuple[int, bytes]:
    """(offset, bytes) of the file's final line (with its newline, if it has one), read backwards."""
    end = size - 1  # a trailing newline belongs to the final line
    start, chunk = end, 65536
    while start > 0:
        lo = max(0, start - chunk)
        nl = os.pread(fd, start - lo, lo).rfind(b"\n")
        if nl >= 0:
            start = lo + nl + 1
            break
        start = lo
    return start, os.pread(fd, size - start, start)


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and _KEYS <= set(rec) else None


def _torn(line: bytes) -> bool:
    """A final line that lacks its newline, or is not JSON, is a torn write (a record cut short by a
    crash or a full disk); a complete JSON line is left to :func:`verify` (an edit is not repaired)."""
    if not line.endswith(b"\n"):
        return True
    try:
        json.loads(line)
    except ValueError:
        return True
    return False


def _last_hash(path: Path) -> tuple[int, str]:
    """(seq, hash) of the last complete record, reading only the file's tail (a torn final line is
    skipped: :func:`repair_tail` deals with it)."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return 0, GENESIS
    with f:
        fd, size = f.fileno(), os.fstat(f.fileno()).st_size
        while size > 0:
            start, line = _final_line(fd, size)
            if not _torn(line):
                rec = json.loads(line)
                return int(rec["seq"]), str(rec["hash"])
            whole = _record(line) if not line.endswith(b"\n") else None
            if whole is not None and _digest(whole) == whole.get("hash"):
                return int(whole["seq"]), str(whole["hash"])
            size = start
    return 0, GENESIS


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # never for a regular file, but never loop on it
            raise OSError(errno.EIO, "write returned 0")
        view = view[n:]


def _move_aside(path: Path, data: bytes) -> Path:
    """Write ``data`` to a new ``<path>.torn-<UTC time>`` (fsynced); return its path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    n = 1
    while True:
        dest = path.with_name(f"{path.name}{TORN_SUFFIX}{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            n += 1
            continue
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except OSError:
            os.close(fd)
            dest.unlink(missing_ok=True)
            raise
        os.close(fd)
        _fsync_dir(path.parent)
        return dest


def _repair_locked(path: Path, fd: int) -> TornTail | None:
    """:func:`repair_tail` on an open descriptor whose ``flock`` the caller holds."""
    size = os.fstat(fd).st_size
    if size == 0:
        return None
    start, line = _final_line(fd, size)
    if not _torn(line):
        return None
    whole = _record(line) if not line.endswith(b"\n") else None
    if whole is not None and _digest(whole) == whole.get("hash"):  # written whole but for its newline: keep it
        os.lseek(fd, 0, os.SEEK_END)
        _write_all(fd, b"\n")
        os.fsync(fd)
        log.warning("%s: its last record (seq %s) lacked its newline (an interrupted write); newline added",
                    path, whole.get("seq"))
        return TornTail(path, start, len(line), None)
    dest = _move_aside(path, line)  # first: should the truncation fail, the bytes are in both places
    os.ftruncate(fd, start)
    os.fsync(fd)
    log.warning("%s: a torn last record (%d bytes at offset %d%s, an interrupted write) was moved to %s; the log "
                "now ends at its last complete record", path, len(line), start,
                "" if line.endswith(b"\n") else ", no newline", dest.name)
    return TornTail(path, start, len(line), dest)


def repair_tail(path: str | os.PathLike[str]) -> TornTail | None:
    """Move a torn final line of the log at ``path`` aside (see the module docstring); None when the
    log is missing, empty or ends with a complete line. Raises OSError when the bytes cannot be
    saved (e.g. the disk is still full): the log is then left as it was."""
    p = Path(path)
    try:
        f = p.open("r+b")
    except FileNotFoundError:
        return None
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            return _repair_locked(p, f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class AuditLog:
    """Append-only; safe across processes (an exclusive ``flock`` around read-tail + append)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def in_state_dir(cls, state_dir: str | os.PathLike[str]) -> AuditLog:
        return cls(Path(state_dir) / AUDIT_FILE)

    def append(self, event: str, job_id: str, **fields: Any) -> dict[str, Any]:
        """Append one record: the whole line, then fsync; on failure the file is truncated back to
        its length before the append and :class:`AuditWriteError` is raised (no half record)."""
        with self.path.open("a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                fd = f.fileno()
                try:
                    _repair_locked(self.path, fd)  # a torn tail left by a crash: the chain continues after it
                except OSError as exc:
                    raise AuditWriteError(exc.errno, f"{self.path}: its torn last record cannot be moved aside "
                                                     f"({exc.strerror or exc}); nothing appended") from exc
                seq, prev = _last_hash(self.path)
                rec: dict[str, Any] = {"seq": seq + 1, "time": time.time(), "event": event, "job_id": job_id,
                                       **fields, "prev": prev}
                rec["hash"] = _digest(rec)
                line = (json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode()
                size = os.fstat(fd).st_size
                try:
                    _write_all(fd, line)  # O_APPEND: at the end, whatever the offset
                    os.fsync(fd)
                except OSError as exc:
                    undone = "truncated back to its last complete record"
                    try:
                        os.ftruncate(fd, size)
                        os.fsync(fd)
                    except OSError as again:  # the torn tail stays; the next append or start moves it aside
                        undone = f"could not be truncated back ({again.strerror or again})"
                    raise AuditWriteError(exc.errno, f"{self.path}: appending a {event} record failed "
                                                     f"({exc.strerror or exc}); the log was {undone}") from exc
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        return rec

    def charge(self, job_id: str, *, dataset: str, epsilon: float, delta: float, spec_digest: str,
               dp_event: dict[str, Any] | None) -> dict[str, Any]:
        return self.append("charge", job_id, dataset=dataset, epsilon=epsilon, delta=delta,
                           spec_digest=spec_digest, dp_event=dp_event)

    def release(self, job_id: str, *, what: str, value: Any, round: int, rounds: int) -> dict[str, Any]:
        import numpy as np

        arr = np.ascontiguousarray(np.asarray(value.detach().cpu() if hasattr(value, "detach") else value,
                                              dtype=np.float64))
        return self.append("release", job_id, what=what, shape=list(arr.shape), round=round, rounds=rounds,
                           sha256=hashlib.sha256(arr.tobytes()).hexdigest())

    def refused(self, job_id: str, *, round: int, members: list[str], bound: float) -> dict[str, Any]:
        """Members whose contribution to ``round`` failed the bound check on its shares and was left
        out (their names and the public bound; never a value)."""
        return self.append("refused", job_id, round=round, members=members, bound=bound)

    def head(self) -> str:
        return _last_hash(self.path)[1]

    def repair_tail(self) -> TornTail | None:
        """See :func:`repair_tail`."""
        return repair_tail(self.path)


@dataclass(frozen=True)
class Verification:
    records: int
    head: str
    jobs: int
    releases: int
    after_expected: int | None = None  # records after the expected head (0: it is the head; None: none given)

    def extension(self) -> str:
        """How the log stands to the expected head, in words ("" when none was given)."""
        if self.after_expected is None:
            return ""
        if self.after_expected == 0:
            return "the expected head is the log's head"
        n = self.after_expected
        return (f"the log extends the expected head (record {self.records - n}) by {n} record{'s' if n != 1 else ''} "
                "(later jobs)")


_HEX64 = frozenset("0123456789abcdef")


def normalise_head(head: str) -> str:
    """A head as :func:`verify` compares it: 64 lower-case hex digits (blanks, case and a
    ``sha256:`` prefix dropped); ValueError naming ``--expect-head`` for anything else."""
    h = head.strip().lower().removeprefix("sha256:")
    if len(h) != 64 or not _HEX64.issuperset(h):
        shown = head if len(head) <= 24 else head[:20] + "…"
        raise ValueError(f"--expect-head: a head is 64 hex digits (a report's parameters.audit_head), got {shown!r} "
                         f"({len(h)} characters)")
    return h


def verify(path: str | os.PathLike[str], expect_head: str | None = None) -> Verification:
    """Check every record's hash and link; raise :class:`AuditError` naming the first bad line.

    ``expect_head`` (a hash kept elsewhere, e.g. a privacy report's ``audit_head``) must be the
    hash of some record of the chain (or GENESIS): the current head, or an older one that later
    records (later jobs) extend (``after_expected`` says by how many). Not found: records were
    dropped from the end (or it is another party's head). Surrounding blanks, upper case and a
    ``sha256:`` prefix are ignored; anything but 64 hex digits is a ValueError naming the field
    (a copied, cut-short head must not read as a truncated log)."""
    p = Path(path)
    if expect_head is not None:
        expect_head = normalise_head(expect_head)
    if not p.exists():
        raise AuditError(f"{p}: no audit log")
    prev, seq, jobs, releases = GENESIS, 0, set(), 0
    found: int | None = 0 if expect_head == GENESIS else None  # seq of the record whose hash is expect_head
    with p.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                rec = json.loads(raw)
            except ValueError:
                raise AuditError(f"{p}:{n}: not a JSON record") from None
            if not isinstance(rec, dict) or not {"seq", "hash", "prev", "event", "job_id"} <= set(rec):
                raise AuditError(f"{p}:{n}: not an audit record")
            if rec["prev"] != prev:
                raise AuditError(f"{p}:{n}: chain broken (prev does not match line {n - 1}'s hash: a record was "
                                 "removed, inserted or reordered)")
            if rec["seq"] != seq + 1:
                raise AuditError(f"{p}:{n}: sequence {rec['seq']} after {seq}")
            if _digest(rec) != rec["hash"]:
                raise AuditError(f"{p}:{n}: record altered (its hash does not match its content)")
            prev, seq = rec["hash"], rec["seq"]
            if rec["hash"] == expect_head:
                found = seq
            jobs.add(rec["job_id"])
            releases += rec["event"] == "release"
    if expect_head is not None and found is None:
        raise AuditError(f"{p}: the expected head {expect_head[:16]}… is not in this chain of {seq} records (head "
                         f"{prev[:16]}…): records were dropped from the end, or it is another party's head (each "
                         "party's report states its own: state_dir/jobs/JOB_ID/privacy_report.json)")
    return Verification(records=seq, head=prev, jobs=len(jobs), releases=releases,
                        after_expected=None if found is None else seq - found)
