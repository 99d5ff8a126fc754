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

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mpc_erm.mpc.callers import CallerPolicy

from .callers import caller_policy
from .context import JobCancelled, WorkerContext
from .jobs import write_result_manifest
from .public_errors import PublicError, storage_problem
from .rows import Rows, device_for, load_rows

log = logging.getLogger(__name__)

__all__ = ["AgreementError", "DealerJobAborted", "run_dealer_job", "run_party_job"]

PROGRESS_EVERY = 5  # rounds between progress events


def _peer_timeout(ctx: WorkerContext) -> float:
    """The daemon's ``peer_timeout_s``: every wait on a peer (a message, an endpoint look-up)."""
    return float(ctx.config.peer_timeout_s)


class AgreementError(PublicError):
    """The members do not hold the identical job or the same dataset schema: nothing was revealed.
    The message names only members, the data set id and digests (public, code AGREEMENT); a schema
    mismatch's columns are in ``detail``, which stays in this party's log."""

    def __init__(self, public: str, detail: str | None = None) -> None:
        super().__init__("AGREEMENT", public, f"{public}; {detail}" if detail else None)


class DealerJobAborted(RuntimeError):
    """The dealer's job ended without party 0's "terminate": a party went away or failed."""


# ------------------------------------------------------------------------------------ data


def _schema_digest(ds: Any) -> str:
    return hashlib.sha256(json.dumps([list(ds.feature_names), ds.task, ds.n_classes]).encode()).hexdigest()


