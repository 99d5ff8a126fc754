"""Issue 17 through real daemons: three compute-party daemons (3-party replicated sharing, no
dealer) run a job for 30 data owners, each an ``OwnerConfig`` with its own certificate (role
``owner``), its own ledger and audit log, running ``parties.owner.process.run_owner_job`` (what
``mpc-erm owner join`` runs) in this test's process, one thread each.

- Test-only zero noise: the model every member ends with equals a plaintext replay of the same
  rounds over the owners the compute parties counted, up to the grid's rounding; one owner drops
  out after two rounds and is left out of the later ones by all three compute parties.
- In-MPC noise: every owner's report states the plan's ε, its ledger is charged exactly that, the
  compute parties charged nothing (no rows there), and a second job that would exceed an owner's
  budget is refused by that owner before it sends anything.
- An owner the job does not list learns nothing from a compute party's daemon (NOT_FOUND).

The tests that leave the compute parties' daemons running and as configured share one set of them
(the ``cons`` fixture: started once for the module; each test brings its own owners, under its own
``tmp_path``, and its own jobs); a test that kills or stops a daemon starts its own.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from coordinator.consortium import LocalConsortium
from mpc_erm.jobs.jobfile import load_job_file
from mpc_erm.jobs.status import TERMINAL
from mpc_erm.mpc import pki

OWNERS = tuple(f"clinic-{i:02d}" for i in range(30))
DROPS_AFTER = {7: 2}  # owner index → the rounds it takes part in before it goes away
ROUNDS = 6

JOB_TABLE = """\
method = "gradient"

[job]
name = "clinics"
dataset = "{dataset}"
parties = ["alice", "bob", "carol"]
trust = "replicated"
features = {d}
round_deadline_s = 3.0
owners = [{owners}]
test_no_noise = {no_noise}
"""
JOB = JOB_TABLE + """
[model]
name = "logistic"
lam = 1e-3

[privacy]
epsilon = {eps}
delta = 1e-5
adjacency = "add_remove"
public_n = {n}

[training]
iterations = {rounds}
learning_rate = 1.0
"""


def _owner_config(root: Path, name: str, i: int, cons: LocalConsortium, budget: float) -> Path:
    """Owner ``i``'s config: shard i of 30 of breast_cancer under two data set ids."""
    shard = {"format": "builtin", "name": "breast_cancer", "part": i, "of": len(OWNERS), "epsilon": budget,
             "delta": 1e-4}
    return cons.add_owner(name, {"clinics": shard, "clinics-exact": shard}, max_epsilon_per_job=2.0,
                          allow_test_only=True, root=root)


def _drop_out(i: int, t: int) -> None:
    """Owners in DROPS_AFTER go away once they have taken part in that many rounds."""
    if i in DROPS_AFTER and t + 1 >= DROPS_AFTER[i]:
        raise ConnectionAbortedError(f"{OWNERS[i]} goes away after round {t + 1}")


def _run_owners(configs: list[Path], job_path: Path, job_id: str, *, on_round: Any = _drop_out,
                wait_s: float = 120, leave: bool = False) -> dict[str, Any]:
    """Every owner's run_owner_job, one thread each: name → summary, or the exception it ended
    with. ``on_round(i, t)`` runs at owner ``i`` after each release; ``leave``: each owner sends
    and leaves (``owner join --leave``)."""
    from parties.config import load_owner_config
    from parties.owner.process import run_owner_job

    job = load_job_file(job_path)
    out: dict[str, Any] = {}

    def one(i: int, path: Path) -> None:
        cfg = load_owner_config(path)
        try:
            out[cfg.identity.name] = run_owner_job(cfg, job, job_id, wait_s=wait_s, leave=leave,
                                                   on_round=lambda t, _sent, _owners: on_round(i, t))
        except Exception as exc:  # collected: the test asserts on them
            out[cfg.identity.name] = exc

    threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(configs)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    return out


def _submit_and_run(cons: LocalConsortium, job_path: Path, configs: list[Path], *, on_round: Any = _drop_out
                    ) -> tuple[str, dict, dict]:
    """Submit the job, run every owner (``_run_owners``), watch the compute parties to the end:
    (job id, each compute party's last event, each owner's summary or exception)."""
    with cons.client() as client:
        job_id = client.submit(job_path)["job_id"]
        box: dict[str, Any] = {}
        th = threading.Thread(target=lambda: box.update(_run_owners(configs, job_path, job_id, on_round=on_round)))
        th.start()
        ends = {e["member"]: e for e in client.watch(job_id) if e["phase"] in TERMINAL or e["phase"] == "error"}
        th.join(600)
    return job_id, ends, box


def _run_to_success(cons: LocalConsortium, job_path: Path, configs: list[Path], results: Path
                    ) -> tuple[str, dict]:
    """``_submit_and_run`` with no owner dropping out; asserts every compute party succeeded and no
    owner missed a round, fetches the results into ``results/<job id>``: (job id, owners' summaries)."""
    job_id, ends, box = _submit_and_run(cons, job_path, configs, on_round=lambda i, t: None)
    with cons.client() as client:
        client.result(job_id, results / job_id)
    assert {m: e["phase"] for m, e in ends.items()} == dict.fromkeys(("alice", "bob", "carol"), "succeeded")
    assert all(isinstance(s, dict) and s["missed_rounds"] == [] for s in box.values()), box
    return job_id, box


def statuses(cons: LocalConsortium, job_id: str, members: tuple[str, ...], wait_s: float = 120) -> dict[str, str]:
    """Each of ``members``' status of the job, once all are terminal (or ``wait_s`` passed)."""
    import time

    end = time.monotonic() + wait_s
    with cons.client() as client:
        while True:
            st = client.status(job_id)
            got = {m: st.get(m, {}).get("status", "?") for m in members}
            if all(s in TERMINAL for s in got.values()) or time.monotonic() > end:
                return got
            time.sleep(0.5)


