"""One job inside one worker process: data → session and agreement → the job's run → results.

Order of a party's job (every step before the first reveal may abort; the daemon then releases
the budget reservation):

1. load this party's rows of the job's dataset (its own file; nothing leaves the process);
2. start a share-transport server, publish its address, learn the peers' (via the daemons);
3. join the CrypTen session over gRPC + mTLS (dealer client, or hardened 3-party RSS);
4. **agree** (:mod:`parties.session`): every member all-gathers (job digest, feature schema, row
   count) and aborts unless all digests and schemas are identical — the row counts are the public
   weights n_j/n;
5. plan the job once (:func:`~mpc_erm.privacy.plan.plan_job` with the agreed sizes) and realise
   its noise for the exact mechanism sampled inside the MPC (:mod:`mpc_erm.mpc.noise`);
6. the job's run (:mod:`mpc_erm.runs`: one class per job kind), driven by the party's reveal guard
   (:func:`parties.spend.party_guard`: check, then the ledger's mark and the audit charge, then the
   reveal) — or, at a compute party serving data owners, the same run fed by its owner intake
   (:mod:`parties.owner.serving`);
7. write model.safetensors, privacy_report.json, metrics.json (public: test-set metrics, MPC and
   noise counters) and training_curve.png; metrics on this party's own rows — a function of its
   data that no ε covers — only to ``.private/own_rows.json``, which the daemon never serves.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import matplotlib
import numpy as np
import torch

from mpc_erm.models.networks import NetworkBuilder
from mpc_erm.models.plugins import load_builder
from mpc_erm.mpc.aggregator import MpcAggregator, ZeroNoise
from mpc_erm.mpc.communicator import GrpcCommunicator, uninit_crypten
from mpc_erm.mpc.dealer import run_dealer, stop_dealer_client
from mpc_erm.mpc.local_noise import DistributedNoise
from mpc_erm.mpc.noise import InMpcNoise, Realisation
from mpc_erm.mpc.transport import PartyTable, TransportError, TransportOptions
from mpc_erm.mpc.verified_aggregator import VerifiedAggregator
from mpc_erm.mpc.verified_grid import party_bounds
from mpc_erm.privacy.plan import PrivacyPlan, plan_job, public_sizes
from mpc_erm.privacy.report import PrivacyReport
from mpc_erm.protocols.row_draws import RowDraws
from mpc_erm.runs import CurvePoint, ModelFacts, NetworkRun, RunResult, run_for

from .callers import caller_policy
from .config import plugin_entry_point
from .context import WorkerContext
from .job_store import write_result_manifest
from .owner.serving import serve_owners
from .owner.shares import contributions_checked
from .public_errors import PublicError
from .row_sample import pooled_row_draws
from .rows import Rows, device_for, load_rows
from .session import AgreementError, DealerJobAborted, agree, join, peer_timeout, trust_setup
from .spend import check_room, party_audit, party_guard, record_refused

matplotlib.use("Agg")
import matplotlib.pyplot as plt

log = logging.getLogger(__name__)

__all__ = ["AgreementError", "DealerJobAborted", "run_dealer_job", "run_party_job"]

def _test_no_noise(ctx: WorkerContext) -> bool:
    if not ctx.job.job.test_no_noise:
        return False
    if not ctx.config.policy.allow_test_only:
        raise PermissionError("job.test_no_noise: refused (this party's policy.allow_test_only is false)")
    return True


def _plugin_builder(ctx: WorkerContext) -> NetworkBuilder | None:
    """A plugin network's builder: this party's own installed code, after checking its source
    against the digest the job pins (mpc_erm.models.plugins); None for every other model."""
    spec = ctx.job.spec
    if spec.model.name != "plugin":
        return None
    return load_builder(plugin_entry_point(ctx.config, spec.model.plugin), str(spec.model.plugin_digest))


def _report(ctx: WorkerContext, plan: PrivacyPlan, real: Realisation | None, trust: str,
            result: RunResult) -> PrivacyReport:
    """The job's privacy report: the plan's, with the engine's realisation of its noise."""
    made = "sampled inside the MPC" if plan.noise_split is None else "added by each compute party as its own share"
    where = ("" if real is None else f"{'discrete Laplace' if plan.mechanism == 'laplace' else 'discrete Gaussian'} "
             f"noise {made} on the grid 2^-{real.plan.grid_bits}")
    audit = party_audit(ctx)
    return plan.report(noise_scale=0.0 if real is None else real.report_scale,
                       realisation=None if real is None else real.describe(), trust_model=trust,
                       security=ctx.job.job.security,
                       parties=len(ctx.job.job.parties),
                       parameters={**result.parameters, "job_digest": ctx.job.spec_digest(),
                                   "audit_head": None if audit is None else audit.head()},
                       notes=tuple(x for x in (where, result.note) if x))


