"""Issue 16 through real daemons: a small CNN job — Poisson-subsampled DP-SGD with the in-MPC
discrete Gaussian — submitted by the coordinator client to 3 `mpc-erm party serve` processes and
a dealer, each party holding its own image files (IDX, and PNG folders at one party); and a job
naming a model plugin refused at admission by a party that does not have it, naming the party
and the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from coordinator.consortium import LocalConsortium
from mpc_erm.data.loaders import write_idx_file
from mpc_erm.jobs.status import TERMINAL
from tests.parties.test_worker import _images  # two classes of 28×28 images: a bright block top-left or bottom-right

pytestmark = [pytest.mark.e2e, pytest.mark.long]  # ~55 s: with the long campaigns (CI runs them)

JOB = """method = "gradient"

[job]
name = "cnn-daemons"
dataset = "images"
parties = ["alice", "bob", "carol"]
trust = "dealer"
dealer = "dealer"

[model]
name = "mnist_cnn"
input_shape = [1, 28, 28]
n_classes = 2
init_seed = 7

[privacy]
epsilon = 2.0
delta = 1e-5
clip = 1.0
adjacency = "add_remove"
public_n = 300
accountant = "rdp"

[training]
iterations = 6
learning_rate = 0.05
sampling_rate = 0.5
optimizer = "adam"
"""


def _png_folder(d: Path, img: np.ndarray, lab: np.ndarray) -> Path:
    from PIL import Image

    d.mkdir(parents=True)
    for i, a in enumerate(img):
        Image.fromarray(a).save(d / f"{i}.png")
    (d / "labels.csv").write_text("file,label\n" + "".join(f"{i}.png,{c}\n" for i, c in enumerate(lab)))
    return d / "labels.csv"


def _run(cons: LocalConsortium, job: Path, out: Path) -> tuple[str, dict[str, dict]]:
    with cons.client() as client:
        job_id = client.submit(job)["job_id"]
        ends = {e["member"]: e for e in client.watch(job_id) if e["phase"] in TERMINAL or e["phase"] == "error"}
        if all(e["phase"] == "succeeded" for e in ends.values()):
            client.result(job_id, out)  # compares the model file's sha256 across every party
    return job_id, ends


def _check_own_progress(cons: LocalConsortium, job_id: str, result: Path) -> None:
    """Alice's operator sees loss and accuracy on her held-out rows per epoch (`mpc-erm party
    progress`); none of it is in what the coordinator fetched."""
    from click.testing import CliRunner

    from coordinator.cli import cli

    run = CliRunner().invoke(cli, ["party", "progress", "--config", str(cons.members["alice"].config), job_id,
                                    "--json"])
    assert run.exit_code == 0, run.output
    points = [json.loads(line) for line in run.output.splitlines()]
    assert [p["round"] for p in points] == [2, 4, 6]  # once an epoch (q = 0.5) and at the end
    for p in points:
        assert set(p["own"]) == {"train", "validation"}
        assert 0.0 <= p["own"]["validation"]["accuracy"] <= 1.0 and p["own"]["validation"]["loss"] > 0
    table = CliRunner().invoke(cli, ["party", "progress", "--config", str(cons.members["alice"].config), job_id])
    assert table.exit_code == 0 and "val acc" in table.output and len(table.output.splitlines()) == 4, table.output
    bob = CliRunner().invoke(cli, ["party", "progress", "--config", str(cons.members["bob"].config), job_id,
                                    "--json"])
    assert all("validation" not in json.loads(line)["own"] for line in bob.output.splitlines())  # bob holds none out
    fetched = "".join(p.read_text(errors="replace") for p in result.iterdir() if p.suffix in (".json", ".toml"))
    assert "validation" not in fetched and '"own"' not in fetched
    bad = CliRunner().invoke(cli, ["party", "progress", "--config", str(cons.members["alice"].config), "../x"])
    assert bad.exit_code != 0 and "not a job id" in bad.output


def test_a_subsampled_cnn_job_runs_through_the_daemons_on_each_partys_image_files(tmp_path: Path) -> None:
    data: dict[str, dict[str, object]] = {}
    for i, name in enumerate(("alice", "bob", "carol")):
        img, lab = _images(100, i)
        if name == "carol":  # a folder of PNGs with a CSV of labels
            data[name] = {"format": "png", "path": _png_folder(tmp_path / "carol-png", img, lab)}
        else:
            data[name] = {"format": "idx", "path": write_idx_file(tmp_path / f"{name}-x.idx", img),
                          "labels": write_idx_file(tmp_path / f"{name}-y.idx", lab)}
        data[name]["adjacency"] = "add_remove"
    data["alice"]["validation_fraction"] = 0.2  # 20 rows held out: her own per-epoch view, never sent
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    with LocalConsortium(tmp_path / "cons", dataset="images", party_data=data, max_epsilon_per_job=2.0) as cons:
        job_id, ends = _run(cons, job, tmp_path / "result")
        assert {m: e["phase"] for m, e in ends.items()} == dict.fromkeys(("alice", "bob", "carol", "dealer"),
                                                                        "succeeded"), ends
        _check_own_progress(cons, job_id, tmp_path / "result")
        # a plugin this party set does not have: refused at admission, naming the party and the field
        plugin = tmp_path / "plugin.toml"
        plugin.write_text(JOB.replace('name = "mnist_cnn"', 'name = "plugin"\nplugin = "acme-cnn"\n'
                                      f'plugin_digest = "sha256:{"ab" * 32}"'))
        from coordinator.client import SubmitRefused

        with cons.client() as client, pytest.raises(SubmitRefused) as refused:
            client.submit(plugin)
        assert "model.plugin: alice has no model plugin 'acme-cnn'" in str(refused.value)
        # DP-SRM (the thesis's ch. 4) on the same files: two gradients per example, at the last two
        # public models, each increment within privacy.clip; the same plan as DP-SGD's
        srm = tmp_path / "srm.toml"
        srm.write_text(JOB.replace('name = "cnn-daemons"', 'name = "cnn-srm"').replace(
            'optimizer = "adam"', 'optimizer = "srm"\nsrm_momentum = 0.5\nclip_difference = 0.5\nmax_step = 1.0')
            .replace("epsilon = 2.0", "epsilon = 1.0"))
        _srm_id, srm_ends = _run(cons, srm, tmp_path / "srm-result")
        assert {m: e["phase"] for m, e in srm_ends.items()} == dict.fromkeys(("alice", "bob", "carol", "dealer"),
                                                                            "succeeded"), srm_ends
        srm_rep = json.loads((tmp_path / "srm-result" / "privacy_report.json").read_text())
        assert srm_rep["rounds"] == 6 and srm_rep["epsilon"] <= 1.0
        assert any("DP-SRM of mnist_cnn" in note and "C₁ = 1.5, C₂ = 0.5" in note for note in srm_rep["notes"]), \
            srm_rep["notes"]
    import mpc_erm

    model = mpc_erm.load_model(tmp_path / "result")
    rep = json.loads((tmp_path / "result" / "privacy_report.json").read_text())
    assert rep["rounds"] == 6 and rep["epsilon"] <= 2.0 and rep["plan"]["event"]["discrete"] is True
    assert rep["plan"]["sampling_rate"] == 0.5 and "exact moments" in rep["accountant"]
    img, lab = _images(200, 99)
    acc = float(np.mean(model.predict(img.reshape(200, -1) / 255.0) == np.where(lab == 1, "positive", "negative")))
    assert acc > 0.7, acc
