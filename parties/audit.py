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
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["AUDIT_FILE", "GENESIS", "AuditError", "AuditLog", "Verification", "verify"]

AUDIT_FILE = "audit.jsonl"
GENESIS = "0" * 64


class AuditError(ValueError):
    """The audit log is not a valid chain; the message names the line."""


def _digest(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _last_hash(path: Path) -> tuple[int, str]:
    """(seq, hash) of the last record, reading only the file's tail."""
    if not path.exists() or path.stat().st_size == 0:
        return 0, GENESIS
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 65536))
        lines = f.read().splitlines()
    rec = json.loads(lines[-1])
    return int(rec["seq"]), str(rec["hash"])


class AuditLog:
    """Append-only; safe across processes (an exclusive ``flock`` around read-tail + append)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def in_state_dir(cls, state_dir: str | os.PathLike[str]) -> AuditLog:
        return cls(Path(state_dir) / AUDIT_FILE)

    def append(self, event: str, job_id: str, **fields: Any) -> dict[str, Any]:
        with self.path.open("a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                seq, prev = _last_hash(self.path)
                rec: dict[str, Any] = {"seq": seq + 1, "time": time.time(), "event": event, "job_id": job_id,
                                       **fields, "prev": prev}
                rec["hash"] = _digest(rec)
                f.write((json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode())
                f.flush()
                os.fsync(f.fileno())
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

    def head(self) -> str:
        return _last_hash(self.path)[1]


@dataclass(frozen=True)
class Verification:
    records: int
    head: str
    jobs: int
    releases: int
    after_expected: int | None = None  # records after the expected head (0: it is the head; None: none given)


def verify(path: str | os.PathLike[str], expect_head: str | None = None) -> Verification:
    """Check every record's hash and link; raise :class:`AuditError` naming the first bad line.

    ``expect_head`` (a hash kept elsewhere, e.g. a privacy report's ``audit_head``) must be the
    hash of some record of the chain (or GENESIS): the current head, or an older one followed by
    later records (``after_expected`` says how many). Not found: records were dropped from the end
    (or this is another log)."""
    p = Path(path)
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
                         f"{prev[:16]}…): records were dropped from the end, or this is another log")
    return Verification(records=seq, head=prev, jobs=len(jobs), releases=releases,
                        after_expected=None if found is None else seq - found)
