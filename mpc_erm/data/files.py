"""Bounded access to the data files a party brings: every loader opens them through here.

Memory is bounded by the input, never by what a file claims: a file larger than ``max_bytes``
is refused before a byte is read (``stat``), a gzip file that inflates past ``max_bytes`` is
refused while streaming, and a line longer than :data:`MAX_LINE_BYTES` is refused. Every
failure is a ``DataError`` naming the file; a cell quoted in a message is cut short
(:func:`quote_cell`), so a hostile file is never echoed whole.
"""

from __future__ import annotations

import gzip
import io
import os
from pathlib import Path
from typing import Any

from .dataset import DataError

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_CELLS", "MAX_LINE_BYTES", "check_file", "check_size", "is_gzip",
           "line_too_long", "open_limited", "open_maybe_gzip", "quote_cell"]


#: Refuse to build a dense matrix with more cells than this (2.4 GB of float64) instead of
#: exhausting memory half-way; pass ``max_cells`` to raise it deliberately.
DEFAULT_MAX_CELLS = 300_000_000

#: Refuse a file larger than this (on disk, and after gzip decompression) before reading it; a
#: party config's ``datasets.<id>.max_bytes`` (the same default) raises it deliberately.
DEFAULT_MAX_BYTES = 512 << 20

#: Longest line (a CSV row or header, a LIBSVM row) read; a longer one is refused, not buffered.
MAX_LINE_BYTES = 4 << 20

_GZIP_MAGIC = b"\x1f\x8b"


def check_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path if it names an existing regular file, else a DataError naming it."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: file not found")
    if not p.is_file():
        raise DataError(f"{p}: not a regular file")
    return p


def is_gzip(path: Path) -> bool:
    """Detect gzip by magic bytes, so a compressed file need not end in .gz."""
    with open(path, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


def open_maybe_gzip(path: Path, mode: str = "rb") -> Any:
    """Open ``path`` for reading, decompressing transparently if it is gzip."""
    if is_gzip(path):
        return gzip.open(path, mode)
    return open(path, mode)


def check_size(p: Path, max_bytes: int | None) -> None:
    """Refuse a file over ``max_bytes`` from its size on disk, before reading any of it; a gzip
    file also by its inflated size, counted in a first pass through a 1 MiB buffer (so a
    1 MB file that inflates to 1 TB is refused in constant memory, before any parsing)."""
    if max_bytes is None:
        return
    size = p.stat().st_size
    if size > max_bytes:
        raise DataError(f"{p}: file is {size:,} bytes, larger than max_bytes={max_bytes:,}; refused "
                        f"before reading (raise max_bytes deliberately for a bigger file)")
    if is_gzip(p):
        try:
            with open_limited(p, max_bytes) as f:
                while f.read(1 << 20):
                    pass
        except (EOFError, gzip.BadGzipFile, OSError) as e:
            raise DataError(f"{p}: not a readable gzip file ({e})") from None


class _Limited(io.RawIOBase):
    """A binary reader that raises DataError once more than ``limit`` bytes came out of ``f``:
    a gzip file that inflates to gigabytes is stopped while streaming, not after."""

    def __init__(self, f: Any, limit: int | None, source: str) -> None:
        self._f, self._limit, self._source, self._n = f, limit, source, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self._f.readinto(b)
        self._n += n or 0
        if self._limit is not None and self._n > self._limit:
            raise DataError(f"{self._source}: decompresses to more than max_bytes={self._limit:,} bytes; "
                            f"refused while reading (raise max_bytes deliberately for a bigger file)")
        return int(n or 0)

    def close(self) -> None:
        self._f.close()
        super().close()


def open_limited(p: Path, max_bytes: int | None) -> io.BufferedReader:
    """``p`` as a binary stream (gunzipped if gzip) that never yields more than ``max_bytes``."""
    raw = gzip.open(p, "rb") if is_gzip(p) else open(p, "rb")
    return io.BufferedReader(_Limited(raw, max_bytes, str(p)))


def line_too_long(source: str, lineno: int) -> DataError:
    """The error for a line over :data:`MAX_LINE_BYTES` (refused, never buffered whole)."""
    return DataError(f"{source}: line {lineno} is longer than {MAX_LINE_BYTES:,} bytes; refused "
                     f"(no table this loader accepts has such rows)")


def quote_cell(v: Any) -> str:
    """A cell quoted in a message, cut to 60 characters (a 5000-digit cell is not echoed whole)."""
    r = repr(v)
    return r if len(r) <= 60 else f"{r[:60]}…({len(r)} characters)"
