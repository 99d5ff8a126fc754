"""`job plan` leaves its verdict beside the job file and `job submit` reads it: a job its dry run
found hopeless is not sent without --yes (exit 3, before any daemon is contacted), a job changed
since its dry run is pointed out, and a usable one goes through with its forecast in one line.

The forecasts are real: breast-cancer rows as three parties' CSV files (`mpc-erm data example`),
the example consortium's schema, and the job's own protocol run in process."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.cli_main import run_main

SCHEMA = Path(__file__).resolve().parents[2] / "coordinator" / "examples" / "schemas" / "diagnosis.toml"
JOB = """\
method = "gradient"

[job]
name = "diagnosis-model"
dataset = "diagnosis"
parties = ["alice", "bob", "carol"]
trust = "replicated"

[model]
name = "logistic"
lam = 1e-3

[privacy]
epsilon = {eps}
delta = 1e-7
clip = 1.0

[training]
iterations = 30
learning_rate = 5.0
"""


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    code, _, err = run_main(monkeypatch, capsys, "data", "example", "breast-cancer", "--out", str(tmp_path / "d"))
    assert code == 0, err
    (tmp_path / "coordinator.toml").write_text("# never read: the gate stops the submission first\n")
    return tmp_path


def _plan(tmp: Path, job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
          ) -> tuple[int, str, str]:
    return run_main(monkeypatch, capsys, "job", "plan", str(job), "--schema", str(SCHEMA), "--runs", "2",
                    *(a for p in ("alice", "bob", "carol") for a in ("--data", str(tmp / "d" / f"{p}.csv"))))


def _submit(tmp: Path, job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            *extra: str) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    return run_main(monkeypatch, capsys, "job", "submit", str(job), "--config", str(tmp / "nowhere.toml"), *extra)


def test_a_hopeless_job_is_sent_only_with_yes(files: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    job = files / "job.toml"
    job.write_text(JOB.format(eps=0.001))  # 455 rows, ε = 0.001: the noise is hundreds of times the signal
    code, out, _ = _plan(files, job, monkeypatch, capsys)
    assert code == 3 and "HOPELESS" in out and "job.plan.json" in out, out
    receipt = json.loads((files / "job.plan.json").read_text())
    assert receipt["hopeless"] is True and receipt["noise_to_signal"] > 3
    assert receipt["stand_in_files"] == ["alice.csv", "bob.csv", "carol.csv"]  # names only, no rows
    assert "malignant" not in (files / "job.plan.json").read_text()

    code, out, err = _submit(files, job, monkeypatch, capsys)
    assert code == 3 and "HOPELESS" in err and "Nothing was sent" in err and "--yes" in err, (out, err)
    # with --yes the gate lets it through: the next step is the coordinator's config (absent here)
    code, out, err = _submit(files, job, monkeypatch, capsys, "--yes")
    assert code != 3 and "Submitted anyway (--yes)" in err, (code, out, err)
    assert "nowhere.toml" in out + err

    job.write_text(JOB.format(eps=0.002))  # another version of the job: its old dry run does not count
    code, out, err = _submit(files, job, monkeypatch, capsys)
    assert code != 3 and "dry run of another version of this job" in err, (code, err)


def test_a_usable_job_shows_its_forecast_and_an_unplanned_one_a_hint(
        files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    job = files / "usable.toml"
    job.write_text(JOB.format(eps=2.0))
    code, out, err = _submit(files, job, monkeypatch, capsys)
    assert code != 3 and "dry run" not in err  # no advice for a script
    monkeypatch.setattr(sys.modules["coordinator.cli.job_plan"], "stderr_is_terminal", lambda: True)
    code, out, err = _submit(files, job, monkeypatch, capsys)
    assert code != 3 and "no dry run of this job" in err and "mpc-erm job plan usable.toml" in err
    code, out, _ = _plan(files, job, monkeypatch, capsys)
    assert code == 0 and "ok: the noise leaves the signal usable" in out, out
    assert "security: semi-honest (3 compute parties with replicated sharing: no two may work together" in out, out
    assert json.loads((files / "usable.plan.json").read_text())["security"] == "semi-honest"
    code, out, err = _submit(files, job, monkeypatch, capsys)
    assert code != 3 and "dry run (" in err and "simulated accuracy 0." in err, err


NETWORK_JOB = """\
method = "gradient"

[job]
name = "diagnosis-net"
dataset = "diagnosis"
parties = ["alice", "bob", "carol"]
trust = "replicated"

[model]
name = "mlp"
input_shape = [8]               # the schema's 7 columns and its intercept
n_classes = 2
hidden = [16]

