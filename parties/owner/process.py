"""A data owner's light process: its side of a job run by compute parties
(docs/explanation/architecture.md §2). No CrypTen and no daemon: ``mpc-erm owner join`` runs one job.

1. **Consent, checked here**: the job lists this owner; its data set is one of this owner's, with
   add/remove adjacency; ε within ``max_epsilon_per_job``; no test-only noise unless allowed.
2. **Plan**: the job's privacy plan (:func:`mpc_erm.privacy.plan.plan_job`, the one the
   compute parties make) and its reservation in this owner's own ledger: a budget that would be
   exceeded refuses the job before anything is sent.
3. **Rows**: loaded and clipped exactly as a party daemon loads its own (``parties.rows``).
4. **Enrol** at every compute party's owner intake (its address from that party's daemon,
   ``GetEndpoint`` with ``service = "owners"``, over mutual TLS): the frame they state must carry
   this job's digest.
5. **Rounds**: the job's run (:mod:`mpc_erm.runs`, the class the compute parties and the simulator
   run too), whose aggregator is :class:`~parties.owner.rounds.OwnerAggregator`, driven by this
   owner's :class:`~mpc_erm.runs.RevealGuard`: before each round the ledger marks it revealed and
   the audit log charges the job once; this owner's weighted contribution (clipped gradient sum,
   update or local minimiser) leaves only as additive shares; the released noisy sum comes back.
6. **Results** in ``state_dir/jobs/<job_id>/``: the public model, the privacy report; the ledger
   commits the rounds revealed. A failure before the first round releases the reservation. A
   run that died (its run lock gone with its process) is settled the same way at the next
   ``owner join`` (:func:`settle_abandoned`).

An owner slow to read the last release after the compute parties closed their intake reads it
from their daemons instead (``GetOwnerRelease``: :mod:`parties.owner.release`). With ``leave``
(``owner join --leave``, one-release jobs only) an owner sends its shares, commits its charge,
writes its privacy report and leaves; ``owner fetch`` (:func:`fetch_owner_model`) later reads the
release from the daemons and writes the model.
"""

from __future__ import annotations

import fcntl
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import grpc
import torch

from mpc_erm.jobs.jobfile import JobFile
from mpc_erm.mpc import tls
from mpc_erm.mpc.noise import Realisation, realise
from mpc_erm.mpc.party_api import party_pb2 as pb
from mpc_erm.mpc.party_api import party_pb2_grpc as pb_grpc
from mpc_erm.mpc.pki import Identity
from mpc_erm.privacy.plan import PrivacyPlan, plan_job, public_sizes
from mpc_erm.privacy.report import PrivacyReport
from mpc_erm.runs import ChargeFacts, FederatedRun, ModelFacts, OutputRun, RevealGuard, RunResult, run_for
from parties.owner.intake import OwnerClient, on_trouble, pauses, state_from_bytes
from parties.owner.rounds import LeftAfterSending, OwnerAggregator
from parties.owner.shares import explicit_party

from ..audit import AuditLog
from ..config import OwnerConfig
from ..ledger import Ledger, LedgerError
from ..rendezvous import grpc_options
from ..rows import Rows, device_for, load_rows
from .attest import Roster, check_release, uncounted
from .failures import JobEnded, JobWatch, PartiesUnreachable, denied, owner_failure

__all__ = ["OwnerRefused", "check_job", "fetch_owner_model", "fetch_release", "intake_addresses", "job_watch",
           "run_owner_job", "settle_abandoned"]

ENDPOINT_POLL_S, ENDPOINT_POLL_MAX_S = 1.0, 5.0  # an owner asks a daemon for its intake again, pausing longer


class OwnerRefused(ValueError):
    """This owner does not run the job; the message names the field (nothing was sent)."""


@dataclass(frozen=True)
class _OwnerView:
    """What the party worker's row loader reads: the config's data sets, the job, the identity."""
    config: OwnerConfig
    job: JobFile
    identity: Identity
    job_id: str


