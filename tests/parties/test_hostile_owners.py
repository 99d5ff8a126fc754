"""Hostile data owners against real daemons: every contribution is checked on its shares against
its public ℓ2 bound before it enters a sum (mpc_erm.mpc.validation), and a failing one is a dropout.

Three compute-party daemons; eight real ``mpc-erm owner join`` processes, four honest and four
that deviate in what they send (``tests.parties.hostile_owner``): 10⁶ × their contribution, a NaN
bit pattern, their round-1 share replayed in later rounds, shares made under other keys (another
job's, another owner's slot). Test-only zero noise, so a release is exact:

- replicated sharing (3 parties, no dealer) and the dealer mode: every hostile contribution is
  left out by all compute parties alike, named in the job's result, each party's audit log and
  the owner's own terminal; every compute party succeeds; the model equals a plaintext replay of
  the same rounds over the contributions that passed (the honest owners', and the replaying
  owner's honest first round);
- the positive control: the same job at daemons whose check is switched off (a test build's
  environment variable, which the trust statement then names) ends with a corrupted model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from coordinator.consortium import LocalConsortium
from mpc_erm.jobs.jobfile import load_job_file
from parties.owner.shares import UNCHECKED_ENV
from tests.parties.owner_joins import run_owner_joins
from tests.parties.test_owner_jobs import JOB

pytestmark = [pytest.mark.e2e, pytest.mark.long]

HONEST = ("owner-00", "owner-01", "owner-02", "owner-03")
HOSTILE = {"owner-04": "scale", "owner-05": "nan", "owner-06": "replay", "owner-07": "foreign"}
OWNERS = HONEST + tuple(HOSTILE)
ROUNDS = 3
N = 569


def _consortium(root: Path, *, dealer: bool) -> LocalConsortium:
    return LocalConsortium(root / "cons", parties=3, dealer=dealer, allow_test_only=True, max_epsilon_per_job=2.0)


def _owners(cons: LocalConsortium, root: Path) -> dict[str, Path]:
    return {name: cons.add_owner(name, {"clinics": {"format": "builtin", "name": "breast_cancer", "part": i,
                                                    "of": len(OWNERS), "epsilon": 10.0, "delta": 1e-4}},
                                 max_epsilon_per_job=2.0, allow_test_only=True, root=root / "owners")
            for i, name in enumerate(OWNERS)}


def _job_file(root: Path, trust: str, d: int) -> Path:
    path = root / f"hostile-{trust}.toml"
    text = JOB.format(dataset="clinics", d=d, owners=", ".join(f'"{o}"' for o in OWNERS), no_noise="true", eps=1.0,
                      n=N, rounds=ROUNDS)
    if trust == "dealer":
        text = text.replace('trust = "replicated"', 'trust = "dealer"\ndealer = "dealer"')
    path.write_text(text)
    return path


def _run(cons: LocalConsortium, configs: dict[str, Path], job: Path) -> tuple[str, dict[str, tuple[int, str, str]],
                                                                              dict[str, str]]:
    """Every owner process (hostile ones through tests.parties.hostile_owner), the job submitted once
    each has reserved it: (job id, owner → (exit code, stdout, stderr), compute party → final phase)."""
    return run_owner_joins(cons, configs, job, lambda o: [sys.executable, "-m", "tests.parties.hostile_owner",
                                                          HOSTILE[o]] if o in HOSTILE else
                           [sys.executable, "-m", "coordinator.cli"])


def _replay(job_path: Path, configs: dict[str, Path], counted: list[list[str]]) -> torch.Tensor:
    """The same rounds in plaintext over the given owners of each round (their weighted clipped
    gradient sums, rounded onto the grid as their shares encode them)."""
    from mpc_erm.mpc.aggregator import PRECISION_BITS
    from mpc_erm.privacy.plan import plan_job, public_sizes
    from mpc_erm.protocols import GradientPerturbation
    from parties.config import load_owner_config
    from parties.owner.process import _OwnerView
    from parties.rows import load_rows

    job = load_job_file(job_path)
    plan = plan_job(job.spec, sampler="mpc", test_no_noise=True, sizes=public_sizes(job.spec, None),
                    n_features=job.job.features)
    proto = GradientPerturbation(job.spec, None, int(job.job.features or 0), plan=plan)
    data = {}
    for o, p in configs.items():
        cfg = load_owner_config(p)
        ds = load_rows(_OwnerView(cfg, job, cfg.identity.load("owner"), "x")).train  # type: ignore[arg-type]
        data[o] = (torch.as_tensor(ds.X.copy(), dtype=torch.float64), torch.as_tensor(ds.y.copy()))
    w = plan.weight(0, 1)
    theta = proto.initial_model()
    for owners in counted:
        total = sum(torch.round(w * proto.local_contribution(theta, *data[o])[0] * 2**PRECISION_BITS) for o in owners)
        theta = proto.public_step(theta, total / 2**PRECISION_BITS)
    return theta


def _model(cons: LocalConsortium, job_id: str, into: Path) -> tuple[torch.Tensor, dict]:
    from safetensors.torch import load_file

    with cons.client() as client:
        client.result(job_id, into)
    metrics = json.loads((into / "metrics.json").read_text())
    metrics["report"] = json.loads((into / "privacy_report.json").read_text())
    return load_file(str(into / "model.safetensors"))["theta"], metrics


def _expected_counted() -> list[list[str]]:
    """Round by round, the owners whose contribution passes: the honest ones, and the replaying
    owner in round 1 (its own share of round 1 is honest)."""
    return [[*HONEST, "owner-06"]] + [list(HONEST)] * (ROUNDS - 1)


@pytest.fixture(scope="module")
def d() -> int:
    from mpc_erm.data import load_dataset

    return load_dataset("breast_cancer")[0].d


@pytest.mark.timeout(900)
@pytest.mark.parametrize("trust", ["replicated", "dealer"])
def test_every_hostile_contribution_is_left_out_named_and_the_release_is_the_honest_replay(
        trust: str, d: int, tmp_path: Path) -> None:
    with _consortium(tmp_path, dealer=trust == "dealer") as cons:
        configs = _owners(cons, tmp_path)
        job = _job_file(tmp_path, trust, d)
        job_id, owners, phases = _run(cons, configs, job)
        members = ("alice", "bob", "carol") + (("dealer",) if trust == "dealer" else ())
        assert phases == dict.fromkeys(members, "succeeded"), (phases, owners)
        theta, metrics = _model(cons, job_id, tmp_path / "result")
        audits = {p: [json.loads(line) for line in (cons.root / p / "state" / "audit.jsonl").read_text().splitlines()]
                  for p in ("alice", "bob", "carol")}
    expected = _expected_counted()
    refused = {str(t + 1): sorted(set(OWNERS) - set(c)) for t, c in enumerate(expected)}
    assert metrics["owners_per_round"] == [len(c) for c in expected]
    assert metrics["owners_refused"] == refused, metrics["owners_refused"]
    assert "checked on its shares against its public ℓ2 bound" in metrics["report"]["trust_model"]
    replay = _replay(job, configs, expected)
    assert torch.allclose(theta, replay, atol=1e-9, rtol=0), float((theta - replay).abs().max())
    for p, records in audits.items():  # each compute party's audit log names them, round by round
        got = {str(r["round"]): sorted(r["members"]) for r in records if r["event"] == "refused" and
               r["job_id"] == job_id}
        assert got == refused, (p, got)
    for o, (code, out, err) in owners.items():
        assert code == 0 and "Traceback" not in err, (o, code, err)
        warned = [int(line.split()[2].rstrip(":")) for line in err.splitlines() if line.startswith("warning: round")]
        assert warned == [int(t) for t, names in refused.items() if o in names], (o, err)
        summary_rounds = [t for t, names in refused.items() if o in names]
        assert ("this owner's contribution was refused" in out) == bool(summary_rounds), (o, out)


@pytest.mark.timeout(900)
def test_positive_control_without_the_check_the_same_owners_corrupt_the_model(
        d: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UNCHECKED_ENV, "1")  # the daemons' (and their workers') environment
    with _consortium(tmp_path, dealer=False) as cons:
        configs = _owners(cons, tmp_path)
        job = _job_file(tmp_path, "replicated", d)
        job_id, owners, phases = _run(cons, configs, job)
        theta, metrics = _model(cons, job_id, tmp_path / "result")
    assert metrics["owners_refused"] == {}
    assert metrics["owners_per_round"] == [len(OWNERS)] * ROUNDS
    assert "CONTRIBUTIONS NOT CHECKED" in metrics["report"]["trust_model"]
    honest = _replay(job, configs, _expected_counted())
    assert not torch.isfinite(theta).all() or float((theta - honest).norm()) > 1e3 * float(honest.norm()), \
        (float(theta.norm()), float(honest.norm()))