[privacy]
epsilon = {eps}
delta = 1e-6
clip = 1.0
adjacency = "add_remove"
public_n = 400

[training]
iterations = 30
learning_rate = 0.1
optimizer = "adam"
"""


def test_a_network_job_is_forecast_by_its_own_dp_sgd_rounds(files: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    job = files / "net.toml"
    job.write_text(NETWORK_JOB.format(eps=2.0))
    code, out, err = _plan(files, job, monkeypatch, capsys)
    assert code == 0 and "ok: the noise leaves the signal usable" in out, (out, err)
    assert "178 numbers" in out and "the same rounds without noise" in out, out
    receipt = json.loads((files / "net.plan.json").read_text())
    assert receipt["private_mean"] > receipt["constant_predictor"] + 0.1, receipt
    assert receipt["nonprivate_is"] == "noise_free_rounds"

    job.write_text(NETWORK_JOB.format(eps=0.02))
    code, out, _ = _plan(files, job, monkeypatch, capsys)
    assert code == 3 and "HOPELESS" in out, out


OWNER_JOB = """\
method = "{method}"

[job]
name = "clinics"
dataset = "diagnosis"
parties = ["alice", "bob", "carol"]
trust = "replicated"
owners = [{owners}]
features = {features}

[model]
name = "{model}"
lam = 1e-3
{extra}
[privacy]
epsilon = 2.0
delta = 1e-6
clip = {clip}
adjacency = "add_remove"
public_n = {n}

[training]
iterations = {T}
learning_rate = {lr}
"""
FEDERATED = """
[federated]
local_epochs = 1
local_batch = 10
local_lr = 0.5
local_lr_decay = 0.99
"""


def test_a_job_never_planned_is_checked_against_its_noise_floor(files: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Without a dry run, `job submit` still stops a job that is hopeless on any data: its noise
    floor, from the job file alone (the network's σ with the public n̂, on its 178 parameters,
    against the clip), exit 3 before any daemon is contacted; a usable job's floor is shown at a
    terminal; a replace-one job's floor is the rows it needs (its σ follows the agreed counts)."""
    job = files / "net.toml"
    job.write_text(NETWORK_JOB.format(eps=0.005))
    code, out, err = _submit(files, job, monkeypatch, capsys)
    assert code == 3 and "likely hopeless on any data" in err and "on 178 numbers" in err, (code, out, err)
    assert "its dry run decides" in err, err  # a ratio does not decide a DP-SGD job: its forecast does
    assert "Nothing was sent" in err and not (files / "net.plan.json").exists()
    code, out, err = _submit(files, job, monkeypatch, capsys, "--yes")
    assert code != 3 and "Submitted anyway (--yes)" in err and "nowhere.toml" in out + err, (code, out, err)

    job.write_text(NETWORK_JOB.format(eps=2.0))
    code, out, err = _submit(files, job, monkeypatch, capsys)
    assert code != 3 and "job file alone" not in err  # nothing for a script
    monkeypatch.setattr(sys.modules["coordinator.cli.job_plan"], "stderr_is_terminal", lambda: True)
    code, out, err = _submit(files, job, monkeypatch, capsys)
    assert code != 3 and "no dry run of this job" in err, err
    assert "from the job file alone: gaussian noise σ = " in err and "noise/signal ≥ 0.0" in err, err

    job.write_text(JOB.format(eps=0.001))  # hopeless in its dry run (above); replace-one: the rows it needs
    code, out, err = _submit(files, job, monkeypatch, capsys)
    assert code != 3 and "no dry run of this job" in err, err
    need = int(re.search(r"unless the parties hold at least ([\d,]+) rows in all", err)[1].replace(",", ""))
    assert need > 455, err  # more than the 455 breast-cancer rows its dry run above found hopeless (2,334)


def _owner_job(n: int, *, method: str = "gradient", features: int = 8, federated: bool = False) -> str:
    owners = ", ".join(f'"clinic-{i:03d}"' for i in range(n))
    if federated:
        job = OWNER_JOB.format(method=method, owners=owners, features=features, model="softmax",
                               extra="n_classes = 2\n", clip=0.4, n=n, T=6, lr=1.0)
        return job + "sampling_rate = 0.5\n" + FEDERATED
    return OWNER_JOB.format(method=method, owners=owners, features=features, model="logistic", extra="", clip=1.0,
                            n=455, T=30, lr=5.0)


