"""Jobs on parties' own CSV files through a shared data schema, with real daemons: the schema is
applied by each daemon (the released model equals the in-process protocol on the schema-mapped
rows), a member holding a different schema is refused naming it and the column, a job that
pins another schema digest is refused naming the field, and a public test file (``public_test``)
gives the job's published curve the released model's accuracy on it.

A knowledge-transfer job (``[transfer]``, DPSL-KT) runs on the same files: every member releases
the same sparse student, its report states the public rows' norm the in-process plan computes,
and ``report verify`` recomputes it from the seed.

The tests use one set of daemons (the ``cons`` fixture, started once for the module): the parties'
CSV files and schemas are written before it starts; the data owners' job needs none of them (a
compute party for data owners holds no rows)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from coordinator.consortium import LocalConsortium
from mpc_erm.data.schema import load_schema, read_csv_with_schema
from mpc_erm.jobs.status import TERMINAL

pytestmark = [pytest.mark.e2e]

SCHEMA = """
intercept = true
missing = "drop"

[label]
column = "outcome"
task = "binary"
positive = "sick"
negative = "well"

[[columns]]
name = "age"
type = "numeric"
low = 0
high = 100

[[columns]]
name = "ward"
type = "categorical"
categories = ["east", "west"]
"""

JOB = """
method = "gradient"

[job]
name = "schema-job"
dataset = "visits"
parties = ["alice", "bob", "carol"]
trust = "replicated"
test_no_noise = true
{pin}

[model]
name = "logistic"
lam = 1e-3

[privacy]
epsilon = 1.0
delta = 1e-6
clip = 1.0

[training]
iterations = 4
learning_rate = 5.0
"""


def _csv(path: Path, seed: int, n: int = 40) -> Path:
    rng = np.random.default_rng(seed)
    age = rng.integers(0, 120, n)  # some above the public bound 100: clipped by the schema
    ward = rng.choice(["east", "west", "north"], n)  # "north" is not listed: encoded as zeros
    outcome = np.where(age + rng.normal(0, 20, n) > 60, "sick", "well")
    rows = [f"{i},{w},{a},{o}" for i, (w, a, o) in enumerate(zip(ward, age, outcome, strict=True))]
    rows[3] = "3,east,,well"  # an empty cell: the row is dropped
    path.write_text("id,ward,age,outcome\n" + "\n".join(rows) + "\n")
    return path


def _run(cons: LocalConsortium, job: Path, out: Path) -> tuple[str, dict[str, dict]]:
    with cons.client() as client:
        job_id = client.submit(job)["job_id"]
        ends = {e["member"]: e for e in client.watch(job_id) if e["phase"] in TERMINAL or e["phase"] == "error"}
        if all(e["phase"] == "succeeded" for e in ends.values()):
            client.result(job_id, out)
    return job_id, ends


@dataclass
class Parties:
    """The daemons and the files their [datasets.visits] and [datasets.visits-other] name."""

    cons: LocalConsortium
    schema_file: Path
    files: dict[str, Path]
    public: Path


@pytest.fixture(scope="module")
def parties(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Parties]:
    """Three party daemons (replicated, no dealer, test-only jobs allowed) each holding its CSV file
    under the schema as "visits" (with the public test file), and as "visits-other", where carol's
    copy of the schema differs in one public bound."""
    root = tmp_path_factory.mktemp("schema-jobs")
    schema_file = root / "schema.toml"
    schema_file.write_text(SCHEMA)
    other = root / "other.toml"  # carol's copy differs in one public bound
    other.write_text(SCHEMA.replace("high = 100", "high = 90"))
    files = {p: _csv(root / f"{p}.csv", k) for k, p in enumerate(("alice", "bob", "carol"))}
    public = _csv(root / "public.csv", 99, n=60)  # a published test set every member holds
    data = {p: {"format": "csv", "path": f, "schema": schema_file, "public_test": public} for p, f in files.items()}
    # the same files as "visits-other", where carol's copy of the schema has another bound
    extra = {p: {"visits-other": {"format": "csv", "path": f, "schema": other if p == "carol" else schema_file},
                 # and as "visits-kt", with its own budget, for the knowledge-transfer job
                 "visits-kt": {"format": "csv", "path": f, "schema": schema_file, "public_test": public}}
             for p, f in files.items()}
    with LocalConsortium(root / "cons", dataset="visits", party_data=data, extra_datasets=extra, dealer=False,
                         allow_test_only=True, budget_epsilon=50.0) as cons:
        yield Parties(cons, schema_file, files, public)


TRANSFER_JOB = """
method = "output"

[job]
name = "kt-job"
dataset = "visits-kt"
parties = ["alice", "bob", "carol"]
trust = "replicated"

[model]
name = "logistic"
lam = 0.05

[privacy]
epsilon = 1.0
delta = 1e-6
mechanism = "gaussian"

