"""parties.worker end to end without the daemon: 3 party processes + a dealer process, each running
the real worker over real gRPC + mTLS on loopback, on shards of a real data set (scikit-learn's
breast cancer). The WorkerContext here is a small real implementation (endpoint registry in a
multiprocessing manager dict); the daemon provides the production one (tests/parties/test_daemon.py).
"""

from __future__ import annotations

import json
import math
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

from mpc_erm.mpc import pki
from parties.config import LimitsConfig
from tests.procs import preloaded_context

PARTIES = ("alice", "bob", "carol")

JOB = """
method = "{method}"
[job]
name = "wk-{method}"
dataset = "bc"
parties = ["alice", "bob", "carol"]
trust = "dealer"
dealer = "dealer"
[model]
name = "logistic"
lam = {lam}
[privacy]
epsilon = {eps}
delta = 1e-5
mechanism = "gaussian"
accountant = "rdp"
[training]
iterations = {T}
learning_rate = 1.0
"""


class LocalContext:
    """WorkerContext over a shared dict (picklable: built in the parent, used in the child)."""

    def __init__(self, job_id: str, job_text: str, config: Any, identity: Any, job_dir: Path, registry: Any,
                 events: Any) -> None:
        from mpc_erm.jobs.jobfile import parse_job_file

        self.job_id, self.job, self.config, self.identity = job_id, parse_job_file(job_text), config, identity
        self.job_dir, self.ledger_path = job_dir, None
        self._registry, self._events = registry, events

    def use_job(self, job: Any) -> None:
        self.job = job

    def emit(self, event: dict[str, Any]) -> None:
        json.dumps(event)  # must be JSON-serialisable
        self._events.put((self.identity.name, event))

    def publish_endpoint(self, address: str) -> None:
        self._registry[self.identity.name] = address

    def lookup_endpoint(self, member: str, timeout_s: float) -> str:
        end = time.monotonic() + timeout_s
        while member not in self._registry:
            if time.monotonic() > end:
                raise TimeoutError(f"no endpoint from {member!r}")
            time.sleep(0.05)
        return self._registry[member]

    def cancelled(self) -> bool:
        return False


def _child(ctx: LocalContext, out_q: Any) -> None:
    try:
        import torch

        torch.set_num_threads(1)
        from parties.worker import run_dealer_job, run_party_job

        fn = run_dealer_job if ctx.identity.role == "dealer" else run_party_job
        out_q.put((ctx.identity.name, fn(ctx)))
    except BaseException as exc:
        out_q.put((ctx.identity.name, {"error": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()}))


def _config(name: str, part: int, allow_test_only: bool = False, dataset: str = "breast_cancer",
            csv: Path | None = None, idx: tuple[Path, Path] | None = None, device: str = "cpu",
            models: dict[str, str] | None = None, schema: Path | None = None) -> Any:
    from types import SimpleNamespace

    if schema is not None and csv is not None:  # a CSV read through a public schema, as a party's data set
        import functools

        from mpc_erm.data.schema import load_schema

        ds = SimpleNamespace(format="csv", path=csv, label=None, max_bytes=1 << 26, feature_range=None, task=None,
                             public_test=None, schema=functools.partial(load_schema, schema))  # picklable
        return SimpleNamespace(listen="127.0.0.1:0", advertise=None, device=device, datasets={"bc": ds},
                               policy=SimpleNamespace(allow_test_only=allow_test_only), peer_timeout_s=120.0,
                               limits=LimitsConfig(), identity=SimpleNamespace(crl=None), threads=None, models={})
    ds = (SimpleNamespace(format="builtin", name=dataset, part=part, of=3, task=None) if csv is None and idx is None
          else SimpleNamespace(format="csv", path=csv, label="label", max_bytes=1 << 26, feature_range=None, task=None)
          if idx is None else SimpleNamespace(format="idx", path=idx[0], labels=idx[1], label=None,
                                               max_bytes=1 << 26, feature_range=None, task=None))
    # what parties.worker reads of a PartyConfig (the rest of it at its defaults)
    return SimpleNamespace(listen="127.0.0.1:0", advertise=None, device=device, datasets={"bc": ds},
                           policy=SimpleNamespace(allow_test_only=allow_test_only), peer_timeout_s=120.0,
                           limits=LimitsConfig(), identity=SimpleNamespace(crl=None), threads=None,
                           models={k: SimpleNamespace(entry_point=v) for k, v in (models or {}).items()})


