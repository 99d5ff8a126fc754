"""A daemon takes jobs within seconds of its start, with its worker pool warming behind it, and a
job taken meanwhile starts only once the pool is warm: `mpc-erm party health` is unreachable,
then briefly "starting" (exit 1, naming what the daemon waits for), then "ok" with what still
warms, then plain "ok".

Why: the health check once said ok as soon as the gRPC server ran, while the worker pool (its
fork server importing torch and the job code) was still starting; a job submitted then stalled
in its worker's start with its peers' workers waiting on it. Then the daemon took no job until
its pool was warm, 8–11 s on this machine. Now it takes jobs once its parser is imported, and
holds a job it took in the admission agreement (``preparing``) until its pool is warm. Here the
worker module's import takes SLOW_IMPORT_S (tests/parties/slow_start_worker.py), so the warming
window is seconds long on any machine.
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
from tests.parties.test_daemon import free_port, job_toml, stand_in_members, status, stub, submit, write_config

ROOT = Path(__file__).resolve().parents[2]
pki_dir = test_daemon.pki_dir  # the CA and identities (a module-scoped fixture)
#: The control plane's promise: health ok within this many seconds of the daemon's start.
TAKES_JOBS_WITHIN_S = 5.0


def _health(cfg: Path) -> tuple[str, str]:
    """("unreachable" | "starting" | "ok", what the daemon waits for, or what warms behind an ok)."""
    from coordinator.cli import cli

    r = CliRunner().invoke(cli, ["party", "health", "--config", str(cfg), "--timeout", "2"])
    if r.exit_code == 0:
        got = json.loads(r.stdout)
        assert got["status"] == "ok", r.stdout
        return "ok", got.get("warming", "")
    assert r.exit_code == 1, r.output
    if not r.stdout:
        assert "UNAVAILABLE" in r.stderr or "DEADLINE_EXCEEDED" in r.stderr, r.stderr
        return "unreachable", ""
    got = json.loads(r.stdout)
    assert got["status"] == "starting" and got["waiting_for"], got
    assert len(r.stderr.splitlines()) == 1 and "is starting: it takes no job yet (waiting for" in r.stderr, r.stderr
    return "starting", got["waiting_for"]


def test_a_daemon_takes_jobs_within_seconds_and_starts_them_once_its_pool_is_warm(tmp_path: Path,
                                                                                 pki_dir: Path) -> None:
    with stand_in_members(pki_dir) as peers:  # bob and carol: agreed to every job
        port = free_port()
        cfg = write_config(tmp_path, pki_dir, "alice", listen=f"127.0.0.1:{port}", peers=peers)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "party", "serve", "--config", str(cfg),
                                 "--worker-module", "tests.parties.slow_start_worker"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        s = stub(pki_dir, port)
        seen: list[tuple[float, str, str, str]] = []  # (time, health, its detail, j1's status or the submission)
        taken = False
        try:
            while time.monotonic() - t0 < 120:
                state, detail = _health(cfg)
                job = ""
                if state != "unreachable" and not taken:
                    try:
                        assert submit(s, "j1", job_toml("block")).accepted
                        taken, job = True, "taken"
                    except grpc.RpcError as exc:
                        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
                        assert re.search(r"alice is starting \(waiting for the job-file parser", exc.details()), \
                            exc.details()
                        job = "refused"
                elif taken:
                    job = status(s, "j1")
                seen.append((time.monotonic() - t0, state, detail, job))
                if job == "running":
                    break
                time.sleep(0.1)
            hello = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
            after = _health(cfg)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    print("\nhealth, detail, job:", [(round(t, 1), h, d[:20], j) for t, h, d, j in seen])
    assert hello["event"] == "listening" and hello["port"] == port and after == ("ok", ""), (hello, after)
    states = [h for _, h, _, _ in seen]
    assert states == sorted(states, key=["unreachable", "starting", "ok"].index), states  # never back
    # ok within seconds, its pool still warming: the first ok names it, and a job is taken then
    first_ok = next(t for t, h, _, _ in seen if h == "ok")
    assert first_ok < TAKES_JOBS_WITHIN_S, seen
    warming = [(t, j) for t, h, d, j in seen if h == "ok" and d]
    assert warming and all(d.startswith("the worker pool") for _, h, d, _ in seen if h == "ok" and d), seen
    assert any(j == "taken" for _, h, _, j in seen if h in ("starting", "ok")), seen
    # the job taken waits prepared (its agreement holds it) while the pool warms, never running
    assert all(j in ("taken", "prepared") for _, j in warming), seen
    # and starts once the pool is warm: not before the worker module's import could end
    started = next(t for t, _, _, j in seen if j == "running")
    assert started >= SLOW_IMPORT_S - 0.5 and started > warming[-1][0], seen
