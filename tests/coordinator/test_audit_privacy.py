"""`mpc-erm audit privacy`: one run of a real job on the parties' CSV files with canaries added,
and a lower bound on its ε. The job as planned shows no violation; the same job with its noise
switched off (the control) is flagged — exit 1 naming the violation — which shows the audit can
see a broken job. Breast-cancer rows as three parties' files (`mpc-erm data example`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_main import run_main
from tests.coordinator.test_dry_run_gate import JOB, SCHEMA


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("audit")
    (tmp / "job.toml").write_text(JOB.format(eps=1.0))
    return tmp


def _audit(tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
           *extra: str) -> tuple[int, str, str]:
    if not (tmp / "d").exists():
        code, _, err = run_main(monkeypatch, capsys, "data", "example", "breast-cancer", "--out", str(tmp / "d"))
        assert code == 0, err
    return run_main(monkeypatch, capsys, "audit", "privacy", str(tmp / "job.toml"), "--schema", str(SCHEMA),
                    "--canaries", "400", *extra,
                    *(a for p in ("alice", "bob", "carol") for a in ("--data", str(tmp / "d" / f"{p}.csv"))))


def test_the_job_as_planned_shows_no_violation_and_its_noiseless_control_does(
        job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _audit(job, monkeypatch, capsys)
    assert code == 0, err
    assert "stated ε = 1 at δ = 1e-07" in out and "no violation seen" in out, out
    code, out, err = _audit(job, monkeypatch, capsys, "--broken-control", "--json")
    assert code == 1, err
    got = json.loads(out)
    assert got["broken_control"] and got["violated"] and got["epsilon_lower_bound"] > got["stated_epsilon"], got
    assert got["correct"] == got["guesses"] and got["canaries"] == 400


def test_a_job_the_audit_cannot_run_is_refused_naming_the_field(
        job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (job / "ridge.toml").write_text(JOB.format(eps=1.0).replace('name = "logistic"', 'name = "ridge"'))
    (job / "job.toml").rename(job / "keep.toml")
    (job / "ridge.toml").rename(job / "job.toml")
    try:
        code, _, err = _audit(job, monkeypatch, capsys)
    finally:
        (job / "job.toml").rename(job / "ridge.toml")
        (job / "keep.toml").rename(job / "job.toml")
    assert code == 2 and "model.name" in err and "ridge" in err, err


def test_a_job_with_data_owners_is_audited_on_the_rows_dealt_to_them(
        job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The example gradient job of six clinics (record level, add/remove, n̂ public): the three
    CSV files are pooled and their rows summed as the owners' clipped gradients are."""
    example = Path(__file__).resolve().parents[2] / "coordinator" / "examples" / "gradient-owners.toml"
    (job / "owners.toml").write_text(example.read_text())
    files = [a for p in ("alice", "bob", "carol") for a in ("--data", str(job / "d" / f"{p}.csv"))]
    if not (job / "d").exists():
        code, _, err = run_main(monkeypatch, capsys, "data", "example", "breast-cancer", "--out", str(job / "d"))
        assert code == 0, err
    for control, want in (((), 0), (("--broken-control",), 1)):
        code, out, err = run_main(monkeypatch, capsys, "audit", "privacy", str(job / "owners.toml"), "--schema",
                                  str(SCHEMA), "--canaries", "200", "--json", *control, *files)
        assert code == want, (control, out, err)
        got = json.loads(out)
        assert got["violated"] == bool(control) and got["stated_epsilon"] <= 1.0 + 1e-9, got
    code, _, err = run_main(monkeypatch, capsys, "audit", "privacy", str(job / "owners.toml"), "--schema",
                            str(SCHEMA), "--daemons", *files)
    assert code == 2 and "--daemons: a job with data owners" in err, err
