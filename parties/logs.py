"""The daemon's and its workers' log format: one JSON object per line, so an operator's tools read
every line the same way; each names its job and phase. Lines carry ids, phases, counts and
reasons, never data, shares, noise or keys."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from pathlib import Path
from typing import Any

__all__ = ["LOG_FILE", "DaemonLog", "JsonFormatter", "log_handlers", "one_line", "os_error_line"]

LOG_FILE = "daemon.log"  # in state_dir: the daemon's lines and its workers'


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, job_id, phase, message (+ a few extras)."""

    EXTRAS = ("member", "caller", "status", "code", "round", "rounds", "address", "pid")

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "job_id": getattr(record, "job_id", None),
            "phase": getattr(record, "phase", None),
            "message": record.getMessage(),
        }
        for key in self.EXTRAS:
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def log_handlers(state_dir: Path, to_stderr: bool) -> list[logging.Handler]:
    """``state_dir/daemon.log`` (and stderr), JSON lines."""
    handlers: list[logging.Handler] = [logging.FileHandler(state_dir / LOG_FILE, encoding="utf-8")]
    if to_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    for h in handlers:
        h.setFormatter(JsonFormatter())
    return handlers


def one_line(exc: BaseException) -> str:
    msg = " ".join(str(exc).split()) or type(exc).__name__
    return msg if len(msg) <= 2000 else msg[:1997] + "..."


class DaemonLog:
    """The daemon's logger, each line with its job id and phase (None where there is none)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def info(self, msg: str, *, job_id: str | None = None, phase: str | None = None, **extra: Any) -> None:
        self.logger.info(msg, extra={"job_id": job_id, "phase": phase, **extra})

    def warning(self, msg: str, *, job_id: str | None = None, phase: str | None = None, **extra: Any) -> None:
        self.logger.warning(msg, extra={"job_id": job_id, "phase": phase, **extra})

    def error(self, msg: str, *, job_id: str | None = None, phase: str | None = None, **extra: Any) -> None:
        self.logger.error(msg, extra={"job_id": job_id, "phase": phase, **extra})

    def exception(self, msg: str, *, job_id: str | None = None, phase: str | None = None) -> None:
        self.logger.exception(msg, extra={"job_id": job_id, "phase": phase})


def os_error_line(exc: OSError) -> str:
    """``<file>: <reason>`` for an OSError about a file (PermissionError, IsADirectoryError, …),
    its one-line text otherwise: what a command prints as its one ``error:`` line."""
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return " ".join(str(exc).split())
