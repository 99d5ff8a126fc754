"""Jobs run end to end on a :class:`~coordinator.consortium.LocalConsortium`, and what they gave.

:func:`run_jobs` starts a fresh consortium (CA, party daemons each holding a shard of a data set
shipped in the package, a dealer daemon unless the sharing is replicated; real processes, gRPC with
mutual TLS on loopback), submits each :class:`LocalJob` through the coordinator client, fetches
its result and compares the private model's test accuracy with the non-private model of the same
objective trained on the pooled rows (computed here, in the clear, only as the reference), beside
the (ε, δ) of its privacy report, the data set's ε spent in every party's ledger after it, and the
wall time.

``mpc-erm demo`` runs :func:`default_jobs` with it; the end-to-end benchmark
(``python -m benchmarks e2e``) and tests run it too. Everything a user would audit lands in
``out``: the job files submitted, each job's result directory (model, privacy report, metrics,
training curve), ``summary.json``, the daemons' logs.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mpc_erm.jobs.status import TERMINAL, JobStatus

from .consortium import LocalConsortium

__all__ = ["JobResult", "LocalJob", "default_jobs", "job_toml", "nonprivate_accuracy", "run_jobs"]


@dataclass(frozen=True)
class LocalJob:
    """One job to run; the fields are the job file's, so a summary can say what ran."""

    name: str
    method: str  # "output" | "gradient"
    lam: float
    epsilon: float = 1.0
    delta: float = 1e-5
    mechanism: str = "gaussian"  # output perturbation only
    iterations: int = 1
    learning_rate: float = 1.0


def default_jobs(iterations: int = 50) -> list[LocalJob]:
    """The demo's two jobs: settings that give useful accuracy on a third of Adult per party at
    ε = 1, δ = 1e-5."""
    return [
        LocalJob("adult-output", "output", lam=1e-3),
        LocalJob("adult-gradient", "gradient", lam=1e-4, iterations=iterations, learning_rate=20.0),
    ]


def job_toml(job: LocalJob, parties: list[str], dataset: str, trust: str, dealer: str | None) -> str:
    plist = ", ".join(f'"{p}"' for p in parties)
    lines = [f'method = "{job.method}"', "", "[job]", f'name = "{job.name}"', f'dataset = "{dataset}"',
             f"parties = [{plist}]", f'trust = "{trust}"']
    if dealer:
        lines.append(f'dealer = "{dealer}"')
    lines += ["", "[model]", 'name = "logistic"', f"lam = {job.lam!r}", "", "[privacy]",
              f"epsilon = {job.epsilon!r}", f"delta = {job.delta!r}"]
    if job.method == "output":
        lines += [f'mechanism = "{job.mechanism}"']
    else:
        lines += ['accountant = "rdp"', "clip = 1.0", "", "[training]", f"iterations = {job.iterations}",
                  f"learning_rate = {job.learning_rate!r}"]
    return "\n".join(lines) + "\n"


def nonprivate_accuracy(dataset: str, lam: float) -> float:
    """Test accuracy of the exact minimiser of the same objective on all training rows, in the clear."""
    import torch

    from mpc_erm.data import load_dataset
    from mpc_erm.models import get_loss
    from mpc_erm.simulate.methods import nonprivate_optimum

    train, test = load_dataset(dataset)
    loss = get_loss("logistic")
    X, y = torch.tensor(train.X, dtype=torch.float64), torch.tensor(train.y)
    theta = nonprivate_optimum(loss, X, y, lam)
    return float(loss.score(theta, torch.tensor(test.X, dtype=torch.float64), torch.tensor(test.y)))


@dataclass
class JobResult:
    job: str
    method: str
    job_id: str
    status: str
    accuracy: float | None
    nonprivate_accuracy: float
    epsilon: float | None
    delta: float | None
    ledger_epsilon: float | None
    wall_s: float
    result_dir: str | None
    reason: str | None = None
    trust_model: str | None = None


Progress = Callable[[str, dict[str, Any]], None]


