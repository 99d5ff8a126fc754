"""One job through a running consortium, as the daemons benchmarks run it: submitted by the
coordinator client, watched to every member's end, its result fetched."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from coordinator.consortium import LocalConsortium
from mpc_erm.jobs.status import TERMINAL, JobStatus


def submit_and_fetch(cons: LocalConsortium, job: Path, out: Path) -> tuple[float, dict[str, Any]]:
    """When the last member's end was seen (``time.perf_counter()``), and the client's result
    (fetched into ``out``); RuntimeError naming each member's payload unless all succeeded."""
    with cons.client() as client:
        job_id = client.submit(job)["job_id"]
        ends = {e["member"]: e for e in client.watch(job_id) if e["phase"] in TERMINAL or e["phase"] == "error"}
        ended = time.perf_counter()
        bad = {m: e["payload"] for m, e in ends.items() if e["phase"] != JobStatus.SUCCEEDED}
        if bad:
            raise RuntimeError(f"the job did not succeed: {bad}")
        return ended, client.result(job_id, out)
