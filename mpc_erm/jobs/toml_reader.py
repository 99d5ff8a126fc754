"""The one strict TOML reader: job files (:mod:`.jobfile`) and daemon configs (``parties.config``).

A job file or a config is a security decision written by a person, and some arrive from a peer
(``SubmitJob``'s ``job_toml``), so reading one must fail as one short line naming what is wrong,
never as a traceback, a hang or a flood:

- **size**: at most ``max_bytes`` (default :data:`MAX_TOML_BYTES`, 1 MiB); only a regular file is
  opened (not a FIFO, not ``/dev/zero``) and never more than ``max_bytes + 1`` bytes are read;
- **text**: UTF-8, else the offending byte and its line;
- **syntax**: ``tomllib``'s error with the offending line quoted (so the key shows); nesting too
  deep for the parser (RecursionError) and integer literals over Python's 4300-digit limit
  (ValueError) are syntax errors too;
- **nesting**: no value deeper than ``max_depth`` (default :data:`MAX_DEPTH`, 8) tables/arrays —
  the real files nest 2 or 3 deep — named by its dotted path;
- **names**: hostile keys and values are quoted and cut (:func:`field_part`, :func:`short_repr`)
  before they reach a message.

Every problem is raised as :class:`TomlProblem` ``(field, reason)``; each caller turns it into its
own error type (``JobFileError``, ``ConfigError``) with the file's name in front.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from typing import Any

import tomllib

__all__ = [
    "MAX_DEPTH",
    "MAX_PROBLEMS",
    "MAX_TOML_BYTES",
    "TomlProblem",
    "dotted",
    "field_part",
    "parse_toml",
    "read_toml_file",
    "short_repr",
    "too_deep",
]

#: A job file is a few hundred bytes and a config a few kB; anything bigger is refused unread.
MAX_TOML_BYTES = 1 << 20
MAX_DEPTH = 8  # tables/arrays nested deeper than this are no job file or config
MAX_PROBLEMS = 20  # a hostile file with 100k unknown keys gets 20 lines and a count, not 100k lines
_SHOW = 60  # characters of an offending value quoted in a message


class TomlProblem(ValueError):
    """Why a TOML document cannot be used.

    ``field`` is the dotted field at fault; ``""`` when the problem is the file as a whole (its
    size, type or encoding); ``None`` when the text could not be read or parsed at all (``cannot
    read: …``, ``invalid TOML: …``)."""

    def __init__(self, field: str | None, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)


def short_repr(v: Any) -> str:
    """repr(v), cut to a readable length: a 10 MB string must not come back as a 10 MB message."""
    r = repr(v)
    return r if len(r) <= _SHOW else f"{r[:_SHOW]}…({len(r)} characters)"


def field_part(key: str) -> str:
    """A key as it appears in a ``<dotted.field>``: a hostile one (a newline would split the one-line
    report, an escape sequence would reach the terminal, 10 kB would flood it) quoted and cut."""
    if not key.isprintable():
        key = repr(key)
    return key if len(key) <= _SHOW else f"{key[:_SHOW]}…"


def dotted(loc: Iterable[str | int]) -> str:
    """``("privacy", "epsilon", 0)`` → ``privacy.epsilon[0]``, every key through :func:`field_part`."""
    out = ""
    for part in loc:
        if part == "":  # TOML allows an empty quoted key
            part = '""'
        elif isinstance(part, str):  # a hostile key: quoted if not printable, cut if long
            part = field_part(part)
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def too_deep(raw: dict[str, Any], max_depth: int = MAX_DEPTH) -> str | None:
    """The dotted path of the first value nested deeper than ``max_depth``, else None (iterative:
    no recursion, whatever the depth)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(raw, ())]
    while stack:
        node, path = stack.pop()
        if len(path) > max_depth:
            return dotted(path[:max_depth + 1])
        if isinstance(node, dict):
            stack += [(v, (*path, k)) for k, v in node.items()]
        elif isinstance(node, list):
            stack += [(v, (*path, i)) for i, v in enumerate(node)]
    return None


def parse_toml(text: str, *, max_bytes: int = MAX_TOML_BYTES, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """TOML text → dict, or :class:`TomlProblem` for size, syntax or nesting."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise TomlProblem("", f"{size:,} bytes, larger than the limit of {max_bytes:,}")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlProblem(None, f"invalid TOML: {exc}{_quote_line(text, str(exc))}") from None
    except RecursionError:
        raise TomlProblem(None, "invalid TOML: arrays or inline tables nested too deeply") from None
    except ValueError as exc:  # int("9" * 5000): Python's limit on integer digits
        m = re.search(r"[0-9_]{4000,}", text)
        where = f" at line {text.count(chr(10), 0, m.start()) + 1}" if m else ""
        raise TomlProblem(None, f"invalid TOML: a number{where} is too long ({exc})") from None
    deep = too_deep(raw, max_depth)
    if deep is not None:
        raise TomlProblem(deep, f"nested more than {max_depth} levels deep")
    return raw


def read_toml_file(path: str | os.PathLike[str], *, max_bytes: int = MAX_TOML_BYTES,
                   max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """Read a regular file of at most ``max_bytes``, as UTF-8, and :func:`parse_toml` it; every
    failure (I/O included) is a :class:`TomlProblem`."""
    try:
        with open(path, "rb") as f:  # only a regular file of bounded size is read (not a FIFO, /dev/zero)
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise TomlProblem("", "not a regular file")
            if st.st_size > max_bytes:
                raise TomlProblem("", f"{st.st_size:,} bytes, larger than the limit of {max_bytes:,}")
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise TomlProblem(None, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TomlProblem("", f"not UTF-8 text: {exc.reason} (byte {data[exc.start]:#04x} at line {line})") from None
    return parse_toml(text, max_bytes=max_bytes, max_depth=max_depth)


def _quote_line(text: str, message: str) -> str:
    """': <the offending line>' for a TOMLDecodeError's '(at line N, ...)'."""
    m = re.search(r"at line (\d+)", message)
    lines = text.splitlines()
    if not m or not 1 <= int(m[1]) <= len(lines):
        return ""
    line = lines[int(m[1]) - 1].strip()
    return f": {short_repr(line)}" if line else ""