def _replay(job_path: Path, configs: list[Path], counted: list[int]) -> torch.Tensor:
    """The same rounds in plaintext: each owner's weighted clipped gradient sum, rounded onto the
    grid as its shares encode it, over the owners counted in each round."""
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
    data = []
    for p in configs:
        cfg = load_owner_config(p)
        ds = load_rows(_OwnerView(cfg, job, cfg.identity.load("owner"), "x")).train  # type: ignore[arg-type]
        data.append((torch.as_tensor(ds.X, dtype=torch.float64), torch.as_tensor(ds.y)))
    w = plan.weight(0, 1)
    theta = proto.initial_model()
    for t in range(ROUNDS):
        present = [i for i in range(len(configs)) if i not in DROPS_AFTER or t < DROPS_AFTER[i]]
        assert len(present) == counted[t]
        total = sum(torch.round(w * proto.local_contribution(theta, *data[i])[0] * 2**PRECISION_BITS)
                    for i in present)
        theta = proto.public_step(theta, total / 2**PRECISION_BITS)
    return theta


@pytest.fixture(scope="module")
def cons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    """Three compute-party daemons (replicated sharing, no dealer, test-only jobs allowed, ε ≤ 2 a
    job) for every test of the module that neither kills nor stops one of them."""
    with LocalConsortium(tmp_path_factory.mktemp("owner-jobs") / "cons", parties=3, dealer=False,
                         allow_test_only=True, max_epsilon_per_job=2.0) as c:
        yield c


