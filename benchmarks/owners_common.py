"""What the owner benchmarks share: run a job through a :class:`LocalConsortium`'s compute
daemons with every owner's ``parties.owner.process.run_owner_job`` (what ``mpc-erm owner join`` runs), one
thread each or a bounded pool of them, in this process or spread over ``procs`` spawned processes
(the benchmarks say which), and collect the results; owners of a one-release job may send and
leave (``owner join --leave``) and fetch their model after the job (``owner fetch``)."""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: Comma-separated owner names that send garbage (their contribution × 10⁶ plus 1 in every
#: coordinate, so a zero update is garbage too): a benchmark's hostile owners, in every process
#: that hosts owners (spawned ones inherit it).
HOSTILE_ENV = "MPC_ERM_BENCH_HOSTILE_OWNERS"
#: "garbage" (default): those owners send contribution × 10⁶ + 1; "zero": they send zeros — what the
#: bound check turns a refused owner into (left out, the sum still divided by the public count),
#: so a run with "zero" is the honest-only comparator of a run with "garbage".
HOSTILE_KIND_ENV = "MPC_ERM_BENCH_HOSTILE_KIND"


def make_hostile() -> None:
    """Patch this process's owner client so that the owners :data:`HOSTILE_ENV` names send garbage
    through it (what a broken app install or a hostile certificate holder sends)."""
    import os

    names = set(filter(None, os.environ.get(HOSTILE_ENV, "").split(",")))
    if not names:
        return
    from parties.owner.intake import OwnerClient

    if getattr(OwnerClient, "_bench_hostile", False):
        return
    honest = OwnerClient.contribute

    zero = os.environ.get(HOSTILE_KIND_ENV, "garbage") == "zero"

    def contribute(self: Any, t: int, v: Any, *a: Any, **k: Any) -> None:
        if self.identity.name in names:
            v = v * 0.0 if zero else v * 1e6 + 1.0
        honest(self, t, v, *a, **k)

    OwnerClient.contribute = contribute  # type: ignore[method-assign]
    OwnerClient._bench_hostile = True  # type: ignore[attr-defined]


def owners_process_setup() -> None:
    """What a process hosting many owners needs: one torch thread (the cores are shared with the
    daemons), dp_accounting's per-order notes quiet, and as many open files as allowed (every
    owner holds a TLS channel to each compute party while it enrols, then to its explicit one);
    the hostile owners of :data:`HOSTILE_ENV`, if any."""
    import logging

    import torch

    torch.set_num_threads(1)
    logging.getLogger("absl").setLevel(logging.ERROR)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    make_hostile()


def benchmark_process_setup() -> None:
    """:func:`owners_process_setup` for a benchmark's main process, and SIGTERM as ``SystemExit``
    there: a stopped benchmark then unwinds its ``with`` blocks (the consortium's daemons stopped,
    its temporary directory removed) and multiprocessing's exit handler terminates the owner
    processes (daemonic), instead of leaving them running on the cores the next run needs."""
    owners_process_setup()
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def _die_with_parent() -> None:
    """Linux: this (spawned owner) process gets SIGTERM when the thread that started it ends, so a
    benchmark killed outright (SIGKILL, no exit handler) does not leave its owners running."""
    import multiprocessing as mp

    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    parent = mp.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the parent ended before prctl
        os._exit(1)


#: What each owner runs: ``join`` (the whole job), ``leave`` (send its shares and leave: a
#: one-release job), ``fetch`` (after ``leave``: the model from the compute parties' daemons).
MODES = ("join", "leave", "fetch")


def run_owners(configs: list[Path], job_path: Path, job_id: str, wait_s: float = 900, procs: int = 1, *,
               mode: str = "join", concurrency: int | None = None) -> dict[str, Any]:
    """Each owner's ``mode`` (:data:`MODES`): name → its summary, or the exception. A thread per
    owner, all at once, or with ``concurrency`` at most that many owners at a time (the owners
    come in waves, each gone once done). With ``procs`` > 1 the owners are dealt
    round-robin to that many spawned processes (``concurrency`` in each); an owner's exception
    comes back as a ``RuntimeError`` holding its repr."""
    if mode not in MODES:
        raise ValueError(f"mode: one of {MODES}")
    if procs > 1:
        return _run_owners_in_processes(configs, job_path, job_id, wait_s, procs, mode, concurrency)
    from concurrent.futures import ThreadPoolExecutor

    from mpc_erm.jobs.jobfile import load_job_file
    from parties.config import load_owner_config
    from parties.owner.process import fetch_owner_model, run_owner_job

    job = load_job_file(job_path)
    out: dict[str, Any] = {}
    make_hostile()

    def one(path: Path) -> None:
        cfg = load_owner_config(path)
        try:
            out[cfg.identity.name] = (fetch_owner_model(cfg, job, job_id, wait_s=wait_s) if mode == "fetch" else
                                      run_owner_job(cfg, job, job_id, wait_s=wait_s, leave=mode == "leave"))
        except Exception as exc:
            out[cfg.identity.name] = exc
            print(f"{cfg.identity.name}: {exc!r}", flush=True)

    # every owner at once (a thread each), or at most ``concurrency`` at a time
    with ThreadPoolExecutor(max_workers=concurrency or max(len(configs), 1), thread_name_prefix="owner") as pool:
        list(pool.map(one, configs))
    return out


def _owners_process(configs: list[Path], job_path: Path, job_id: str, wait_s: float, mode: str,
                    concurrency: int | None, q: Any) -> None:
    owners_process_setup()
    got = run_owners(configs, job_path, job_id, wait_s, mode=mode, concurrency=concurrency)
    q.put({k: (v if isinstance(v, dict) else repr(v)) for k, v in got.items()})


def _run_owners_in_processes(configs: list[Path], job_path: Path, job_id: str, wait_s: float, procs: int, mode: str,
                             concurrency: int | None) -> dict[str, Any]:
    chunks = [configs[i::procs] for i in range(procs)]
    out: dict[str, Any] = {}
    for part in in_spawned_processes(_owners_process, [(c, job_path, job_id, wait_s, mode, concurrency)
                                                       for c in chunks if c]):
        out |= {k: (v if isinstance(v, dict) else RuntimeError(v)) for k, v in part.items()}
    return out


def in_spawned_processes(target: Any, args: list[tuple[Any, ...]], timeout_s: float = 3600 * 4) -> list[Any]:
    """``target(*a, q)`` in one spawned process per ``a`` in ``args``, each putting one result on
    ``q``: the results, in the order they arrived."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    workers = [ctx.Process(target=_spawned, args=(target, *a, q), daemon=True) for a in args]
    for w in workers:
        w.start()
    results = [q.get(timeout=timeout_s) for _ in workers]
    for w in workers:
        w.join(60)
    return results


def _spawned(target: Any, *args: Any) -> None:
    _die_with_parent()
    target(*args)


def run_job(cons: Any, configs: list[Path], job_path: Path, out_root: Path, owner_procs: int = 1, *,
            leave: bool = False, concurrency: int | None = None, wait_s: float = 900) -> dict[str, Any]:
    """Submit ``job_path``, run every owner, watch the compute parties to the end and fetch the
    results into ``out_root/<job_id>``. Raises unless every compute party succeeded. With
    ``leave`` (a one-release job) the owners send and leave, then each fetches its model once the
    compute parties are done (timed apart: ``send_seconds``, ``fetch_seconds``)."""
    from mpc_erm.jobs.status import TERMINAL

    mem = MemoryPeak().start()
    tic = time.perf_counter()
    sent_at: list[float] = []
    with cons.client() as client:
        job_id = client.submit(job_path)["job_id"]
        box: dict[str, Any] = {}

        def owners() -> None:
            box.update(run_owners(configs, job_path, job_id, wait_s, procs=owner_procs,
                                  mode="leave" if leave else "join", concurrency=concurrency))
            sent_at.append(time.perf_counter())

        th = threading.Thread(target=owners, daemon=True)
        th.start()
        ends = {e["member"]: e["phase"] for e in client.watch(job_id) if e["phase"] in TERMINAL}
        th.join(3600 * 4)
        wall = time.perf_counter() - tic
        if set(ends.values()) != {"succeeded"}:
            mem.stop()
            errors = [v for v in box.values() if isinstance(v, Exception)][:3]
            raise RuntimeError(f"the job ended {ends}; owners: {errors}")
        out = out_root / job_id
        client.result(job_id, out)
    fetched: dict[str, Any] = {}
    fetch_s = None
    if leave:
        t0 = time.perf_counter()
        fetched = run_owners(configs, job_path, job_id, wait_s, procs=owner_procs, mode="fetch",
                             concurrency=concurrency)
        fetch_s = time.perf_counter() - t0
    mem.stop()
    return {"job_id": job_id, "dir": out, "wall_seconds": wall, "owners": box,
            "send_seconds": (sent_at[0] - tic) if sent_at else None, "fetch_seconds": fetch_s,
            "owners_fetched": sum(isinstance(v, dict) and v.get("status") == "done" for v in fetched.values()),
            "owners_fetch_failed": {k: repr(v) for k, v in list(fetched.items()) if isinstance(v, Exception)},
            "metrics": json.loads((out / "metrics.json").read_text()),
            "report": json.loads((out / "privacy_report.json").read_text()),
            "owners_failed": {k: repr(v) for k, v in box.items() if isinstance(v, Exception)},
            "machine_memory_gib": mem.gib("MemTotal - MemAvailable of the whole machine (daemons, workers, "
                                          "owners), sampled every 0.5 s during the job")}


class MemoryPeak(threading.Thread):
    """The machine's used memory (MemTotal − MemAvailable) before and at its peak during a job."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.before = self.peak = self._used()
        self._done = threading.Event()

    @staticmethod
    def _used() -> int:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return 1024 * (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0]))

    def start(self) -> MemoryPeak:  # type: ignore[override]
        super().start()
        return self

    def run(self) -> None:
        while not self._done.wait(0.5):
            self.peak = max(self.peak, self._used())

    def stop(self) -> None:
        self._done.set()
        self.join(5)

    def gib(self, what: str) -> dict[str, Any]:
        """Before and peak in GiB, with ``what`` was sampled (the results' ``machine_memory_gib``)."""
        return {"before": self.before / 2**30, "peak": self.peak / 2**30, "what": what}