def check_job(cfg: OwnerConfig, job: JobFile) -> int:
    """This owner's index in the job's owner list, or :class:`OwnerRefused` naming the field."""
    jt, name = job.job, cfg.identity.name
    if name not in jt.owners:
        raise OwnerRefused(f"job.owners: this owner ({name}) is not one of the job's {len(jt.owners)} owners")
    if jt.dataset not in cfg.datasets:
        raise OwnerRefused(f"job.dataset: {name} offers no dataset {jt.dataset!r}")
    missing = [p for p in jt.parties if p not in cfg.compute]
    if missing:
        raise OwnerRefused(f"job.parties: {name}'s config has no address for compute part"
                           f"{'ies' if len(missing) > 1 else 'y'} {', '.join(missing)} (compute)")
    eps = job.spec.privacy.epsilon
    if eps > cfg.max_epsilon_per_job:
        raise OwnerRefused(f"privacy.epsilon: {eps:g} exceeds {name}'s max_epsilon_per_job "
                           f"({cfg.max_epsilon_per_job:g})")
    if jt.test_no_noise and not cfg.allow_test_only:
        raise OwnerRefused(f"job.test_no_noise: a zero-noise (test-only) job is refused by {name} "
                           "(allow_test_only = false)")
    return jt.owners.index(name)


def intake_addresses(identity: Identity, cfg: OwnerConfig, job: JobFile, job_id: str, wait_s: float,
                     watch: JobWatch | None = None) -> list[tuple[str, str]]:
    """(name, owner-intake address) of each compute party in rank order, asked of its daemon;
    waits up to ``wait_s`` for each to publish (the job may still be admitted or queued there),
    asking ``watch`` between tries whether the job ended meanwhile."""
    out = []
    end = time.monotonic() + wait_s
    pause = pauses(ENDPOINT_POLL_S, ENDPOINT_POLL_MAX_S)
    trouble = on_trouble(watch.check if watch is not None else lambda: None)
    for name in job.job.parties:
        with tls.secure_channel(cfg.compute[name], identity, f"party/{name}", grpc_options()) as ch:
            stub = pb_grpc.PartyControlStub(ch)
            while True:
                left = end - time.monotonic()
                try:
                    r = stub.GetEndpoint(pb.EndpointRequest(job_id=job_id, member=name, wait_s=min(max(left, 0), 30),
                                                            service="owners"), timeout=min(max(left, 0), 30) + 10)
                    out.append((name, r.address))
                    break
                except grpc.RpcError as exc:  # a deadline too: thousands of owners asking queue at its daemon
                    code, details = exc.code(), exc.details() or ""
                    if (refused := denied(name, identity.name, code, details)) is not None:
                        raise refused from None
                    if code not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE,
                                    grpc.StatusCode.DEADLINE_EXCEEDED):
                        raise JobEnded(f"compute party {name}: {details}") from None
                    if left <= 0:
                        raise PartiesUnreachable(f"job {job_id}: compute party {name} did not start the job within "
                                                 f"{wait_s:g} s (--wait): {code.name}: {details}") from None
                    trouble(code)  # a daemon gone: has the job ended at the others? (not yet admitted: rarely)
                    time.sleep(next(pause))  # the daemon answers an owner within 1 s
    return out


