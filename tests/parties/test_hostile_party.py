"""A full-peer party that inflates its own local sum, against real daemons: bob's daemon and its
job workers run with ``tests/parties/hostile_party`` on their path (its weighted contributions ×
10⁶ in every aggregate, the protocol otherwise followed). Three parties, replicated sharing, a
test-only zero-noise gradient job on UCI Adult: every round leaves bob's contribution out at all
three parties (named in the result and the logs), every party succeeds, and the model equals a
plaintext replay of the same rounds over alice's and carol's shards only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from coordinator.consortium import LocalConsortium
from coordinator.end_to_end import LocalJob, job_toml

pytestmark = [pytest.mark.e2e, pytest.mark.long]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ROUNDS = 3


def _replay(job_path: Path, honest: list[int]) -> torch.Tensor:
    """The job's rounds in plaintext over the honest parties' shards (bob's term left out), each
    weighted contribution rounded onto the grid as the aggregator encodes it."""
    from mpc_erm.data import load_dataset
    from mpc_erm.data.partition import partition_equal
    from mpc_erm.jobs.jobfile import load_job_file
    from mpc_erm.mpc.aggregator import PRECISION_BITS
    from mpc_erm.privacy.plan import plan_job, public_sizes
    from mpc_erm.protocols import GradientPerturbation

    job = load_job_file(job_path)
    train, _test = load_dataset("adult")
    parts = partition_equal(train.n, 3, rng=0)
    counts = [len(p) for p in parts]
    plan = plan_job(job.spec, sampler="mpc", test_no_noise=True, sizes=public_sizes(job.spec, counts),
                    n_features=train.d)
    proto = GradientPerturbation(job.spec, None, train.d, plan=plan)
    data = {j: (torch.as_tensor(train.X[np.sort(parts[j])], dtype=torch.float64),
                torch.as_tensor(train.y[np.sort(parts[j])])) for j in honest}
    theta = proto.initial_model()
    for _ in range(ROUNDS):
        total = sum(torch.round(plan.weight(j, counts[j]) * proto.local_contribution(theta, *data[j])[0]
                                * 2**PRECISION_BITS) for j in honest)
        theta = proto.public_step(theta, total / 2**PRECISION_BITS)
    return theta


@pytest.mark.timeout(600)
def test_a_party_inflating_its_local_sum_is_left_out_every_round(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    path = tmp_path / "job.toml"
    job = LocalJob("inflated", "gradient", lam=1e-3, iterations=ROUNDS, learning_rate=1.0)
    path.write_text(job_toml(job, ["alice", "bob", "carol"], "adult", "replicated", None)
                    .replace("[job]\n", "[job]\ntest_no_noise = true\n"))
    path_env = f"PYTHONPATH={HERE / 'hostile_party'}{os.pathsep}{ROOT}"
    cons = LocalConsortium(tmp_path / "c", dealer=False, allow_test_only=True, device="cpu",
                           wrap=lambda name: ["env", path_env] if name == "bob" else [])
    with cons:
        with cons.client() as client:
            job_id = client.submit(path)["job_id"]
            phases = {e["member"]: e["phase"] for e in client.watch(job_id)
                      if e["phase"] in ("succeeded", "failed", "cancelled", "error")}
            client.result(job_id, tmp_path / "result")
        audits = {m: (tmp_path / "c" / m / "state" / "audit.jsonl").read_text() for m in ("alice", "bob", "carol")}
    assert phases == dict.fromkeys(("alice", "bob", "carol"), "succeeded"), phases
    metrics = json.loads((tmp_path / "result" / "metrics.json").read_text())
    assert metrics["parties_refused"] == {str(t + 1): ["bob"] for t in range(ROUNDS)}, metrics.get("parties_refused")
    theta = load_file(str(tmp_path / "result" / "model.safetensors"))["theta"]
    replay = _replay(path, honest=[0, 2])
    assert torch.allclose(theta, replay, atol=1e-9, rtol=0), float((theta - replay).abs().max())
    report = json.loads((tmp_path / "result" / "privacy_report.json").read_text())
    assert "every party's contribution checked on its shares" in report["trust_model"]
    for m, text in audits.items():  # each party's audit log names bob, round by round
        got = [json.loads(line) for line in text.splitlines()]
        assert [(r["round"], r["members"]) for r in got if r["event"] == "refused"] == \
            [(t + 1, ["bob"]) for t in range(ROUNDS)], m


@pytest.mark.timeout(600)
def test_positive_control_without_the_check_the_inflated_sum_corrupts_the_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import load_file

    from parties.owner.shares import UNCHECKED_ENV

    monkeypatch.setenv(UNCHECKED_ENV, "1")
    path = tmp_path / "job.toml"
    job = LocalJob("inflated", "gradient", lam=1e-3, iterations=ROUNDS, learning_rate=1.0)
    path.write_text(job_toml(job, ["alice", "bob", "carol"], "adult", "replicated", None)
                    .replace("[job]\n", "[job]\ntest_no_noise = true\n"))
    path_env = f"PYTHONPATH={HERE / 'hostile_party'}{os.pathsep}{ROOT}"
    with LocalConsortium(tmp_path / "c", dealer=False, allow_test_only=True, device="cpu",
                         wrap=lambda name: ["env", path_env] if name == "bob" else []) as cons:
        with cons.client() as client:
            job_id = client.submit(path)["job_id"]
            list(client.watch(job_id))
            client.result(job_id, tmp_path / "result")
    metrics = json.loads((tmp_path / "result" / "metrics.json").read_text())
    assert metrics["parties_refused"] == {}
    theta = load_file(str(tmp_path / "result" / "model.safetensors"))["theta"]
    honest = _replay(path, honest=[0, 2])
    assert float((theta - honest).norm()) > 1e3 * float(honest.norm())
