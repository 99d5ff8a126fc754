"""Soak: many jobs, one after another and several at once, on the same party daemons + dealer.

Why: a daemon runs for months; a descriptor, thread or megabyte it keeps per job is a slow leak
that no single-job test sees. This starts one :class:`coordinator.consortium.LocalConsortium`
(3 ``mpc-erm party serve`` processes + ``mpc-erm dealer serve``, real mTLS, UCI Adult split over
the parties), runs a plan of real jobs through the coordinator client, and after each batch
samples every daemon process: open descriptors (``/proc/PID/fd``), threads and RSS
(``/proc/PID/status``) and its live child processes (the fork server, plus any worker left
behind). ``tests/reliability/test_soak.py`` asserts on the curve; ``python -m benchmarks.soak``
writes it (``benchmarks/results/soak.json``).

The plan (:func:`plan`): gradient-perturbation jobs with ``rounds`` rounds (zero-noise test jobs,
``job.test_no_noise``, so a round costs the MPC aggregation alone and 10,000 rounds fit in a
soak), every ``noisy_every``-th job an output-perturbation job with in-MPC noise (discrete
Gaussian and Laplace alternately), every 5th job on 3-party replicated sharing instead of the
dealer; batches of 1, 2 or 4 jobs submitted at the same instant by separate coordinator clients.

:func:`startup` measures worker start-up (the daemon's ``running`` event to the worker's first
event) for the same job under both worker start methods.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Job", "Soak", "plan", "sample_process", "startup"]

RESULT = Path(__file__).resolve().parent / "results" / "soak.json"


@dataclass(frozen=True)
class Job:
    index: int
    kind: str  # "gradient" | "output"
    rounds: int
    trust: str  # "dealer" | "replicated"
    mechanism: str = "gaussian"  # output jobs: "gaussian" | "laplace_thesis"

    def toml(self) -> str:
        name = f"soak-{self.index:04d}-{self.kind}"
        dealer = 'dealer = "dealer"\n' if self.trust == "dealer" else ""
        # a zero-noise job spends its data set's whole budget (parties.ledger): each gets a scratch id
        dataset = scratch_dataset(self.index) if self.kind == "gradient" else "adult"
        head = (f'method = "{self.kind}"\n\n[job]\nname = "{name}"\ndataset = "{dataset}"\n'
                f'parties = ["alice", "bob", "carol"]\ntrust = "{self.trust}"\n{dealer}device = "cpu"\n')
        if self.kind == "gradient":
            return (head + "test_no_noise = true\n\n[model]\nname = \"logistic\"\nlam = 1e-4\n\n"
                    "[privacy]\nepsilon = 1.0\ndelta = 1e-5\naccountant = \"rdp\"\nclip = 1.0\n\n"
                    f"[training]\niterations = {self.rounds}\nlearning_rate = 20.0\n")
        return (head + "\n[model]\nname = \"logistic\"\nlam = 1e-3\n\n"
                f"[privacy]\nepsilon = 1.0\ndelta = 1e-5\nmechanism = \"{self.mechanism}\"\n\n"
                "[training]\nsolver_tol = 1e-9\n")


def scratch_dataset(index: int) -> str:
    """The data set id a zero-noise soak job runs on (the same Adult shard, its own budget)."""
    return f"adult-z{index:04d}"


def plan(jobs: int, *, rounds: int = 56, noisy_every: int = 10,
         phases: Iterable[tuple[int, int]] = ()) -> list[list[Job]]:
    """Batches of jobs. ``phases``: (first job index, jobs per batch) from that index on; before
    the first phase, one job per batch."""
    starts = sorted(phases)
    out: list[list[Job]] = []
    i = 0
    while i < jobs:
        width = 1
        for first, w in starts:
            if i >= first:
                width = w
        batch = []
        for k in range(i, min(i + width, jobs)):
            trust = "replicated" if k % 5 == 4 else "dealer"
            if noisy_every and k % noisy_every == noisy_every - 1:
                mech = "gaussian" if (k // noisy_every) % 2 == 0 else "laplace_thesis"
                batch.append(Job(k, "output", 1, trust, mech))
            else:
                batch.append(Job(k, "gradient", rounds, trust))
        out.append(batch)
        i += width
    return out


def sample_process(pid: int) -> dict[str, int]:
    """Open descriptors, threads and RSS (kB) of one process, from /proc; and the live processes of
    its session (a daemon started by LocalConsortium leads its own): ``helpers`` (its fork server
    and multiprocessing's resource tracker) and ``workers`` (everything else: job workers)."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    helpers = workers = 0
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == pid:
            continue
        try:
            stat = (p / "stat").read_text()
            cmdline = (p / "cmdline").read_bytes()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()
        if int(rest[3]) != pid or rest[0] == "Z":  # field 6: session id
            continue
        # a forked worker shares its fork server's command line: only the daemon's own children are helpers
        if int(rest[1]) == pid and (b"multiprocessing.forkserver" in cmdline or b"resource_tracker" in cmdline):
            helpers += 1
        else:
            workers += 1
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": int(fields["Threads"].strip()),
            "rss_kb": int(fields["VmRSS"].split()[0]), "helpers": helpers, "workers": workers}