def _plot(path: Path, curve: list[CurvePoint], title: str) -> None:
    """The training curve: the public test set's objective (or accuracy), else ε spent, by round."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [c.round for c in curve]
    has_test = all(c.test is not None for c in curve)
    key = "objective" if has_test and all("objective" in (c.test or {}) for c in curve) else "accuracy"
    ys = [(c.test or {})[key] if has_test else c.epsilon_spent for c in curve]
    ax.plot(xs, ys, marker="o" if len(xs) < 3 else None)
    ax.set_xlabel("round")
    ax.set_ylabel(f"{key} on the public test set" if has_test else "ε spent")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _write_results(ctx: WorkerContext, result: RunResult, report: PrivacyReport, metrics: dict[str, object],
                   trust: str) -> None:
    """The served results (model, report, public metrics, curve) and, in ``.private/`` (a dot
    directory the daemon never serves), the metrics on this party's own rows."""
    d = ctx.job_dir
    d.mkdir(parents=True, exist_ok=True)
    job = ctx.job
    result.write_model(d, ModelFacts(ctx.job_id, job.spec_digest(), job.job.name, job.job.dataset, trust,
                                      job.job.security))
    (d / "privacy_report.json").write_text(report.to_json(indent=2))
    (d / "metrics.json").write_text(json.dumps(metrics, indent=2, default=float))
    final = result.curve[-1]  # the last round's point: the trained model's metrics
    own = {"train_own_rows": final.own.get("train"), "validation_rows": final.own.get("validation"),
           "curve": [{"round": c.round, **c.own} for c in result.curve]}
    private = d / ".private"
    private.mkdir(mode=0o700, exist_ok=True)
    (private / "own_rows.json").write_text(json.dumps(own, indent=2, default=float))
    _plot(d / "training_curve.png", result.curve,
          f"{job.job.name}: {job.spec.method} perturbation, ε = {report.epsilon:.3g}")


def _own_run(ctx: WorkerContext, comm: GrpcCommunicator, agg: MpcAggregator | VerifiedAggregator,
             pool: InMpcNoise | DistributedNoise,
             rows: Rows, plan: PrivacyPlan, real: Realisation | None, builder: NetworkBuilder | None) -> RunResult:
    """This party's run on its own rows, guarded by its ledger and audit log."""
    spec, ds = ctx.job.spec, rows.train
    run = run_for(spec, plan, rows, features=ds.d, noise=None if real is None else real.spec,
                  pool=None if real is None else pool, device=device_for(ctx), builder=builder,
                  weight=1.0 if spec.model.is_network else plan.weight(comm.get_rank(), int(ds.n)),
                  draws=_row_draws(ctx, comm, plan, int(ds.n)))
    if isinstance(agg, VerifiedAggregator) and real is not None:  # refuse before anything is charged
        agg.prepare(run.p, real.spec)
    if isinstance(run, NetworkRun):  # every party must build the same initial weights (public, not data)
        mine = run.model_digest()
        first = comm.broadcast_obj(mine if comm.get_rank() == 0 else None, 0)
        if first != mine:
            raise ValueError(f"model: the initial {spec.model.name} built here differs from party 0's (digest "
                             f"{mine[:12]} vs {str(first)[:12]}): the parties' PyTorch builds disagree")
    with party_guard(ctx, plan, spends=True) as guard:
        if isinstance(agg, VerifiedAggregator):  # charge a round only once its checks passed
            agg.before_open = guard.defer_marks()
        return run.run(agg, guard)


