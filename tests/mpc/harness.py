"""Shared by the tests that run real party processes: collect what each member reports, reap the
processes whatever happened, and surface any child's traceback as the test failure."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

import pytest
import torch


def tensors_from_numpy(report: dict[str, Any]) -> dict[str, Any]:
    """Children send numpy arrays through the queue (no torch pickling across spawn)."""
    return {k: torch.from_numpy(v) if hasattr(v, "dtype") else v for k, v in report.items()}


def collect_reports(
    procs: Sequence[BaseProcess],
    out_q: Any,
    members: int,
    timeout: float,
    convert: Callable[[dict[str, Any]], dict[str, Any]] = tensors_from_numpy,
) -> dict[int, dict[str, Any]]:
    """Wait up to ``timeout`` s in all for one report per member (keyed by its "rank"), then join
    or kill every process; fail the test naming the silent members or with the children's errors."""
    reports: dict[int, dict[str, Any]] = {}
    end = time.monotonic() + timeout
    try:
        while len(reports) < members:
            rep = out_q.get(timeout=max(1.0, end - time.monotonic()))
            reports[rep["rank"]] = convert(rep)
    except queue.Empty:
        pytest.fail(f"members {sorted(set(range(members)) - set(reports))} did not report in time")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    errors = [r["error"] for r in reports.values() if "error" in r]
    assert not errors, "\n".join(errors)
    return reports