@pytest.mark.timeout(900)
def test_thirty_owners_train_through_three_compute_daemons(cons: LocalConsortium, tmp_path: Path) -> None:
    from mpc_erm.data import load_dataset
    from parties.ledger import Ledger

    d = load_dataset("breast_cancer")[0].d
    names = ", ".join(f'"{o}"' for o in OWNERS)
    configs = [_owner_config(tmp_path / "owners", o, i, cons, budget=2.5) for i, o in enumerate(OWNERS)]
    exact = tmp_path / "exact.toml"
    exact.write_text(JOB.format(dataset="clinics-exact", d=d, owners=names, no_noise="true", eps=1.0, n=400,
                                rounds=ROUNDS))
    job_id, ends, owners = _submit_and_run(cons, exact, configs)
    assert {m: e["phase"] for m, e in ends.items()} == dict.fromkeys(("alice", "bob", "carol"), "succeeded"), ends
    dropped = OWNERS[next(iter(DROPS_AFTER))]
    assert isinstance(owners.pop(dropped), ConnectionAbortedError)
    assert all(isinstance(s, dict) and s["missed_rounds"] == [] for s in owners.values()), owners
    with cons.client() as client:
        client.result(job_id, tmp_path / "exact-result")  # the same model file at every compute party
    from safetensors.torch import load_file

    metrics = json.loads((tmp_path / "exact-result" / "metrics.json").read_text())
    counted = metrics["owners_per_round"]
    assert counted == [30, 30, 29, 29, 29, 29]  # the dropped owner left out of rounds 3..6 by all three
    theta = load_file(str(tmp_path / "exact-result" / "model.safetensors"))["theta"]
    replay = _replay(exact, configs, counted)
    assert torch.allclose(theta, replay, atol=1e-9, rtol=0), float((theta - replay).abs().max())
    for name in OWNERS[:3]:  # every owner ends with the same public model
        mine = load_file(str(tmp_path / "owners" / name / "state" / "jobs" / job_id / "model.safetensors"))
        assert torch.equal(mine["theta"], theta)

    # in-MPC noise: each owner's ε from the plan, charged in its own ledger, none at the compute parties
    noisy = tmp_path / "noisy.toml"
    noisy.write_text(JOB.format(dataset="clinics", d=d, owners=names, no_noise="false", eps=2.0, n=400,
                                rounds=ROUNDS))
    job_id2, ends, owners = _submit_and_run(cons, noisy, configs)
    assert {m: e["phase"] for m, e in ends.items()} == dict.fromkeys(("alice", "bob", "carol"), "succeeded"), ends
    owners.pop(dropped)
    eps = {round(s["epsilon"], 9) for s in owners.values()}
    assert len(eps) == 1 and 0 < eps.pop() <= 2.0
    led = Ledger.in_state_dir(tmp_path / "owners" / OWNERS[0] / "state")
    try:
        r = led.get(job_id2)
        assert r is not None and r.state == "committed" and r.revealed_rounds == ROUNDS, r
        assert 0 < led.spent("clinics") <= 2.0  # composed at the data set's δ = 1e-4 (the job's: 1e-5)
    finally:
        led.close()
    report = json.loads((tmp_path / "owners" / OWNERS[0] / "state" / "jobs" / job_id2 /
                         "privacy_report.json").read_text())
    assert report["adjacency"] == "add_remove" and report["realisation"]["grid_bits"] > 0
    assert report["security"] == "semi-honest", report  # what the compute parties were assumed to do
    from parties.ledger_check import check_ledger

    for p in ("alice", "bob", "carol"):  # nothing reserved or charged at a compute party (no rows there)
        led = Ledger.in_state_dir(cons.root / p / "state")
        try:
            assert led.get(job_id2) is None and led.get(job_id) is None
        finally:
            led.close()
        audit = cons.root / p / "state" / "audit.jsonl"
        assert not audit.exists() or job_id2 not in audit.read_text()
        check_ledger(cons.root / p / "state")  # what a restarted daemon runs first

    # a third job would exceed the owners' budget of 2.5: each owner refuses it, sending nothing
    from parties.config import load_owner_config
    from parties.owner.process import OwnerRefused, run_owner_job

    with pytest.raises(OwnerRefused, match="budget: clinic-00's ledger refuses job"):
        run_owner_job(load_owner_config(configs[0]), load_job_file(noisy), "a" * 32, wait_s=5)

    # an owner the job does not list: the compute party's daemon answers as for an unknown job
    stranger = pki.issue_identity(pki.load_ca(cons.pki_dir), "stranger", "owner", valid_days=1)
    from mpc_erm.mpc import tls
    from mpc_erm.mpc._proto import party_pb2 as pb
    from mpc_erm.mpc._proto import party_pb2_grpc as pb_grpc

    with tls.secure_channel(cons.members["alice"].address, stranger, "party/alice") as ch:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.PartyControlStub(ch).GetEndpoint(pb.EndpointRequest(job_id=job_id2, member="alice",
                                                                        service="owners"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    assert np.isfinite(theta.numpy()).all()


@pytest.mark.timeout(600)
@pytest.mark.slow  # `make test-all`; default suite: killed members: tests/reliability/test_faults.py
def test_a_killed_compute_party_ends_the_job_and_every_owners_reservation_is_settled(tmp_path: Path) -> None:
    """Bob's daemon and worker are killed after round 2: alice and carol fail the job (no model
    written), every owner's run ends with an error, and no owner's ledger keeps an open
    reservation — charged the rounds it had marked, or released."""

    from mpc_erm.data import load_dataset
    from parties.ledger import Ledger

    d = load_dataset("breast_cancer")[0].d
    few = OWNERS[:6]
    with LocalConsortium(tmp_path / "cons", parties=3, dealer=False, max_epsilon_per_job=2.0,
                         peer_timeout_s=10.0) as cons:
        configs = [_owner_config(tmp_path / "owners", o, i, cons, budget=5.0) for i, o in enumerate(few)]
        job_path = tmp_path / "job.toml"
        job_path.write_text(JOB.format(dataset="clinics", d=d, owners=", ".join(f'"{o}"' for o in few),
                                       no_noise="false", eps=1.0, n=400, rounds=40))
        with cons.client() as client:
            job_id = client.submit(job_path)["job_id"]

        def kill_bob(i: int, t: int) -> None:
            if i == 0 and t == 1:
                cons.kill("bob")

        outcome = _run_owners(configs, job_path, job_id, on_round=kill_bob, wait_s=30)
        assert all(isinstance(v, Exception) for v in outcome.values()), outcome
        st = statuses(cons, job_id, ("alice", "carol"))
        assert st == {"alice": "failed", "carol": "failed"}, st
        for p in ("alice", "carol"):
            assert not (cons.root / p / "state" / "jobs" / job_id / "model.safetensors").exists()
        for name in few:
            led = Ledger.in_state_dir(tmp_path / "owners" / name / "state")
            try:
                r = led.get(job_id)
                assert r is not None and r.state in ("committed", "released"), r
                assert r.state == "released" or 2 <= (r.revealed_rounds or 0) < 40, r
            finally:
                led.close()


FED_OWNERS = 20
FED_ROUNDS = 4
FED_JOB = JOB_TABLE + """
[model]
name = "softmax"
n_classes = 2
lam = 4e-5

[privacy]
epsilon = {eps}
delta = 1e-5
clip = 0.5
adjacency = "add_remove"
public_n = {n}

[training]
iterations = {rounds}
sampling_rate = {tau}
learning_rate = 1.0
ls_sigma = 1.0

[federated]
local_epochs = 2
local_batch = 64
local_lr = 0.5
local_lr_decay = 0.9
"""


SEND_AFTER_S = 1.5  # the noisy federated job's fixed send time


def _fed_job(job_path: Path, configs: list[Path]) -> tuple[Any, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A federated job's zero-noise protocol object as every member builds it, and each owner's rows."""
    from mpc_erm.privacy.plan import plan_job, public_sizes
    from mpc_erm.protocols.common import network_rows
    from mpc_erm.protocols.fedls import DpFedLs

    job = load_job_file(job_path)
    plan = plan_job(job.spec, sampler="mpc", test_no_noise=True, sizes=public_sizes(job.spec, None),
                    n_features=job.job.features)
    data = [network_rows(ds, job.spec, "cpu") for ds in _owner_rows(job, configs)]
    return DpFedLs.for_job(job.spec, plan, int(job.job.features or 0)), data


def _owner_rows(job: Any, configs: list[Path]) -> list[Any]:
    """Each owner's rows as its own process reads them."""
    from parties.config import load_owner_config
    from parties.owner.process import _OwnerView
    from parties.rows import load_rows

    out = []
    for p in configs:
        cfg = load_owner_config(p)
        out.append(load_rows(_OwnerView(cfg, job, cfg.identity.load("owner"), "x")).train)  # type: ignore[arg-type]
    return out


def _fed_replay(job_path: Path, configs: list[Path]) -> torch.Tensor:
    """DP-Fed-LS's rounds in plaintext with every owner joining (τ = 1): each owner's update from
    the same public model, weighted 1/(τN) and rounded onto the grid as its shares encode it."""
    from mpc_erm.mpc.aggregator import PRECISION_BITS

    fed, data = _fed_job(job_path, configs)
    g = torch.Generator()  # a full batch per step (b ≥ every owner's rows): the order does not matter
    for t in range(FED_ROUNDS):
        total = sum(torch.round(fed.weight * fed.local_update(X, y, t, g) * 2**PRECISION_BITS) for X, y in data)
        fed.public_step(total / 2**PRECISION_BITS)
    return fed.w


@pytest.mark.timeout(900)
def test_dp_fed_ls_through_three_compute_daemons_hides_which_owners_joined(cons: LocalConsortium,
                                                                            tmp_path: Path) -> None:
    """DP-Fed-LS (``[federated]``) through the daemons, 20 owners:

    - zero noise, τ = 1: the model the compute parties release (a bundle ``mpc_erm.load_model``
      reads) equals a plaintext replay of the owners' local epochs, and every owner holds it;
    - in-MPC noise, τ = 0.5: each owner joins by its own coin, yet every compute party counts all
      20 owners in every round (an owner not sampled sends shares of a zero update), so no
      compute party learns the sample; every owner's report states the owner as the unit of
      privacy and its ledger is charged the plan's event for all T rounds."""
    from safetensors.torch import load_file

    import mpc_erm
    from mpc_erm.data import load_dataset
    from parties.ledger import Ledger

    d = load_dataset("breast_cancer")[0].d
    owners = OWNERS[:FED_OWNERS]
    names = ", ".join(f'"{o}"' for o in owners)
    configs = [_owner_config(tmp_path / "owners", o, i, cons, budget=5.0) for i, o in enumerate(owners)]

    exact = tmp_path / "fed-exact.toml"
    exact.write_text(FED_JOB.format(dataset="clinics-exact", d=d, owners=names, no_noise="true", eps=1.0,
                                    n=FED_OWNERS, rounds=FED_ROUNDS, tau=1.0))
    job_id, summaries = _run_to_success(cons, exact, configs, tmp_path)
    assert all(s["rounds_joined"] == FED_ROUNDS for s in summaries.values())  # τ = 1
    model = mpc_erm.load_model(tmp_path / job_id)
    released = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()]).double()
    replay = _fed_replay(exact, configs)
    assert torch.allclose(released, replay, atol=2e-6, rtol=0), float((released - replay).abs().max())
    # `job plan`'s forecast runs the same rounds: without noise, on these owners' rows, it
    # predicts the release up to the grid (each owner's share rounded: ≤ N·2^-17 a round)
    from mpc_erm.privacy.plan import plan_job, public_sizes
    from mpc_erm.simulate.forecast import InProcessFederatedJob

    jf = load_job_file(exact)
    plan = plan_job(jf.spec, sampler="mpc", sizes=public_sizes(jf.spec, None), n_features=d)
    forecast = InProcessFederatedJob(jf.spec, plan, _owner_rows(jf, configs)).train(
        torch.Generator().manual_seed(0), noise=False).w
    assert torch.allclose(released, forecast, atol=FED_ROUNDS * FED_OWNERS * 2.0**-17, rtol=0), \
        float((released - forecast).abs().max())
    mine = load_file(str(tmp_path / "owners" / owners[0] / "state" / "jobs" / job_id / "model.safetensors"))
    theirs = load_file(str(tmp_path / job_id / "model.safetensors"))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)

    noisy = tmp_path / "fed-noisy.toml"
    noisy.write_text(FED_JOB.format(dataset="clinics", d=d, owners=names, no_noise="false", eps=2.0,
                                    n=FED_OWNERS, rounds=FED_ROUNDS, tau=0.5) + f"send_after_s = {SEND_AFTER_S}\n")
    job_id2, summaries = _run_to_success(cons, noisy, configs, tmp_path)
    metrics = json.loads((tmp_path / job_id2 / "metrics.json").read_text())
    assert metrics["owners_per_round"] == [FED_OWNERS] * FED_ROUNDS  # presence says nothing of the sample
    # nor timing: every owner sent each round's shares at the fixed time, none late
    assert metrics["wall_seconds"] >= FED_ROUNDS * SEND_AFTER_S
    assert all(s["rounds_sent_late"] == [] for s in summaries.values()), summaries
    for where in (tmp_path / "owners" / owners[0] / "state" / "jobs" / job_id2, tmp_path / job_id2):
        notes = json.loads((where / "privacy_report.json").read_text())["notes"]
        assert any(f"share {SEND_AFTER_S:g} s after it read the previous release" in n for n in notes), notes
    joined = [s["rounds_joined"] for s in summaries.values()]
    assert 0 < sum(joined) < FED_OWNERS * FED_ROUNDS, joined  # 40 expected; P(0 or all 80) ≈ 2e-24
    eps = {round(s["epsilon"], 9) for s in summaries.values()}
    assert len(eps) == 1 and 0 < eps.pop() <= 2.0
    report = json.loads((tmp_path / "owners" / owners[0] / "state" / "jobs" / job_id2 /
                         "privacy_report.json").read_text())
    assert report["plan"]["unit"] == "owner" and report["plan"]["sampling_rate"] == 0.5
    assert report["parameters"]["protocol"] == "dp_fed_ls"
    assert any("no member learns who was sampled" in n for n in report["notes"])
    from mpc_erm.privacy.report import PrivacyReport
    from mpc_erm.privacy.verify import verify_report

    assert verify_report(PrivacyReport.from_json(json.dumps(report))).ok  # recomputed from the report alone
    led = Ledger.in_state_dir(tmp_path / "owners" / owners[0] / "state")
    try:
        r = led.get(job_id2)
        assert r is not None and r.state == "committed" and r.revealed_rounds == FED_ROUNDS, r
    finally:
        led.close()
    assert mpc_erm.load_model(tmp_path / job_id2).meta["privacy"]["unit"] == "owner"


