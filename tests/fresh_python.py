"""Run Python code in a fresh interpreter at the repository root: what a CLI command or a daemon's
control process imports, seen without the test process's own imports (torch among them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fresh_python(code: str, timeout_s: float = 120.0) -> list[str]:
    """``code``'s stdout lines; its stderr in the failure when it exits non-zero."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()
