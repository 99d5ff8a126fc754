"""A stopped owner benchmark does not leave its spawned owner processes running: SIGTERM to the
benchmark ends them through its exit handler, SIGKILL through their parent-death signal. (Left
running, 8 such processes once held the cores at load 190 and failed the next test's dealer.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")

ROOT = Path(__file__).resolve().parents[1]

SLEEPER = """\
import os, time

def sleep(pid_file, q):
    with open(pid_file, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(600)
"""

PARENT = """\
import sys, threading, time
sys.path[:0] = [{root!r}, {tmp!r}]
from benchmarks.owners_common import benchmark_process_setup, in_spawned_processes
import sleeper

if __name__ == "__main__":
    benchmark_process_setup()
    threading.Thread(target=in_spawned_processes, args=(sleeper.sleep, [({pids!r},), ({pids!r},)]),
                     daemon=True).start()
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Running, and not a zombie (an orphan's zombie may wait for a container's init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_owner_processes_end_with_the_benchmark(tmp_path: Path, sig: signal.Signals) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pids = tmp_path / "pids"
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(root=str(ROOT), tmp=str(tmp_path), pids=str(pids)))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(children) < 2:
            assert time.monotonic() < deadline, "the owner processes did not start"
            assert parent.poll() is None, parent.communicate()[0].decode()
            time.sleep(0.1)
            children = [int(x) for x in pids.read_text().split()] if pids.exists() else []
        assert all(_alive(c) for c in children)
        os.kill(parent.pid, sig)
        assert parent.wait(60) == (128 + sig if sig == signal.SIGTERM else -sig)
        deadline = time.monotonic() + 60
        while any(_alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [c for c in children if _alive(c)], "owner processes outlived the benchmark"
    finally:
        parent.kill()
        for c in children:
            if _alive(c):
                os.kill(c, signal.SIGKILL)
