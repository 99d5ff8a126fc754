"""A daemon that answers but cannot take jobs yet says so: `mpc-erm party health` is unreachable or
"starting" (exit 1, naming what the daemon waits for) until a submission is taken, and "ok" exactly
from then on.

Why: the health check used to say ok as soon as the gRPC server ran, while the daemon's worker pool
(its fork server importing torch and the job code) was still starting; a job submitted then stalled
in its worker's start. Here the worker module's import takes SLOW_IMPORT_S
(tests/parties/slow_start_worker.py), so that window is seconds long on any machine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from click.testing import CliRunner

from tests.parties import test_daemon
from tests.parties.slow_start_worker import SLOW_IMPORT_S
from tests.parties.test_daemon import free_port, job_toml, stub, submit, write_config

ROOT = Path(__file__).resolve().parents[2]
pki_dir = test_daemon.pki_dir  # the CA and identities (a module-scoped fixture)


def _health(cfg: Path) -> tuple[str, str]:
    """("unreachable" | "starting" | "ok", what the daemon waits for)."""
    from coordinator.cli import cli

    r = CliRunner().invoke(cli, ["party", "health", "--config", str(cfg), "--timeout", "2"])
    if r.exit_code == 0:
        assert json.loads(r.stdout)["status"] == "ok", r.stdout
        return "ok", ""
    assert r.exit_code == 1, r.output
    if not r.stdout:
        assert "UNAVAILABLE" in r.stderr or "DEADLINE_EXCEEDED" in r.stderr, r.stderr
        return "unreachable", ""
    got = json.loads(r.stdout)
    assert got["status"] == "starting" and got["waiting_for"], got
    assert len(r.stderr.splitlines()) == 1 and "is starting: it takes no job yet (waiting for" in r.stderr, r.stderr
    return "starting", got["waiting_for"]


def test_health_is_starting_until_a_submission_is_taken(tmp_path: Path, pki_dir: Path) -> None:
    port = free_port()
    cfg = write_config(tmp_path, pki_dir, "alice", listen=f"127.0.0.1:{port}")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "party", "serve", "--config", str(cfg),
                             "--worker-module", "tests.parties.slow_start_worker"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    s = stub(pki_dir, port)
    seen: list[tuple[float, str, str]] = []  # (time, health, submission: "" | "refused" | "taken")
    try:
        n = 0
        while time.monotonic() - t0 < 120:
            state, waiting = _health(cfg)
            tried = ""
            if state != "unreachable":
                n += 1
                try:
                    assert submit(s, f"j{n}", job_toml("block")).accepted
                    tried = "taken"
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
                    assert re.search(r"alice is starting \(waiting for the (job-file parser|worker pool)",
                                     exc.details()), exc.details()
                    tried = "refused"
            seen.append((time.monotonic() - t0, state, tried))
            if state == "starting":  # from its first answer: the warm-up's phases, never the server's own
                assert waiting.startswith(("the job-file parser", "the worker pool")), waiting
            if tried == "taken":
                break
            time.sleep(0.1)
        hello = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        after = _health(cfg)[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    states = [h for _, h, _ in seen]
    print("\nhealth, submission:", [(round(t, 1), h, x) for t, h, x in seen])
    assert hello["event"] == "listening" and hello["port"] == port and after == "ok", (hello, after)
    # unreachable while it binds and settles its state, then starting, then ok — never back
    assert states == sorted(states, key=["unreachable", "starting", "ok"].index), states
    starting = [x for _, h, x in seen if h == "starting"]
    assert len(starting) >= 3 and "taken" not in starting[:-1], seen  # seconds of "starting", every job refused
    # the first submission taken is the first one after (or racing) the switch to ok
    assert seen[-1][2] == "taken" and all(x == "refused" for _, h, x in seen[:-1] if h != "unreachable"), seen
    first_ok = next((t for t, h, _ in seen if h == "ok"), seen[-1][0])
    assert first_ok >= SLOW_IMPORT_S - 0.5, seen  # not before the worker pool could start a worker
