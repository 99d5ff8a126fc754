"""One job inside one worker process: data → agreement → MPC protocol → private model on disk.

Order of a party's job (every step before the first reveal may abort; the daemon then releases
the budget reservation):

1. load this party's rows of the job's dataset (its own file; nothing leaves the process);
2. start a share-transport server, publish its address, learn the peers' (via the daemons);
3. join the CrypTen session over gRPC + mTLS (dealer client, or hardened 3-party RSS);
4. **agree**: every member all-gathers (job digest, feature schema, row count) and aborts unless
   all digests and schemas are identical — the row counts are the public weights n_j/n;
5. calibrate the in-MPC noise for the exact mechanism sampled (:mod:`mpc_erm.mpc.noise`), fill
   the offline noise pool (for output perturbation concurrently with the local solve);
6. mark the ledger reservation revealed (permanent spend), then run the protocol's reveals;
7. write model.safetensors, privacy_report.json, metrics.json (public: test-set metrics, MPC and
   noise counters) and training_curve.png; metrics on this party's own rows — a function of its
   data that no ε covers — only to ``.private/own_rows.json``, which the daemon never serves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from typing import Any

import numpy as np

from .context import JobCancelled, WorkerContext
from .jobs import write_result_manifest

log = logging.getLogger(__name__)

__all__ = ["AgreementError", "DealerJobAborted", "run_dealer_job", "run_party_job"]

DEADLINE_S = 120.0  # default of the daemon config's peer_timeout_s: every wait on a peer (a message, an
# endpoint look-up) is bounded by it


def _peer_timeout(ctx: WorkerContext) -> float:
    """The daemon's ``peer_timeout_s`` (transport deadline and endpoint look-up)."""
    return float(getattr(ctx.config, "peer_timeout_s", DEADLINE_S))
PROGRESS_EVERY = 5  # rounds between progress events


class AgreementError(RuntimeError):
    """The members do not hold the identical job or the same dataset schema: nothing was revealed."""


class DealerJobAborted(RuntimeError):
    """The dealer's job ended without party 0's "terminate": a party went away or failed."""


# ------------------------------------------------------------------------------------ data


def _load_rows(ctx: WorkerContext) -> tuple[Any, Any | None]:
    """(this party's training rows, a public test set if the dataset has one) as mpc_erm Datasets."""
    from mpc_erm.data import Dataset, clip_to_unit_ball, load_dataset
    from mpc_erm.data.loaders import load_file
    from mpc_erm.data.partition import partition_equal

    ds_id = ctx.job.job.dataset
    cfg = ctx.config.datasets.get(ds_id) if hasattr(ctx.config, "datasets") else None
    if cfg is None:
        raise ValueError(f"job.dataset: this party has no dataset {ds_id!r}")
    task = getattr(cfg, "task", None) or ("multiclass" if ctx.job.spec.model.name == "softmax" else "binary")
    if ctx.job.spec.model.name == "ridge":
        task = "regression"
    if cfg.format == "builtin":
        train, test = load_dataset(cfg.name)
        parts = partition_equal(train.n, cfg.of, rng=0)  # public seed: the shards are disjoint
        idx = np.sort(parts[cfg.part])
        mine = Dataset(train.X[idx], train.y[idx], train.task, f"{cfg.name}[{cfg.part}/{cfg.of}]",
                       train.feature_names, train.n_classes)
        return mine, test
    # the loader refuses a file over max_bytes before reading it, and values outside feature_range
    ds = load_file(cfg.format, cfg.path, task=task, label=cfg.label, max_bytes=cfg.max_bytes,
                   feature_range=cfg.feature_range)
    # A user's file is expected to be scaled by a public schema; rows are clipped into the unit ball
    # so the protocols' sensitivity bounds hold whatever the file contains.
    X = clip_to_unit_ball(np.asarray(ds.X))
    return Dataset(X, ds.y, ds.task, ds.name, ds.feature_names, ds.n_classes), None


def _schema_digest(ds: Any) -> str:
    return hashlib.sha256(json.dumps([list(ds.feature_names), ds.task, ds.n_classes]).encode()).hexdigest()


