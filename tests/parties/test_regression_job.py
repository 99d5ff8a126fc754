"""A regression on parties' own CSV files through real daemons (issue 18's housing user, on a data
set every machine has: `mpc-erm data example diabetes`, 442 patients, the label in its own units):
the schema maps the label's public bounds onto [-1, 1] at each daemon; a ridge job with the in-MPC
noise ends at every party; a zero-noise job's release equals the in-process protocol on the
schema-mapped rows; the model predicts in the label's units (the bounds' inverse map of θ·x), and
`model predict` reports the R² of what it wrote."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from coordinator.consortium import LocalConsortium
from mpc_erm.data.schema import load_schema, read_csv_with_schema
from mpc_erm.jobs.status import TERMINAL
from tests.cli_main import run_main

pytestmark = [pytest.mark.e2e]

SCHEMA = Path(__file__).resolve().parents[2] / "coordinator" / "examples" / "schemas" / "progression.toml"
PARTIES = ("alice", "bob", "carol")
JOB = """
method = "gradient"

[job]
name = "{name}"
dataset = "{dataset}"
parties = ["alice", "bob", "carol"]
trust = "replicated"
{extra}

[model]
name = "ridge"
lam = 1e-3

[privacy]
epsilon = 4.0
delta = 1e-7
clip = 1.0

[training]
iterations = {T}
learning_rate = 1.9
{training}"""


def _run(cons: LocalConsortium, job: Path, out: Path) -> dict[str, str]:
    with cons.client() as client:
        job_id = client.submit(job)["job_id"]
        ends = {e["member"]: e["phase"] for e in client.watch(job_id)
                if e["phase"] in TERMINAL or e["phase"] == "error"}
        if set(ends.values()) == {"succeeded"}:
            client.result(job_id, out)
    return ends


def test_a_regression_on_raw_units_through_three_daemons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(monkeypatch, capsys, "data", "example", "diabetes", "--out", str(tmp_path / "d"))
    assert code == 0, err
    files = {p: tmp_path / "d" / f"{p}.csv" for p in PARTIES}
    data = {p: {"format": "csv", "path": f, "schema": SCHEMA} for p, f in files.items()}
    noisy, quiet = tmp_path / "noisy.toml", tmp_path / "quiet.toml"
    noisy.write_text(JOB.format(name="progression-dp", dataset="progression", extra="", T=100, training=""))
    quiet.write_text(JOB.format(name="progression-0", dataset="scratch", extra="test_no_noise = true", T=20,
                                training=""))
    # DP-IGHT (training.sparsity): the same job keeping 4 of its 11 weights after each step
    sparse, sparse_quiet = tmp_path / "sparse.toml", tmp_path / "sparse-quiet.toml"
    sparse.write_text(JOB.format(name="progression-sparse", dataset="progression", extra="", T=100,
                                 training="sparsity = 4\n"))
    sparse_quiet.write_text(JOB.format(name="progression-sparse-0", dataset="scratch2", extra="test_no_noise = true",
                                       T=20, training="sparsity = 4\n"))
    with LocalConsortium(tmp_path / "cons", dataset="progression", party_data=data, dealer=False,
                         allow_test_only=True, budget_epsilon=50.0, max_epsilon_per_job=4.0,
                         scratch_datasets=("scratch", "scratch2")) as cons:  # a zero-noise job exhausts its own
        assert _run(cons, noisy, tmp_path / "dp") == dict.fromkeys(PARTIES, "succeeded")
        assert _run(cons, quiet, tmp_path / "zero") == dict.fromkeys(PARTIES, "succeeded")
        assert _run(cons, sparse, tmp_path / "sparse") == dict.fromkeys(PARTIES, "succeeded")
        assert _run(cons, sparse_quiet, tmp_path / "sparse-zero") == dict.fromkeys(PARTIES, "succeeded")

    report = json.loads((tmp_path / "dp" / "privacy_report.json").read_text())
    assert report["rounds"] == 100 and report["epsilon"] <= 4.0 and report["noise_scale"] > 0
    assert report["plan"]["public_counts"] == [118, 118, 118]

    # the zero-noise release is the protocol run in process on the schema-mapped rows
    from mpc_erm import load_model
    from mpc_erm.jobs import load_job_file
    from mpc_erm.privacy.plan import plan_job, public_sizes
    from mpc_erm.simulate.forecast import InProcessJob

    schema = load_schema(SCHEMA)
    parts = [read_csv_with_schema(f, schema) for f in files.values()]
    assert all(p.task == "regression" and np.abs(p.y).max() <= 1.0 for p in parts)
    spec = load_job_file(quiet).spec
    plan = plan_job(spec, sampler="mpc", test_no_noise=True, sizes=public_sizes(spec, [118] * 3),
                    n_features=parts[0].d)
    theta = InProcessJob(spec, plan, parts).release(torch.Generator().manual_seed(0))
    model = load_model(tmp_path / "zero")
    np.testing.assert_allclose(model.theta, theta.numpy(), atol=1e-4)  # the MPC's fixed-point grid

    # DP-IGHT through the daemons: 4 non-zeros released, the same report as the job without it, and
    # its zero-noise release is IGHT run in process on the same rows (the same entries kept)
    assert np.count_nonzero(load_model(tmp_path / "sparse").theta) <= 4
    sparse_report = json.loads((tmp_path / "sparse" / "privacy_report.json").read_text())
    assert sparse_report["epsilon"] == report["epsilon"] and sparse_report["noise_scale"] == report["noise_scale"]
    sparse_spec = load_job_file(sparse_quiet).spec
    ight = InProcessJob(sparse_spec, plan_job(sparse_spec, sampler="mpc", test_no_noise=True,
                                              sizes=public_sizes(sparse_spec, [118] * 3), n_features=parts[0].d),
                        parts).release(torch.Generator().manual_seed(0)).numpy()
    released = load_model(tmp_path / "sparse-zero").theta.reshape(-1)
    assert np.count_nonzero(ight) == 4 and set(np.flatnonzero(released)) == set(np.flatnonzero(ight))
    np.testing.assert_allclose(released, ight, atol=1e-4)

    # predictions in the label's units: the public bounds [0, 350] undo the [-1, 1] mapping
    new = tmp_path / "d" / "new.csv"
    held = read_csv_with_schema(new, schema)
    frame = pd.read_csv(new, dtype=str, keep_default_na=False)
    by_hand = 0.0 + (np.asarray(held.X) @ model.theta.reshape(-1) + 1.0) / 2.0 * 350.0
    np.testing.assert_allclose(np.asarray(model.predict(frame), dtype=float), by_hand, rtol=1e-9, atol=1e-9)

    # `model predict` writes them and reports the R² of what it wrote
    out = tmp_path / "predictions.csv"
    code, text, err = run_main(monkeypatch, capsys, "model", "predict", "--model", str(tmp_path / "dp"),
                               "--data", str(new), "--out", str(out))
    assert code == 0, err
    r2 = re.search(r"R² (-?[0-9.]+)", text)
    assert r2 is not None, text
    pred = pd.read_csv(out)["prediction"].to_numpy()
    truth = frame["progression"].astype(float).to_numpy()
    assert float(r2.group(1)) == pytest.approx(1 - ((pred - truth) ** 2).sum() / ((truth - truth.mean()) ** 2).sum(),
                                               abs=1e-4)
    print(f"\nridge on diabetes through 3 daemons, ε = {report['epsilon']:.3f} (δ = {report['delta']:.2g}), "
          f"T = 100: held-out R² {float(r2.group(1)):.4f}")
