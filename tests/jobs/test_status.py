"""JobStatus: the stored and wire strings are the enum's values, unchanged, and one TERMINAL set
serves the daemon's job store, the coordinator and the tests."""

from __future__ import annotations

import json
import re

from mpc_erm.jobs import LIVE, TERMINAL, JobStatus
from parties import job_store as jobs


def test_values_are_the_stored_strings() -> None:
    # "prepared": admitted here, waiting for every member to prepare it (two-phase admission, issue 14 item 3);
    # "refused": a member refused it, so it started nowhere (the reason names the member)
    assert [s.value for s in JobStatus] == ["prepared", "queued", "running", "succeeded", "failed", "cancelled",
                                            "refused"]
    assert TERMINAL == {"succeeded", "failed", "cancelled", "refused"} and LIVE == {"prepared", "queued", "running"}
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
        store.create("p", name="n", job_toml="", digest="d", dataset=None, method=None, parties=["a"], dealer=None,
                     coordinator="c", status=JobStatus.PREPARED)
        assert store.get("p").status == "prepared" and not store.set_running("p")  # not before it is queued
        assert store.set_queued("p", "every member prepared it") and not store.set_queued("p", "again")
        assert [e.phase for e in store.events("p")] == ["prepared", "queued"] and store.set_running("p")


def test_a_job_table_from_before_the_prepared_status_is_migrated(tmp_path) -> None:
    import sqlite3

    path = tmp_path / "jobs.sqlite3"
    old_schema = jobs._SCHEMA.replace("'prepared', ", "")
    con = sqlite3.connect(path)
    con.executescript(old_schema)
    con.execute("INSERT INTO jobs (id, name, status, job_toml, digest, parties, created_at) "
                "VALUES ('old', 'n', 'queued', '', 'd', '[]', 1.0)")
    con.execute("INSERT INTO events VALUES ('old', 1, 1.0, 'queued', '{}')")
    con.commit()
    con.close()
    with jobs.JobStore(path) as store:
        assert store.get("old").status == "queued" and [e.phase for e in store.events("old")] == ["queued"]
        store.create("new", name="n", job_toml="", digest="d", dataset=None, method=None, parties=["a"], dealer=None,
                     coordinator="c", status="prepared")
        assert store.get("new").status == "prepared"
        assert store._conn.execute("PRAGMA foreign_key_check").fetchall() == []
    with jobs.JobStore(path) as store:  # idempotent
        assert {r.id for r in store.list()} == {"old", "new"}


def test_a_job_table_from_before_the_refused_status_is_migrated(tmp_path) -> None:
    import sqlite3

    path = tmp_path / "jobs.sqlite3"
    con = sqlite3.connect(path)
    con.executescript(jobs._SCHEMA.replace(", 'refused'", ""))
    con.execute("INSERT INTO jobs (id, name, status, job_toml, digest, parties, created_at) "
                "VALUES ('old', 'n', 'prepared', '', 'd', '[]', 1.0)")
    con.commit()
    con.close()
    with jobs.JobStore(path) as store:
        assert store.finish("old", JobStatus.REFUSED, "POLICY: refused by carol: privacy.epsilon: too large")
        assert store.get("old").status == "refused" and store.get("old").terminal


def test_refusal_of_reads_who_refused_and_why() -> None:
    from mpc_erm.jobs.status import BUDGET_RELEASED, refusal_of

    r = refusal_of(f"POLICY: refused by carol: privacy.epsilon: 0.8 exceeds carol's limit; {BUDGET_RELEASED}")
    assert r is not None and (r.code, r.member, r.reason) == ("POLICY", "carol", "privacy.epsilon: 0.8 exceeds "
                                                                                 "carol's limit")
    assert str(r) == "POLICY: refused by carol: privacy.epsilon: 0.8 exceeds carol's limit"
    assert str(refusal_of("PEER_FAILED: refused by bob")) == "PEER_FAILED: refused by bob"
    for other in (None, "", "PEER_LOST: bob had not heard of the job", "cancelled by coord"):
        assert refusal_of(other) is None, other