def _rows_digest(ds: Any) -> str | None:
    """A public test set's digest (its rows, labels and column names): members that hold one must
    hold the same, so the curve every member publishes is one curve. None: no public test set."""
    if ds is None:
        return None
    import numpy as np

    h = hashlib.sha256(_schema_digest(ds).encode())
    h.update(np.ascontiguousarray(ds.X, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(ds.y, dtype=np.float64).tobytes())
    return h.hexdigest()


def _compare_public_tests(ctx: WorkerContext, everyone: list[dict[str, Any]]) -> None:
    """The public test sets are public among the members: two members holding different ones would
    publish two curves for one model, so the job is refused naming them (a member with none
    publishes no curve)."""
    held = [(e["name"], e.get("public_test")) for e in everyone if e.get("public_test")]
    if len({d for _, d in held}) > 1:
        shown = ", ".join(f"{n!r} {d[:12]}…" for n, d in held)
        raise AgreementError(f"public test set mismatch for {ctx.job.job.dataset!r}: {shown}; members that set "
                             "public_test must hold the same file (its rows, read through the schema); "
                             "nothing revealed")


def _column_digests(ds: Any, salt: str) -> list[str]:
    """One short digest per (position, feature name), salted with the job digest: enough for each
    party to find *which positions* differ, without any party sending its column names."""
    return [hashlib.sha256(json.dumps([salt, k, str(name)]).encode()).hexdigest()[:16]
            for k, name in enumerate(ds.feature_names)]


def _schema_difference(ds: Any, mine: list[str], theirs: list[str]) -> str:
    """For this party's log only: our columns whose name or position the other party does not share."""
    names = [str(n) for n in ds.feature_names]
    differ = [names[k] for k in range(len(mine)) if k >= len(theirs) or mine[k] != theirs[k]]
    out = f"we have {len(mine)} columns, they have {len(theirs)}"
    if differ:
        shown = ", ".join(repr(n) for n in differ[:20]) + (f" and {len(differ) - 20} more" if len(differ) > 20 else "")
        out += f"; our columns that differ: {shown}"
    else:
        out += f"; every column is the same: the task or class count differs (ours: {ds.task!r}, {ds.n_classes})"
    return out


def _compare_schemas(ctx: WorkerContext, mine: dict[str, Any], everyone: list[dict[str, Any]]) -> None:
    """Every member must hold the same data schema (by digest). Schemas are public among the
    members, so the refusal names the member and the columns whose public description differs."""
    ours = mine.get("data_schema")
    for e in everyone:
        theirs = e.get("data_schema")
        if (ours or {}).get("digest") == (theirs or {}).get("digest"):
            continue
        if ours is None or theirs is None:
            has, lacks = (e["name"], ctx.identity.name) if ours is None else (ctx.identity.name, e["name"])
            raise AgreementError(f"dataset schema mismatch: party {has!r} has a schema file for "
                                 f"{ctx.job.job.dataset!r}, party {lacks!r} has none; every member needs the "
                                 "same schema; nothing revealed")
        a, b = list(ours["lines"]), list(theirs["lines"])
        differ = [f"ours {x!r} vs {y!r}" for x, y in zip(a, b, strict=False) if x != y]
        differ += [f"only ours: {x!r}" for x in a[len(b):]] + [f"only theirs: {y!r}" for y in b[len(a):]]
        raise AgreementError(f"dataset schema mismatch: party {e['name']!r} holds schema "
                             f"{theirs['digest'][:12]}… for {ctx.job.job.dataset!r}, {ctx.identity.name!r} holds "
                             f"{ours['digest'][:12]}…: " + "; ".join(differ[:4]) + "; nothing revealed")


# ------------------------------------------------------------------------------------ session


def _members(ctx: WorkerContext) -> tuple[list[str], str | None]:
    return list(ctx.job.job.parties), ctx.job.job.dealer


def _hosts(ctx: WorkerContext) -> tuple[str, str]:
    """(host a worker's server binds, host its peers dial): the daemon's listen and advertise hosts."""
    return (str(ctx.config.listen).rsplit(":", 1)[0],
            str(ctx.config.advertise or ctx.config.listen).rsplit(":", 1)[0])


def _join(ctx: WorkerContext, callers: CallerPolicy) -> tuple[Any, Any]:
    """Transport server (its callers checked by ``callers``) + PartyTable + CrypTen session;
    returns (server, comm)."""
    from mpc_erm.mpc.communicator import init_crypten
    from mpc_erm.mpc.transport import Member, PartyTable, TransportOptions, TransportServer

    listen_host, adv_host = _hosts(ctx)
    server = TransportServer.configured(ctx.identity, f"{listen_host}:0", callers=callers,
                                        max_message_bytes=ctx.config.limits.transport_max_message_bytes)
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


def _agree(ctx: WorkerContext, comm: Any, rows: Rows | None) -> list[int] | None:
    """All-gather (digest, schema, public test set's digest, n) and refuse any mismatch; returns
    every party's row count (replace-one adjacency) or None (add/remove: counts stay private, n is
    not sent). ``rows``: None at a compute party for data owners (it holds none)."""
    ds, test, schema = (None, None, None) if rows is None else (rows.train, rows.test, rows.schema)
    digest = ctx.job.spec_digest()
    # under add/remove a count is a private statistic: it never leaves the party (privacy.plan)
    public_counts = ctx.job.spec.privacy.adjacency == "replace"
    mine = {"digest": digest, "schema": None if ds is None else _schema_digest(ds),  # None: compute for owners
            "n": int(ds.n) if public_counts else None, "name": ctx.identity.name,
            "columns": [] if ds is None else _column_digests(ds, digest), "public_test": _rows_digest(test)}
    if schema is not None:  # a schema is public among the members: its lines may be compared openly
        mine["data_schema"] = {"digest": schema.digest(), "lines": schema.describe_columns()}
    everyone = [comm.broadcast_obj(mine if r == comm.get_rank() else None, r) for r in range(comm.get_world_size())]
    names = [e["name"] for e in everyone]
    for e in everyone:
        if e["digest"] != mine["digest"]:
            raise AgreementError(f"job spec mismatch: party {e['name']!r} holds a different job (digest "
                                 f"{e['digest'][:12]}… vs ours {mine['digest'][:12]}…); nothing revealed")
    _compare_schemas(ctx, mine, everyone)
    _compare_public_tests(ctx, everyone)
    other = [e for e in everyone if e["schema"] != mine["schema"]]
    if other:  # the public reason names the parties; which columns differ stays in this party's log
        who = ", ".join(repr(e["name"]) for e in other)
        detail = "; ".join(f"vs {e['name']!r}: " + _schema_difference(ds, mine["columns"], list(e.get("columns") or []))
                           for e in other)
        raise AgreementError(f"dataset schema mismatch: part{'ies' if len(other) > 1 else 'y'} {who} "
                             f"{'have' if len(other) > 1 else 'has'} different features for {ctx.job.job.dataset!r} "
                             f"than {ctx.identity.name!r}; nothing revealed; each party's log names its own "
                             "differing columns", detail)
    if names != list(ctx.job.job.parties):
        raise AgreementError(f"party order {names} differs from the job's {list(ctx.job.job.parties)}")
    return [int(e["n"]) for e in everyone] if public_counts else None


# ------------------------------------------------------------------------------------ protocol


def _check_cancel(ctx: WorkerContext) -> None:
    if ctx.cancelled():
        raise JobCancelled("cancelled by the coordinator")


class _Spend:
    """Records a job's spend before each reveal, in this order: the ledger's count of revealed
    rounds (with the plan's event, which must be the one reserved), then — once — the audit
    log's charge. A party that cannot record a release raises here and does not reveal."""

    def __init__(self, ctx: WorkerContext, plan: Any) -> None:
        from .ledger import Ledger

        self.ctx, self.plan, self.charged = ctx, plan, False
        self.ledger = Ledger(ctx.ledger_path) if ctx.ledger_path is not None else None

    def before_round(self, t: int) -> None:
        if self.ledger is not None:
            try:
                self.ledger.mark_revealed(self.ctx.job_id, self.plan.event, rounds=t)
            except (OSError, sqlite3.OperationalError) as exc:  # one transaction: nothing of it was written
                raise _unrecorded(self.ctx, exc, f"round {t} in its ledger", f"round {t} was not revealed") from exc
        if not self.charged:
            job = self.ctx.job
            _audit(self.ctx).charge(self.ctx.job_id, dataset=job.job.dataset, epsilon=job.spec.privacy.epsilon,
                                    delta=job.spec.privacy.delta, spec_digest=job.spec_digest(),
                                    dp_event=self.plan.event.as_dict())
            self.charged = True

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()


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

    return _Recorded(ctx, AuditLog.in_state_dir(ctx.ledger_path.parent))


def _unrecorded(ctx: WorkerContext, exc: BaseException, what: str, then: str) -> PublicError:
    """This party could not write ``what`` (disk full, I/O error): a public STORAGE failure."""
    why = storage_problem(exc) or type(exc).__name__
    return PublicError("STORAGE", f"{ctx.identity.name} could not record {what} ({why}): {then}; see "
                                  f"{ctx.identity.name}'s log", f"{what}: {exc}")


class _Recorded:
    """The audit log, whose failed append (it leaves the log as it was: parties.audit) ends the job
    with a public STORAGE reason. The charge comes before the first reveal, so it fails with nothing
    revealed (the ledger, marked first, keeps that round as spent); a release record comes after its
    reveal, so the job stops there and the rounds revealed stay charged (the daemon commits them)."""

    def __init__(self, ctx: WorkerContext, log: Any) -> None:
        self.ctx, self.log = ctx, log

    def charge(self, job_id: str, **fields: Any) -> Any:
        try:
            return self.log.charge(job_id, **fields)
        except OSError as exc:
            raise _unrecorded(self.ctx, exc, "the job's charge in its audit log", "nothing was revealed; its "
                              "ledger keeps the round it marked just before as spent") from exc

    def release(self, job_id: str, *, round: int, rounds: int, **fields: Any) -> Any:
        try:
            return self.log.release(job_id, round=round, rounds=rounds, **fields)
        except OSError as exc:
            raise _unrecorded(self.ctx, exc, f"the release of round {round} of {rounds} in its audit log",
                              f"the job stops; the {round} round(s) revealed stay charged") from exc

    def head(self) -> str:
        return str(self.log.head())


AUDIT_RECORD_BYTES = 600  # a release record is ~450 bytes, a charge with its mechanism ~700
SQLITE_FRAME_BYTES = 4096 + 24  # one WAL frame: what a ledger mark or a job-table event adds
SPACE_MARGIN_BYTES = 1 << 20  # results (model, report, metrics, curve), log lines, SQLite checkpoints


def _check_room(ctx: WorkerContext) -> None:
    """Refuse the job, before anything is revealed or spent anywhere, when this party's state
    directory cannot hold what the job will write there: one audit record per round and the charge,
    a ledger mark per round (a WAL frame; the WAL stops growing at SQLite's 1000-frame checkpoint),
    a job-table event per ``PROGRESS_EVERY`` rounds, and a margin for the results."""
    if ctx.ledger_path is None:
        return
    spec = ctx.job.spec
    rounds = 1 if spec.method == "output" else int(spec.training.iterations)
    audit = (rounds + 2) * AUDIT_RECORD_BYTES
    need = (audit + (min(rounds, 1000) + 16) * SQLITE_FRAME_BYTES
            + (rounds // PROGRESS_EVERY + 16) * SQLITE_FRAME_BYTES + SPACE_MARGIN_BYTES)
    st = os.statvfs(ctx.ledger_path.parent)
    free = st.f_bavail * st.f_frsize
    if free < need:
        me = ctx.identity.name
        raise PublicError("STORAGE", f"the state directory of {me} has {free} bytes free; the job's audit records "
                                     f"need ~{audit} ({rounds} round(s)), ~{need} with the ledger's and job table's "
                                     f"pages and a {SPACE_MARGIN_BYTES >> 20} MiB margin; nothing was revealed: free "
                                     "space there and submit the job again")


def _test_no_noise(ctx: WorkerContext) -> bool:
    if not ctx.job.job.test_no_noise:
        return False
    if not ctx.config.policy.allow_test_only:
        raise PermissionError("job.test_no_noise: refused (this party's policy.allow_test_only is false)")
    return True


def _report(ctx: WorkerContext, plan: Any, real: Any, trust: str, note: str) -> Any:
    """The job's privacy report: the plan's, with the engine's realisation of its noise."""
    where = ("" if real is None else f"{'discrete Laplace' if plan.mechanism == 'laplace' else 'discrete Gaussian'} "
             f"noise sampled inside the MPC on the grid 2^-{real.plan.grid_bits}")
    return plan.report(noise_scale=0.0 if real is None else real.spec.scale,
                       realisation=None if real is None else real.describe(), trust_model=trust,
                       parties=len(ctx.job.job.parties),
                       parameters={"protocol": f"{plan.method}_perturbation", "loss": ctx.job.spec.model.name,
                                   "job_digest": ctx.job.spec_digest(), "audit_head": _audit(ctx).head()},
                       notes=tuple(x for x in (where, note) if x))


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


def _point(t: int, eps: float, proto: Any, theta: Any, rows: Rows, lam: float) -> dict[str, Any]:
    """One point of the training curve: public part (round, ε spent, test-set metrics) and, under
    ``own``, the private part (this party's training and validation rows)."""
    own = {"train": _metrics(proto.loss, theta, rows.train, lam)}
    if rows.validation is not None:
        own["validation"] = _metrics(proto.loss, theta, rows.validation, lam)
    point: dict[str, Any] = {"round": t, "epsilon_spent": eps, "own": own}
    if rows.test is not None:
        point["test"] = _metrics(proto.loss, theta, rows.test, lam)
    return point


def _progress(ctx: WorkerContext, point: dict[str, Any]) -> None:
    """Append a curve point, private part included, to the job's ``.private/progress.jsonl``: this
    party's operator follows training on its own rows (``mpc-erm party progress``) while nothing of
    it leaves the party."""
    private = ctx.job_dir / ".private"
    with contextlib.suppress(OSError):  # progress is a convenience: a full disk must not fail the job here
        private.mkdir(parents=True, mode=0o700, exist_ok=True)
        with open(private / "progress.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(point, default=float) + "\n")


def _output_job(ctx: WorkerContext, agg: Any, src: Any, rows: Rows, plan: Any, real: Any, weight: float,
                dev: Any) -> tuple:
    import torch

    from mpc_erm.protocols import OutputPerturbation

    spec, ds = ctx.job.spec, rows.train
    proto = OutputPerturbation(spec, None, ds.d, plan=plan, noise=None if real is None else real.spec)
    X = torch.as_tensor(np.array(ds.X), dtype=torch.float64, device=dev)
    y = torch.as_tensor(np.array(ds.y), device=dev)
    ctx.emit({"phase": "local", "message": "local solve and offline noise, concurrently"})
    # CrypTen stays in this thread
    local_theta = _concurrently(lambda: proto.local_model(X, y),
                                lambda: None if real is None else src.prepare(real.spec, proto.p, 1))
    _check_cancel(ctx)
    spend = _Spend(ctx, plan)
    try:
        spend.before_round(1)
    finally:
        spend.close()
    eps = plan.guarantee().epsilon
    ctx.emit({"phase": "reveal", "round": 1, "rounds": 1, "epsilon_spent": eps})
    theta = proto.release(agg, local_theta.reshape(1, -1).to("cpu", torch.float64),
                          torch.tensor([weight], dtype=torch.float64))
    _audit(ctx).release(ctx.job_id, what="noisy weighted average of the local models", value=theta, round=1,
                        rounds=1)
    curve = [_point(1, eps, proto, theta, rows, spec.model.lam)]
    _progress(ctx, curve[-1])
    how = "n_j/n̂ (each party its own count)" if plan.adjacency == "add_remove" else (
        "n_j/n" if plan.weighting == "pooled" else "1/m")
    return theta, curve, f"output perturbation: locally solved models averaged with weights {how}"


def _concurrently(work: Any, here: Any) -> Any:
    """``work()`` in a thread while ``here()`` runs in this one; ``work``'s result, or the first
    error (``here``'s first: the MPC's failures are the ones the job must report)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # re-raised in this thread
            box["error"] = exc

    th = threading.Thread(target=run, name="local-work")
    th.start()
    try:
        here()
    finally:
        th.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _with_next_noise(src: Any, real: Any, dim: int, gradient: Any) -> Any:
    """``gradient()``'s value; meanwhile the next round's noise is sampled in this thread (CrypTen
    stays here, every party at the same point) while the local gradient is computed in another."""
    if real is None:
        return gradient()
    return _concurrently(gradient, lambda: src.top_up(real.spec, dim))


def _gradient_job(ctx: WorkerContext, agg: Any, src: Any, rows: Rows, plan: Any, real: Any, weight: float,
                  dev: Any) -> tuple:
    import torch

    from mpc_erm.protocols import GradientPerturbation

    spec, ds = ctx.job.spec, rows.train
    tr = spec.training
    proto = GradientPerturbation(spec, None, ds.d, plan=plan, noise=None if real is None else real.spec)
    if real is not None:
        ctx.emit({"phase": "offline", "message": f"sampling {tr.iterations * proto.p} noise values inside the MPC, "
                                                 "streamed: one round ahead, while the local gradients are computed"})
        src.prepare(real.spec, proto.p, tr.iterations)
    X = torch.as_tensor(np.array(ds.X), dtype=torch.float64, device=dev)
    y = torch.as_tensor(np.array(ds.y), device=dev)
    w = torch.tensor([weight], dtype=torch.float64)
    audit = _audit(ctx)
    curve: list[dict[str, Any]] = []
    spend = _Spend(ctx, plan)

    def local_sum(theta: Any) -> tuple[Any, Any]:
        _check_cancel(ctx)
        return _with_next_noise(src, real, proto.p, lambda: proto.local_contribution(theta.to(dev), X, y).to(
            "cpu", torch.float64)), w

    def before_reveal(t: int) -> None:
        _check_cancel(ctx)
        spend.before_round(t)

    def after_round(t: int, theta: Any, noisy: Any) -> None:
        audit.release(ctx.job_id, what="noisy weighted sum of clipped gradients", value=noisy, round=t,
                      rounds=tr.iterations)
        if t % PROGRESS_EVERY == 0 or t == tr.iterations:
            eps_t = plan.guarantee(rounds=t).epsilon
            curve.append(_point(t, eps_t, proto, theta, rows, spec.model.lam))
            _progress(ctx, curve[-1])
            ctx.emit({"phase": "training", "round": t, "rounds": tr.iterations, "epsilon_spent": eps_t})

    try:
        theta = proto.train(agg, local_sum, before_reveal=before_reveal, after_round=after_round)
    finally:
        spend.close()
    note = (f"gradient perturbation: T = {tr.iterations} full-batch rounds, clip C = {proto.clip:g}; accountant "
            f"{plan.accountant!r}")
    return theta.cpu(), curve, note


@dataclass
class _Outcome:
    """What a job's training leaves for its results: the curve (public part, and ``own`` per point;
    its last point is the trained model's), the report's note, and the model: ``theta`` (a linear
    model) or ``write_model(dir)`` (a network's bundle)."""

    curve: list[dict[str, Any]]
    note: str
    theta: Any = None
    write_model: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


#: How long a compute party waits for the owners (unless the job sets round_deadline_s): each
#: round for those enrolled, and the first round FIRST_ROUND_FACTOR× as long for every listed
#: owner to enrol (owners start their clients when they choose).
OWNER_ROUND_DEADLINE_S = 30.0
FIRST_ROUND_FACTOR = 10.0
LAST_READ_WAIT_S = 30.0  # the longest a compute party keeps its intake up for the counted owners' last reads


def _owner_rounds_job(ctx: WorkerContext, comm: Any, agg: Any, src: Any, plan: Any, real: Any,
                      callers: CallerPolicy) -> _Outcome:
    """A compute party's job with data owners (docs/explanation/architecture.md §2): the protocol's own round
    loop (gradient, DP-Fed-LS, or output perturbation's one release), whose aggregate is this
    party's owner intake — the agreed owners' shares summed,
    the in-MPC noise added, the sum revealed and published to the owners. No rows here, so no
    ledger spend: each owner charges its own ledger for its data."""
    import torch

    from mpc_erm.mpc.aggregator import PRECISION_BITS
    from mpc_erm.mpc.owner_intake import OwnerIntake, RoundFrame, intake_threads
    from mpc_erm.mpc.owner_rounds import IntakeAggregator
    from mpc_erm.mpc.owner_shares import owner_margin_bits
    from mpc_erm.protocols import GradientPerturbation, OutputPerturbation
    from mpc_erm.protocols.fedls import DpFedLs, timing_statement

    from .owner_release import StoredRelease, write_release

    spec, jt = ctx.job.spec, ctx.job.job
    tr = spec.training
    noise = None if real is None else real.spec
    fed, output = spec.federated is not None, spec.method == "output"
    d = int(jt.features or 0)
    proto: Any = (DpFedLs.for_job(spec, plan, d, noise=noise) if fed else
                  OutputPerturbation(spec, None, d, plan=plan, noise=noise) if output else
                  GradientPerturbation(spec, None, d, plan=plan, noise=noise))
    releases = 1 if output else int(tr.iterations)
    grid = PRECISION_BITS if real is None else int(src.precision_bits(real.spec, proto.p))
    if real is not None:
        src.prepare(real.spec, proto.p, releases)
    drawn: tuple[bytes, ...] = ()
    if fed and proto.config.uniform:  # each round's owners: a secret shuffle among the compute parties
        from mpc_erm.mpc.owner_sample import pack_owner_bits, uniform_sample_shares

        ctx.emit({"phase": "owners", "message": f"drawing {proto.config.sample_size} of {len(jt.owners)} owners for "
                                                f"each of {releases} rounds (secret shuffle)"})
        share = uniform_sample_shares(comm, len(jt.owners), proto.config.sample_size, releases)
        drawn = () if share is None else pack_owner_bits(share)
    frame = RoundFrame(ctx.job_id, jt.owners, len(jt.parties), comm.get_rank(), grid,
                       owner_margin_bits(len(jt.owners)), proto.p, ctx.job.spec_digest(), sample_shares=drawn)
    listen_host, adv_host = _hosts(ctx)
    intake = OwnerIntake(ctx.identity, frame, bind=f"{listen_host}:0", callers=callers,
                         max_workers=intake_threads(len(jt.owners), len(jt.parties))).start()
    curve: list[dict[str, Any]] = []
    try:
        ctx.publish_endpoint(f"{adv_host}:{intake.port}", service="owners")
        ctx.emit({"phase": "owners", "message": f"waiting for {len(jt.owners)} data owners to enrol"})
        deadline = jt.round_deadline_s or OWNER_ROUND_DEADLINE_S
        rounds = IntakeAggregator(intake, comm, agg, deadline_s=deadline, first_wait_s=FIRST_ROUND_FACTOR * deadline,
                                  while_owners_compute=None if real is None else lambda: src.top_up(real.spec, proto.p),
                                  check=lambda: _check_cancel(ctx))

        def after_round(t: int, *_: Any) -> None:
            # no audit record here: this party's audit log pairs every release with a charge on its
            # own data (parties.ledger_check); the owners charge and log the releases of their data
            if t % PROGRESS_EVERY == 0 or t == releases:
                eps_t = plan.guarantee(rounds=t).epsilon
                curve.append({"round": t, "epsilon_spent": eps_t, "owners": rounds.counted[-1], "own": {}})
                ctx.emit({"phase": "training", "round": t, "rounds": releases, "epsilon_spent": eps_t,
                          "owners": rounds.counted[-1]})

        if output:  # one release: the owners' weighted local minimisers, summed, plus the noise
            _check_cancel(ctx)
            theta = proto.release(rounds, torch.zeros(0, proto.p, dtype=torch.float64),
                                  torch.zeros(0, dtype=torch.float64))
            after_round(1)
        elif fed:  # no owner here: every round hands in no row; the owners know whether they are drawn
            theta = proto.train(rounds, lambda _t, _o: None, lambda _t: [], after_round=after_round,
                                before_reveal=lambda _t: _check_cancel(ctx))
        else:
            empty = torch.zeros(0, proto.p, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
            theta = proto.train(rounds, lambda _theta: empty, before_reveal=lambda _t: _check_cancel(ctx),
                                after_round=after_round)
        if rounds.last is not None:  # served by the daemon once the intake has stopped (parties.owner_release)
            write_release(ctx.job_dir, StoredRelease(ctx.job_id, ctx.job.spec_digest(), len(rounds.counted) - 1,
                                                     rounds.last, rounds.counted[-1]))
        unread = rounds.wait_last_read(LAST_READ_WAIT_S)  # a fixed 1 s left owners of a loaded 1,000 without it
        if unread:
            ctx.emit({"phase": "owners", "message": f"{len(unread)} counted owners did not read the last release "
                                                    f"from this party within {LAST_READ_WAIT_S:g} s"})
    finally:
        intake.stop()
    rounds_extra = {"owners_per_round": rounds.counted, "round_wait_seconds": rounds.wait_seconds,
                    "round_mpc_seconds": rounds.mpc_seconds, "round_cpu_seconds": rounds.cpu_seconds}
    if fed:
        f = spec.federated
        drawn_how = (f"{proto.config.sample_size} of the {len(jt.owners)} owners are drawn each round without "
                     "replacement by a secret shuffle among the compute parties (each learns nothing of the sample; "
                     "each owner only its own bits)" if proto.config.uniform else
                     f"each owner joins w.p. τ = {tr.sampling_rate:g} by its own coin")
        note = (f"DP-Fed{'-LS' if tr.ls_sigma else ''} with {len(jt.owners)} data owners: T = {tr.iterations} rounds, "
                f"{drawn_how}; a drawn owner runs E = {f.local_epochs} local "
                f"epochs (b = {f.local_batch}, η_l = {f.local_lr:g}·{f.local_lr_decay:g}^t), its update projected "
                f"into the 𝓛 = {plan.clip:g} ball; each owner sends additive shares of its update (zero when not "
                f"sampled) to the {len(jt.parties)} compute parties; accountant {plan.accountant!r}; "
                + timing_statement(f.send_after_s))
        return _Outcome(curve, note, theta=theta.cpu(), extra=rounds_extra,
                        write_model=lambda d: proto.save(d, plan, trust_model=f"{jt.trust} among the compute "
                                                         f"parties {', '.join(jt.parties)}",
                                                         job={"job_id": ctx.job_id,
                                                              "spec_digest": ctx.job.spec_digest()}))
    if output:
        note = (f"output perturbation with {len(jt.owners)} data owners: each owner solves its λ = {spec.model.lam:g} "
                f"regularised ERM locally (certified), weights its minimiser by n_j/n̂ with its own count and the "
                f"public n̂ = {plan.public_n}, and sends additive shares of it to the {len(jt.parties)} compute "
                f"parties, which add the noise once; {plan.mechanism}, accountant {plan.accountant!r}")
        return _Outcome(curve, note, theta=theta.cpu(), extra=rounds_extra)
    note = (f"gradient perturbation with {len(jt.owners)} data owners: T = {tr.iterations} full-batch rounds, clip "
            f"C = {proto.clip:g}; each owner sends additive shares of its clipped gradient sum to the "
            f"{len(jt.parties)} compute parties; accountant {plan.accountant!r}")
    return _Outcome(curve, note, theta=theta.cpu(), extra=rounds_extra)


def _network_metrics(job: Any, X: Any, y: Any) -> dict[str, float]:
    import torch

    with torch.no_grad():
        job.model.eval()
        logits = torch.cat([job.model(X[i : i + 4096]) for i in range(0, X.shape[0], 4096)])
        job.model.train()
    return {"loss": float(torch.nn.functional.cross_entropy(logits, y)),
            "accuracy": float((logits.argmax(dim=-1) == y).double().mean())}


def _plugin_builder(ctx: WorkerContext) -> Any:
    """A plugin network's builder: this party's own installed code, after checking its source
    against the digest the job pins (mpc_erm.models.plugins); None for every other model."""
    spec = ctx.job.spec
    if spec.model.name != "plugin":
        return None
    from mpc_erm.models.plugins import load_builder

    from .config import plugin_entry_point

    return load_builder(plugin_entry_point(ctx.config, spec.model.plugin), str(spec.model.plugin_digest))


def _network_job(ctx: WorkerContext, comm: Any, agg: Any, src: Any, rows: Rows, plan: Any, real: Any, dev: Any,
                 builder: Any) -> _Outcome:
    """A network trained by DP-SGD / DP-Adam (mpc_erm.protocols.dpsgd): the same round loop as the
    simulator, this party's Poisson batches drawn from its own generator, the public step on a
    float64 CPU master copy (so every party keeps the same public model whatever its device)."""
    import secrets

    import torch

    from mpc_erm.models import model_digest
    from mpc_erm.protocols.common import network_rows
    from mpc_erm.protocols.dpsgd import DpSgd

    spec = ctx.job.spec
    tr = spec.training
    job = DpSgd(spec, plan=plan, noise=None if real is None else real.spec, device=dev, builder=builder)
    mine = model_digest(job.model)  # public: the agreed initial weights, not data
    first = comm.broadcast_obj(mine if comm.get_rank() == 0 else None, 0)
    if first != mine:
        raise ValueError(f"model: the initial {spec.model.name} built here differs from party 0's (digest "
                         f"{mine[:12]} vs {str(first)[:12]}): the parties' PyTorch builds disagree")
    ds = rows.train
    X, y = network_rows(ds, spec, dev)
    tX, ty = (None, None) if rows.test is None else network_rows(rows.test, spec, dev)
    vX, vy = (None, None) if rows.validation is None else network_rows(rows.validation, spec, dev)
    gen = torch.Generator().manual_seed(secrets.randbits(63))  # this party's batches: nobody else's to know
    if real is not None:
        ctx.emit({"phase": "offline", "message": f"sampling {tr.iterations * job.p} noise values inside the MPC, "
                                                 "streamed: one round ahead, while the local gradients are computed"})
        src.prepare(real.spec, job.p, tr.iterations)
    audit = _audit(ctx)
    spend = _Spend(ctx, plan)
    curve: list[dict[str, Any]] = []

    def local_sum(_model: Any) -> tuple[Any, Any]:
        _check_cancel(ctx)  # the batch size (second value of local_contribution) stays here
        return _with_next_noise(src, real, job.p, lambda: job.local_contribution(X, y, gen)[0]), None

    def before_reveal(t: int) -> None:
        _check_cancel(ctx)
        spend.before_round(t)

    epoch = max(1, round(1.0 / job.q)) if job.q < 1.0 else PROGRESS_EVERY  # rounds per expected pass

    def after_round(t: int, noisy: Any) -> None:
        audit.release(ctx.job_id, what="noisy sum of clipped per-example gradients of a Poisson batch", value=noisy,
                      round=t, rounds=tr.iterations)
        last = t == tr.iterations
        if t % PROGRESS_EVERY == 0 or last or t % epoch == 0:
            eps_t = plan.guarantee(rounds=t).epsilon
            ctx.emit({"phase": "training", "round": t, "rounds": tr.iterations, "epsilon_spent": eps_t,
                      "epoch": round(t * job.q, 3)})
        if t % epoch == 0 or last:  # the curve: once an epoch (a pass over this party's rows costs one)
            own = {"train": _network_metrics(job, X, y)}
            if vX is not None:
                own["validation"] = _network_metrics(job, vX, vy)
            point: dict[str, Any] = {"round": t, "epoch": t * job.q, "epsilon_spent": eps_t, "own": own}
            if tX is not None:
                point["test"] = _network_metrics(job, tX, ty)
            curve.append(point)
            _progress(ctx, point)

    try:
        job.train(agg, local_sum, before_reveal=before_reveal, after_round=after_round)
    finally:
        spend.close()
    note = (f"DP-{'Adam' if tr.optimizer == 'adam' else 'SGD'} of {spec.model.name} ({job.p} parameters): "
            f"T = {tr.iterations} rounds, Poisson rate q = {job.q:g} per party, clip C = {job.clip:g}, "
            f"Laplacian smoothing σ = {tr.ls_sigma:g} per parameter tensor; accountant {plan.accountant!r}")
    schema = rows.schema
    classes = (schema.label.class_names if schema is not None else
               ["negative", "positive"] if ds.task == "binary" else list(range(int(spec.model.n_classes))))
    return _Outcome(curve, note, extra={"parameters": job.p},
                    write_model=lambda d: job.save(d, classes=classes, feature_names=list(ds.feature_names) or None,
                                                   trust_model=agg.trust_model,
                                                   schema=None if schema is None else schema.to_dict()))


def _linear_writer(ctx: WorkerContext, theta: Any, rows: Rows, plan: Any, trust_model: str) -> Any:
    """Writes a linear model's bundle: weights, loss, classes, feature names, the data schema (so
    ``predict`` takes raw rows) and the plan's privacy statement."""
    from mpc_erm.models.bundle import save_linear_weights

    ds, schema = rows.train, rows.schema
    m = ctx.job.spec.model
    return lambda d: save_linear_weights(
        d, theta, job_id=ctx.job_id, job_digest=ctx.job.spec_digest(), loss=m.name, n_classes=m.n_classes,
        feature_names=[str(f) for f in ds.feature_names] or None,
        schema=None if schema is None else schema.to_dict(),
        privacy=plan.model_statement(plan.rounds, trust_model), job={"name": ctx.job.job.name,
                                                                      "dataset": ctx.job.job.dataset})


def _write_results(ctx: WorkerContext, theta: Any, report: Any, metrics: dict[str, Any], curve: list,
                   own: dict[str, Any], write_model: Any = None) -> None:
    """The served results (model, report, public metrics, curve) and, in ``.private/`` (a dot
    directory the daemon never serves), the metrics on this party's own rows. ``write_model(dir)``
    writes a network's bundle; a linear model is ``theta`` in model.safetensors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mpc_erm.models.bundle import save_linear_weights

    d = ctx.job_dir
    d.mkdir(parents=True, exist_ok=True)
    if write_model is not None:
        write_model(d)
    else:
        save_linear_weights(d, theta, job_id=ctx.job_id, job_digest=ctx.job.spec_digest(),
                            loss=ctx.job.spec.model.name)
    (d / "privacy_report.json").write_text(report.to_json(indent=2))
    (d / "metrics.json").write_text(json.dumps(metrics, indent=2, default=float))
    private = d / ".private"
    private.mkdir(mode=0o700, exist_ok=True)
    (private / "own_rows.json").write_text(json.dumps(own, indent=2, default=float))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [c["round"] for c in curve]
    has_test = all("test" in c for c in curve)
    key = "objective" if has_test and all("objective" in c["test"] for c in curve) else "accuracy"
    ys = [c["test"][key] if has_test else c["epsilon_spent"] for c in curve]
    ax.plot(xs, ys, marker="o" if len(xs) < 3 else None)
    ax.set_xlabel("round")
    ax.set_ylabel(f"{key} on the public test set" if has_test else "ε spent")
    ax.set_title(f"{ctx.job.job.name}: {ctx.job.spec.method} perturbation, ε = {report.epsilon:.3g}")
    fig.tight_layout()
    fig.savefig(d / "training_curve.png", dpi=100)
    plt.close(fig)


def run_party_job(ctx: WorkerContext) -> dict[str, Any]:
    """The worker process's main for a party. Raises on any failure (the daemon records it)."""
    import torch

    from mpc_erm.mpc.aggregator import MpcAggregator, ZeroNoise
    from mpc_erm.mpc.communicator import uninit_crypten
    from mpc_erm.mpc.noise import InMpcNoise, realise
    from mpc_erm.protocols.common import PartySizes, plan_job, public_sizes

    if ctx.config.threads:
        torch.set_num_threads(ctx.config.threads)
    tic = time.perf_counter()
    ctx.emit({"phase": "loading", "message": f"dataset {ctx.job.job.dataset!r}"})
    owners = bool(ctx.job.job.owners)  # a compute party for data owners holds no rows
    rows = None if owners else load_rows(ctx)
    ds = None if rows is None else rows.train
    builder = None if owners else _plugin_builder(ctx)  # before any peer is joined: refuse first
    dev = device_for(ctx)
    _check_room(ctx)  # disk full: refuse before any member spends ε (issue 14 item 1)
    callers = caller_policy(ctx.config, ctx.identity)  # this job's servers: the daemon's CRL, roles and rates
    server, comm = _join(ctx, callers)
    ok = False
    try:
        _trust_setup(ctx, comm)
        counts = _agree(ctx, comm, rows)
        rank = comm.get_rank()
        no_noise = _test_no_noise(ctx)
        spec = ctx.job.spec
        plan = plan_job(spec, sampler="mpc", test_no_noise=no_noise,
                        sizes=public_sizes(spec, None if counts is None else PartySizes.of(counts)),
                        n_features=ctx.job.job.features if ds is None else ds.d, builder=builder)
        real = None if no_noise else realise(plan, comm.get_world_size())
        # The MPC (noise, secure sum) runs on the CPU whatever the party's device: its correlated
        # randomness (CrypTen's shared generators, the dealer's per-party streams) is drawn by
        # torch generators whose CPU and CUDA streams differ for one seed, so parties on different
        # devices would draw different "common" values; and the sampler is bound by bytes, not
        # arithmetic (docs/how-to/gpu.md, "Why the MPC stays on the CPU": CUDA gains nothing there).
        src = InMpcNoise(device="cpu")
        agg = MpcAggregator(ZeroNoise() if no_noise else src, allow_test_only=no_noise)
        ctx.emit({"phase": "agreed", "message": (f"n = {sum(counts)} rows over {len(counts)} parties" if counts
                                                 else f"add/remove: normaliser n̂ = {plan.public_n}")
                  + f"; {agg.trust_model}"})
        if rows is None:
            out = _owner_rounds_job(ctx, comm, agg, src, plan, real, callers)
        elif spec.model.is_network:
            out = _network_job(ctx, comm, agg, src, rows, plan, real, dev, builder)
        else:
            run = _output_job if spec.method == "output" else _gradient_job
            theta, curve, note = run(ctx, agg, src, rows, plan, real, plan.weight(rank, int(ds.n)), dev)
            writer = _linear_writer(ctx, theta, rows, plan, agg.trust_model)
            out = _Outcome(curve, note, theta=theta, write_model=writer)
        report = _report(ctx, plan, real, agg.trust_model, out.note)
        final = out.curve[-1]  # the last round's point: the trained model's metrics
        own = {"train_own_rows": final["own"].get("train"), "validation_rows": final["own"].get("validation"),
               "curve": [{"round": c["round"], **c["own"]} for c in out.curve]}
        metrics: dict[str, Any] = {
            "wall_seconds": time.perf_counter() - tic,
            "mpc": agg.describe(), "noise": src.stats(), **out.extra,
            "curve": [{k: v for k, v in c.items() if k != "own"} for c in out.curve],
        }
        if "test" in final:
            metrics["test"] = final["test"]
        summary = {"epsilon": report.epsilon, "delta": report.delta_total, "metrics": {"wall_seconds": metrics[
                   "wall_seconds"]} | ({"test": metrics["test"]} if "test" in final else {})}
        _write_results(ctx, out.theta, report, metrics, out.curve, own, out.write_model)
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

    if ctx.config.threads:
        torch.set_num_threads(ctx.config.threads)
    server, table = _join(ctx, caller_policy(ctx.config, ctx.identity))
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