def run_members(tmp_path: Path, job_texts: dict[str, str], timeout: float = 300, allow_test_only: bool = False,
                dataset: str = "breast_cancer", csvs: dict[str, Path] | None = None,
                idxs: dict[str, tuple[Path, Path]] | None = None,
                devices: dict[str, str] | None = None, models: dict[str, str] | None = None,
                schema: Path | None = None) -> dict[str, Any]:
    ca = pki.create_ca("worker test CA")
    ctx_mp = preloaded_context()
    manager = ctx_mp.Manager()
    registry, events, out_q = manager.dict(), ctx_mp.Queue(), ctx_mp.Queue()
    procs = []
    for i, name in enumerate((*PARTIES, "dealer")):
        ident = pki.issue_identity(ca, name, "dealer" if name == "dealer" else "party")
        ctx = LocalContext("wk-job", job_texts.get(name, job_texts["*"]),
                           _config(name, i, allow_test_only, dataset, (csvs or {}).get(name),
                                   (idxs or {}).get(name), (devices or {}).get(name, "cpu"), models, schema),
                           ident, tmp_path / name, registry, events)
        p = ctx_mp.Process(target=_child, args=(ctx, out_q), daemon=True)
        p.start()
        procs.append(p)
    results: dict[str, Any] = {}
    try:
        end = time.monotonic() + timeout
        while len(results) < len(procs):
            name, res = out_q.get(timeout=max(1.0, end - time.monotonic()))
            results[name] = res
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        ev = []
        while not events.empty():
            ev.append(events.get())
        results["_events"] = ev
        manager.shutdown()
    return results


@pytest.fixture(scope="module")
def gradient_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("gradient")
    job = JOB.format(method="gradient", lam=1e-3, eps=1.0, T=20)
    return tmp, run_members(tmp, {"*": job})


def test_gradient_job_produces_one_private_model_at_every_party(gradient_run: tuple[Path, dict[str, Any]]) -> None:
    from safetensors.torch import load_file

    tmp, res = gradient_run
    errors = {k: v for k, v in res.items() if isinstance(v, dict) and "error" in v}
    assert not errors, "\n".join(v["tb"] for v in errors.values())
    models = [load_file(str(tmp / n / "model.safetensors"))["theta"] for n in PARTIES]
    assert all(bool((m == models[0]).all()) for m in models)
    rep = json.loads((tmp / "alice" / "privacy_report.json").read_text())
    assert rep["mechanism"] == "gaussian" and rep["rounds"] == 20 and rep["parties"] == 3
    assert rep["epsilon"] <= 1.0 and rep["delta"] + rep["delta_sampler"] <= 1e-5
    assert 0 < rep["delta_sampler"] < 1e-7
    assert "dealer 'dealer'" in rep["trust_model"] and rep["security"] == "semi-honest"
    assert "discrete Gaussian" in rep["accountant"]
    metrics = json.loads((tmp / "alice" / "metrics.json").read_text())
    assert 0.0 <= metrics["test"]["accuracy"] <= 1.0  # utility: see the output job and the no-noise twin
    # metrics on a party's own rows are not covered by ε: they stay private (never served)
    assert "train_own_rows" not in metrics
    assert all(set(c) <= {"round", "epsilon_spent", "test"} for c in metrics["curve"])
    own = json.loads((tmp / "alice" / ".private" / "own_rows.json").read_text())
    assert 0.0 <= own["train_own_rows"]["accuracy"] <= 1.0 and len(own["curve"]) == len(metrics["curve"])
    assert metrics["noise"]["online_samples"] == 0  # all noise came from the streamed pool, sampled ahead
    (pool,) = metrics["noise"]["plans"]  # streamed: exactly the job's noise, one release ahead at most
    assert pool["produced"] == pool["taken"] == 20 * pool["dim"]
    assert metrics["noise"]["peak_pool_samples"] <= pool["dim"] + pool["batch"]
    assert rep["realisation"]["coin_bits"] == 44  # a small job gets the cheapest coins that fit its TV budget
    assert rep["realisation"]["sampler"]["fair_bits"] > 0  # and staircase candidates
    assert (tmp / "alice" / "training_curve.png").stat().st_size > 1000
    phases = {e["phase"] for who, e in res["_events"] if who == "alice"}
    assert {"loading", "agreed", "offline", "training", "done"} <= phases
    assert res["dealer"]["requests"] > 0