def _device(ctx: WorkerContext) -> Any:
    import torch

    want = ctx.job.job.device or getattr(ctx.config, "device", "auto")
    if want == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but no CUDA device is available to this party")
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(want)


# ------------------------------------------------------------------------------------ session


def _members(ctx: WorkerContext) -> tuple[list[str], str | None]:
    return list(ctx.job.job.parties), ctx.job.job.dealer


def _join(ctx: WorkerContext) -> tuple[Any, Any]:
    """Transport server + PartyTable + CrypTen session; returns (server, comm)."""
    from mpc_erm.mpc.communicator import init_crypten
    from mpc_erm.mpc.transport import Member, PartyTable, TransportOptions, TransportServer

    listen_host = str(ctx.config.listen).rsplit(":", 1)[0]
    adv_host = str(getattr(ctx.config, "advertise", None) or ctx.config.listen).rsplit(":", 1)[0]
    server = TransportServer.configured(ctx.identity, f"{listen_host}:0", limits=getattr(ctx.config, "limits", None),
                                        crl=getattr(getattr(ctx.config, "identity", None), "crl", None))
    port = server.start()
    ctx.publish_endpoint(f"{adv_host}:{port}")
    parties, dealer = _members(ctx)
    me = ctx.identity.name
    addr = {n: (f"{adv_host}:{port}" if n == me else ctx.lookup_endpoint(n, _peer_timeout(ctx))) for n in parties}
    if dealer:
        addr[dealer] = f"{adv_host}:{port}" if dealer == me else ctx.lookup_endpoint(dealer, _peer_timeout(ctx))
    table = PartyTable(
        job_id=ctx.job_id,
        parties=tuple(Member(n, addr[n], "party") for n in parties),
        dealer=Member(dealer, addr[dealer], "dealer") if dealer else None,
    )
    ctx.emit({"phase": "connecting", "message": f"{len(parties)} parties" + (f" + dealer {dealer}" if dealer else "")})
    if ctx.identity.role == "dealer":
        return server, table
    comm = init_crypten(table, me, ctx.identity, server=server, options=TransportOptions(deadline_s=_peer_timeout(ctx)))
    return server, comm


def _trust_setup(ctx: WorkerContext, comm: Any) -> None:
    """dealer: every triple from the job's dealer; replicated: 3-party RSS, no dealer (the binary
    triples and B2A bits of comparisons made by the parties themselves, mpc.rss_provider)."""
    from mpc_erm.mpc.crypten_compat import import_crypten

    import_crypten()
    from crypten.config import cfg

    if ctx.job.job.trust == "replicated":
        from mpc_erm.mpc.rss_provider import start_replicated_provider

        start_replicated_provider()
        return
    from mpc_erm.mpc.dealer import start_dealer_client

    cfg.mpc.protocol = "beaver"
    start_dealer_client(comm)


def _agree(ctx: WorkerContext, comm: Any, ds: Any) -> list[int]:
    """All-gather (digest, schema, n) and refuse any mismatch; returns every party's row count."""
    mine = {"digest": ctx.job.spec_digest(), "schema": _schema_digest(ds), "n": int(ds.n), "name": ctx.identity.name}
    everyone = [comm.broadcast_obj(mine if r == comm.get_rank() else None, r) for r in range(comm.get_world_size())]
    names = [e["name"] for e in everyone]
    for e in everyone:
        if e["digest"] != mine["digest"]:
            raise AgreementError(f"job spec mismatch: party {e['name']!r} holds a different job (digest "
                                 f"{e['digest'][:12]}… vs ours {mine['digest'][:12]}…); nothing revealed")
        if e["schema"] != mine["schema"]:
            raise AgreementError(f"dataset schema mismatch: party {e['name']!r} has different features for "
                                 f"{ctx.job.job.dataset!r}; nothing revealed")
    if names != list(ctx.job.job.parties):
        raise AgreementError(f"party order {names} differs from the job's {list(ctx.job.job.parties)}")
    return [int(e["n"]) for e in everyone]


# ------------------------------------------------------------------------------------ protocol


