"""`mpc-erm party serve` / `dealer serve` that cannot start end with one line naming the address or
the file and a non-zero status, never a traceback — through the real entry point, in a subprocess.

Unreadable files: as root, the file's mode does not stop a read, so the command runs under capsh
without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH (skipped where neither a non-root user nor capsh is
available).
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.parties import test_health_cli
from tests.parties.test_health_cli import write_config

ROOT = Path(__file__).resolve().parents[2]
pki_dir = test_health_cli.pki_dir  # alice, bob (parties) and the dealer (a module-scoped fixture)


def serve(role: str, config: Path, *, unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "coordinator.cli", role, "serve", "--config", str(config)]
    if unprivileged and os.geteuid() == 0:
        capsh = shutil.which("capsh")
        if capsh is None:
            pytest.skip("running as root without capsh: a file's mode cannot make it unreadable")
        cmd = [capsh, "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", "exec " + shlex.join(cmd)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)


def one_line_naming(r: subprocess.CompletedProcess[str], *words: str) -> str:
    assert r.returncode != 0 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    line = r.stderr.strip()
    assert line.startswith("error: "), line
    for w in words:
        assert w in line, (w, line)
    return line


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("role", ["party", "dealer"])
def test_a_port_in_use_is_one_line_naming_the_address(tmp_path: Path, pki_dir: Path, taken: int, role: str) -> None:
    name = "dealer" if role == "dealer" else "alice"
    cfg = write_config(tmp_path, pki_dir, name, f"127.0.0.1:{taken}", dealer=role == "dealer")
    line = one_line_naming(serve(role, cfg), f"listen: cannot bind 127.0.0.1:{taken}", "in use")
    assert "add_port" not in line
    # refused before its state was read or settled: a daemon already serving this config keeps its jobs
    assert not (cfg.parent / "state").exists()


@pytest.mark.parametrize("which", ["config", "key", "data"])
def test_an_unreadable_file_is_one_line_naming_it(tmp_path: Path, pki_dir: Path, which: str) -> None:
    keys = tmp_path / "pki"
    shutil.copytree(pki_dir, keys)
    cfg = write_config(tmp_path, keys, "alice", "127.0.0.1:0", advertise="127.0.0.1:1")
    target = {"config": cfg, "key": keys / "alice.key", "data": cfg.parent / "rows.npz"}[which]
    target.chmod(0)
    line = one_line_naming(serve("party", cfg, unprivileged=True), str(target))
    assert "ermission denied" in line or "not readable" in line, line
    assert not (cfg.parent / "state").exists()  # nothing was created