def fetch_release(identity: Identity, cfg: OwnerConfig, job: JobFile, job_id: str, owner_index: int, t: int,
                  wait_s: float, watch: JobWatch | None = None, *,
                  keys: Sequence[bytes]) -> tuple[torch.Tensor, Roster]:
    """Round ``t``'s release of ``job_id`` and its signed roster, as the compute parties' daemons
    keep them once their intake stopped (``GetOwnerRelease``): asked of the party this owner reads from
    first, then of the others, waiting up to ``wait_s`` while none keeps it yet. Between passes
    ``watch`` (default: one for this job) ends the wait once the job has ended without it
    (:class:`JobEnded`) or the compute parties are lost (:class:`PartiesUnreachable`). ``keys``:
    the compute parties' release keys (stated at enrolment); a release without every party's
    signature raises :class:`~.attest.UnsignedRelease`."""
    if len(keys) != len(job.job.parties):
        raise ValueError(f"keys: one release key per compute party ({len(job.job.parties)}), got {len(keys)}")
    names = list(job.job.parties)
    first = explicit_party(owner_index, len(names))
    watch = watch or job_watch(identity, cfg, job, job_id)
    digest, end, pause, why = job.spec_digest(), time.monotonic() + wait_s, pauses(ENDPOINT_POLL_S,
                                                                                    ENDPOINT_POLL_MAX_S), ""
    trouble = on_trouble(lambda: watch.check(now=True))  # raises once no compute party can serve it any more
    while True:
        ended = lost = 0  # compute parties where the job ended without a release they can serve; unreachable
        for name in names[first:] + names[:first]:
            try:
                with tls.secure_channel(cfg.compute[name], identity, f"party/{name}", grpc_options()) as ch:
                    r = pb_grpc.PartyControlStub(ch).GetOwnerRelease(pb.OwnerReleaseRequest(job_id=job_id, round=t),
                                                                     timeout=30)
            except grpc.RpcError as exc:
                code = exc.code()
                if (refused := denied(name, identity.name, code, exc.details() or "")) is not None:
                    raise refused from None
                ended += code == grpc.StatusCode.FAILED_PRECONDITION
                lost += code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                why = f"{name}: {exc.details()}"
                continue
            if r.spec_digest != digest:
                raise JobEnded(f"compute party {name} keeps the release of another job under {job_id} (digest "
                               f"{r.spec_digest[:12]}… vs this owner's {digest[:12]}…)")
            state, roster = state_from_bytes(r.state, r.shape), Roster(bytes(r.counted), bytes(r.refused_owners))
            check_release(keys, names, job_id, t, state, int(r.owners_counted), roster, list(r.signatures),
                          f"kept at {name}")
            return state, roster
        if ended == len(names):
            raise JobEnded(f"job {job_id}: no compute party serves round {t}'s release, and the job has ended at each "
                           f"(last answer: {why})")
        trouble(grpc.StatusCode.UNAVAILABLE if lost else grpc.StatusCode.NOT_FOUND)
        if time.monotonic() >= end:
            raise PartiesUnreachable(f"job {job_id}: no compute party kept round {t}'s release within {wait_s:g} s "
                                     f"(--wait; last answer: {why})")
        time.sleep(min(next(pause), max(0.0, end - time.monotonic())))


def job_watch(identity: Identity, cfg: OwnerConfig, job: JobFile, job_id: str) -> JobWatch:
    """The watch an owner in trouble asks whether ``job_id`` ended (:mod:`parties.owner.failures`)."""
    return JobWatch(identity, [(n, cfg.compute[n]) for n in job.job.parties], job_id,
                    peer_timeout_s=cfg.peer_timeout_s)