def _check_cancel(ctx: WorkerContext) -> None:
    if ctx.cancelled():
        raise JobCancelled("cancelled by the coordinator")


def dp_event_of(g: Any) -> dict[str, Any]:
    """The ledger's description of the mechanism a job runs (parties.ledger): the discrete
    Gaussian's Rényi divergence equals the continuous Gaussian's at z = σ/‖s‖₂ in grid units (CKS
    2020, Prop. 5), so it composes as a Gaussian event; the discrete Laplace as a pure-ε release.
    The sampler's own δ rides along as ``delta_extra``."""
    if g.mechanism == "discrete_gaussian":
        return {"kind": "gaussian", "noise_multiplier": g.noise_scale_grid / g.sensitivity_grid,
                "rounds": g.releases, "delta_extra": g.delta_sampler}
    return {"kind": "laplace", "epsilon": g.epsilon, "delta_extra": g.delta_sampler}


def _mark_revealed(ctx: WorkerContext, g: Any = None) -> None:
    if ctx.ledger_path is None:
        return
    from .ledger import Ledger

    event = dp_event_of(g) if g is not None and not _test_no_noise(ctx) else None
    with Ledger(ctx.ledger_path) as led:
        led.mark_revealed(ctx.job_id, event)
    pv = ctx.job.spec.privacy
    _audit(ctx).charge(ctx.job_id, dataset=ctx.job.job.dataset, epsilon=pv.epsilon, delta=pv.delta,
                       spec_digest=ctx.job.spec_digest(), dp_event=event)


class _NoAudit:
    """Where the worker has no state dir (the dealer, tests without a daemon): nothing to log."""

    def charge(self, *_a: Any, **_k: Any) -> None:
        return None

    def release(self, *_a: Any, **_k: Any) -> None:
        return None

    def head(self) -> None:
        return None


def _audit(ctx: WorkerContext) -> Any:
    """The party's hash-chained audit log of charges and releases (parties.audit), in its state dir."""
    if ctx.ledger_path is None:
        return _NoAudit()
    from .audit import AuditLog

    return AuditLog.in_state_dir(ctx.ledger_path.parent)


def _test_no_noise(ctx: WorkerContext) -> bool:
    if not ctx.job.job.test_no_noise:
        return False
    if not getattr(getattr(ctx.config, "policy", None), "allow_test_only", False):
        raise PermissionError("job.test_no_noise: refused (this party's policy.allow_test_only is false)")
    return True


def _noise_or_none(ctx: WorkerContext, noise: Any) -> Any:
    from mpc_erm.protocols import NO_NOISE

    return NO_NOISE if _test_no_noise(ctx) else noise


def _report(ctx: WorkerContext, proto: Any, g: Any, mechanism: str, trust: str, sizes: Any, note: str) -> Any:
    from mpc_erm.privacy import PrivacyReport

    pv = ctx.job.spec.privacy
    if mechanism == "none":
        return PrivacyReport(
            mechanism="none", noise_scale=0.0, norm="l2", adjacency=pv.adjacency, accountant="none",
            epsilon=math.inf, delta=1.0, trust_model=trust, parties=sizes.m, n=sizes.n,
            notes=("TEST-ONLY ZERO-NOISE RUN: NO PRIVACY (job.test_no_noise)", note),
        )
    l1 = mechanism == "laplace"
    return PrivacyReport(
        mechanism="laplace" if l1 else "gaussian",
        noise_scale=g.noise_scale,
        norm="l1" if l1 else "l2",
        sensitivity_l2=proto.sensitivity,
        sensitivity_l1=g.sensitivity if l1 else None,
        adjacency=pv.adjacency,
        accountant=g.accountant,
        epsilon=g.epsilon,
        delta=g.delta - g.delta_sampler,
        delta_sampler=g.delta_sampler,
        rounds=g.releases,
        trust_model=trust,
        parties=sizes.m,
        n=sizes.n,
        parameters={
            "protocol": f"{ctx.job.spec.method}_perturbation", "loss": proto.loss.name, "lam": ctx.job.spec.model.lam,
            "dim": proto.p, "grid_bits": g.grid_bits, "noise_scale_grid": g.noise_scale_grid,
            "sensitivity_grid": g.sensitivity_grid, "tv_per_coordinate": g.tv_per_coordinate,
            "requested_epsilon": pv.epsilon, "requested_delta": pv.delta, "job_digest": ctx.job.spec_digest(),
            "audit_head": _audit(ctx).head(),
        },
        notes=(g.statement, note),
    )