def _row_draws(ctx: WorkerContext, comm: GrpcCommunicator, plan: PrivacyPlan, own: int) -> RowDraws | None:
    """A job whose batch is b of the pooled rows (``training.batch_size``): this party's part of
    every round's draw, by the three parties' secret shuffle (:mod:`parties.row_sample`), once its
    own count is the one the job file made public."""
    spec, jt = ctx.job.spec, ctx.job.job
    b, stated = spec.training.batch_size, spec.privacy.party_rows
    if b is None or stated is None:
        return None
    me = jt.parties[comm.get_rank()]
    if stated.get(me) != own:
        raise ValueError(f"privacy.party_rows: the job file states {stated.get(me)} rows for {me}, which holds {own}: "
                         "the plan's accounting needs every party's true count")
    counts = [int(stated[name]) for name in jt.parties]
    ctx.emit({"phase": "sample", "message": f"drawing {b} of the {sum(counts)} pooled rows for each of "
                                            f"{spec.training.iterations} rounds (secret shuffle)"})
    return pooled_row_draws(comm, counts, int(b), int(spec.training.iterations))


def _on_refused(ctx: WorkerContext, plan: PrivacyPlan) -> Callable[[int, list[int]], None]:
    """The aggregator's report of the parties whose contribution to a round failed the bound
    check: recorded by name as it happens (:func:`~.spend.record_refused`)."""
    names = ctx.job.job.parties
    audit = party_audit(ctx)
    bound = max(plan.member_bound(j) for j in range(len(names)))

    def refused(k: int, ranks: list[int]) -> None:
        record_refused(ctx, audit, k + 1, [names[c] for c in ranks], bound, "training")

    return refused


def _party_bounds(plan: PrivacyPlan, parties: int) -> tuple[float, ...] | None:
    """Each party's public contribution bound, which every aggregate checks on the shares (None in
    a test build that switched the check off: the trust model then says so)."""
    if not contributions_checked():
        return None
    return tuple(plan.member_bound(j) for j in range(parties))


def schema_classes(ctx: WorkerContext, rows: Rows) -> int:
    """A softmax job's class count from this party's schema (the one the job pins: its digest was
    checked when the rows were read)."""
    if rows.schema is None or rows.schema.task != "multiclass":
        raise PublicError("DATA_SCHEMA", f"model.n_classes: left to the schema, but {ctx.identity.name}'s data set "
                                         f"{ctx.job.job.dataset!r} has no multiclass schema; nothing revealed")
    return int(rows.schema.n_classes)


