"""JobStatus: the stored and wire strings are the enum's values, unchanged, and one TERMINAL set
serves the daemon's job store, the coordinator and the tests."""

from __future__ import annotations

import json
import re

from mpc_erm.jobs import LIVE, TERMINAL, JobStatus
from parties import jobs


def test_values_are_the_stored_strings() -> None:
    assert [s.value for s in JobStatus] == ["queued", "running", "succeeded", "failed", "cancelled"]
    assert TERMINAL == {"succeeded", "failed", "cancelled"} and LIVE == {"queued", "running"}
    assert not TERMINAL & LIVE and TERMINAL | LIVE == set(JobStatus)
    # the job table's CHECK constraint allows exactly these
    check = re.search(r"CHECK \(status IN \(([^)]*)\)\)", jobs._SCHEMA)
    assert check is not None and {v.strip(" '") for v in check[1].split(",")} == {s.value for s in JobStatus}


def test_a_status_is_its_string() -> None:
    s = JobStatus.SUCCEEDED
    assert s == "succeeded" and str(s) == f"{s}" == format(s, ">9").strip() == "succeeded"
    assert json.dumps({"status": s}) == '{"status": "succeeded"}'
    assert JobStatus("cancelled").terminal and not JobStatus.RUNNING.terminal
    assert "failed" in TERMINAL and "error" not in TERMINAL  # a received string is looked up as is
    assert jobs.TERMINAL is TERMINAL and jobs.LIVE is LIVE


def test_the_store_takes_and_gives_back_plain_strings(tmp_path) -> None:
    with jobs.JobStore(tmp_path / "jobs.sqlite3") as store:
        store.create("j", name="n", job_toml="", digest="d", dataset=None, method=None, parties=["a"], dealer=None,
                     coordinator="c")
        assert [r.id for r in store.list(statuses=LIVE)] == ["j"]
        assert store.finish("j", JobStatus.CANCELLED, "why")
        rec = store.get("j")
        assert rec is not None and rec.status == "cancelled" and type(rec.status) is str and rec.terminal
        assert not store.finish("j", JobStatus.FAILED)