OUT_OWNERS = 12  # the last one holds a single row
OUT_JOB = JOB_TABLE.replace('method = "gradient"', 'method = "output"') + """
[model]
name = "logistic"
lam = 1e-2

[privacy]
epsilon = {eps}
delta = 1e-5
mechanism = "gaussian"
adjacency = "add_remove"
public_n = {n}
"""


def _output_owners(root: Path, cons: LocalConsortium) -> tuple[list[Path], int]:
    """OUT_OWNERS owners of breast_cancer rows as .npz files under the data set ids "full" (also
    as "gone" and "noisy") and "minus": the same rows except that owner 0 lacks its last row. The
    last owner holds one row."""
    from mpc_erm.data import Dataset, load_dataset
    from mpc_erm.data.loaders import save_numpy

    ds = load_dataset("breast_cancer")[0]
    cuts = np.linspace(0, ds.n - 1, OUT_OWNERS).astype(int).tolist() + [ds.n]
    configs = []
    for i in range(OUT_OWNERS):
        idx = np.arange(cuts[i], cuts[i + 1])
        files = {}
        for which, rows in (("full", idx), ("minus", idx[:-1] if i == 0 else idx)):
            p = save_numpy(Dataset(ds.X[rows], ds.y[rows], ds.task, f"o{i}"), root / f"o{i}-{which}.npz")
            files[which] = {"format": "npz", "path": p, "epsilon": 5.0, "delta": 1e-4}
        # a zero-noise job spends a data set's whole budget (ε = ∞): each run its own id
        files |= {"gone": files["full"], "noisy": files["full"], "leave": files["full"]}
        configs.append(cons.add_owner(f"clinic-{i:02d}", files, max_epsilon_per_job=2.0, allow_test_only=True,
                                      root=root / "owners"))
    assert cuts[-1] - cuts[-2] == 1
    return configs, ds.n