def test_distributed_noise_through_the_workers(tmp_path: Path) -> None:
    """privacy.noise = "distributed" with a dealer: each party adds its own share, sized so that one
    honest party's alone carries the guarantee (σ_p = z·s_grid, the release √3 times the in-MPC
    noise); no noise sampler runs in the MPC. The parties release one model and a report that
    ``report verify`` recomputes, and each sampled exactly its own share of every release."""
    from safetensors.torch import load_file

    from mpc_erm.privacy.report import PrivacyReport
    from mpc_erm.privacy.statement import job_statement
    from mpc_erm.privacy.verify import verify_report

    rounds = 4
    job = JOB.format(method="gradient", lam=1e-3, eps=1.0, T=rounds).replace(
        'accountant = "rdp"', 'accountant = "rdp"\nnoise = "distributed"')
    res = run_members(tmp_path, {"*": job})
    errors = {k: v for k, v in res.items() if isinstance(v, dict) and "error" in v}
    assert not errors, "\n".join(v["tb"] for v in errors.values())
    models = [load_file(str(tmp_path / n / "model.safetensors"))["theta"] for n in PARTIES]
    assert all(bool((m == models[0]).all()) for m in models)
    rep = json.loads((tmp_path / "alice" / "privacy_report.json").read_text())
    real = rep["realisation"]
    assert rep["plan"]["noise"] == real["noise"] == "distributed"
    assert (real["noise_parties"], real["noise_honest"]) == (3, 1)  # a dealer job: one honest party suffices
    assert real["noise_scale_grid"] == real["party_noise_scale_grid"]  # its share alone is z·s_grid
    assert real["noise_scale_grid"] >= rep["plan"]["noise_multiplier"] * real["sensitivity_grid"]
    assert verify_report(PrivacyReport.from_json(json.dumps(rep))).ok
    assert "The noise is distributed" in job_statement(PrivacyReport.from_json(json.dumps(rep)))
    assert any("noise added by each compute party as its own share on the grid" in n for n in rep["notes"])
    dim = len(models[0])
    for name in PARTIES:  # every party sampled its own share of each release, ahead of it, and no more
        noise = json.loads((tmp_path / name / "metrics.json").read_text())["noise"]
        assert noise["kind"] == "distributed" and noise["samples"] == rounds * dim, noise
        assert noise["online_samples"] == 0


def test_output_job_and_spec_mismatch(tmp_path: Path) -> None:
    good = JOB.format(method="output", lam=1e-3, eps=1.0, T=1)
    res = run_members(tmp_path, {"*": good}, dataset="adult")  # Adult ships with the package
    assert "error" not in res["alice"], res["alice"].get("tb")
    rep = json.loads((tmp_path / "alice" / "privacy_report.json").read_text())
    assert rep["rounds"] == 1 and rep["epsilon"] <= 1.0
    # plaintext: non-private 0.823, σ = 0.27 noise 0.826 on one draw (/tmp/sim3.py in the closing note)
    assert res["alice"]["metrics"]["test"]["accuracy"] > 0.78

    tampered = good.replace("epsilon = 1.0", "epsilon = 2.0")
    res = run_members(tmp_path / "mismatch", {"*": good, "carol": tampered}, timeout=200)
    for name in PARTIES:
        assert "error" in res[name], name
    assert "job spec mismatch" in res["alice"]["error"] and "carol" in res["alice"]["error"]
    assert not (tmp_path / "mismatch" / "alice" / "model.safetensors").exists()


def test_no_noise_twin_equals_the_plaintext_protocol(tmp_path: Path) -> None:
    """The same gradient job with noise switched off (test-only mode) gives the plaintext model up to
    the fixed-point grid: the daemons run the simulator's protocol, nothing else."""
    import numpy as np
    import torch
    from safetensors.torch import load_file

    from mpc_erm.data import load_dataset
    from mpc_erm.data.partition import partition_equal
    from mpc_erm.jobs.jobfile import parse_job_file
    from mpc_erm.protocols import GradientPerturbation, PartySizes

    job = JOB.format(method="gradient", lam=1e-3, eps=1.0, T=10).replace('dealer = "dealer"\n',
                                                                          'dealer = "dealer"\ntest_no_noise = true\n')
    refused = run_members(tmp_path / "refused", {"*": job}, timeout=200)
    assert "allow_test_only" in refused["alice"]["error"]
    res = run_members(tmp_path, {"*": job}, allow_test_only=True)
    assert "error" not in res["alice"], res["alice"].get("tb")
    rep = json.loads((tmp_path / "alice" / "privacy_report.json").read_text())
    assert rep["mechanism"] == "none" and "NO PRIVACY" in rep["notes"][0]
    mpc_theta = load_file(str(tmp_path / "alice" / "model.safetensors"))["theta"]

    train, _ = load_dataset("breast_cancer")
    parts = [np.sort(p) for p in partition_equal(train.n, 3, rng=0)]
    spec = parse_job_file(job).spec
    proto = GradientPerturbation(spec, PartySizes.of([len(p) for p in parts]), train.d)
    theta = proto.initial_model()
    for _ in range(spec.training.iterations):
        contribs = torch.cat([proto.local_contribution(theta, torch.tensor(train.X[p]), torch.tensor(train.y[p]))
                              for p in parts])
        agg = (proto.weights.to(contribs.dtype)[:, None] * contribs).sum(0)
        theta = proto.public_step(theta, agg)
    assert torch.allclose(mpc_theta, theta, atol=1e-4, rtol=0), float((mpc_theta - theta).abs().max())


