"""Data owners in the malicious-secure mode through real daemons: three compute-party daemons
(3-party replicated sharing, ``security = "malicious"``, distributed noise) and nine owners, each
an ``OwnerConfig`` with its own certificate, ledger and audit log, running
``parties.owner.process.run_owner_job`` (what ``mpc-erm owner join`` runs) in this process, one
thread each. Two of them deviate in what they send, through the real client:

- owner 4 proves a contribution 20× over its bound with a forged proof (the honest recipe applied
  to it, every value reduced into its bits' range);
- owner 7 sends, from round 2 on, its explicit share of round 1 again (a replayed share).

Every compute party refuses both in every round they deviate, names them, and releases the other
owners' sum; each deviating owner is told it was refused; every honest owner ends with the compute
parties' model and a privacy report that states the malicious-secure mode and verifies alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coordinator.consortium import LocalConsortium
from tests.parties.test_owner_jobs import JOB, OWNERS, _owner_config, _submit_and_run

pytestmark = [pytest.mark.e2e]

N_OWNERS = 9
LIAR, REPLAYER = 4, 7
ROUNDS = 3
#: The owner jobs' gradient job (test_owner_jobs), in the malicious-secure mode with distributed noise.
MALICIOUS_JOB = JOB.replace('trust = "replicated"', 'trust = "replicated"\nsecurity = "malicious"').replace(
    "public_n = {n}", 'public_n = {n}\nnoise = "distributed"')


@pytest.fixture(scope="module")
def malicious_cons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    with LocalConsortium(tmp_path_factory.mktemp("malicious-owners") / "cons", parties=3, dealer=False,
                         max_epsilon_per_job=2.0) as c:
        yield c


def _deviating(monkeypatch: pytest.MonkeyPatch) -> None:
    """Owners LIAR and REPLAYER deviate at the send (the client's proof and payload)."""
    from mpc_erm.mpc import norm_proof as N
    from parties.owner import intake
    from tests.mpc.forgery import naive_aux

    honest = intake.prove_contribution
    first: dict[int, tuple[int, np.ndarray]] = {}

    def deviating(units: np.ndarray, keys: Any, t: int, spec: Any, context: bytes) -> tuple[int, np.ndarray]:
        owner = int(context.rsplit(b"owner ", 1)[1])
        if owner == LIAR:
            real = N.aux_vector
            N.aux_vector = lambda x, spec, rows_key: naive_aux(x, rows_key, spec)  # type: ignore[assignment]
            try:
                big = units.astype(np.float64) * (20 * spec.bound / max(float(np.linalg.norm(units)), 1.0))
                return honest(np.round(big).astype(np.int64), keys, t, spec, context)
            finally:
                N.aux_vector = real  # type: ignore[assignment]
        out = honest(units, keys, t, spec, context)
        if owner == REPLAYER:
            return first.setdefault(owner, out)
        return out

    monkeypatch.setattr(intake, "prove_contribution", deviating)


@pytest.mark.timeout(600)
def test_owners_in_the_malicious_secure_mode_deviating_ones_refused(malicious_cons: LocalConsortium,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import mpc_erm
    from mpc_erm.data import load_dataset
    from mpc_erm.privacy.report import PrivacyReport
    from mpc_erm.privacy.verify import verify_report

    d = load_dataset("breast_cancer")[0].d
    owners = OWNERS[:N_OWNERS]
    names = ", ".join(f'"{o}"' for o in owners)
    configs = [_owner_config(tmp_path / "owners", o, i, malicious_cons, budget=2.5) for i, o in enumerate(owners)]
    job = tmp_path / "job.toml"
    job.write_text(MALICIOUS_JOB.format(dataset="clinics", d=d, owners=names, no_noise="false", eps=1.0, n=569,
                              rounds=ROUNDS))
    _deviating(monkeypatch)
    job_id, ends, box = _submit_and_run(malicious_cons, job, configs, on_round=lambda i, t: None)
    assert {m: e["phase"] for m, e in ends.items()} == dict.fromkeys(("alice", "bob", "carol"), "succeeded"), ends
    with malicious_cons.client() as client:
        client.result(job_id, tmp_path / job_id)
    metrics = json.loads((tmp_path / job_id / "metrics.json").read_text())
    # the liar in every round, the replayer from round 2 on: counted = the others
    assert metrics["owners_refused"] == {"1": [owners[LIAR]], **{str(t): sorted([owners[LIAR], owners[REPLAYER]])
                                                                 for t in range(2, ROUNDS + 1)}}, metrics
    assert metrics["owners_per_round"] == [N_OWNERS - 1] + [N_OWNERS - 2] * (ROUNDS - 1)
    assert metrics["mpc"]["security"] == "malicious"
    report = json.loads((tmp_path / job_id / "privacy_report.json").read_text())
    assert report["security"] == "malicious" and "proved within its public ℓ2 bound" in report["trust_model"]
    assert verify_report(PrivacyReport.from_json(json.dumps(report))).ok
    released = mpc_erm.load_model(tmp_path / job_id)
    w = np.asarray(released.theta, dtype=np.float64)
    assert bool(np.isfinite(w).all()) and float(np.linalg.norm(w)) < 100  # not the 10^14 of an unchecked liar
    for i, o in enumerate(owners):
        summary = box[o]
        assert isinstance(summary, dict), (o, summary)
        assert summary["refused_rounds"] == ([1, 2, 3] if i == LIAR else [2, 3] if i == REPLAYER else []), \
            (o, summary)
        mine = json.loads((tmp_path / "owners" / o / "state" / "jobs" / job_id / "privacy_report.json").read_text())
        assert mine["security"] == "malicious" and "malicious security with abort" in mine["trust_model"]
        assert verify_report(PrivacyReport.from_json(json.dumps(mine))).ok, o
        assert mine["realisation"] == report["realisation"]  # the owner planned the grid its compute parties took
