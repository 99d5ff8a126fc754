"""The hash-chained audit log: intact chains verify; every kind of edit is caught and named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from parties.audit import GENESIS, AuditError, AuditLog, verify
from tests.procs import preloaded_context


def _fill(log: AuditLog, jobs: int = 3, rounds: int = 4) -> None:
    for j in range(jobs):
        log.charge(f"job{j}", dataset="adult", epsilon=1.0, delta=1e-5, spec_digest="d" * 64,
                   dp_event={"kind": "gaussian", "noise_multiplier": 3.0, "rounds": rounds, "delta_extra": 0.0})
        for t in range(1, rounds + 1):
            log.release(f"job{j}", what="noisy gradient", value=np.full(5, t / 7), round=t, rounds=rounds)


def test_an_intact_log_verifies(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    assert log.head() == GENESIS
    _fill(log)
    v = verify(log.path, expect_head=log.head())
    assert (v.records, v.jobs, v.releases) == (15, 3, 12) and v.head == log.head()
    rec = json.loads(log.path.read_text().splitlines()[1])
    assert rec["event"] == "release" and rec["shape"] == [5] and len(rec["sha256"]) == 64
    assert rec["sha256"] == __import__("hashlib").sha256(np.full(5, 1 / 7).tobytes()).hexdigest()
    assert "value" not in rec  # the log holds a digest, never the numbers


@pytest.mark.parametrize(("edit", "message"), [
    (lambda ls: ls.__setitem__(3, ls[3].replace('"round":3', '"round":2')), "jsonl:4: record altered"),
    (lambda ls: ls.__delitem__(5), "jsonl:6: chain broken"),
    (lambda ls: ls.insert(2, ls[2]), "jsonl:4: chain broken"),
    (lambda ls: ls.__setitem__(1, ls[1][:-5]), "jsonl:2: not a JSON record"),
    (lambda ls: (ls.__setitem__(0, ls[1]), ls.__setitem__(1, ls[0])), "jsonl:1: chain broken"),
])
def test_edits_are_caught_at_their_line(tmp_path: Path, edit, message: str) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    _fill(log)
    lines = log.path.read_text().splitlines()
    edit(lines)
    log.path.write_text("\n".join(lines) + "\n")
    with pytest.raises(AuditError, match=message):
        verify(log.path)


def test_a_dropped_tail_is_caught_by_the_head_kept_elsewhere(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    _fill(log)
    head = log.head()
    lines = log.path.read_text().splitlines()
    log.path.write_text("\n".join(lines[:-2]) + "\n")
    verify(log.path)  # still a valid chain on its own ...
    with pytest.raises(AuditError, match="records were dropped from the end"):
        verify(log.path, expect_head=head)  # ... but not the one the report anchored


def test_an_older_head_of_the_same_chain_is_accepted(tmp_path: Path) -> None:
    """A job's report carries the head after its last release; later jobs append to the same log,
    so that report's head is an older head of an intact log, not a sign of dropped records."""
    from coordinator.cli import cli

    log = AuditLog.in_state_dir(tmp_path / "state")
    _fill(log, jobs=1, rounds=2)
    first_job_head = log.head()  # what job0's privacy report holds
    log.charge("job1", dataset="adult", epsilon=1.0, delta=1e-5, spec_digest="d" * 64, dp_event=None)
    log.release("job1", what="x", value=np.zeros(2), round=1, rounds=1)
    v = verify(log.path, expect_head=first_job_head)
    assert (v.records, v.after_expected) == (5, 2) and v.head == log.head()
    assert verify(log.path, expect_head=log.head()).after_expected == 0
    assert verify(log.path).after_expected is None
    lines = log.path.read_text().splitlines()
    log.path.write_text("\n".join(lines[:2]) + "\n")  # cut back past job0's last release
    with pytest.raises(AuditError, match="not in this chain of 2 records .*records were dropped from the end"):
        verify(log.path, expect_head=first_job_head)
    log.path.write_text("\n".join(lines) + "\n")
    cfg = _config(tmp_path)
    run = CliRunner().invoke(cli, ["audit", "verify", "--config", str(cfg), "--expect-head", first_job_head])
    assert run.exit_code == 0, run.output
    assert "chain intact" in run.output and "the log extends the expected head (record 3) by 2 records" in run.output


