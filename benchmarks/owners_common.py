"""What the owner benchmarks share: run a job through a :class:`LocalConsortium`'s compute
daemons with every owner's ``parties.owner.run_owner_job`` (what ``mpc-erm owner join`` runs) in
this process, one thread each (the benchmarks say so), and collect the results."""

from __future__ import annotations

import json
import resource
import threading
import time
from pathlib import Path
from typing import Any


def raise_open_files() -> None:
    """Every owner holds a TLS channel to each compute party, all in this one process."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_owners(configs: list[Path], job_path: Path, job_id: str, wait_s: float = 900) -> dict[str, Any]:
    """Each owner's run_owner_job in its own thread: name → its summary, or the exception."""
    from mpc_erm.jobs.jobfile import load_job_file
    from parties.config import load_owner_config
    from parties.owner import run_owner_job

    job = load_job_file(job_path)
    out: dict[str, Any] = {}

    def one(path: Path) -> None:
        cfg = load_owner_config(path)
        try:
            out[cfg.identity.name] = run_owner_job(cfg, job, job_id, wait_s=wait_s)
        except Exception as exc:
            out[cfg.identity.name] = exc
            print(f"{cfg.identity.name}: {exc!r}", flush=True)

    threads = [threading.Thread(target=one, args=(p,), daemon=True) for p in configs]
    for th in threads:
        th.start()
    for th in threads:
        th.join(3600 * 4)
    return out


def run_job(cons: Any, configs: list[Path], job_path: Path, out_root: Path) -> dict[str, Any]:
    """Submit ``job_path``, run every owner, watch the compute parties to the end and fetch the
    results into ``out_root/<job_id>``. Raises unless every compute party succeeded."""
    from mpc_erm.jobs.status import TERMINAL

    tic = time.perf_counter()
    with cons.client() as client:
        job_id = client.submit(job_path)["job_id"]
        box: dict[str, Any] = {}
        th = threading.Thread(target=lambda: box.update(run_owners(configs, job_path, job_id)), daemon=True)
        th.start()
        ends = {e["member"]: e["phase"] for e in client.watch(job_id) if e["phase"] in TERMINAL}
        th.join(3600 * 4)
        wall = time.perf_counter() - tic
        if set(ends.values()) != {"succeeded"}:
            errors = [v for v in box.values() if isinstance(v, Exception)][:3]
            raise RuntimeError(f"the job ended {ends}; owners: {errors}")
        out = out_root / job_id
        client.result(job_id, out)
    return {"job_id": job_id, "dir": out, "wall_seconds": wall, "owners": box,
            "metrics": json.loads((out / "metrics.json").read_text()),
            "report": json.loads((out / "privacy_report.json").read_text()),
            "owners_failed": {k: repr(v) for k, v in box.items() if isinstance(v, Exception)}}