def _run_job(cons: LocalConsortium, job: LocalJob, out: Path, trust: str, on_event: Progress) -> JobResult:
    dealer = "dealer" if cons.dealer else None
    path = out / "jobs" / f"{job.name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(job_toml(job, cons.party_names, cons.dataset, trust, dealer))
    tic = time.perf_counter()
    with cons.client() as client:
        job_id = client.submit(path)["job_id"]
        ends: dict[str, dict[str, Any]] = {}
        for ev in client.watch(job_id):
            on_event(job.name, ev)
            if ev["phase"] in TERMINAL or ev["phase"] == "error":
                ends[ev["member"]] = ev
        wall = time.perf_counter() - tic
        bad = {m: e for m, e in ends.items() if e["phase"] != JobStatus.SUCCEEDED}
        status = JobStatus.FAILED if bad else JobStatus.SUCCEEDED
        base = JobResult(job.name, job.method, job_id, status.value, None,
                         nonprivate_accuracy(cons.dataset, job.lam), None, None, None, wall, None)
        if bad:
            base.reason = "; ".join(f"{m}: {e['phase']} ({e['payload'].get('reason') or e['payload'].get('message')})"
                                    for m, e in bad.items())
            return base
        res_dir = out / job.name
        if res_dir.exists():
            shutil.rmtree(res_dir)
        client.result(job_id, res_dir)
    report = json.loads((res_dir / "privacy_report.json").read_text())
    metrics = json.loads((res_dir / "metrics.json").read_text())
    base.accuracy = metrics.get("test", {}).get("accuracy")
    base.epsilon, base.delta = report["epsilon"], report["delta"] + report.get("delta_sampler", 0.0)
    base.trust_model = report.get("trust_model")
    base.result_dir = str(res_dir)
    base.ledger_epsilon = _ledger_spend(cons, job_id)
    return base


def _ledger_spend(cons: LocalConsortium, job_id: str) -> float | None:
    """The data set's ε spent after the job, as every party's ledger composes its jobs at the data
    set's lifetime δ (they must agree; None if any differs or the job was not charged)."""
    from parties.ledger import Ledger

    got = set()
    for name in cons.party_names:
        with Ledger(cons.root / name / "state" / "ledger.sqlite3") as led:
            row = led.get(job_id)
            got.add(None if row is None or row.state != "committed" else round(led.spent(row.dataset), 9))
    return got.pop() if len(got) == 1 else None


def run_jobs(out: Path, *, jobs: list[LocalJob] | None = None, parties: int = 3, trust: str = "dealer",
             dataset: str = "adult", keep_state: bool = False, on_event: Progress | None = None,
             on_status: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Start the consortium, run the jobs one after the other, stop everything; returns the summary
    (also written to ``out/summary.json``). The PKI and ledgers live in a temporary directory
    unless ``keep_state`` (then under ``out/consortium``)."""
    say = on_status or (lambda _msg: None)
    on_event = on_event or (lambda _job, _ev: None)
    jobs = jobs or default_jobs()
    out.mkdir(parents=True, exist_ok=True)
    tic = time.perf_counter()
    tmp = None
    if keep_state:
        root = out / "consortium"
        if root.exists():
            shutil.rmtree(root)
    else:
        tmp = tempfile.mkdtemp(prefix="mpc-erm-local-")
        root = Path(tmp)
    results: list[JobResult] = []
    try:
        cons = LocalConsortium(root, parties=parties, dataset=dataset, dealer=trust == "dealer")
        extra = " and a dealer daemon" if cons.dealer else " (replicated sharing: no dealer)"
        say(f"certificates and configs in {root}; starting {parties} party daemons{extra}")
        with cons:
            say("daemons listening: " + ", ".join(f"{m.name}@{m.address}" for m in cons.members.values()))
            for job in jobs:
                say(f"submitting {job.name} ({job.method} perturbation)")
                results.append(_run_job(cons, job, out, trust, on_event))
        logs = out / "logs"
        logs.mkdir(exist_ok=True)
        for m in cons.members.values():
            if m.log.exists():
                shutil.copy(m.log, logs / f"{m.name}.log")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    summary = {"dataset": dataset, "parties": parties, "trust": trust, "wall_s": time.perf_counter() - tic,
               "jobs": [asdict(r) for r in results]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