[transfer]
rows = 50
seed = 3
student_sparsity = 2
"""


def test_a_knowledge_transfer_job_through_three_daemons(parties: Parties, tmp_path: Path) -> None:
    from mpc_erm import load_model
    from mpc_erm.jobs import load_job_file
    from mpc_erm.privacy.plan import plan_job, public_sizes
    from mpc_erm.privacy.report import PrivacyReport
    from mpc_erm.privacy.verify import verify_report

    job = tmp_path / "kt.toml"
    job.write_text(TRANSFER_JOB)
    with parties.cons.client() as client:
        job_id = client.submit(job)["job_id"]
        ends = {e["member"]: e for e in client.watch(job_id) if e["phase"] in TERMINAL or e["phase"] == "error"}
        assert {m: e["phase"] for m, e in ends.items()} == dict.fromkeys(("alice", "bob", "carol"), "succeeded"), ends
        assert client.result(job_id, tmp_path / "result")["models_identical"]
    model = load_model(tmp_path / "result")
    parts = [read_csv_with_schema(f, load_schema(parties.schema_file)) for f in parties.files.values()]
    assert model.theta.shape == (parts[0].d,) and int(np.count_nonzero(model.theta)) <= 2
    report = json.loads((tmp_path / "result" / "privacy_report.json").read_text())
    spec = load_job_file(job).spec
    plan = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, [p.n for p in parts]), n_features=parts[0].d)
    assert plan.transfer is not None and report["plan"]["transfer"]["operator_norm"] == plan.transfer.norm
    assert report["plan"]["dim"] == 50 and report["sensitivity_l2"] == pytest.approx(plan.sensitivity_l2())
    assert report["parameters"]["protocol"] == "knowledge_transfer", report["parameters"]
    v = verify_report(PrivacyReport.model_validate(report))
    assert v.ok and any(c.name == "transfer" for c in v.checks), [c for c in v.checks if not c.ok]

    # the public test file every party holds as the public rows: the same sparse student at every
    # member, the file's digest in the report, and `report verify` recomputes the norm from the file
    from click.testing import CliRunner

    from coordinator.cli import cli

    on_file = tmp_path / "kt-file.toml"
    on_file.write_text(TRANSFER_JOB.replace("rows = 50\nseed = 3\n", 'public = "public_test"\n'))
    with parties.cons.client() as client:
        job_id = client.submit(on_file)["job_id"]
        ends = {e["member"]: e for e in client.watch(job_id) if e["phase"] in TERMINAL or e["phase"] == "error"}
        assert {m: e["phase"] for m, e in ends.items()} == dict.fromkeys(("alice", "bob", "carol"), "succeeded"), ends
        assert client.result(job_id, tmp_path / "result-file")["models_identical"]
    got = json.loads((tmp_path / "result-file" / "privacy_report.json").read_text())["plan"]["transfer"]
    assert got["distribution"] == "public_test" and got["rows"] == 59 and len(got["sha256"]) == 64  # 60, one dropped
    runner = CliRunner()
    path = str(tmp_path / "result-file" / "privacy_report.json")
    alone = runner.invoke(cli, ["report", "verify", path])
    assert alone.exit_code == 1 and "--public-rows" in alone.output, alone.output
    given = runner.invoke(cli, ["report", "verify", path, "--public-rows", str(parties.public),
                                "--schema", str(parties.schema_file)])
    assert given.exit_code == 0, given.output

    # malicious-secure: every party proves its scores within ‖X̃‖₂·(G/λ + τ)·w and its noise share
    malicious = tmp_path / "kt-malicious.toml"
    malicious.write_text(TRANSFER_JOB.replace('trust = "replicated"', 'trust = "replicated"\nsecurity = "malicious"')
                         .replace('mechanism = "gaussian"', 'mechanism = "gaussian"\nnoise = "distributed"'))
    with parties.cons.client() as client:
        job_id = client.submit(malicious)["job_id"]
        ends = {e["member"]: e for e in client.watch(job_id) if e["phase"] in TERMINAL or e["phase"] == "error"}
        assert {m: e["phase"] for m, e in ends.items()} == dict.fromkeys(("alice", "bob", "carol"), "succeeded"), ends
        assert client.result(job_id, tmp_path / "result-malicious")["models_identical"]
    got = json.loads((tmp_path / "result-malicious" / "privacy_report.json").read_text())
    assert got["security"] == "malicious" and got["plan"]["transfer"]["rows"] == 50, got["security"]


def test_schema_jobs_through_three_daemons(parties: Parties, tmp_path: Path) -> None:
    cons, schema_file, files, public = parties.cons, parties.schema_file, parties.files, parties.public
    digest = load_schema(schema_file).digest()
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(pin=f'schema_sha256 = "{digest}"'))
    # a job pinning another schema: refused before any share moves, naming the field
    pinned = tmp_path / "pinned.toml"
    pinned.write_text(JOB.format(pin=f'schema_sha256 = "{"0" * 64}"'))
    _, ends = _run(cons, pinned, tmp_path / "unused")
    reasons = json.dumps(ends)
    assert "job.schema_sha256: party 'alice' holds schema" in reasons, ends
    # carol holds a schema with another bound: every member refuses, naming carol and the column
    mismatch = tmp_path / "mismatch.toml"
    mismatch.write_text(JOB.format(pin="").replace('dataset = "visits"', 'dataset = "visits-other"'))
    _, ends = _run(cons, mismatch, tmp_path / "unused2")
    assert all(e["phase"] == "failed" for e in ends.values()), ends
    alice = json.dumps(ends["alice"], ensure_ascii=False)
    assert "dataset schema mismatch: party 'carol' holds schema" in alice, ends
    assert "age: numeric [0, 100]" in alice and "age: numeric [0, 90]" in alice, alice
    # (a zero-noise job exhausts the data set's budget: it runs last)
    _, ends = _run(cons, job, tmp_path / "result")
    assert {m: e["phase"] for m, e in ends.items()} == dict.fromkeys(("alice", "bob", "carol"), "succeeded")

    # the release equals the protocol run in process on the schema-mapped rows (zero noise)
    from mpc_erm import load_model
    from mpc_erm.jobs import load_job_file
    from mpc_erm.privacy.plan import plan_job, public_sizes
    from mpc_erm.simulate.forecast import InProcessJob

    model = load_model(tmp_path / "result")
    parts = [read_csv_with_schema(f, load_schema(schema_file)) for f in files.values()]
    assert [p.n for p in parts] == [39, 39, 39]
    spec = load_job_file(job).spec
    plan = plan_job(spec, sampler="mpc", test_no_noise=True, sizes=public_sizes(spec, [39] * 3),
                    n_features=parts[0].d)
    theta = InProcessJob(spec, plan, parts).release(torch.Generator().manual_seed(0))
    np.testing.assert_allclose(model.theta, theta.numpy(), atol=1e-4)  # the MPC's fixed-point grid
    meta = json.loads((tmp_path / "result" / "model.json").read_text())
    assert meta["schema"] == load_schema(schema_file).to_dict() and meta["classes"] == ["well", "sick"]
    # the published curve scores each round's model on the public file: at the end, the released one
    import pandas as pd

    curve = json.loads((tmp_path / "result" / "metrics.json").read_text())["curve"]
    assert curve[-1]["round"] == 4 and all("test" in c and "own" not in c for c in curve), curve
    frame = pd.read_csv(public, dtype=str, keep_default_na=False)
    kept = frame[frame["age"] != ""]  # the schema drops the row with an empty cell
    assert curve[-1]["test"]["accuracy"] == pytest.approx(float((model.predict(kept) == kept["outcome"]).mean()))


def test_a_data_owners_bundle_carries_its_schema_and_predicts_raw_rows(parties: Parties, tmp_path: Path) -> None:
    """Three data owners with CSV files and the schema, through three compute-party daemons: each
    owner's own copy of the released model (state/jobs/<id>) records the schema, the feature names
    and the job, so `predict` takes raw rows like the compute parties' bundle of a schema job."""
    import pandas as pd

    from mpc_erm import load_model
    from tests.parties.test_owner_jobs import JOB as OWNER_JOB
    from tests.parties.test_owner_jobs import _run_to_success

    schema_file = tmp_path / "schema.toml"
    schema_file.write_text(SCHEMA)
    schema = load_schema(schema_file)
    files = [_csv(tmp_path / f"owner-{i}.csv", 10 + i) for i in range(3)]
    d = read_csv_with_schema(files[0], schema).d
    names = ", ".join(f'"owner-{i}"' for i in range(3))
    job = tmp_path / "owners.toml"
    job.write_text(OWNER_JOB.format(dataset="visits", d=d, owners=names, no_noise="true", eps=1.0, n=120, rounds=3))
    cons = parties.cons
    configs = [cons.add_owner(f"owner-{i}", {"visits": {"format": "csv", "path": f, "schema": schema_file,
                                                        "epsilon": 5.0, "delta": 1e-4}},
                              max_epsilon_per_job=2.0, allow_test_only=True, root=tmp_path / "owners")
               for i, f in enumerate(files)]
    job_id, _ = _run_to_success(cons, job, configs, tmp_path / "results")
    mine = load_model(tmp_path / "owners" / "owner-0" / "state" / "jobs" / job_id)
    assert mine.meta["schema"] == schema.to_dict() and mine.meta["classes"] == ["well", "sick"]
    assert mine.meta["job"]["name"] == "clinics" and mine.meta["job"]["dataset"] == "visits"
    assert mine.meta["feature_names"] == list(read_csv_with_schema(files[0], schema).feature_names)
    frame = pd.read_csv(files[1], dtype=str, keep_default_na=False)
    raw = mine.predict(frame)  # raw rows through the schema: the row with an empty cell gets None
    mapped = mine.predict(read_csv_with_schema(files[1], schema).X)
    assert [p for p in raw if p is not None] == list(mapped) and sum(p is None for p in raw) == 1
    theirs = load_model(tmp_path / "results" / job_id)  # the compute parties': the same weights
    np.testing.assert_array_equal(mine.theta, theirs.theta)