def run_party_job(ctx: WorkerContext) -> dict[str, object]:
    """The worker process's main for a party. Raises on any failure (the daemon records it)."""
    if ctx.config.threads:
        torch.set_num_threads(ctx.config.threads)
    tic = time.perf_counter()
    ctx.emit({"phase": "loading", "message": f"dataset {ctx.job.job.dataset!r}"})
    owners = bool(ctx.job.job.owners)  # a compute party for data owners holds no rows
    rows = None if owners else load_rows(ctx)
    if rows is not None and ctx.job.classes_from_schema:
        ctx.use_job(ctx.job.with_schema_classes(schema_classes(ctx, rows)))
    builder = None if owners else _plugin_builder(ctx)  # before any peer is joined: refuse first
    check_room(ctx)  # disk full: refuse before any member spends ε
    callers = caller_policy(ctx.config, ctx.identity)  # this job's servers: the daemon's CRL, roles and rates
    server, comm = join(ctx, callers)
    assert isinstance(comm, GrpcCommunicator)
    ok = False
    try:
        trust_setup(ctx, comm)
        counts = agree(ctx, comm, rows)
        no_noise = _test_no_noise(ctx)
        spec = ctx.job.spec
        public = None if rows is None or rows.test is None else np.asarray(rows.test.X)  # [transfer] public_test
        plan = plan_job(spec, sampler="mpc", test_no_noise=no_noise,
                        sizes=public_sizes(spec, counts), noise_split=ctx.job.noise_split(),
                        n_features=ctx.job.job.features if rows is None else rows.train.d, builder=builder,
                        public_rows=public)
        # The MPC (noise, secure sum) runs on the CPU whatever the party's device: its correlated
        # randomness (CrypTen's shared generators, the dealer's per-party streams) is drawn by
        # torch generators whose CPU and CUDA streams differ for one seed, so parties on different
        # devices would draw different "common" values; and the sampler is bound by bytes, not
        # arithmetic (docs/how-to/gpu.md, "Why the MPC stays on the CPU": CUDA gains nothing there).
        pool: InMpcNoise | DistributedNoise = DistributedNoise() if plan.noise == "distributed" else InMpcNoise("cpu")
        agg: MpcAggregator | VerifiedAggregator
        real: Realisation | None
        if ctx.job.job.security == "malicious":  # the job file admits it with distributed noise only
            assert isinstance(pool, DistributedNoise) and not no_noise
            agg = VerifiedAggregator(pool, party_bounds(plan, comm.get_world_size(), owners), comm)
            # the finest grid whose proofs fit: refused here, before anything is charged
            real = agg.realise(plan, owner_bound=plan.member_bound() if owners else None)
        else:
            agg = MpcAggregator(ZeroNoise() if no_noise else pool, allow_test_only=no_noise,
                                bounds=None if owners else _party_bounds(plan, comm.get_world_size()),
                                on_refused=None if owners else _on_refused(ctx, plan))
            # the grid where the parties' bound check fits: refused here, before anything is charged
            real = None if no_noise else agg.realise(plan)
        ctx.emit({"phase": "agreed", "message": (f"n = {sum(counts)} rows over {len(counts)} parties" if counts
                                                 else f"add/remove: normaliser n̂ = {plan.public_n}")
                  + f"; {agg.trust_model}"})
        counters: dict[str, object] = {}
        trust = agg.trust_model
        if rows is None:
            served = serve_owners(ctx, comm, agg, pool, plan, real, callers)
            result, counters, trust = served.result, served.counters, served.trust_model
        else:
            result = _own_run(ctx, comm, agg, pool, rows, plan, real, builder)
            counters["parties_refused"] = {str(k + 1): [ctx.job.job.parties[c] for c in r]
                                           for k, r in enumerate(agg.refused) if r}
        report = _report(ctx, plan, real, trust, result)
        final = result.curve[-1]
        metrics: dict[str, object] = {
            "wall_seconds": time.perf_counter() - tic,
            "mpc": agg.describe(), "noise": pool.stats(), **result.extra, **counters,
            "curve": [c.public() for c in result.curve],
        }
        if final.test is not None:
            metrics["test"] = final.test
        summary: dict[str, object] = {
            "epsilon": report.epsilon, "delta": report.delta_total,
            "metrics": {"wall_seconds": metrics["wall_seconds"]} | ({"test": final.test} if final.test else {})}
        _write_results(ctx, result, report, metrics, trust)
        write_result_manifest(ctx.job_dir, summary)  # last: a restarted daemon trusts the results only with it
        ctx.emit({"phase": "done", "epsilon_spent": report.epsilon, "message": "results written"})
        ok = True
        return summary
    finally:
        try:
            _stop_dealer(ctx, ok)
        finally:
            uninit_crypten()
            server.stop(1.0)


def _stop_dealer(ctx: WorkerContext, ok: bool) -> None:
    """Party 0 tells the dealer the job is over. After a success that is a courtesy: every reveal
    is done, the results are written and the budget is spent, so a dealer that cannot be reached
    (it crashed after serving its last triple; gradient rounds and the output reveal need none) must
    not turn the job into a failure: the coordinator would see "failed", refetch nothing and
    resubmit, charging the ε twice. The dealer's worker ends by itself once party 0's is gone."""
    try:
        stop_dealer_client(send_terminate=ok)
    except TransportError as exc:
        if not ok:
            raise
        log.warning("job %s: results written, but the dealer could not be told the job is over: %s", ctx.job_id,
                    " ".join(str(exc).split())[:500])


def run_dealer_job(ctx: WorkerContext) -> dict[str, object]:
    """The worker process's main for the dealer: serve triples for this job, then exit."""
    if ctx.config.threads:
        torch.set_num_threads(ctx.config.threads)
    server, table = join(ctx, caller_policy(ctx.config, ctx.identity))
    assert isinstance(table, PartyTable)
    try:
        ctx.emit({"phase": "dealing", "message": "serving triples"})
        rep = run_dealer(table, ctx.identity, server=server, options=TransportOptions(deadline_s=peer_timeout(ctx)),
                         idle_timeout_s=peer_timeout(ctx) * 5)
        if rep.ended_by != "terminate":
            # Party 0 sends "terminate" only once its job has succeeded; anything else (a party
            # crashed or failed, no request for too long) means the job failed, and the dealer's
            # job table must not say "succeeded" for a job whose parties failed.
            raise DealerJobAborted(f"the parties did not finish the job ({rep.requests} requests served): "
                                   f"{rep.ended_by or 'the dealer loop ended without terminate'}")
        return {"requests": rep.requests, "elements": rep.elements_served, "ended_by": rep.ended_by}
    finally:
        server.stop(1.0)
