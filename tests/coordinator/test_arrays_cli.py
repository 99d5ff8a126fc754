"""Arrays and images without a schema, as a newcomer meets them: `data check` states rows, shape,
label counts and what a job does to them; `job plan` reads .npz stand-ins for a network job (and
asks for a schema for a linear one); `model predict` takes a network bundle with the same .npz and
PNG formats, labelled or not, and scores it where labels are given."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from coordinator.cli import cli
from mpc_erm.data import Dataset, save_numpy
from mpc_erm.models.bundle import save_network_bundle
from mpc_erm.models.networks import NetworkSpec, build_network

JOB = """\
method = "gradient"

[job]
name = "digits"
dataset = "digits"
parties = ["alice", "bob", "carol"]
trust = "replicated"

[model]
name = "{model}"
{shape}

[privacy]
epsilon = 1.0
delta = 1e-6
clip = 1.0
adjacency = "add_remove"
public_n = 1000

[training]
iterations = 30
{sampling}learning_rate = 1.0
"""
MLP = 'input_shape = [1, 8, 8]\nn_classes = 10\nhidden = [16]'


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's digits as three parties' .npz files (images (n, 8, 8), pixels in [0, 1]) and a
    held-out one, plus the PNG listing `data example digits` writes."""
    from sklearn.datasets import load_digits

    d = tmp_path_factory.mktemp("digits")
    b = load_digits()
    X, y = b.images / 16.0, b.target
    idx = np.random.default_rng(0).permutation(len(y))
    for name, rows in (("alice", idx[0:1200:3]), ("bob", idx[1:1200:3]), ("carol", idx[2:1200:3]),
                       ("new", idx[1200:])):
        np.savez(d / f"{name}.npz", X=X[rows], y=y[rows])
    np.savez(d / "unlabelled.npz", X=X[idx[1200:1210]])
    out = CliRunner().invoke(cli, ["data", "example", "digits", "--out", str(d / "png")])
    assert out.exit_code == 0, out.output
    return d


def test_data_check_states_rows_shape_labels_and_the_real_preprocessing(digits: Path) -> None:
    from coordinator.cli.data import check_dataset
    from parties.config import DatasetConfig

    for fmt, path, n in (("npz", digits / "alice.npz", 400), ("png", digits / "png" / "alice" / "labels.csv", None)):
        cfg = DatasetConfig.model_validate({"format": fmt, "path": str(path), "epsilon": 1.0, "delta": 1e-5})
        got = check_dataset("digits", cfg)
        assert got["schema"] is None and got["features"] == 64 and got["task"] == "multiclass", got
        assert got["row_shape"] == ([64] if fmt == "npz" else [1, 8, 8]), got
        assert 0.0 <= got["value_range"][0] and got["value_range"][1] <= 1.0
        assert sorted(got["label_counts"]) == [str(k) for k in range(10)]
        assert sum(got["label_counts"].values()) == got["rows"] and (n is None or got["rows"] == n)
        assert "clips each example's gradient" in got["preprocessing"] and "unit ball" in got["preprocessing"]
        assert "only clipped into the unit ball" not in json.dumps(got)


def test_job_plan_reads_npz_stand_ins_for_a_network_and_asks_a_linear_job_for_its_schema(
        digits: Path, tmp_path: Path) -> None:
    job = tmp_path / "net.toml"
    job.write_text(JOB.format(model="mlp", shape=MLP, sampling="sampling_rate = 0.25\n"))
    data = [a for p in ("alice", "bob", "carol") for a in ("--data", str(digits / f"{p}.npz"))]
    out = CliRunner().invoke(cli, ["job", "plan", str(job), "--eval", str(digits / "new.npz"), "--runs", "2", *data])
    assert out.exit_code == 0, out.output
    assert "rows: alice 400, bob 400, carol 400" in out.output
    assert "ok: the noise leaves the signal usable" in out.output
    linear = tmp_path / "linear.toml"
    linear.write_text(JOB.format(model="softmax", shape="n_classes = 10", sampling="").replace(
        'adjacency = "add_remove"\npublic_n = 1000\n', ""))
    out = CliRunner().invoke(cli, ["job", "plan", str(linear), *data])
    assert out.exit_code == 2 and "--schema" in out.output and "network jobs" in out.output, out.output


def test_model_predict_takes_a_network_bundle_on_arrays_and_images(digits: Path, tmp_path: Path) -> None:
    """A bundle of the released kind (no schema, classes 0..9), trained here in the clear so that
    its accuracy is known: `model predict` gives the same predictions and accuracy as the bundle
    in Python, on the .npz and on the PNG listing, and none without labels."""
    from mpc_erm import load_model

    spec = NetworkSpec("mlp", (1, 8, 8), 10, hidden=(16,))
    net = build_network(spec)
    with np.load(digits / "alice.npz") as f:
        X, y = torch.tensor(f["X"], dtype=torch.float32).reshape(-1, 1, 8, 8), torch.tensor(f["y"])
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(X), y).backward()
        opt.step()
    bundle = save_network_bundle(tmp_path / "bundle", spec, torch.nn.utils.parameters_to_vector(net.parameters()))
    with np.load(digits / "new.npz") as f:
        want = float(np.mean(load_model(bundle).predict(f["X"]) == f["y"]))
    assert want > 0.8
    out = CliRunner().invoke(cli, ["model", "predict", "--model", str(bundle), "--data", str(digits / "new.npz"),
                                   "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["rows"] == 597 and got["accuracy"] == pytest.approx(want)
    listing = digits / "png" / "new" / "labels.csv"
    out = CliRunner().invoke(cli, ["model", "predict", "--model", str(bundle), "--data", str(listing),
                                   "--out", str(tmp_path / "p.csv")])
    assert out.exit_code == 0 and f"labelled rows of {listing}: 0." in out.output, out.output
    preds = (tmp_path / "p.csv").read_text().splitlines()
    assert preds[0] == "prediction,probability" and len(preds) == 359 + 1
    unlabelled = str(digits / "unlabelled.npz")
    out = CliRunner().invoke(cli, ["model", "predict", "--model", str(bundle), "--data", unlabelled, "--json"])
    assert out.exit_code == 0 and "accuracy" not in json.loads(out.output), out.output
    bad = tmp_path / "bad.npz"
    np.savez(bad, X=np.zeros((3, 64)), y=np.array([0, 11, 2]))
    out = CliRunner().invoke(cli, ["model", "predict", "--model", str(bundle), "--data", str(bad)])
    assert out.exit_code != 0 and "labels must be the model's classes" in str(out.exception), out.output


def test_save_numpy_files_are_read_back_the_same(tmp_path: Path) -> None:
    """save_numpy (what the docs suggest for one's own arrays) round-trips through the readers."""
    from mpc_erm.data.loaders import load_inputs

    ds = Dataset(np.random.default_rng(1).random((5, 4)), np.array([0.0, 1, 2, 1, 0]), "multiclass", "x")
    X, y = load_inputs("npz", save_numpy(ds, tmp_path / "a.npz"))
    np.testing.assert_array_equal(X, ds.X) and np.testing.assert_array_equal(y, ds.y)
