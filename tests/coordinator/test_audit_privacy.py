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


def test_a_cnn_job_is_audited_with_gradient_canaries_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A network with no input column per canary (TF-Privacy's MNIST CNN on 28×28 pixels, three
    parties' CSVs through a 784-column schema): the CLI picks gradient canaries and names them."""
    import numpy as np

    rng = np.random.default_rng(0)
    header = ",".join(f"px{i}" for i in range(784)) + ",digit"
    parties = ("alice", "bob", "carol")
    for party in parties:
        rows = np.column_stack([rng.integers(0, 256, (40, 784)), rng.integers(0, 10, 40)])
        np.savetxt(tmp_path / f"{party}.csv", rows, fmt="%d", delimiter=",", header=header, comments="")
    columns = "".join(f'[[columns]]\nname = "px{i}"\ntype = "numeric"\nlow = 0\nhigh = 255\n\n' for i in range(784))
    (tmp_path / "schema.toml").write_text('row_norm = 1.0\n[label]\ncolumn = "digit"\ntask = "multiclass"\n'
                                          f"classes = {list(range(10))}\n\n{columns}")
    (tmp_path / "job.toml").write_text(
        'method = "gradient"\n[job]\nname = "cnn"\ndataset = "digits"\nparties = ["alice", "bob", "carol"]\n'
        'trust = "replicated"\n[model]\nname = "mnist_cnn"\ninput_shape = [1, 28, 28]\nn_classes = 10\n'
        '[privacy]\nepsilon = 1.0\ndelta = 1e-5\nclip = 1.0\nadjacency = "add_remove"\npublic_n = 120\n'
        "[training]\niterations = 8\nsampling_rate = 0.5\nlearning_rate = 0.3\n")
    args = ["audit", "privacy", str(tmp_path / "job.toml"), "--schema", str(tmp_path / "schema.toml"),
            "--canaries", "60", *(a for p in parties for a in ("--data", str(tmp_path / f"{p}.csv")))]
    code, out, err = run_main(monkeypatch, capsys, *args)
    assert code == 0 and "60 gradient canaries" in out and "no violation seen" in out, (out, err)
    code, out, err = run_main(monkeypatch, capsys, *args, "--broken-control", "--json")
    got = json.loads(out)
    assert code == 1 and got["canary_kind"] == "gradients" and got["violated"], (out, err)