def _metrics(loss: Any, theta: Any, ds: Any, lam: float) -> dict[str, float]:
    """Objective and accuracy (classification) or MSE (regression) of θ on the rows of ``ds``.

    On this party's own rows they are a function of its private data that no ε covers: they stay
    in the job's ``.private/`` directory (never served); only metrics on a public test set leave."""
    import torch

    from mpc_erm.models import objective_value

    X = torch.as_tensor(np.array(ds.X), dtype=torch.float64)
    y = torch.as_tensor(np.array(ds.y))
    th = theta.detach().to("cpu", torch.float64)
    key = "mse" if loss.task == "regression" else "accuracy"
    return {"objective": float(objective_value(loss, th, X, y, lam)), key: loss.score(th, X, y)}


def _point(t: int, eps: float, proto: Any, theta: Any, ds: Any, test: Any, lam: float) -> dict[str, Any]:
    """One point of the training curve: public part (round, ε spent, test-set metrics) and, under
    ``own``, the private part."""
    point: dict[str, Any] = {"round": t, "epsilon_spent": eps, "own": _metrics(proto.loss, theta, ds, lam)}
    if test is not None:
        point["test"] = _metrics(proto.loss, theta, test, lam)
    return point


def _output_job(ctx: WorkerContext, agg: Any, src: Any, ds: Any, test: Any, sizes: Any, rank: int,
                dev: Any) -> tuple:
    import torch

    from mpc_erm.mpc.noise import calibrate_gaussian, calibrate_laplace
    from mpc_erm.protocols import OutputPerturbation

    spec = ctx.job.spec
    proto = OutputPerturbation(spec, sizes, ds.d)
    pv = spec.privacy
    if pv.mechanism == "gaussian":
        noise, g = calibrate_gaussian(proto.sensitivity, proto.p, 1, pv.epsilon, pv.delta, sizes.m)
    elif pv.mechanism == "laplace_thesis":
        noise, g = calibrate_laplace(math.sqrt(proto.p) * proto.sensitivity, proto.p, pv.epsilon,
                                     max(pv.delta, 1e-9), sizes.m)
    else:
        raise ValueError("privacy.mechanism: 'l2_laplace' is not sampled inside the MPC; use 'gaussian' (ε, δ) "
                         "or 'laplace_thesis' (pure ε per coordinate with Δ₁ = √d·Δ₂)")
    proto.noise = _noise_or_none(ctx, noise)
    X = torch.as_tensor(np.array(ds.X), dtype=torch.float64, device=dev)
    y = torch.as_tensor(np.array(ds.y), device=dev)
    local: dict[str, Any] = {}

    def solve() -> None:
        try:
            local["theta"] = proto.local_model(X, y)
        except BaseException as exc:  # re-raised in the main thread
            local["error"] = exc

    ctx.emit({"phase": "local", "message": "local solve and offline noise, concurrently"})
    th = threading.Thread(target=solve, name="local-solve")
    th.start()
    if proto.noise.mechanism != "none":
        src.prepare(noise, proto.p, 1)  # CrypTen stays in this thread
    th.join()
    if "error" in local:
        raise local["error"]
    _check_cancel(ctx)
    _mark_revealed(ctx, g)
    ctx.emit({"phase": "reveal", "round": 1, "rounds": 1, "epsilon_spent": g.epsilon})
    theta = proto.release(agg, local["theta"].reshape(1, -1).to("cpu", torch.float64), [rank])
    _audit(ctx).release(ctx.job_id, what="noisy weighted average of the local models", value=theta, round=1,
                        rounds=1)
    curve = [_point(1, g.epsilon, proto, theta, ds, test, spec.model.lam)]
    return proto, g, theta, curve, "output perturbation: locally solved models averaged with public weights n_j/n"


