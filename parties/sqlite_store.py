"""One durable SQLite file in a daemon's state dir: what the job store and the ledger share.

Why one base: both must survive a crash between any two statements (WAL, ``synchronous = FULL``,
so a committed row survives power loss), be safe between threads (one connection behind an
``RLock``) and between processes (SQLite's locks, a busy timeout), and take their writes as
``BEGIN IMMEDIATE`` transactions that re-check what they depend on.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

__all__ = ["SqliteStore", "StoreDamaged", "state_file"]

_S = TypeVar("_S", bound="SqliteStore")


def state_file(state_dir: str | Path, name: str) -> Path:
    """``state_dir/name``, creating the directory (0700: budgets and job specs are not for others)."""
    d = Path(state_dir)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d / name


class StoreDamaged(sqlite3.DatabaseError, ValueError):
    """A store file SQLite cannot open: one line naming the file (the CLI prints it as ``error: …``)."""

    def __init__(self, path: Path, exc: sqlite3.DatabaseError) -> None:
        self.path = path
        name = getattr(exc, "sqlite_errorname", "")
        if name in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or not isinstance(exc, sqlite3.OperationalError):
            todo = ("damaged or not a SQLite database", "with the daemon stopped, move the file aside and restore a "
                    "good copy (a ledger: `mpc-erm budget rebuild` rebuilds it from the audit log)")
        else:
            todo = ("cannot be opened", "check the path, its permissions and the disk")
        super().__init__(f"{path}: {todo[0]} (SQLite: {exc}); {todo[1]}")


class SqliteStore:
    """Opens (creating if needed) ``path`` and applies ``schema`` (``;``-separated, idempotent)."""

    def __init__(self, path: str | Path, schema: str, *, timeout: float = 30.0) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        try:
            self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
        except sqlite3.DatabaseError as exc:  # "unable to open database file"
            raise StoreDamaged(self.path, exc) from None
        try:
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = FULL")  # a committed row survives power loss
            self._conn.execute("PRAGMA foreign_keys = ON")
            with self._tx() as c:
                for stmt in filter(str.strip, schema.split(";")):
                    c.execute(stmt)
        except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
            if isinstance(exc, sqlite3.OperationalError):  # locked, busy, disk full: not the file's fault
                raise
            self._conn.close()
            raise StoreDamaged(self.path, exc) from None

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self, mode: str = "IMMEDIATE") -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute(f"BEGIN {mode}")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:  # also when COMMIT itself failed
                    self._conn.execute("ROLLBACK")
                raise