def test_add_remove_release_through_the_workers_moves_by_at_most_its_sensitivity(tmp_path: Path) -> None:
    """Issue 13, defect 1, measured on what the worker processes reveal: one zero-noise gradient
    round (θ₁ = −η·g̃ from θ₀ = 0, so the revealed aggregate is −θ₁/η) on D and on D minus the row
    whose clipped gradient is farthest from the mean. Under add/remove the parties divide by the
    public n̂, so g̃ moves by ‖clip(g_z)‖/n̂ ≤ C/n̂ = the report's sensitivity; dividing by the
    realised counts (the old protocol) moved it past the C/n it reported (1.13× here, ≈ 2× on Adult)."""
    import numpy as np
    import torch
    from safetensors.torch import load_file

    from mpc_erm.data import load_dataset
    from mpc_erm.data.partition import partition_equal
    from mpc_erm.models import clip_rows, get_loss

    clip, n_hat = 0.2, 40  # n̂ small: C/n̂ = 5e-3 dwarfs the zero-noise grid's rounding (2^-16 per party)
    train, _ = load_dataset("breast_cancer")
    X = train.X / np.maximum(1.0, np.linalg.norm(train.X, axis=1, keepdims=True))
    y = train.y
    g = clip_rows(get_loss("logistic").per_example_grad(torch.zeros(X.shape[1], dtype=torch.float64),
                                                         torch.tensor(X), torch.tensor(y)), clip)
    parts = [np.sort(p) for p in partition_equal(len(X), 3, rng=0)]
    alice = parts[0]
    z = int(alice[int((g[alice] - g.mean(0)).norm(dim=1).argmax())])

    def write(where: Path, drop: int | None) -> dict[str, Path]:
        out = {}
        for name, rows in zip(PARTIES, parts, strict=True):
            keep = [r for r in rows if r != drop]
            path = where / f"{name}.csv"
            where.mkdir(parents=True, exist_ok=True)
            header = ",".join(f"f{k}" for k in range(X.shape[1])) + ",label"
            np.savetxt(path, np.column_stack([X[keep], (y[keep] > 0).astype(float)]), delimiter=",",
                       header=header, comments="", fmt="%.17g")
            out[name] = path
        return out

    job = JOB.format(method="gradient", lam=0.0, eps=1.0, T=1).replace(
        'accountant = "rdp"', f'accountant = "rdp"\nclip = {clip}\nadjacency = "add_remove"\npublic_n = {n_hat}'
    ).replace('dealer = "dealer"\n', 'dealer = "dealer"\ntest_no_noise = true\n')
    thetas, reports = [], []
    for label, drop in (("D", None), ("D-minus-z", z)):
        res = run_members(tmp_path / label, {"*": job}, allow_test_only=True,
                          csvs=write(tmp_path / f"{label}-data", drop))
        assert "error" not in res["alice"], res["alice"].get("tb")
        thetas.append(load_file(str(tmp_path / label / "alice" / "model.safetensors"))["theta"])
        reports.append(json.loads((tmp_path / label / "alice" / "privacy_report.json").read_text()))
    sens = reports[0]["plan"]["sensitivity_l2"]
    assert sens == pytest.approx(clip / n_hat)
    assert reports[0]["plan"]["public_counts"] is None and reports[0]["n"] is None  # no count left a party
    moved = float((thetas[0] - thetas[1]).norm())  # η = 1
    rounding = 2 * 3 * math.sqrt(X.shape[1]) * 2.0**-17  # each of 3 parties rounds to 2^-16, in both runs
    assert moved <= sens + rounding
    assert moved == pytest.approx(float(g[z].norm()) / n_hat, abs=rounding)
    realised = float((g[np.concatenate(parts)].sum(0) / len(X) - g[[r for r in range(len(X)) if r != z]].sum(0)
                      / (len(X) - 1)).norm())
    assert realised > 1.1 * clip / len(X)  # dividing by the realised count moves it past the C/n once reported


