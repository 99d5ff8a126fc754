"""`mpc-erm report verify`: a report made by a job's plan recomputes on its own; a report whose
numbers were changed (ε lowered, counts altered, noise shrunk, event swapped) does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from coordinator.cli import cli
from mpc_erm.mpc.noise import realise
from mpc_erm.privacy.plan import PublicSizes, plan_job
from mpc_erm.privacy.report import SIMULATION_TRUST_MODEL
from mpc_erm.spec import JobSpec


def _report(method: str = "gradient", adjacency: str = "replace", mechanism: str = "gaussian") -> dict:
    privacy: dict = {"epsilon": 1.0, "delta": 1e-5, "adjacency": adjacency}
    if method == "gradient":
        privacy["clip"] = 1.0
    else:
        privacy["mechanism"] = mechanism
    if adjacency == "add_remove":
        privacy["public_n"] = 30000
    spec = JobSpec.model_validate({"method": method, "model": {"name": "logistic", "lam": 1e-3}, "privacy": privacy,
                                   "training": {"iterations": 50 if method == "gradient" else 1}})
    sizes = PublicSizes(counts=(10054, 10054, 10054)) if adjacency == "replace" else PublicSizes(public_n=30000)
    plan = plan_job(spec, sampler="mpc", sizes=sizes, n_features=104)
    real = realise(plan, 3)
    rep = plan.report(noise_scale=real.report_scale, realisation=real.describe(),
                      trust_model="MPC: CrypTen 3-party replicated sharing (test)", parties=3, security="semi-honest")
    return json.loads(rep.to_json())


def _verify(tmp_path: Path, rep: dict) -> tuple[int, str]:
    path = tmp_path / "privacy_report.json"
    path.write_text(json.dumps(rep))
    res = CliRunner().invoke(cli, ["report", "verify", str(path)])
    return res.exit_code, res.output


@pytest.mark.parametrize("kind", [("gradient", "replace", "gaussian"), ("gradient", "add_remove", "gaussian"),
                                  ("output", "replace", "gaussian"), ("output", "replace", "laplace_thesis"),
                                  ("output", "add_remove", "gaussian")])
def test_a_planned_report_holds(tmp_path: Path, kind: tuple[str, str, str]) -> None:
    code, out = _verify(tmp_path, _report(*kind))
    assert code == 0, out
    assert "holds" in out and "FAIL" not in out
    assert "semi-honest: the compute parties are trusted to follow the protocol" in out
    old = {k: v for k, v in _report(*kind).items() if k != "security"}  # written before reports stated it
    code, out = _verify(tmp_path, old)
    assert code == 0 and "not stated" in out, out


def _tampered(change: str) -> tuple[dict, str]:
    rep = _report()
    if change == "epsilon":
        rep["epsilon"] = 0.5
        return rep, "epsilon"
    if change == "counts":
        rep["plan"]["public_counts"] = [20000, 20000, 20000]
        return rep, "sensitivity"
    if change == "noise":
        rep["realisation"]["noise_scale_grid"] *= 0.9
        return rep, "noise"
    if change == "event":
        rep["plan"]["event"]["noise_multiplier"] *= 0.5
        return rep, "event"
    if change == "security":  # a claim no version of the engine can back
        rep["security"] = "malicious"
        return rep, "security"
    if change == "dealer-malicious":  # a dealer is trusted by construction
        rep["security"], rep["trust_model"] = "malicious", "MPC: CrypTen additive sharing, dealer 'dealer'"
        return rep, "security"
    if change == "simulation-security":  # an in-process run has no compute parties to state it of
        rep["security"], rep["trust_model"] = "semi-honest", SIMULATION_TRUST_MODEL
        return rep, "security"
    rep["realisation"]["sampler_tv_per_release"] = 1.0
    return rep, "sampler"


@pytest.mark.parametrize("change", ["epsilon", "counts", "noise", "event", "sampler", "security", "dealer-malicious",
                                    "simulation-security"])
def test_a_changed_report_does_not_hold(tmp_path: Path, change: str) -> None:
    rep, check = _tampered(change)
    code, out = _verify(tmp_path, rep)
    assert code == 1, out
    assert any(line.startswith("FAIL") and check in line for line in out.splitlines()), out
    assert "DOES NOT HOLD" in out


def test_json_output_and_a_report_without_plan(tmp_path: Path) -> None:
    rep = _report()
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rep))
    res = CliRunner().invoke(cli, ["report", "verify", "--json", str(path)])
    body = json.loads(res.output)
    assert res.exit_code == 0 and body["ok"] and body["epsilon"] <= 1.0
    del rep["plan"]
    code, out = _verify(tmp_path, rep)
    assert code == 1 and "no plan section" in out
    path.write_text("{not json")
    res = CliRunner().invoke(cli, ["report", "verify", str(path)])
    assert res.exit_code == 2 and "not a privacy report" in res.output


def test_report_explain_reads_the_report_and_the_job_name_beside_it(tmp_path: Path) -> None:
    rep = _report()
    path = tmp_path / "privacy_report.json"
    path.write_text(json.dumps(rep))
    (tmp_path / "model.json").write_text(json.dumps({"job": {"name": "income-model"}}))
    res = CliRunner().invoke(cli, ["report", "explain", str(path)])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("# Privacy statement — job 'income-model'")
    assert f"(ε, δ) = ({rep['epsilon']:.4g}, " in res.output and "replace-one adjacency" in res.output
    (tmp_path / "bad.json").write_text("{}")
    bad = CliRunner().invoke(cli, ["report", "explain", str(tmp_path / "bad.json")])
    assert bad.exit_code == 2 and "not a privacy report" in bad.output