def test_a_job_with_data_owners_is_forecast_on_rows_dealt_to_its_owners(
        files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Any number of stand-in files: their rows are pooled and dealt to the job's owners; a
    gradient job's rounds (the public n̂) and a federated job's own DP-Fed-LS rounds, its verdict
    naming the federated knobs when the rounds do not train; a schema of another width than the
    job's `features` is named."""
    job = files / "owners.toml"
    job.write_text(_owner_job(6))
    code, out, err = _plan(files, job, monkeypatch, capsys)
    assert code == 0 and "455 stand-in rows dealt to 6 owners (about 75 each)" in out, (out, err)
    receipt = json.loads((files / "owners.plan.json").read_text())
    assert receipt["nonprivate_is"] == "exact_minimiser"
    assert receipt["private_mean"] > receipt["constant_predictor"] + 0.1

    # 60 owners of about 7 rows, one local epoch of one step each for 6 rounds: not enough training
    job.write_text(_owner_job(60, federated=True).replace("epsilon = 2.0", "epsilon = 8.0"))
    code, out, err = _plan(files, job, monkeypatch, capsys)
    receipt = json.loads((files / "owners.plan.json").read_text())
    assert "dealt to 60 owners" in out and receipt["nonprivate_is"] == "noise_free_rounds", (out, err)
    assert receipt["rounds"] == 6 and receipt["dim"] == 18  # softmax: 2 × 8 weights + 2 biases
    assert receipt["noise_to_signal"] < 1  # not the noise's fault:
    assert code == 3 and "not for privacy" in out and "tune federated.local_lr" in out, out

    job.write_text(_owner_job(6, features=30))
    code, _, err = _plan(files, job, monkeypatch, capsys)
    assert code != 0 and "job.features = 30" in err and "8 features" in err, err


def test_a_distributed_noise_job_forecasts_the_noise_every_party_adds(
        files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    job = files / "shared.toml"
    job.write_text(JOB.format(eps=2.0))
    data = [a for p in ("alice", "bob", "carol") for a in ("--data", str(files / "d" / f"{p}.csv"))]
    code, out, _ = run_main(monkeypatch, capsys, "job", "plan", str(job), "--schema", str(SCHEMA), "--runs", "1",
                            "--json", *data)
    in_mpc = json.loads(out)
    job.write_text(JOB.format(eps=2.0).replace("clip = 1.0", 'clip = 1.0\nnoise = "distributed"'))
    code, out, _ = _plan(files, job, monkeypatch, capsys)
    assert code == 0 and "noise: distributed (each of the 3 compute parties adds its own share; the guarantee rests " \
                          "on the 2 honest ones' shares alone (up to 1 corrupt), so the noise is 1.22× the in-MPC " \
                          "sampler's)" in out, out
    shared = json.loads((files / "shared.plan.json").read_text())
    assert shared["noise"] == "distributed" and in_mpc["noise"] == "mpc"
    assert shared["noise_std_per_coordinate"] == pytest.approx(1.5**0.5 * in_mpc["noise_std_per_coordinate"])
    assert shared["epsilon"] == pytest.approx(in_mpc["epsilon"])  # the same guarantee, from the honest shares
    job.write_text(JOB.format(eps=2.0).replace("clip = 1.0", 'clip = 1.0\nnoise = "distributed"')
                   .replace('trust = "replicated"', 'trust = "replicated"\nsecurity = "malicious"'))
    code, out, _ = _plan(files, job, monkeypatch, capsys)
    assert code == 0 and "security: malicious, with abort (3 compute parties with replicated sharing" in out, out
    assert json.loads((files / "shared.plan.json").read_text())["security"] == "malicious"


def test_the_submit_check_of_a_linear_job_plans_it_without_importing_torch() -> None:
    """`job submit` checks a job never planned against its noise floor: for a linear model the
    plan's constants and dimension come from mpc_erm.models.facts, so the check (a fresh process,
    as the CLI) never pays torch's import."""
    from tests.fresh_python import fresh_python

    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from mpc_erm.jobs import load_job_file\n"
        "from mpc_erm.privacy.noise_floor import noise_floor\n"
        "from coordinator.cli.job_plan import check_before_submit\n"
        "p = Path('coordinator/examples/gradient-owners.toml')\n"
        "jf = load_job_file(p)\n"
        "check_before_submit(p, jf, yes=True)\n"
        "floor = noise_floor(jf.spec, features=jf.job.features)\n"
        "assert floor is not None and floor.dim_known, floor\n"
        "print(floor.describe())\n"
        "print('torch' in sys.modules)\n"
    )
    described, imported = fresh_python(code)
    assert "noise/signal" in described and imported == "False", (described, imported)


def test_search_proposes_a_sampling_rate_rounds_and_step_that_the_dry_run_then_passes(
        files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """At ε = 0.5 the network as written (q = 0.5, 60 rounds, η = 0.1) forecasts a constant; --search
    forecasts the grid around it at the same (ε, δ), proposes a setting that beats it, and that
    setting, written into the job file, passes its own dry run. The receipt keeps the search."""
    job = files / "net.toml"
    job.write_text(NETWORK_JOB.format(eps=0.5).replace("iterations = 30", "iterations = 60\nsampling_rate = 0.5"))
    code, out, _ = run_main(monkeypatch, capsys, "job", "plan", str(job), "--schema", str(SCHEMA), "--runs", "2",
                            "--search", "--search-runs", "1",
                            *(a for p in ("alice", "bob", "carol") for a in ("--data", str(files / "d" / f"{p}.csv"))))
    assert code == 3 and "HOPELESS" in out and "a smaller training.sampling_rate" in out, out
    assert "spends no ε only if they are public" in out and "← as written" in out, out
    receipt = json.loads((files / "net.plan.json").read_text())
    proposed = receipt["search"]["proposed"]
    assert proposed is not None and len(receipt["search"]["settings"]) == 27, receipt["search"]
    line = re.search(r"proposed: \[training\] (.*) → accuracy ([0-9.]+)", out)
    assert line is not None, out
    text = job.read_text()
    for key in ("sampling_rate", "iterations", "learning_rate"):
        text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {proposed[key]!r}", text)
    job.write_text(text)
    code, out, _ = _plan(files, job, monkeypatch, capsys)
    assert code == 0 and "ok: the noise leaves the signal usable" in out, out


def test_a_softmax_job_is_planned_with_the_class_count_of_the_schema_it_pins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """model.n_classes left to the pinned schema: the dry run reads the count from --schema (3
    cultivars: 14 × 3 = 42 numbers), as each party does; a binary schema is refused for it."""
    from mpc_erm.data.schema import load_schema
    from tests.parties.test_worker import SOFTMAX_FROM_SCHEMA, wine_files

    schema, csvs = wine_files(tmp_path / "wine")
    job = tmp_path / "wine.toml"
    job.write_text(SOFTMAX_FROM_SCHEMA.format(digest=load_schema(schema).digest()).replace('dealer = "dealer"\n', "")
                   .replace('trust = "dealer"', 'trust = "replicated"'))
    data = [a for p in ("alice", "bob", "carol") for a in ("--data", str(csvs[p]))]
    code, out, err = run_main(monkeypatch, capsys, "job", "plan", str(job), "--schema", str(schema), "--runs", "2",
                              *data)
    assert code in (0, 3) and "release(s) of 42 numbers" in out, (out, err)


def test_a_knowledge_transfer_job_plans_on_csv_files_and_says_what_it_releases(
        files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`[transfer]` on an output job: the dry run names knowledge transfer, counts the public rows'
    scores as the release, and forecasts the student on the held rows."""
    job = files / "kt.toml"
    job.write_text(JOB.format(eps=4.0).replace('method = "gradient"', 'method = "output"')
                   .replace("clip = 1.0", 'mechanism = "gaussian"')
                   .split("[training]")[0] + "[transfer]\nrows = 300\nstudent_sparsity = 8\n")
    code, out, err = _plan(files, job, monkeypatch, capsys)
    assert code in (0, 3), err
    assert "knowledge transfer" in out and "1 release(s) of 300 numbers" in out, out
    receipt = json.loads((files / "kt.plan.json").read_text())
    assert receipt["dim"] == 300 and receipt["method"] == "output"


def test_a_transfer_job_on_the_public_test_file_plans_on_the_eval_file(
        files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``transfer.public = "public_test"``: the dry run scores the --eval file as the public rows
    (in the daemons, the data set's public test file), and without one it says which option to give."""
    job = files / "kt-file.toml"
    job.write_text(JOB.format(eps=4.0).replace('method = "gradient"', 'method = "output"')
                   .replace("clip = 1.0", 'mechanism = "gaussian"')
                   .split("[training]")[0] + '[transfer]\npublic = "public_test"\n')
    code, _, err = _plan(files, job, monkeypatch, capsys)
    assert code != 0 and "--eval" in err, err
    data = [a for p in ("alice", "bob", "carol") for a in ("--data", str(files / "d" / f"{p}.csv"))]
    code, out, err = run_main(monkeypatch, capsys, "job", "plan", str(job), "--schema", str(SCHEMA), "--runs", "2",
                              "--eval", str(files / "d" / "new.csv"), *data)
    assert code in (0, 3) and "knowledge transfer" in out, (out, err)
    rows = sum(1 for _ in (files / "d" / "new.csv").open()) - 1
    assert f"1 release(s) of {rows} numbers" in out, out