def test_local_work_runs_beside_the_mpc_and_errors_reach_the_worker() -> None:
    """_concurrently: the local gradient in a thread while this thread samples noise (CrypTen stays
    in the thread that started it); the MPC side's error first, else the local one, else the result."""
    import threading

    from mpc_erm.runs import concurrently as _concurrently

    def fail(exc: BaseException) -> Any:
        def run() -> None:
            raise exc
        return run

    main = threading.get_ident()
    seen: dict[str, int] = {}
    got = _concurrently(lambda: seen.setdefault("work", threading.get_ident()) and 7,
                        lambda: seen.setdefault("here", threading.get_ident()))
    assert got == 7 and seen["here"] == main and seen["work"] != main
    with pytest.raises(ValueError, match="mpc"):
        _concurrently(fail(KeyError("local")), fail(ValueError("mpc")))
    with pytest.raises(KeyError, match="local"):
        _concurrently(fail(KeyError("local")), lambda: None)


NETWORK_JOB = """
method = "gradient"
[job]
name = "wk-net"
dataset = "bc"
parties = ["alice", "bob", "carol"]
trust = "dealer"
dealer = "dealer"
[model]
name = "mlp"
input_shape = [30]
n_classes = 2
hidden = [16]
init_seed = 3
[privacy]
epsilon = 2.0
delta = 1e-5
clip = 1.0
adjacency = "add_remove"
public_n = 430
accountant = "rdp"
[training]
iterations = 12
learning_rate = 0.2
optimizer = "adam"
"""


def _breast_cancer_network_job(tmp_path: Path, job: str,
                               models: dict[str, str] | None = None) -> tuple[list[Any], float, float]:
    """Run ``job`` on breast cancer through 3 workers + dealer; (the parties' loaded models, their
    test accuracy, the majority class's) after checking every party released the same model."""
    import numpy as np

    import mpc_erm
    from mpc_erm.data import load_dataset

    res = run_members(tmp_path, {"*": job}, timeout=400, models=models)
    errors = {k: v for k, v in res.items() if isinstance(v, dict) and "error" in v}
    assert not errors, "\n".join(v["tb"] for v in errors.values())
    models_ = [mpc_erm.load_model(tmp_path / n, plugins=models) for n in PARTIES]
    _, test = load_dataset("breast_cancer")
    preds = [m.predict(test.X) for m in models_]
    assert all(np.array_equal(p, preds[0]) for p in preds)  # one public model, bit for bit
    acc = float(np.mean(preds[0] == np.where(test.y > 0, "positive", "negative")))
    return models_, acc, float(max(np.mean(test.y > 0), np.mean(test.y <= 0)))


PLUGIN_SOURCE = """
import torch


def build(spec):
    return torch.nn.Sequential(torch.nn.Linear(spec.input_shape[0], 12), torch.nn.ReLU(),
                               torch.nn.Linear(12, spec.n_outputs))
"""


def test_a_partys_own_network_runs_through_the_workers_pinned_by_its_source(tmp_path: Path) -> None:
    """Issue 16: a model plugin — each party's config maps the job's plugin id to code installed
    there; the job pins the source's sha256, which every worker checks before importing it; the
    released bundle loads only with the same entry point and source."""
    import sys

    from mpc_erm.models.plugins import source_digest

    src = tmp_path / "site"
    src.mkdir()
    (src / "acme_nets_wk.py").write_text(PLUGIN_SOURCE)
    sys.path.insert(0, str(src))  # the workers inherit it (multiprocessing sends sys.path)
    try:
        entry = "acme_nets_wk:build"
        # ε = 8: the test is about the plugin's pinning, not its accuracy under noise; at ε = 2 this
        # 12-unit ReLU net trains to 0.85-0.93 (8 runs) but once in the default suite came out at
        # the majority class's 0.655 (a noisy step that kills every unit, we believe)
        job = NETWORK_JOB.replace('name = "mlp"\ninput_shape = [30]\nn_classes = 2\nhidden = [16]',
                                  'name = "plugin"\nplugin = "acme-small"\n'
                                  f'plugin_digest = "{source_digest(entry)}"\ninput_shape = [30]\nn_classes = 2'
                                  ).replace("epsilon = 2.0", "epsilon = 8.0")
        models, acc, majority = _breast_cancer_network_job(tmp_path / "run", job, {"acme-small": entry})
    finally:
        sys.path.remove(str(src))
    assert models[0].meta["architecture"]["network"] == "plugin:acme-small"
    assert models[0].meta["architecture"]["plugin_digest"] == source_digest(entry)
    assert acc > majority + 0.1