def _job_lock(state_dir: Path, job_id: str, *, wait: bool) -> TextIO | None:
    """The job's run lock (``state_dir/jobs/<id>/.running``, flock) while an ``owner join`` runs
    it, or None if another holds it and ``wait`` is False. The OS drops it when the process dies."""
    d = Path(state_dir) / "jobs" / job_id
    d.mkdir(parents=True, exist_ok=True)
    f = open(d / ".running", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        f.close()
        return None
    return f


def settle_abandoned(cfg: OwnerConfig, ledger: Ledger) -> dict[str, str]:
    """Settle what an ``owner join`` that died (killed, power lost) left open in this owner's
    ledger, as a daemon's restart does: a job that revealed a round stays charged the rounds it
    marked (committed); one that revealed nothing is released. Jobs another live ``owner join``
    runs (its run lock held) are left alone. Returns {job_id: "committed" | "released"}."""
    out: dict[str, str] = {}
    for r in ledger.open_reservations():
        lock = _job_lock(Path(cfg.state_dir), r.job_id, wait=False)
        if lock is None:
            continue  # running now, in another process
        try:
            if r.revealed:
                ledger.commit(r.job_id)
                out[r.job_id] = "committed"
            else:
                ledger.release(r.job_id, "owner join ended before the first round (process died)")
                out[r.job_id] = "released"
        finally:
            lock.close()
    return out


def _prepare(cfg: OwnerConfig, job: JobFile, job_id: str) -> tuple[Identity, PrivacyPlan, _OwnerView, Rows,
                                                                   Realisation | None]:
    """What ``owner join`` and ``owner fetch`` both start from: this owner's identity, the job's
    privacy plan (the one the compute parties make), the rows' view and the rows loaded (refused
    unless they have the job's feature count), and the plan's noise as the MPC realises it (None
    for a zero-noise test job)."""
    jt, spec = job.job, job.spec
    identity = cfg.identity.load("owner")
    plan = plan_job(spec, sampler="mpc", test_no_noise=jt.test_no_noise, sizes=public_sizes(spec, None),
                    n_features=jt.features, noise_split=job.noise_split())
    view = _OwnerView(cfg, job, identity, job_id)
    loaded = load_rows(view)  # type: ignore[arg-type]
    if loaded.train.d != jt.features:
        raise OwnerRefused(f"job.features: the job says {jt.features}, {cfg.identity.name}'s data set "
                           f"{jt.dataset!r} has {loaded.train.d}")
    real = None if jt.test_no_noise else _realise(job, plan)
    return identity, plan, view, loaded, real


def _realise(job: JobFile, plan: PrivacyPlan) -> Realisation:
    """The noise's grid as the compute parties realise it: the default one, or, in the
    malicious-secure mode, the finest on which every party's and owner's proof fits."""
    if job.job.security == "malicious":
        from mpc_erm.mpc.local_noise import DistributedNoise
        from mpc_erm.mpc.verified_grid import party_bounds, realise_verified

        return realise_verified(plan, DistributedNoise(), party_bounds(plan, len(job.job.parties), owners=True),
                                plan.member_bound())
    return realise(plan, len(job.job.parties))


def run_owner_job(cfg: OwnerConfig, job: JobFile, job_id: str, *, wait_s: float = 600.0,
                  on_round: Callable[[int, str, int], None] | None = None, leave: bool = False) -> dict[str, object]:
    """Run this owner's side of ``job`` (see the module); returns the summary it writes. With
    ``leave`` (a one-release job only) return once the shares are sent, without the model."""
    index = check_job(cfg, job)
    jt, spec = job.job, job.spec
    if leave and not _one_release(job):
        raise OwnerRefused(f"--leave: only a job with one release (method = \"output\") can be left once the shares "
                           f"are sent; this one ({spec.method}{', federated' if spec.federated else ''}) releases "
                           f"{spec.training.iterations} rounds")
    identity, plan, view, loaded, real = _prepare(cfg, job, job_id)
    rows = loaded.train
    rounds: OwnerAggregator | None = None
    run = run_for(spec, plan, loaded, features=rows.d, weight=plan.weight(index, int(rows.n)),
                  noise=None if real is None else real.spec, device=device_for(view),  # type: ignore[arg-type]
                  owners=len(jt.owners), drawn=lambda T: rounds.client.drawn(T) if rounds is not None else [])
    if isinstance(run, OutputRun):  # solved before this owner reserves or enrols: the round does not wait on it
        run.solve_locally()
    digest = job.spec_digest()
    budgets = {k: (d.epsilon, d.delta, d.adjacency) for k, d in cfg.datasets.items()}
    ledger = Ledger.in_state_dir(cfg.state_dir, budgets)
    audit = AuditLog.in_state_dir(cfg.state_dir)
    left: LeftAfterSending | None = None
    result: RunResult | None = None
    running = _job_lock(Path(cfg.state_dir), job_id, wait=False)
    if running is None:
        ledger.close()
        raise OwnerRefused(f"job_id: {job_id} is already running at {cfg.identity.name} (another owner join)")
    watch = job_watch(identity, cfg, job, job_id)
    guard = RevealGuard(plan, ChargeFacts(job_id, jt.dataset, spec.privacy.epsilon, spec.privacy.delta, digest),
                        ledger=ledger, audit=audit)
    try:
        settled = settle_abandoned(cfg, ledger)
        try:
            ledger.reserve(job_id, jt.dataset, spec.privacy.epsilon, spec.privacy.delta, digest, plan.event)
        except LedgerError as exc:
            raise OwnerRefused(f"budget: {cfg.identity.name}'s ledger refuses job {job_id}: {exc}") from None
        try:
            client = OwnerClient(identity, job_id, index, intake_addresses(identity, cfg, job, job_id, wait_s, watch),
                                 check=watch.check, replicated=jt.trust == "replicated")
            try:
                client.enroll(timeout_s=wait_s, spec_digest=digest)
                rounds = OwnerAggregator(client, round_wait_s=wait_s, on_round=on_round,
                                         send_after_s=spec.federated.send_after_s if spec.federated else None,
                                         leave=leave, fetch_later=lambda t, w: fetch_release(
                                             identity, cfg, job, job_id, index, t, w, watch, keys=client.release_keys),
                                         bound=plan.member_bound())

                try:
                    result = run.run(rounds, guard)
                except LeftAfterSending as exc:
                    left = exc
            finally:
                client.close()
        except BaseException as exc:
            failure = owner_failure(exc, cfg.identity.name, watch) if isinstance(exc, Exception) else None
            charged = _settle_failed(ledger, job_id, plan, guard.charged, 0 if rounds is None else rounds.received,
                                     exc)
            if failure is None:
                raise
            failure.charged = charged
            raise failure from exc
        ledger.commit(job_id)
    except sqlite3.Error as exc:  # this owner's own ledger (a full disk): one line, its exit code
        raise owner_failure(exc, cfg.identity.name) or exc from exc
    finally:
        ledger.close()
        running.close()
    d = Path(cfg.state_dir) / "jobs" / job_id
    d.mkdir(parents=True, exist_ok=True)
    notes = ("this owner sent its shares and left before the release (owner join --leave); owner fetch writes the model"
             if left is not None else f"rounds this owner missed (late for the deadline): {rounds.missed or 'none'}",)
    report = _report(job, plan, real, run.parameters(), audit.head(), (*notes, run.note()))
    (d / "privacy_report.json").write_text(report.to_json(indent=2))
    summary = {"job_id": job_id, "owner": cfg.identity.name, "epsilon": report.epsilon, "delta": report.delta_total,
               "rounds": run.rounds, "settled_abandoned_jobs": settled}
    if left is not None:  # what `owner fetch` needs: that this owner sent shares in this job, which round
        summary |= {"status": "sent" if left.sent else "late", "round": left.round}
        (d / SENT_FILE).write_text(json.dumps({"job_id": job_id, "spec_digest": digest, "round": left.round,
                                               "sent": left.sent,  # and the keys that check the release later:
                                               "release_keys": [k.hex() for k in client.release_keys]}))
    else:
        assert result is not None and rounds is not None
        summary |= {"status": "done", "missed_rounds": rounds.missed,
                    "refused_rounds": [t + 1 for t in rounds.client.refused]}
        if isinstance(run, FederatedRun):
            # this owner's own file: the sample (and the rounds whose local epochs overran the fixed send
            # time, which the compute parties could then tell apart) never leaves it
            summary |= {"rounds_joined": len(run.joined), "joined_rounds": list(run.joined),
                        "rounds_sent_late": [t + 1 for t in rounds.overran]}
        result.write_model(d, _model_facts(job, job_id))
    (d / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    return summary


#: ``owner join --leave`` leaves it in the job's directory: this owner sent shares in the job, in which round.
SENT_FILE = "sent.json"


def _settle_failed(ledger: Ledger, job_id: str, plan: PrivacyPlan, revealed: bool, received: int,
                   exc: BaseException) -> str:
    """Settle the job in this owner's ledger after its run failed, as a daemon does: nothing
    revealed, the reservation released; else the rounds marked revealed are charged. Returns what
    was charged, and why, for the owner's last line. A round is marked before its shares leave,
    so a failure after sending charges that round too, released or not: the compute parties may
    have revealed it before the job ended there (conservative)."""
    if not revealed:
        ledger.release(job_id, f"failed before the first round: {type(exc).__name__}")
        return "nothing charged: no round was revealed"
    r = ledger.commit(job_id)
    marked = int(r.revealed_rounds or 0)
    eps = plan.guarantee(rounds=marked).epsilon
    text = f"charged ε = {eps:.4g} for {marked} round{'s' if marked != 1 else ''}"
    if marked > received:
        late = marked - received
        return (text + f" ({received} release{'s' if received != 1 else ''} reached this owner; "
                + (f"the last {late} rounds were" if late > 1 else "the last round was")
                + " sent and may have been revealed at the compute parties before the job ended: charged, to be "
                "safe)")
    return text + " (the rounds revealed before the job ended)"


def _one_release(job: JobFile) -> bool:
    return job.spec.method == "output" and job.spec.federated is None


def _trust(job: JobFile) -> str:
    jt = job.job
    if jt.security == "malicious":
        return (f"{jt.trust} among the compute parties {', '.join(jt.parties)}, malicious security with abort (any "
                "one may deviate); this owner's contribution leaves it only as replicated shares in F_p with a proof "
                "of its bound, checked by openings from both holders of each share")
    return (f"{jt.trust} among the compute parties {', '.join(jt.parties)}; this owner's contribution leaves it only "
            "as additive shares, one per compute party")


def _model_facts(job: JobFile, job_id: str) -> ModelFacts:
    return ModelFacts(job_id, job.spec_digest(), job.job.name, job.job.dataset, _trust(job), job.job.security)


def _report(job: JobFile, plan: PrivacyPlan, real: Realisation | None, parameters: dict[str, object],
            audit_head: str, notes: tuple[str, ...]) -> PrivacyReport:
    """This owner's privacy report of ``job`` (the plan's, with its run's parameters)."""
    return plan.report(noise_scale=0.0 if real is None else real.report_scale,
                       realisation=None if real is None else real.describe(), trust_model=_trust(job),
                       security=job.job.security,
                       parties=len(job.job.parties),
                       parameters={**parameters, "job_digest": job.spec_digest(), "owners": len(job.job.owners),
                                   "audit_head": audit_head},
                       notes=notes)


def fetch_owner_model(cfg: OwnerConfig, job: JobFile, job_id: str, *, wait_s: float = 600.0) -> dict[str, object]:
    """After ``owner join --leave``: read the job's release from the compute parties' daemons and
    write this owner's model beside its privacy report; returns the summary. Nothing is charged
    here (the join charged the release); a second fetch of a fetched job returns its summary."""
    index = check_job(cfg, job)
    spec, digest = job.spec, job.spec_digest()
    d = Path(cfg.state_dir) / "jobs" / job_id
    try:
        sent = json.loads((d / SENT_FILE).read_text())
    except (OSError, ValueError):
        sent = None
    if not isinstance(sent, dict) or sent.get("job_id") != job_id or sent.get("spec_digest") != digest:
        raise OwnerRefused(f"job_id: {cfg.identity.name} has not sent shares in job {job_id} with this job file "
                           "(owner join --leave first)")
    running = _job_lock(Path(cfg.state_dir), job_id, wait=False)
    if running is None:
        raise OwnerRefused(f"job_id: {job_id} is already running at {cfg.identity.name} (another owner join or fetch)")
    try:
        try:
            done = json.loads((d / "summary.json").read_text())
        except (OSError, ValueError):
            done = None
        if isinstance(done, dict) and done.get("status") == "done" and (d / "model.safetensors").exists():
            return done
        identity, plan, view, loaded, real = _prepare(cfg, job, job_id)
        run = OutputRun(spec, plan, loaded, features=loaded.train.d, weight=plan.weight(index, int(loaded.train.n)),
                        noise=None if real is None else real.spec, device=device_for(view),  # type: ignore[arg-type]
                        owners=len(job.job.owners))
        keys = [bytes.fromhex(k) for k in sent.get("release_keys", [])]
        if len(keys) != len(job.job.parties):
            raise OwnerRefused(f"job_id: {cfg.identity.name}'s record of job {job_id} holds no release keys (an older "
                               "mpc-erm sent its shares): its release cannot be checked")
        t = int(sent["round"])
        state, roster = fetch_release(identity, cfg, job, job_id, index, t, wait_s, keys=keys)
        parties = list(job.job.parties)
        uncounted(roster, index, bool(sent.get("sent")), parties[explicit_party(index, len(parties))], t)
        audit = AuditLog.in_state_dir(cfg.state_dir)
        audit.release(job_id, what=run.released, value=state, round=1, rounds=1)
        notes = ("this owner's contribution was refused by the compute parties' check (left out of the release)"
                 if roster.refuses(index) else
                 "this owner sent its shares and left before the release (owner join --leave); the release was "
                 "read from the compute parties' daemons" if sent.get("sent") else
                 "this owner's shares reached the compute parties after they closed the round: not counted",)
        report = _report(job, plan, real, run.parameters(), audit.head(), (*notes, run.note()))
        (d / "privacy_report.json").write_text(report.to_json(indent=2))
        run.writer(state)(d, _model_facts(job, job_id))
        summary = {"job_id": job_id, "owner": cfg.identity.name, "epsilon": report.epsilon,
                   "delta": report.delta_total, "rounds": 1, "status": "done", "left_after_sending": True,
                   "counted": roster.counts(index), "owners_counted": roster.count}
        (d / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
        return summary
    finally:
        running.close()