def _gradient_job(ctx: WorkerContext, agg: Any, src: Any, ds: Any, test: Any, sizes: Any, rank: int,
                  dev: Any) -> tuple:
    import torch

    from mpc_erm.mpc.noise import calibrate_gaussian, guarantee, plan_noise
    from mpc_erm.protocols import GradientPerturbation

    spec = ctx.job.spec
    pv, tr = spec.privacy, spec.training
    proto = GradientPerturbation(spec, sizes, ds.d)
    acc = pv.accountant if pv.accountant in ("rdp", "zcdp") else "rdp"
    noise, g = calibrate_gaussian(proto.sensitivity, proto.p, tr.iterations, pv.epsilon, pv.delta, sizes.m, acc)
    proto.noise = _noise_or_none(ctx, noise)
    if proto.noise.mechanism != "none":
        ctx.emit({"phase": "offline", "message": f"sampling {tr.iterations * proto.p} noise values inside the MPC"})
        src.prepare(noise, proto.p, tr.iterations)
    X = torch.as_tensor(np.array(ds.X), dtype=torch.float64, device=dev)
    y = torch.as_tensor(np.array(ds.y), device=dev)
    theta = proto.initial_model(device=dev)
    _check_cancel(ctx)
    _mark_revealed(ctx, g)
    audit = _audit(ctx)
    curve = []
    for t in range(1, tr.iterations + 1):
        _check_cancel(ctx)
        contrib = proto.local_contribution(theta, X, y).to("cpu", torch.float64)
        theta, noisy = proto.round(agg, theta.to("cpu", torch.float64), contrib, [rank])
        audit.release(ctx.job_id, what="noisy weighted sum of clipped gradients", value=noisy, round=t,
                      rounds=tr.iterations)
        theta = theta.to(dev)
        if t % PROGRESS_EVERY == 0 or t == tr.iterations:
            eps_t = g.epsilon if t == tr.iterations else (
                guarantee(plan_noise(noise, proto.p, sizes.m), t, pv.delta, acc).epsilon)
            curve.append(_point(t, eps_t, proto, theta, ds, test, spec.model.lam))
            ctx.emit({"phase": "training", "round": t, "rounds": tr.iterations, "epsilon_spent": eps_t})
    note = (f"gradient perturbation: T = {tr.iterations} full-batch rounds, clip C = {proto.clip:g}; accountant "
            f"{acc!r} (the job asked for {pv.accountant!r}; the discrete Gaussian is accounted by its "
            "Rényi divergence)")
    return proto, g, theta.cpu(), curve, note