def _output_replay(job_path: Path, configs: list[Path]) -> torch.Tensor:
    """Σ_j round((n_j/n̂)·θ̂_j · 2^g)/2^g: each owner's certified local minimiser, weighted and
    rounded onto the grid as its shares encode it."""
    from mpc_erm.mpc.aggregator import PRECISION_BITS
    from mpc_erm.privacy.plan import plan_job, public_sizes
    from mpc_erm.protocols import OutputPerturbation
    from parties.config import load_owner_config
    from parties.owner.process import _OwnerView
    from parties.rows import load_rows

    job = load_job_file(job_path)
    plan = plan_job(job.spec, sampler="mpc", test_no_noise=True, sizes=public_sizes(job.spec, None),
                    n_features=job.job.features)
    proto = OutputPerturbation(job.spec, None, int(job.job.features or 0), plan=plan)
    total = torch.zeros(proto.p, dtype=torch.float64)
    for p in configs:
        cfg = load_owner_config(p)
        ds = load_rows(_OwnerView(cfg, job, cfg.identity.load("owner"), "x")).train  # type: ignore[arg-type]
        theta = proto.local_model(torch.as_tensor(ds.X, dtype=torch.float64), torch.as_tensor(ds.y))
        total += torch.round(plan.weight(0, ds.n) * theta * 2**PRECISION_BITS)
    return total / 2**PRECISION_BITS


@pytest.mark.timeout(900)
def test_output_perturbation_with_owners_moves_no_more_than_its_stated_sensitivity(cons: LocalConsortium,
                                                                                  tmp_path: Path) -> None:
    """The thesis's MPC Out P with 12 data owners through three compute daemons (one release):

    - zero noise: the released model is the owners' weighted local minimisers summed on the grid
      (a plaintext replay), and every owner holds it;
    - add/remove, measured on what is released: the zero-noise model moves by no more than the
      report's Δ₂ when one record is removed — a row from an owner with many (data set "minus"),
      or the one-row owner gone (it never joins; the compute parties leave it out);
    - in-MPC Gaussian noise: each owner's report is recomputed alone (``verify_report``), its
      ledger charged one release; the compute parties charge nothing."""
    from safetensors.torch import load_file

    from mpc_erm.privacy.report import PrivacyReport
    from mpc_erm.privacy.verify import verify_report
    from parties.ledger import Ledger

    configs, n = _output_owners(tmp_path, cons)
    names = ", ".join(f'"clinic-{i:02d}"' for i in range(OUT_OWNERS))

    def run(name: str, dataset: str, no_noise: bool, joining: list[Path]) -> tuple[str, torch.Tensor, dict]:
        job_path = tmp_path / f"{name}.toml"
        job_path.write_text(OUT_JOB.format(dataset=dataset, d=30, owners=names, eps=1.0, n=n,
                                           no_noise="true" if no_noise else "false").replace(
                                               "round_deadline_s = 3.0", "round_deadline_s = 1.0"))
        job_id, box = _run_to_success(cons, job_path, joining, tmp_path)
        metrics = json.loads((tmp_path / job_id / "metrics.json").read_text())
        assert metrics["owners_per_round"] == [len(joining)]
        return job_id, load_file(str(tmp_path / job_id / "model.safetensors"))["theta"], box

    job_id, full, _ = run("full", "full", True, configs)
    replay = _output_replay(tmp_path / "full.toml", configs)
    assert torch.allclose(full, replay, atol=1e-9, rtol=0), float((full - replay).abs().max())
    mine = load_file(str(tmp_path / "owners" / "clinic-03" / "state" / "jobs" / job_id / "model.safetensors"))
    assert torch.equal(mine["theta"], full)
    delta2 = json.loads((tmp_path / job_id / "privacy_report.json").read_text())["plan"]["sensitivity_l2"]
    _, minus_row, _ = run("minus", "minus", True, configs)
    _, minus_owner, _ = run("gone", "gone", True, configs[:-1])
    for neighbour in (minus_row, minus_owner):
        moved = float((full - neighbour).norm())
        assert 0 < moved <= delta2, (moved, delta2)

    job_id, noisy, summaries = run("noisy", "noisy", False, configs)
    assert float((noisy - full).norm()) > 0
    for i in (0, OUT_OWNERS - 1):
        state = tmp_path / "owners" / f"clinic-{i:02d}" / "state"
        report = json.loads((state / "jobs" / job_id / "privacy_report.json").read_text())
        assert verify_report(PrivacyReport.from_json(json.dumps(report))).ok, report
        assert report["mechanism"] == "gaussian" and 0 < report["epsilon"] <= 1.0
        # the job's one release in the owner's audit log is exactly the model the daemons wrote
        (rel,) = [r for r in _audit_records(state, job_id) if r["event"] == "release"]
        assert rel["sha256"] == hashlib.sha256(noisy.double().numpy().tobytes()).hexdigest(), rel
        led = Ledger.in_state_dir(state)
        try:
            r = led.get(job_id)
            assert r is not None and r.state == "committed" and r.revealed_rounds == 1, r
        finally:
            led.close()
    for p in ("alice", "bob", "carol"):
        led = Ledger.in_state_dir(cons.root / p / "state")
        try:
            assert led.get(job_id) is None
        finally:
            led.close()


