"""Soak: many real jobs on the same 3 party daemons + dealer; no daemon grows per job.

``benchmarks/soak.py`` runs the jobs (gradient perturbation on UCI Adult, output perturbation
with in-MPC Gaussian and Laplace noise every 10th job, replicated sharing every 5th, batches of
1, 2 and 4 jobs submitted at the same instant by separate coordinator clients) and samples each
daemon process after every batch: open descriptors, threads, RSS, live children. After the
warm-up (which already includes a batch at the largest concurrency, so that the allocator
reaches its working size) no daemon may grow by more than 10 % on any of them
(descriptors and threads: and by more than 2 and 4, see COUNT_SLACK), and no job worker process
may be left behind (the daemon's session then holds only its fork server and resource tracker).

- ``test_soak_short`` (default CI selection): 12 jobs, two at a time, warm-up 4 jobs.
- ``test_soak_full`` (``-m soak``, slow): 200 jobs and 10,000+ rounds, writes
  ``benchmarks/results/soak.json``. ``MPC_ERM_SOAK_JOBS`` / ``MPC_ERM_SOAK_BUDGET_S`` shrink it.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from benchmarks.soak import RESULT, growth, run

GROWTH_LIMIT = 1.10
# Descriptors and threads are small counts (~20 and ~50): one in flight when sampled (a peer's
# connection, a job's watcher thread finishing) is not growth. The gRPC server's pool starts all
# its threads up front (parties.daemon.prestarted_thread_pool; a lazily grown pool stepped up by
# 5-6 threads when the 2- and 4-job phases began). A per-job leak shows as +1 per job (dozens over
# a soak); more than this many above the warm-up value (and 10 %) fails. Descriptors: 6, because on
# a slow, shared machine a batch of two jobs was sampled with both workers' pipes and their peer
# connections still closing: 19 → 25 at one sample, back to 19 at the end (twice in 8 CI runs);
# a per-job leak still shows as +8 over the 8 jobs after the warm-up.
COUNT_SLACK = {"fds": 6, "threads": 4}


def _check(summary: dict[str, Any], warmup: int) -> None:
    rows = summary["jobs"]
    failed = [(r["index"], r.get("error"), r["status"], r.get("reasons")) for r in rows
              if not r["status"] or set(r["status"].values()) != {"succeeded"}]
    assert not failed, failed
    assert len(rows) > warmup, f"only {len(rows)} jobs ran"
    for r in rows:  # no job worker outlives its batch; the fork server and resource tracker stay
        assert all(d["workers"] == 0 and d["helpers"] <= 2 for d in r["daemons"].values()), (r["index"], r["daemons"])
    report = growth(rows, warmup)
    too_much = {(name, key): v for name, metrics in report.items() for key, v in metrics.items()
                if v["ratio"] > GROWTH_LIMIT and v["peak"] - v["warmup"] > COUNT_SLACK.get(key, 0)}
    assert not too_much, too_much


@pytest.mark.reliability
@pytest.mark.slow  # 26 s; `make test-reliability` runs it (the default suite keeps under 20 min)
def test_soak_short(tmp_path: Any) -> None:
    summary = run(tmp_path / "soak_short.json", jobs=12, rounds=5, noisy_every=6, phases=((0, 2),),
                  root=tmp_path / "run")
    assert summary["jobs_run"] == 12 and summary["rounds_total"] == 10 * 5 + 2
    _check(summary, warmup=4)


@pytest.mark.soak
@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)
def test_soak_full() -> None:
    jobs = int(os.environ.get("MPC_ERM_SOAK_JOBS", "200"))
    budget = float(os.environ.get("MPC_ERM_SOAK_BUDGET_S", "0")) or None
    summary = run(RESULT, jobs=jobs, rounds=56, noisy_every=10,
                  phases=((4, 4), (8, 2), (10, 1), (100, 2), (160, 4)), time_budget_s=budget)
    if not summary["stopped_early"]:
        assert summary["jobs_run"] == jobs
        if jobs == 200:
            assert summary["rounds_total"] >= 10_000
    _check(summary, warmup=10)