def _writer(path: str, who: int) -> None:
    log = AuditLog(path)
    for t in range(25):
        log.release(f"w{who}", what="x", value=np.zeros(2), round=t + 1, rounds=25)


def test_concurrent_writers_keep_one_chain(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    ctx = preloaded_context()
    procs = [ctx.Process(target=_writer, args=(str(path), i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    v = verify(path)
    assert (v.records, v.jobs, v.releases) == (100, 4, 100)


def _config(tmp_path: Path) -> Path:
    """A party config whose state_dir is tmp_path/state (identity files are stand-ins)."""
    cfg = tmp_path / "party.toml"
    for f in ("a.crt", "a.key", "ca.crt"):
        (tmp_path / f).write_text("x")
    cfg.write_text('listen = "127.0.0.1:7001"\nstate_dir = "state"\n\n[identity]\nname = "alice"\ncert = "a.crt"\n'
                   'key = "a.key"\nca = "ca.crt"\n\n[datasets.adult]\nformat = "builtin"\nname = "adult"\n'
                   'part = 0\nof = 3\n'
                   'epsilon = 1.0\ndelta = 1e-5\n\n[policy]\nallowed_coordinators = ["c"]\nmax_epsilon_per_job = 1.0\n'
                   'max_iterations = 10\n')
    return cfg


def test_cli_verify(tmp_path: Path) -> None:
    from coordinator.cli import cli

    state = tmp_path / "state"
    log = AuditLog.in_state_dir(state)
    _fill(log, jobs=1, rounds=2)
    cfg = _config(tmp_path)
    run = CliRunner().invoke(cli, ["audit", "verify", "--config", str(cfg), "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.output) | {"path": None} == {"ok": True, "path": None, "records": 3, "head": log.head(),
                                                        "jobs": 1, "releases": 2, "after_expected": None}
    run = CliRunner().invoke(cli, ["audit", "verify", "--config", str(cfg), "--expect-head", "f" * 64])
    assert run.exit_code == 1 and "NOT valid" in run.output


def test_cli_expect_head_older_heads_pass_cut_logs_and_malformed_heads_fail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the real entry point: a job's report head, after later jobs appended, is accepted and
    the extension counted (also pasted in upper case, with blanks or a sha256: prefix); a log cut back
    before it fails (exit 1); a head cut short when copied is a usage error naming --expect-head
    (exit 2), never a claim that records were dropped."""
    from tests.parties.test_ledger_check import run_main

    log = AuditLog.in_state_dir(tmp_path / "state")
    _fill(log, jobs=1, rounds=2)
    job0 = log.head()
    _fill(log, jobs=2, rounds=3)  # later jobs: 8 more records
    cfg = str(_config(tmp_path))
    for pasted in (job0, f"  {job0.upper()}\n", f"sha256:{job0}"):
        code, out, err = run_main(monkeypatch, capsys, "audit", "verify", "--config", cfg, "--expect-head", pasted)
        assert code == 0 and err == "", err
        assert "chain intact" in out and "the log extends the expected head (record 3) by 8 records" in out, out
    code, out, _ = run_main(monkeypatch, capsys, "audit", "verify", "--config", cfg, "--expect-head", job0, "--json")
    assert code == 0 and json.loads(out)["after_expected"] == 8
    code, out, _ = run_main(monkeypatch, capsys, "audit", "verify", "--config", cfg, "--expect-head", log.head())
    assert code == 0 and "the expected head is the log's head" in out, out
    for bad in (job0[:16], job0[:16] + "…", "z" * 64):
        code, out, err = run_main(monkeypatch, capsys, "audit", "verify", "--config", cfg, "--expect-head", bad)
        assert code == 2 and out == "" and len(err.splitlines()) == 1, (bad, err)
        assert err.startswith("error: --expect-head: a head is 64 hex digits") and "dropped" not in err, err
    lines = log.path.read_text().splitlines()
    log.path.write_text("\n".join(lines[:2]) + "\n")  # cut back before job0's head
    code, _, err = run_main(monkeypatch, capsys, "audit", "verify", "--config", cfg, "--expect-head", job0)
    assert code == 1 and "NOT valid" in err and "records were dropped from the end" in err, err
    code, _, err = run_main(monkeypatch, capsys, "audit", "verify", "--config", cfg, "--expect-head", "ab" * 32)
    assert code == 1 and "is not in this chain of 2 records" in err, err  # not a record of this chain at all