@pytest.mark.slow  # `make test-all`; default suite: a network's bundle: test_network_daemons.py and test_schema_jobs.py
def test_a_network_job_runs_through_the_workers_and_releases_a_loadable_model(tmp_path: Path) -> None:
    """Issue 16: an MLP trained by DP-Adam (full batch, q = 1) across 3 worker processes + dealer
    with in-MPC discrete Gaussian noise: the same public network at every party, a bundle
    mpc_erm.load_model reads, the report's plan."""
    models, acc, majority = _breast_cancer_network_job(tmp_path, NETWORK_JOB)
    rep = json.loads((tmp_path / "alice" / "privacy_report.json").read_text())
    assert rep["mechanism"] == "gaussian" and rep["rounds"] == 12 and rep["epsilon"] <= 2.0
    assert "discrete Gaussian" in rep["accountant"] and rep["plan"]["sampling_rate"] == 1.0
    assert "DP-Adam of mlp" in " ".join(rep["notes"])
    meta = models[0].meta
    assert meta["privacy"]["epsilon"] == rep["epsilon"] and "dealer 'dealer'" in meta["privacy"]["trust_model"]
    metrics = json.loads((tmp_path / "alice" / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] == acc and metrics["parameters"] == 30 * 16 + 16 + 16 * 2 + 2
    assert "train_own_rows" not in metrics and (tmp_path / "alice" / ".private" / "own_rows.json").is_file()
    print(f"\nMLP by DP-Adam through 3 workers + dealer (in-MPC noise), ε = {rep['epsilon']:.3f}: test accuracy "
          f"{acc:.4f} (majority {majority:.4f})")
    assert acc > majority + 0.1


SUBSAMPLED_JOB = NETWORK_JOB.replace("iterations = 12", "iterations = 30\nsampling_rate = 0.25")


@pytest.mark.slow  # `make test-all`; default suite: test_network_daemons.py's subsampled CNN
def test_poisson_subsampled_dp_adam_runs_through_the_workers_with_in_mpc_noise(tmp_path: Path) -> None:
    """Issue 16: DP-SGD's rounds proper — each party draws its own Poisson batch (q = 0.25) — with
    the in-MPC discrete Gaussian, accounted by its exact subsampled moments (the plan's event is
    discrete and subsampled); every party ends with the same model, better than the majority."""
    _, acc, majority = _breast_cancer_network_job(tmp_path, SUBSAMPLED_JOB)
    rep = json.loads((tmp_path / "alice" / "privacy_report.json").read_text())
    assert rep["rounds"] == 30 and rep["epsilon"] <= 2.0 and rep["plan"]["sampling_rate"] == 0.25
    assert "exact moments" in rep["accountant"] and rep["plan"]["event"]["discrete"] is True
    assert rep["plan"]["event"]["subsampled_rdp"] == "exact"
    print(f"\nMLP by Poisson-subsampled DP-Adam (q = 0.25) through 3 workers + dealer, ε = {rep['epsilon']:.3f}: "
          f"test accuracy {acc:.4f} (majority {majority:.4f})")
    assert acc > majority + 0.1


CNN_JOB = NETWORK_JOB.replace('name = "mlp"\ninput_shape = [30]\nn_classes = 2\nhidden = [16]',
                              'name = "mnist_cnn"\ninput_shape = [1, 28, 28]\nn_classes = 2').replace(
    "public_n = 430", "public_n = 300").replace("iterations = 12", "iterations = 8").replace(
    "learning_rate = 0.2", "learning_rate = 0.01")


def _images(n: int, seed: int) -> tuple:
    """28×28 images of two classes: a bright block top-left (0) or bottom-right (1), on noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    img = rng.integers(0, 60, size=(n, 28, 28))
    for i, c in enumerate(y):
        r = slice(2, 12) if c == 0 else slice(16, 26)
        img[i, r, r] = 230
    return img.astype(np.uint8), y.astype(np.uint8)


@pytest.mark.slow  # `make test-all`; default suite: a CNN on image files: tests/parties/test_network_daemons.py
def test_a_cnn_job_on_idx_images_runs_through_the_workers(tmp_path: Path) -> None:
    """Issue 16: the MNIST CNN on each party's own IDX image files (a party config's format
    'idx'), through 3 workers + dealer with in-MPC noise; every party ends with the same model."""
    _cnn_job_through_the_workers(tmp_path, {})


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA device (CI is CPU-only)")
def test_a_cuda_party_and_cpu_parties_end_with_the_same_model(tmp_path: Path) -> None:
    """Issue 16, GPU: bob's worker runs the network, its per-example gradients and clipping on
    CUDA, alice and carol on the CPU; the public model after the job is the same bit for bit
    (the step is taken on each party's float64 CPU master from the same revealed g̃)."""
    _cnn_job_through_the_workers(tmp_path, {"bob": "cuda"})


def _cnn_job_through_the_workers(tmp_path: Path, devices: dict[str, str]) -> None:
    import numpy as np
    from safetensors.numpy import load_file

    import mpc_erm
    from tests.data.test_images import write_idx

    idxs = {}
    for i, name in enumerate(PARTIES):
        img, lab = _images(100, i)
        idxs[name] = (write_idx(tmp_path / f"{name}-x.idx", img), write_idx(tmp_path / f"{name}-y.idx", lab))
    res = run_members(tmp_path / "run", {"*": CNN_JOB}, timeout=400, idxs=idxs, devices=devices)
    errors = {k: v for k, v in res.items() if isinstance(v, dict) and "error" in v}
    assert not errors, "\n".join(v["tb"] for v in errors.values())
    models = [mpc_erm.load_model(tmp_path / "run" / n) for n in PARTIES]
    img, lab = _images(200, 99)
    X = img.reshape(200, -1).astype(np.float32) / 255.0
    preds = [m.predict(X) for m in models]
    assert all(np.array_equal(p, preds[0]) for p in preds)
    weights = [load_file(str(tmp_path / "run" / n / "model.safetensors")) for n in PARTIES]
    assert all(w.keys() == weights[0].keys() and all(np.array_equal(w[k], weights[0][k]) for k in w)
               for w in weights), f"the parties' public models differ (devices {devices})"
    acc = float(np.mean(preds[0] == np.where(lab == 1, "positive", "negative")))
    rep = json.loads((tmp_path / "run" / "alice" / "privacy_report.json").read_text())
    assert rep["rounds"] == 8 and rep["epsilon"] <= 2.0 and models[0].meta["architecture"]["network"] == "mnist_cnn"
    print(f"\nMNIST CNN through 3 workers + dealer on IDX files, ε = {rep['epsilon']:.3f}: accuracy {acc:.3f}")
    assert acc > 0.8


SOFTMAX_FROM_SCHEMA = """
method = "gradient"
[job]
name = "wk-wine"
dataset = "bc"
parties = ["alice", "bob", "carol"]
trust = "dealer"
dealer = "dealer"
schema_sha256 = "{digest}"
[model]
name = "softmax"
lam = 1e-3
[privacy]
epsilon = 10.0
delta = 1e-5
clip = 1.0
[training]
iterations = 20
learning_rate = 8.0
"""


def wine_files(d: Path) -> tuple[Path, dict[str, Path]]:
    """scikit-learn's wine (178 rows, 13 measurements, 3 cultivars) as three parties' CSV files and a
    public schema: each column's public bounds from the data set's documentation, rounded out."""
    from sklearn.datasets import load_wine

    w = load_wine(as_frame=True)
    frame = w.frame.rename(columns=lambda c: c.replace("/", "_"))
    frame["cultivar"] = [f"c{k}" for k in w.target]
    d.mkdir(parents=True, exist_ok=True)
    cols = [c for c in frame.columns if c not in ("target", "cultivar")]
    lines = ["intercept = true", 'missing = "drop"', "", "[label]", 'column = "cultivar"', 'task = "multiclass"',
             'classes = ["c0", "c1", "c2"]']
    for c in cols:
        lo, hi = float(frame[c].min()), float(frame[c].max())
        lines += ["", "[[columns]]", f'name = "{c}"', 'type = "numeric"', f"low = {lo * 0.9:.6g}",
                  f"high = {hi * 1.1:.6g}"]
    schema = d / "schema.toml"
    schema.write_text("\n".join(lines) + "\n")
    csvs = {}
    for i, name in enumerate(PARTIES):
        csvs[name] = d / f"{name}.csv"
        frame.iloc[i::3].drop(columns=["target"]).to_csv(csvs[name], index=False)
    return schema, csvs


def test_a_softmax_job_takes_its_class_count_from_the_pinned_schema(tmp_path: Path) -> None:
    """model.n_classes left out: the job file pins the schema, every party fills the class count in
    from it (the same digest, so the same count), trains a 3-class model, and every member ends
    with the same model; the job's digest is the file's as written."""
    from mpc_erm.data.schema import load_schema
    from mpc_erm.jobs.jobfile import parse_job_file

    schema, csvs = wine_files(tmp_path / "wine")
    text = SOFTMAX_FROM_SCHEMA.format(digest=load_schema(schema).digest())
    jf = parse_job_file(text)
    assert jf.classes_from_schema and jf.with_schema_classes(3).spec.model.n_classes == 3
    assert jf.with_schema_classes(3).spec_digest() == jf.spec_digest()
    results = run_members(tmp_path, {"*": text}, csvs=csvs, schema=schema)
    for name in PARTIES:
        assert "error" not in results[name], results[name]
    theta = {name: json.loads((tmp_path / name / "model.json").read_text()) for name in PARTIES}
    assert all(t["classes"] == ["c0", "c1", "c2"] for t in theta.values()), theta["alice"]["classes"]
    import mpc_erm

    models = [mpc_erm.load_model(tmp_path / name) for name in PARTIES]
    import pandas as pd

    rows = pd.read_csv(csvs["alice"], dtype=str)
    preds = [m.predict(rows) for m in models]
    assert all((p == preds[0]).all() for p in preds)
    acc = float((preds[0] == rows["cultivar"].to_numpy()).mean())
    majority = float(rows["cultivar"].value_counts(normalize=True).max())
    # a 3-class model that learned: the same job in process scored at least 0.74 over 20 seeds (mean 0.89);
    # at ε = 4 and 40 rounds it ranged down to 0.59, and one run through the workers gave 0.48
    assert acc > majority + 0.2, (acc, majority)


SPARSE_JOB = """
method = "gradient"
[job]
name = "wk-sparse"
dataset = "bc"
parties = ["alice", "bob", "carol"]
trust = "dealer"
dealer = "dealer"
[model]
name = "ridge"
lam = 1e-6
[privacy]
epsilon = 10.0
delta = 0.01
clip = 0.02
accountant = "zcdp"
[training]
iterations = 20
learning_rate = 80.0
sparsity = {s}
"""


def test_dp_ight_runs_through_the_workers_and_releases_an_s_sparse_model(tmp_path: Path) -> None:
    """DP-IGHT (training.sparsity) through three party workers and a dealer: the thesis's synthetic
    sparse regression (n = 600, d = 80, s* = 4) as three parties' CSV files; every party ends with
    the same model with at most s non-zeros, and the privacy report is the one of the same job
    without thresholding (post-processing)."""
    import numpy as np
    import torch

    from benchmarks.dp_ight import synthetic

    parts, theta_star = synthetic(600, 80, 4, 3)
    csvs = {}
    for name, part in zip(PARTIES, parts, strict=True):
        csvs[name] = tmp_path / "data" / f"{name}.csv"
        csvs[name].parent.mkdir(parents=True, exist_ok=True)
        header = ",".join(f"f{k}" for k in range(part.d)) + ",label"
        np.savetxt(csvs[name], np.column_stack([part.X, part.y]), delimiter=",", header=header, comments="",
                   fmt="%.17g")
    res = run_members(tmp_path / "sparse", {"*": SPARSE_JOB.format(s=8)}, csvs=csvs)
    for name in PARTIES:
        assert "error" not in res[name], res[name].get("tb")
    from safetensors.torch import load_file

    thetas = [load_file(str(tmp_path / "sparse" / name / "model.safetensors"))["theta"] for name in PARTIES]
    assert all(torch.equal(t, thetas[0]) for t in thetas)
    assert 0 < int((thetas[0] != 0).sum()) <= 8
    err = float(np.linalg.norm(thetas[0].numpy() - theta_star) / np.linalg.norm(theta_star))
    report = json.loads((tmp_path / "sparse" / "alice" / "privacy_report.json").read_text())
    from mpc_erm.jobs.jobfile import parse_job_file
    from mpc_erm.privacy.plan import plan_job

    dense = parse_job_file(SPARSE_JOB.format(s=8).replace("sparsity = 8\n", "")).spec
    assert report["plan"]["noise_multiplier"] == plan_job(dense, sampler="mpc").noise_multiplier
    print(f"\nDP-IGHT through the workers (ε = 10, s = 8 of 80): relative error {err:.3f}")
    assert err < 1.0