def _audit_records(state: Path, job_id: str) -> list[dict[str, Any]]:
    """A member's audit records of one job (a torn or missing log fails the test)."""
    lines = (state / "audit.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("job_id") == job_id]


def _audit_events(state: Path, job_id: str) -> list[str]:
    return [r["event"] for r in _audit_records(state, job_id)]


@pytest.mark.timeout(900)
def test_owners_that_leave_after_sending_fetch_the_released_model_from_the_daemons(cons: LocalConsortium,
                                                                                   tmp_path: Path) -> None:
    """``owner join --leave`` on a one-release job (output perturbation, in-MPC noise) through
    three compute daemons, 12 owners, one through the CLI: each owner returns once its shares are
    sent, charged one release (ledger committed, audit charge) with its privacy report written and
    no model; after the job, ``owner fetch`` reads the release the daemons keep
    (``GetOwnerRelease``) and writes the model the compute parties wrote, bit for bit. Refused
    naming the field: ``--leave`` on a job of many rounds (before anything is reserved), a fetch
    with no shares sent, an owner the job does not list (NOT_FOUND, as for an unknown job). A kept
    release deleted or overwritten with garbage is never served: the fetch goes to another
    compute party, and with none left it says so at once."""
    import uuid

    from click.testing import CliRunner
    from safetensors.torch import load_file

    from coordinator.cli import cli
    from mpc_erm.mpc import tls
    from mpc_erm.mpc._proto import party_pb2 as ppb
    from mpc_erm.mpc._proto import party_pb2_grpc as ppb_grpc
    from parties.config import load_owner_config
    from parties.ledger import Ledger
    from parties.owner.failures import JobEnded
    from parties.owner.process import OwnerRefused, fetch_owner_model, run_owner_job
    from parties.owner.release import RELEASE_FILE

    configs, n = _output_owners(tmp_path, cons)
    names = ", ".join(f'"clinic-{i:02d}"' for i in range(OUT_OWNERS))
    job_path = tmp_path / "leave.toml"
    job_path.write_text(OUT_JOB.format(dataset="leave", d=30, owners=names, eps=1.0, n=n, no_noise="false"))
    job = load_job_file(job_path)
    cfgs = [load_owner_config(p) for p in configs]
    state = [Path(c.state_dir) for c in cfgs]

    grad_path = tmp_path / "grad.toml"
    grad_path.write_text(JOB.format(dataset="leave", d=30, owners=names, eps=1.0, n=n, no_noise="false",
                                    rounds=3))
    other = uuid.uuid4().hex
    with pytest.raises(OwnerRefused, match="--leave: only a job with one release"):
        run_owner_job(cfgs[1], load_job_file(grad_path), other, leave=True)
    with pytest.raises(OwnerRefused, match="job_id: clinic-01 has not sent shares"):
        fetch_owner_model(cfgs[1], job, other, wait_s=1)
    led = Ledger.in_state_dir(state[1])
    try:
        assert led.get(other) is None
    finally:
        led.close()

    with cons.client() as client:
        job_id = client.submit(job_path)["job_id"]
        box: dict[int, Any] = {}

        def one(i: int) -> None:
            try:
                box[i] = run_owner_job(cfgs[i], job, job_id, wait_s=120, leave=True)
            except Exception as exc:  # collected: asserted below
                box[i] = exc

        threads = [threading.Thread(target=one, args=(i,)) for i in range(1, OUT_OWNERS)]
        for th in threads:
            th.start()
        res = CliRunner().invoke(cli, ["owner", "join", "--config", str(configs[0]), "--job", str(job_path),
                                       "--job-id", job_id, "--leave", "--wait", "120"])
        assert res.exit_code == 0 and "shares sent" in res.output and "owner fetch" in res.output, res.output
        for th in threads:
            th.join(300)
        ends = {e["member"]: e["phase"] for e in client.watch(job_id) if e["phase"] in TERMINAL}
        assert set(ends.values()) == {"succeeded"}, ends
        client.result(job_id, tmp_path / job_id)
    assert all(isinstance(v, dict) and v["status"] == "sent" for v in box.values()) and len(box) == 11, box
    theirs = load_file(str(tmp_path / job_id / "model.safetensors"))["theta"]
    assert json.loads((tmp_path / job_id / "metrics.json").read_text())["owners_per_round"] == [OUT_OWNERS]
    for i in range(OUT_OWNERS):
        d = state[i] / "jobs" / job_id
        assert (d / "privacy_report.json").exists() and not (d / "model.safetensors").exists()
        assert _audit_events(state[i], job_id) == ["charge"]
        led = Ledger.in_state_dir(state[i])
        try:
            r = led.get(job_id)
            assert r is not None and r.state == "committed" and r.revealed_rounds == 1, r
        finally:
            led.close()

    res = CliRunner().invoke(cli, ["owner", "fetch", "--config", str(configs[0]), "--job", str(job_path),
                                   "--job-id", job_id])
    assert res.exit_code == 0 and f"{OUT_OWNERS} owners summed" in res.output, res.output
    for i in range(1, OUT_OWNERS):
        got = fetch_owner_model(cfgs[i], job, job_id, wait_s=30)
        assert got["status"] == "done" and got["counted"] and got["owners_counted"] == OUT_OWNERS
    for i in range(OUT_OWNERS):
        mine = load_file(str(state[i] / "jobs" / job_id / "model.safetensors"))["theta"]
        assert torch.equal(mine, theirs)
        assert _audit_events(state[i], job_id) == ["charge", "release"]
    assert fetch_owner_model(cfgs[2], job, job_id)["status"] == "done"  # again: the same, nothing appended
    assert _audit_events(state[2], job_id) == ["charge", "release"]

    # a job that ends without its release: 11 of the 12 owners send and leave, the job is cancelled while
    # the compute parties wait for the twelfth; nothing is revealed, and a fetch says so at once (the
    # leavers stay charged: an owner cannot know that no compute party revealed)
    gone_path = tmp_path / "cancelled.toml"
    gone_path.write_text(job_path.read_text().replace('name = "clinics"', 'name = "clinics-cancelled"'))
    gone = load_job_file(gone_path)
    with cons.client() as client:
        gone_id = client.submit(gone_path)["job_id"]
        left = [run_owner_job(cfgs[i], gone, gone_id, wait_s=120, leave=True) for i in range(1, OUT_OWNERS)]
        assert all(v["status"] == "sent" for v in left), left
        client.cancel(gone_id, "test: no release")
        ends = {e["member"]: e["phase"] for e in client.watch(gone_id) if e["phase"] in TERMINAL}
        assert set(ends.values()) == {"cancelled"}, ends
    tic = time.monotonic()
    with pytest.raises(JobEnded, match="no compute party serves round 0's release, and the job has ended at each "
                                       r".*\(the job cancelled without releasing\)"):
        fetch_owner_model(cfgs[1], gone, gone_id, wait_s=120)
    assert time.monotonic() - tic < 30
    assert not (state[1] / "jobs" / gone_id / "model.safetensors").exists()
    assert all(not (cons.root / p / "state" / "jobs" / gone_id / RELEASE_FILE).exists()
               for p in ("alice", "bob", "carol"))

    stranger = pki.issue_identity(pki.load_ca(cons.pki_dir), "clinic-99", "owner", valid_days=1)
    with tls.secure_channel(cons.members["alice"].address, stranger, "party/alice") as ch:
        stub = ppb_grpc.PartyControlStub(ch)
        for jid in (job_id, other):
            with pytest.raises(grpc.RpcError) as info:
                stub.GetOwnerRelease(ppb.OwnerReleaseRequest(job_id=jid, round=0), timeout=10)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
            assert info.value.details() == f"no job {jid!r} at alice"  # type: ignore[attr-defined]

    # storage faults: alice's kept release deleted, bob's overwritten with garbage; owner 3 reads from alice
    parties = [cons.root / p / "state" / "jobs" / job_id / RELEASE_FILE for p in ("alice", "bob", "carol")]
    parties[0].unlink()
    parties[1].write_bytes(b"\x00" * 64)
    (state[3] / "jobs" / job_id / "model.safetensors").unlink()
    assert fetch_owner_model(cfgs[3], job, job_id, wait_s=10)["owners_counted"] == OUT_OWNERS
    assert torch.equal(load_file(str(state[3] / "jobs" / job_id / "model.safetensors"))["theta"], theirs)
    parties[2].write_bytes(parties[2].read_bytes()[:100])  # truncated
    (state[4] / "jobs" / job_id / "model.safetensors").unlink()
    with pytest.raises(JobEnded, match="no compute party serves round 0's release, and the job has ended at "
                                           "each .*keeps no release of it .*missing or unreadable"):
        fetch_owner_model(cfgs[4], job, job_id, wait_s=60)  # at once: the job has ended everywhere


CROWD = 48  # more owners than a daemon's CONTROL_THREADS (32)


@pytest.mark.timeout(300)
@pytest.mark.slow  # `make test-all`; default suite: test_thirty_owners_train_through_…
def test_owners_asking_early_do_not_starve_the_compute_parties_look_ups(tmp_path: Path) -> None:
    """Regression (benchmarks.many_owners_thesis at 100 owners): owners asking a compute party for
    its intake before the job's workers have met each held one of its 32 control threads for the
    whole long poll (30 s), so the other compute parties' endpoint look-ups waited behind them and
    the workers never met. Here carol is stopped right after the job is accepted (alice's intake is
    never published while she is), 48 owners keep asking alice with wait_s = 30, and a member's
    look-up must still be answered at once; every owner's call is held at most
    OWNER_ENDPOINT_WAIT_S."""
    import signal
    import time

    from mpc_erm.mpc import tls
    from mpc_erm.mpc._proto import party_pb2 as pb
    from mpc_erm.mpc._proto import party_pb2_grpc as pb_grpc
    from parties.rendezvous import OWNER_ENDPOINT_WAIT_S

    names = [f"early-{i:02d}" for i in range(CROWD)]
    job_path = tmp_path / "early.toml"
    job_path.write_text(JOB.format(dataset="early", d=30, owners=", ".join(f'"{o}"' for o in names),
                                   no_noise="true", eps=1.0, n=400, rounds=2))
    with LocalConsortium(tmp_path / "cons", parties=3, dealer=False, allow_test_only=True,
                         max_epsilon_per_job=2.0) as cons:
        ca = pki.load_ca(cons.pki_dir)
        owners = [pki.issue_identity(ca, o, "owner", valid_days=1) for o in names]
        alice = cons.members["alice"].address
        with cons.client() as client:
            job_id = client.submit(job_path)["job_id"]
            cons.kill("carol", signal.SIGSTOP)  # carol's daemon and worker: the workers cannot meet
            try:
                calls: list[tuple[float, str]] = []
                stop = threading.Event()

                def ask(ident: Any) -> None:
                    with tls.secure_channel(alice, ident, "party/alice") as ch:
                        stub = pb_grpc.PartyControlStub(ch)
                        while not stop.is_set():
                            tic = time.monotonic()
                            try:
                                stub.GetEndpoint(pb.EndpointRequest(job_id=job_id, member="alice", service="owners",
                                                                    wait_s=30.0), timeout=40)
                                what = "published"
                            except grpc.RpcError as exc:
                                what = f"{exc.code().name}: {exc.details()}"  # type: ignore[attr-defined]
                            calls.append((time.monotonic() - tic, what))

                crowd = [threading.Thread(target=ask, args=(o,)) for o in owners]
                for th in crowd:
                    th.start()
                time.sleep(3.0)  # every control thread would be held by now, as before the fix
                bob = pki.load_identity(cons.pki_dir, "bob")
                member: list[float] = []
                with tls.secure_channel(alice, bob, "party/alice") as ch:
                    stub = pb_grpc.PartyControlStub(ch)
                    for _ in range(3):
                        tic = time.monotonic()
                        try:  # alice's share transport: published or not, answered within its own wait
                            stub.GetEndpoint(pb.EndpointRequest(job_id=job_id, member="alice", wait_s=1.0),
                                             timeout=20)
                        except grpc.RpcError as exc:
                            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc  # type: ignore[attr-defined]
                        member.append(time.monotonic() - tic)
                stop.set()
                for th in crowd:
                    th.join(60)
            finally:
                cons.kill("carol", signal.SIGCONT)
            client.cancel(job_id, "test over")
        assert max(member) < 4.0, member  # before the fix: queued behind 30 s polls (≥ 20 s, DEADLINE_EXCEEDED)
        assert len(calls) >= 2 * CROWD, len(calls)
        assert all(what.startswith("NOT_FOUND") and "not published" in what for _, what in calls), \
            {w for _, w in calls}  # the intake was never up: the crowd really asked early
        assert max(sec for sec, _ in calls) < OWNER_ENDPOINT_WAIT_S + 3.0, max(sec for sec, _ in calls)


UNI_OWNERS, UNI_TAU = 12, 0.25  # s = 3 owners drawn a round


def _uniform_replay(job_path: Path, configs: list[Path], drawn: list[list[int]]) -> tuple[torch.Tensor, float]:
    """DP-Fed-LS's rounds in plaintext over the owners drawn in each round (``drawn[t]``), weighted
    1/s and rounded onto the grid as their shares encode them: (the final model, the most that
    replacing one drawn owner's data — by another owner's, or by nothing — moved a round's sum)."""
    from mpc_erm.mpc.aggregator import PRECISION_BITS

    fed, data = _fed_job(job_path, configs)
    g = torch.Generator()  # a full batch per step: the order does not matter
    moved = 0.0
    for t, owners in enumerate(drawn):
        upd = {o: torch.round(fed.weight * fed.local_update(*data[o], t, g) * 2**PRECISION_BITS) / 2**PRECISION_BITS
               for o in range(len(data))}
        total = sum(upd[o] for o in owners)
        for o in owners:  # replace drawn owner o's data by every other owner's, and by none (a zero update)
            for other in [*(upd[x] for x in range(len(data)) if x != o), torch.zeros_like(upd[o])]:
                moved = max(moved, float((total - upd[o] + other - total).norm()))
        fed.public_step(total)
    return fed.w, moved


@pytest.mark.timeout(900)
@pytest.mark.slow  # `make test-all`; default suite: tests/mpc/test_owner_sample.py
def test_uniform_owner_sampling_through_three_compute_daemons(cons: LocalConsortium, tmp_path: Path) -> None:
    """DP-Fed-LS with ``sampling = "uniform"`` through the daemons, 12 owners, s = 3 a round:

    - zero noise: every round exactly s owners ran local epochs (each owner's own summary), every
      compute party counted all 12 (everyone sends shares), and the released model equals a
      plaintext replay over the drawn owners; replacing one drawn owner's data (by another's, or
      by nothing) moves a round's released sum by at most the report's sensitivity 2𝓛/s;
    - in-MPC noise: the owners' report states the shuffle and the replace-one accounting, is
      recomputed alone, and ε is within the target."""
    import mpc_erm
    from mpc_erm.data import load_dataset
    from mpc_erm.privacy.report import PrivacyReport
    from mpc_erm.privacy.verify import verify_report

    d = load_dataset("breast_cancer")[0].d
    owners = OWNERS[:UNI_OWNERS]
    names = ", ".join(f'"{o}"' for o in owners)
    size = round(UNI_TAU * UNI_OWNERS)
    configs = [_owner_config(tmp_path / "owners", o, i, cons, budget=20.0) for i, o in enumerate(owners)]
    exact = tmp_path / "uniform-exact.toml"
    exact.write_text(FED_JOB.format(dataset="clinics-exact", d=d, owners=names, no_noise="true", eps=1.0,
                                    n=UNI_OWNERS, rounds=FED_ROUNDS, tau=UNI_TAU) + 'sampling = "uniform"\n')
    job_id, summaries = _run_to_success(cons, exact, configs, tmp_path)
    drawn = [[i for i, o in enumerate(owners) if t + 1 in summaries[o]["joined_rounds"]]
             for t in range(FED_ROUNDS)]
    assert [len(s) for s in drawn] == [size] * FED_ROUNDS, drawn
    assert len({tuple(s) for s in drawn}) > 1  # P(the same 3 of 12 four times) = 220^-3
    metrics = json.loads((tmp_path / job_id / "metrics.json").read_text())
    assert metrics["owners_per_round"] == [UNI_OWNERS] * FED_ROUNDS  # presence says nothing of the sample
    replay, moved = _uniform_replay(exact, configs, drawn)
    released = torch.cat([p.detach().reshape(-1) for p in
                          mpc_erm.load_model(tmp_path / job_id).module.parameters()]).double()
    assert torch.allclose(released, replay, atol=2e-6, rtol=0), float((released - replay).abs().max())
    report = json.loads((tmp_path / "owners" / owners[0] / "state" / "jobs" / job_id /
                         "privacy_report.json").read_text())
    sens = report["plan"]["sensitivity_l2"]
    assert sens == pytest.approx(2 * 0.5 / size, rel=1e-12)
    # the bound holds (2𝓛/s is reached only by two opposite updates at the clip; these are
    # neither: the drawn owners' updates on one task point alike)
    assert 0 < moved <= sens * (1 + 1e-9), (moved, sens)

    noisy = tmp_path / "uniform-noisy.toml"
    noisy.write_text(FED_JOB.format(dataset="clinics", d=d, owners=names, no_noise="false", eps=2.0,
                                    n=UNI_OWNERS, rounds=FED_ROUNDS, tau=UNI_TAU) + 'sampling = "uniform"\n')
    job_id2, summaries = _run_to_success(cons, noisy, configs, tmp_path)
    assert sum(s["rounds_joined"] for s in summaries.values()) == size * FED_ROUNDS
    for where in (tmp_path / "owners" / owners[0] / "state" / "jobs" / job_id2, tmp_path / job_id2):
        rep = json.loads((where / "privacy_report.json").read_text())
        assert rep["plan"]["population"] == UNI_OWNERS and rep["plan"]["sample_size"] == size
        assert any("shuffle" in n for n in rep["notes"]), rep["notes"]
        assert 0 < rep["epsilon"] <= 2.0
        assert verify_report(PrivacyReport.from_json(json.dumps(rep))).ok
