"""Real ``mpc-erm owner join`` processes against a local consortium (tests only): start every
owner, submit the job once each has reserved it in its own ledger, wait for all of them."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from coordinator.consortium import LocalConsortium, _child_env
from tests.reliability.faults import wait_for
from tests.reliability.test_store_errors import ledger_state


def reserved(config: Path, job_id: str) -> bool:
    """Whether the owner of ``config`` has reserved ``job_id`` in its ledger."""
    try:
        return ledger_state(config.parent / "state", job_id) is not None
    except sqlite3.Error:
        return False


def run_owner_joins(cons: LocalConsortium, configs: Mapping[str, Path], job: Path,
                    head: Callable[[str], list[str]] = lambda _o: [sys.executable, "-m", "coordinator.cli"],
                    ) -> tuple[str, dict[str, tuple[int, str, str]], dict[str, str]]:
    """(job id, owner → (exit code, stdout, stderr), member → final phase). ``head(owner)``: the
    command that runs ``owner join`` for that owner (a deviating one's wrapper, say)."""
    job_id = uuid.uuid4().hex
    env = _child_env() | {"OMP_NUM_THREADS": "1"}
    procs = {o: subprocess.Popen([*head(o), "owner", "join", "--config", str(cfg), "--job", str(job), "--job-id",
                                  job_id, "--wait", "300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 stdin=subprocess.DEVNULL, env=env)
             for o, cfg in configs.items()}
    try:
        wait_for(lambda: all(reserved(configs[o], job_id) or p.poll() is not None for o, p in procs.items()), 240,
                 "every owner to reserve the job", every=0.2)
        with cons.client() as client:
            client.submit(job, job_id=job_id)
            phases = {e["member"]: e["phase"] for e in client.watch(job_id)
                      if e["phase"] in ("succeeded", "failed", "cancelled", "error")}
        out = {}
        for o, p in procs.items():
            stdout, stderr = p.communicate(timeout=300)
            out[o] = (p.returncode, stdout, stderr)
        return job_id, out, phases
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