class Soak:
    """A running consortium and the clients that submit to it (use as a context manager)."""

    def __init__(self, root: Path, *, max_concurrent_jobs: int | None = None, start_method: str | None = None,
                 clients: int = 4, scratch: int = 0) -> None:
        from coordinator.consortium import LocalConsortium

        self.root = Path(root)
        self.consortium = LocalConsortium(self.root / "consortium", budget_epsilon=1e6, budget_delta=0.5,
                                          max_epsilon_per_job=1.0, allow_test_only=True, device="cpu",
                                          scratch_datasets=[scratch_dataset(i) for i in range(scratch)])
        self.max_concurrent_jobs = max_concurrent_jobs
        self.start_method = start_method
        self.n_clients = clients
        self.clients: list[Any] = []

    def __enter__(self) -> Soak:
        c = self.consortium
        c.write()
        if self.max_concurrent_jobs is not None:  # a top-level key: before the first [table]
            for m in c.members.values():
                m.config.write_text(f"max_concurrent_jobs = {self.max_concurrent_jobs}\n" + m.config.read_text())
        old = os.environ.get("MPC_ERM_WORKER_START")
        if self.start_method:
            os.environ["MPC_ERM_WORKER_START"] = self.start_method
        try:
            c.start()
        finally:
            if self.start_method:
                if old is None:
                    os.environ.pop("MPC_ERM_WORKER_START", None)
                else:
                    os.environ["MPC_ERM_WORKER_START"] = old
        self.clients = [c.client() for _ in range(self.n_clients)]  # one per "coordinator", own channels
        return self

    def __exit__(self, *exc: object) -> None:
        for cl in self.clients:
            cl.close()
        self.consortium.stop()

    @property
    def pids(self) -> dict[str, int]:
        return {n: m.proc.pid for n, m in self.consortium.members.items() if m.proc is not None}

    def sample(self) -> dict[str, dict[str, int]]:
        return {n: sample_process(pid) for n, pid in self.pids.items()}

    def run_job(self, job: Job, client: Any, barrier: threading.Barrier | None = None) -> dict[str, Any]:
        """Submit (after ``barrier``, so a batch's submissions race), follow to the end."""
        path = self.root / "jobs" / f"{job.index:04d}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(job.toml())
        if barrier is not None:
            barrier.wait(60)
        t0 = time.monotonic()
        job_id = client.submit(path)["job_id"]
        running: dict[str, float] = {}
        first_worker: dict[str, float] = {}
        ends: dict[str, tuple[str, str]] = {}
        for ev in client.watch(job_id):
            m, phase = ev["member"], ev["phase"]
            if phase == "running":
                running[m] = ev["time"]
            elif phase in ("succeeded", "failed", "cancelled"):
                ends[m] = (phase, str(ev["payload"].get("message", ""))[:300])
            elif phase not in ("prepared", "queued", "error") and m not in first_worker:
                first_worker[m] = ev["time"]
        wall = time.monotonic() - t0
        startup = {m: round(first_worker[m] - running[m], 3) for m in running if m in first_worker
                   and m != "dealer"}  # the dealer's first event comes after its look-ups
        return {"index": job.index, "job_id": job_id, "kind": job.kind, "trust": job.trust, "rounds": job.rounds,
                "wall_s": round(wall, 3), "status": {m: e[0] for m, e in ends.items()},
                "reasons": {m: e[1] for m, e in ends.items() if e[0] != "succeeded"}, "startup_s": startup}

    def run_batch(self, batch: list[Job]) -> list[dict[str, Any]]:
        """The batch's jobs submitted at the same instant, each by its own coordinator client."""
        if len(batch) == 1:
            return [self.run_job(batch[0], self.clients[0])]
        if len(batch) > len(self.clients):
            raise ValueError(f"a batch of {len(batch)} needs as many clients (have {len(self.clients)})")
        barrier = threading.Barrier(len(batch))
        results: list[Any] = [None] * len(batch)

        def one(k: int) -> None:
            try:
                results[k] = self.run_job(batch[k], self.clients[k], barrier)
            except Exception as exc:  # reported, not raised from a thread
                results[k] = {"index": batch[k].index, "error": f"{type(exc).__name__}: {exc}", "status": {}}

        threads = [threading.Thread(target=one, args=(k,)) for k in range(len(batch))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results


def run(out: Path | None = RESULT, *, jobs: int = 200, rounds: int = 56, noisy_every: int = 10,
        phases: Iterable[tuple[int, int]] = ((100, 2), (160, 4)), max_concurrent_jobs: int | None = None,
        time_budget_s: float | None = None, root: Path | None = None,
        on_job: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the plan on one consortium; per job: index, wall, status, and every daemon's sample
    taken after the job's batch ended. Stops early (``stopped_early``) past ``time_budget_s``."""
    batches = plan(jobs, rounds=rounds, noisy_every=noisy_every, phases=phases)
    rows: list[dict[str, Any]] = []
    t_start = time.monotonic()
    stopped_early = False
    with tempfile.TemporaryDirectory(prefix="mpc-erm-soak-") as tmp, \
            Soak(Path(root or tmp), max_concurrent_jobs=max_concurrent_jobs,
                 clients=max(len(b) for b in batches), scratch=1 + max(j.index for b in batches for j in b)) as soak:
        baseline = soak.sample()
        for batch in batches:
            if time_budget_s is not None and time.monotonic() - t_start > time_budget_s:
                stopped_early = True
                break
            results = soak.run_batch(batch)
            snap = soak.sample()
            for r in results:
                r["batch"] = len(batch)
                r["daemons"] = snap
                rows.append(r)
                if on_job:
                    on_job(r)
    total = time.monotonic() - t_start
    ok = [r for r in rows if r["status"] and all(s == "succeeded" for s in r["status"].values())]
    starts = [s for r in rows for s in r.get("startup_s", {}).values()]
    summary = {
        "benchmark": "soak",
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg_at_end": os.getloadavg()},
        "parameters": {"jobs_planned": jobs, "rounds_per_gradient_job": rounds, "noisy_every": noisy_every,
                       "phases": [list(p) for p in phases], "max_concurrent_jobs": max_concurrent_jobs or 4},
        "jobs_run": len(rows), "jobs_succeeded": len(ok), "stopped_early": stopped_early,
        "rounds_total": sum(r.get("rounds", 0) for r in ok), "wall_s": round(total, 1),
        "worker_startup_s": {"median": statistics.median(starts) if starts else None,
                             "max": max(starts) if starts else None},
        "baseline": baseline, "jobs": rows,
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=1))
    return summary


def growth(rows: list[dict[str, Any]], warmup: int) -> dict[str, dict[str, dict[str, float]]]:
    """Per daemon and metric: the value after the warm-up job, the largest after it, their ratio."""
    ref = rows[warmup - 1]["daemons"]
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, base in ref.items():
        out[name] = {}
        for key in ("fds", "threads", "rss_kb"):
            later = [r["daemons"][name][key] for r in rows[warmup:]]
            peak = max(later) if later else base[key]
            out[name][key] = {"warmup": base[key], "peak": peak, "end": later[-1] if later else base[key],
                              "ratio": round(peak / base[key], 3)}
    return out


def startup(start_method: str, repeats: int = 3, root: Path | None = None) -> dict[str, Any]:
    """The same output job ``repeats`` times under one worker start method: per job the parties'
    worker start-up (daemon ``running`` event → the worker's first event) and the job's wall time."""
    job = Job(0, "output", 1, "dealer")
    out = []
    with tempfile.TemporaryDirectory(prefix="mpc-erm-startup-") as tmp, \
            Soak(Path(root or tmp), start_method=start_method, clients=1, scratch=repeats) as soak:
        for k in range(repeats):
            r = soak.run_job(Job(k, job.kind, job.rounds, job.trust), soak.clients[0])
            out.append({"wall_s": r["wall_s"], "startup_s": r["startup_s"], "status": r["status"]})
    starts = [s for r in out for s in r["startup_s"].values()]
    return {"start_method": start_method, "jobs": out, "startup_median_s": statistics.median(starts),
            "wall_median_s": statistics.median(r["wall_s"] for r in out), "load_avg": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=56)
    ap.add_argument("--time-budget-s", type=float, default=None)
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--startup", action="store_true", help="measure worker start-up, spawn vs forkserver")
    args = ap.parse_args()
    if args.startup:
        res = {m: startup(m) for m in ("spawn", "forkserver")}
        print(json.dumps(res, indent=1))
        args.out.with_name("worker_startup.json").write_text(json.dumps(res, indent=1))
        return

    def progress(r: dict[str, Any]) -> None:
        d = r["daemons"]
        print(json.dumps({"i": r["index"], "wall": r.get("wall_s"), "ok": set(r["status"].values()) == {"succeeded"},
                          **{n: [v["fds"], v["threads"], v["rss_kb"] // 1024] for n, v in d.items()}}), flush=True)

    s = run(args.out, jobs=args.jobs, rounds=args.rounds, time_budget_s=args.time_budget_s, on_job=progress)
    print(json.dumps({k: v for k, v in s.items() if k not in ("jobs", "baseline")}, indent=1))
    print(json.dumps(growth(s["jobs"], min(10, len(s["jobs"]))), indent=1))


if __name__ == "__main__":
    main()
