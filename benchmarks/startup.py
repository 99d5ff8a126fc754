"""Start-up of a consortium: how soon each daemon takes jobs, how soon its worker pool is warm (when
a daemon used to start taking jobs), and how soon a job submitted at once ends.

    python -m benchmarks.startup --out benchmarks/results/startup.json

Three ``mpc-erm party serve`` processes (:class:`coordinator.consortium.LocalConsortium`,
replicated sharing, real mTLS, UCI Adult split over the parties). From the moment the processes
are started, per daemon, read from its own log: ``taking jobs`` (its health check says ok, a
submission is taken) and ``the worker pool is warm`` (its fork server imported torch and the job
code; before this change the daemon took no job until then). The demo's gradient job (50 rounds)
is submitted as soon as every daemon takes jobs; its end is timed from the same start, beside the
same job on the warm consortium (the baseline, same run). Ratio reported: the slowest daemon's
time to take jobs ÷ its time to a warm pool.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.aggregate import jsonable, machine_info

TAKING = "taking jobs"
WARM = "ready: the worker pool is warm"


def _log_times(log: Path, since: float) -> dict[str, float]:
    """Seconds from ``since`` (epoch) to the daemon's first log line of each start-up step."""
    out: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        msg = str(rec.get("message", ""))
        for key, prefix in (("takes_jobs_s", TAKING), ("pool_warm_s", WARM)):
            if key not in out and msg.startswith(prefix):
                out[key] = datetime.fromisoformat(rec["time"]).timestamp() - since
    return out


def _run_job(cons: Any, out: Path, name: str) -> tuple[float, str]:
    from coordinator.end_to_end import default_jobs, job_toml
    from mpc_erm.jobs.status import TERMINAL

    job = next(j for j in default_jobs(50) if j.method == "gradient")
    path = out / f"{name}.toml"
    path.write_text(job_toml(job, cons.party_names, cons.dataset, "replicated", None))
    client = cons.client()
    tic = time.perf_counter()
    job_id = client.submit(path)["job_id"]
    ends = {}
    for ev in client.watch(job_id):
        if ev["phase"] in TERMINAL or ev["phase"] == "error":
            ends[ev["member"]] = ev["phase"]
    status = "succeeded" if ends and set(ends.values()) == {"succeeded"} else json.dumps(ends)
    return time.perf_counter() - tic, status


def run(repeats: int) -> dict[str, Any]:
    from coordinator.consortium import LocalConsortium

    trials = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="mpc-erm-bench-startup-") as tmp:
            cons = LocalConsortium(Path(tmp) / "c", parties=3, dataset="adult", dealer=False)
            cons.write()
            since = time.time()
            tic = time.perf_counter()
            with cons:
                listening = time.perf_counter() - tic
                cold_job_s, cold_status = _run_job(cons, Path(tmp), "cold")
                cold_end = time.perf_counter() - tic
                warm_job_s, warm_status = _run_job(cons, Path(tmp), "warm")
                daemons = {m.name: _log_times(m.log, since) for m in cons.members.values()}
        trials.append({"every_daemon_listening_s": listening, "daemons": daemons,
                       "first_job": {"submitted_at_s": listening, "ended_at_s": cold_end, "job_s": cold_job_s,
                                     "status": cold_status},
                       "same_job_warm": {"job_s": warm_job_s, "status": warm_status}})
    takes = [max(d["takes_jobs_s"] for d in t["daemons"].values()) for t in trials]
    warm = [max(d["pool_warm_s"] for d in t["daemons"].values()) for t in trials]
    return {"trials": trials,
            "summary": {"slowest_daemon_takes_jobs_s_p50": statistics.median(takes),
                        "slowest_daemon_pool_warm_s_p50": statistics.median(warm),
                        "takes_jobs_over_pool_warm": statistics.median(takes) / statistics.median(warm),
                        "first_job_ended_at_s_p50": statistics.median(t["first_job"]["ended_at_s"] for t in trials),
                        "first_job_s_over_warm_job_s": statistics.median(
                            t["first_job"]["job_s"] / t["same_job_warm"]["job_s"] for t in trials)}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    res = run(a.repeats)
    out = jsonable({"benchmark": "startup", "machine": machine_info(),
                    "command": "python -m benchmarks.startup " + " ".join(sys.argv[1:] if argv is None else argv),
                    "what": ("three party daemons started at once: per daemon, seconds from the start to taking jobs "
                             "(health ok) and to a warm worker pool (when daemons used to take jobs); the demo's "
                             "gradient job (50 rounds) submitted as soon as every daemon takes jobs, against the "
                             "same job on the warm consortium"), **res})
    print(json.dumps(out["summary"], indent=1))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
