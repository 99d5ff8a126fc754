"""What the owner benchmarks share: run a job through a :class:`LocalConsortium`'s compute
daemons with every owner's ``parties.owner.run_owner_job`` (what ``mpc-erm owner join`` runs), one
thread each, in this process or spread over ``procs`` spawned processes (the benchmarks say which),
and collect the results."""

from __future__ import annotations

import json
import resource
import threading
import time
from pathlib import Path
from typing import Any


def owners_process_setup() -> None:
    """What a process hosting many owners needs: one torch thread (the cores are shared with the
    daemons), dp_accounting's per-order notes quiet, and as many open files as allowed (every
    owner holds a TLS channel to each compute party)."""
    import logging

    import torch

    torch.set_num_threads(1)
    logging.getLogger("absl").setLevel(logging.ERROR)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_owners(configs: list[Path], job_path: Path, job_id: str, wait_s: float = 900, procs: int = 1
               ) -> dict[str, Any]:
    """Each owner's run_owner_job in its own thread: name → its summary, or the exception. With
    ``procs`` > 1 the owners are dealt round-robin to that many spawned processes (threads there);
    an owner's exception comes back as a ``RuntimeError`` holding its repr."""
    if procs > 1:
        return _run_owners_in_processes(configs, job_path, job_id, wait_s, procs)
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


def _owners_process(configs: list[Path], job_path: Path, job_id: str, wait_s: float, q: Any) -> None:
    owners_process_setup()
    got = run_owners(configs, job_path, job_id, wait_s)
    q.put({k: (v if isinstance(v, dict) else repr(v)) for k, v in got.items()})


def _run_owners_in_processes(configs: list[Path], job_path: Path, job_id: str, wait_s: float, procs: int
                             ) -> dict[str, Any]:
    chunks = [configs[i::procs] for i in range(procs)]
    out: dict[str, Any] = {}
    for part in in_spawned_processes(_owners_process, [(c, job_path, job_id, wait_s) for c in chunks if c]):
        out |= {k: (v if isinstance(v, dict) else RuntimeError(v)) for k, v in part.items()}
    return out


def in_spawned_processes(target: Any, args: list[tuple[Any, ...]], timeout_s: float = 3600 * 4) -> list[Any]:
    """``target(*a, q)`` in one spawned process per ``a`` in ``args``, each putting one result on
    ``q``: the results, in the order they arrived."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    workers = [ctx.Process(target=target, args=(*a, q), daemon=True) for a in args]
    for w in workers:
        w.start()
    results = [q.get(timeout=timeout_s) for _ in workers]
    for w in workers:
        w.join(60)
    return results


def run_job(cons: Any, configs: list[Path], job_path: Path, out_root: Path, owner_procs: int = 1) -> dict[str, Any]:
    """Submit ``job_path``, run every owner, watch the compute parties to the end and fetch the
    results into ``out_root/<job_id>``. Raises unless every compute party succeeded."""
    from mpc_erm.jobs.status import TERMINAL

    mem = _MemoryPeak().start()
    tic = time.perf_counter()
    with cons.client() as client:
        job_id = client.submit(job_path)["job_id"]
        box: dict[str, Any] = {}
        th = threading.Thread(target=lambda: box.update(run_owners(configs, job_path, job_id, procs=owner_procs)),
                              daemon=True)
        th.start()
        ends = {e["member"]: e["phase"] for e in client.watch(job_id) if e["phase"] in TERMINAL}
        th.join(3600 * 4)
        wall = time.perf_counter() - tic
        mem.stop()
        if set(ends.values()) != {"succeeded"}:
            errors = [v for v in box.values() if isinstance(v, Exception)][:3]
            raise RuntimeError(f"the job ended {ends}; owners: {errors}")
        out = out_root / job_id
        client.result(job_id, out)
    return {"job_id": job_id, "dir": out, "wall_seconds": wall, "owners": box,
            "metrics": json.loads((out / "metrics.json").read_text()),
            "report": json.loads((out / "privacy_report.json").read_text()),
            "owners_failed": {k: repr(v) for k, v in box.items() if isinstance(v, Exception)},
            "machine_memory_gib": {"before": mem.before / 2**30, "peak": mem.peak / 2**30,
                                   "what": "MemTotal - MemAvailable of the whole machine (daemons, workers, "
                                           "owners), sampled every 0.5 s during the job"}}


class _MemoryPeak(threading.Thread):
    """The machine's used memory (MemTotal − MemAvailable) before and at its peak during a job."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.before = self.peak = self._used()
        self._done = threading.Event()

    @staticmethod
    def _used() -> int:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return 1024 * (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0]))

    def start(self) -> _MemoryPeak:  # type: ignore[override]
        super().start()
        return self

    def run(self) -> None:
        while not self._done.wait(0.5):
            self.peak = max(self.peak, self._used())

    def stop(self) -> None:
        self._done.set()
        self.join(5)