def _write_results(ctx: WorkerContext, theta: Any, report: Any, metrics: dict[str, Any], curve: list,
                   own: dict[str, Any]) -> None:
    """The served results (model, report, public metrics, curve) and, in ``.private/`` (a dot
    directory the daemon never serves), the metrics on this party's own rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from safetensors.torch import save_file

    d = ctx.job_dir
    d.mkdir(parents=True, exist_ok=True)
    save_file({"theta": theta.detach().to("cpu").contiguous()}, str(d / "model.safetensors"),
              metadata={"job_id": ctx.job_id, "job_digest": ctx.job.spec_digest(), "loss": ctx.job.spec.model.name})
    (d / "privacy_report.json").write_text(report.to_json(indent=2))
    (d / "metrics.json").write_text(json.dumps(metrics, indent=2, default=float))
    private = d / ".private"
    private.mkdir(mode=0o700, exist_ok=True)
    (private / "own_rows.json").write_text(json.dumps(own, indent=2, default=float))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [c["round"] for c in curve]
    has_test = all("test" in c for c in curve)
    ys = [c["test"]["objective"] if has_test else c["epsilon_spent"] for c in curve]
    ax.plot(xs, ys, marker="o" if len(xs) < 3 else None)
    ax.set_xlabel("round")
    ax.set_ylabel("objective on the public test set" if has_test else "ε spent")
    ax.set_title(f"{ctx.job.job.name}: {ctx.job.spec.method} perturbation, ε = {report.epsilon:.3g}")
    fig.tight_layout()
    fig.savefig(d / "training_curve.png", dpi=100)
    plt.close(fig)


def run_party_job(ctx: WorkerContext) -> dict[str, Any]:
    """The worker process's main for a party. Raises on any failure (the daemon records it)."""
    import torch

    from mpc_erm.mpc.aggregator import MpcAggregator, ZeroNoise
    from mpc_erm.mpc.communicator import uninit_crypten
    from mpc_erm.mpc.noise import InMpcNoise
    from mpc_erm.protocols.common import PartySizes

    if getattr(ctx.config, "threads", None):
        torch.set_num_threads(ctx.config.threads)
    tic = time.perf_counter()
    ctx.emit({"phase": "loading", "message": f"dataset {ctx.job.job.dataset!r}"})
    ds, test = _load_rows(ctx)
    dev = _device(ctx)
    server, comm = _join(ctx)
    ok = False
    try:
        _trust_setup(ctx, comm)
        sizes = PartySizes.of(_agree(ctx, comm, ds))
        rank = comm.get_rank()
        no_noise = _test_no_noise(ctx)
        src = InMpcNoise()
        agg = MpcAggregator(ZeroNoise() if no_noise else src, allow_test_only=no_noise)
        ctx.emit({"phase": "agreed", "message": f"n = {sizes.n} rows over {sizes.m} parties; {agg.trust_model}"})
        run = _output_job if ctx.job.spec.method == "output" else _gradient_job
        proto, g, theta, curve, note = run(ctx, agg, src, ds, test, sizes, rank, dev)
        report = _report(ctx, proto, g, proto.noise.mechanism, agg.trust_model, sizes, note)
        lam = ctx.job.spec.model.lam
        own = {"train_own_rows": _metrics(proto.loss, theta, ds, lam),
               "curve": [{"round": c["round"], **c["own"]} for c in curve]}
        metrics: dict[str, Any] = {
            "wall_seconds": time.perf_counter() - tic,
            "mpc": agg.describe(), "noise": src.stats(),
            "curve": [{k: v for k, v in c.items() if k != "own"} for c in curve],
        }
        if test is not None:
            metrics["test"] = _metrics(proto.loss, theta, test, lam)
        summary = {"epsilon": report.epsilon, "delta": report.delta_total, "metrics": {"wall_seconds": metrics[
                   "wall_seconds"]} | ({"test": metrics["test"]} if test is not None else {})}
        _write_results(ctx, theta, report, metrics, curve, own)
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
    from mpc_erm.mpc.dealer import stop_dealer_client
    from mpc_erm.mpc.transport import TransportError

    try:
        stop_dealer_client(send_terminate=ok)
    except TransportError as exc:
        if not ok:
            raise
        log.warning("job %s: results written, but the dealer could not be told the job is over: %s", ctx.job_id,
                    " ".join(str(exc).split())[:500])


def run_dealer_job(ctx: WorkerContext) -> dict[str, Any]:
    """The worker process's main for the dealer: serve triples for this job, then exit."""
    import torch

    from mpc_erm.mpc.dealer import run_dealer
    from mpc_erm.mpc.transport import TransportOptions

    if getattr(ctx.config, "threads", None):
        torch.set_num_threads(ctx.config.threads)
    server, table = _join(ctx)
    try:
        ctx.emit({"phase": "dealing", "message": "serving triples"})
        rep = run_dealer(table, ctx.identity, server=server, options=TransportOptions(deadline_s=_peer_timeout(ctx)),
                         idle_timeout_s=_peer_timeout(ctx) * 5)
        if rep.ended_by != "terminate":
            # Party 0 sends "terminate" only once its job has succeeded; anything else (a party
            # crashed or failed, no request for too long) means the job failed, and the dealer's
            # job table must not say "succeeded" for a job whose parties failed.
            raise DealerJobAborted(f"the parties did not finish the job ({rep.requests} requests served): "
                                   f"{rep.ended_by or 'the dealer loop ended without terminate'}")
        return {"requests": rep.requests, "elements": rep.elements_served, "ended_by": rep.ended_by}
    finally:
        server.stop(1.0)
