"""A compute party's job with data owners (docs/explanation/architecture.md §2): the job's run with no rows of
its own, whose aggregator is this party's owner intake — the agreed owners' shares summed, the
in-MPC noise added, the sum revealed and published to the owners. No ledger spend here: each
owner charges its own ledger for its data."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mpc_erm.mpc.aggregator import PRECISION_BITS, MpcAggregator
from mpc_erm.mpc.callers import CallerPolicy
from mpc_erm.mpc.communicator import GrpcCommunicator
from mpc_erm.mpc.local_noise import DistributedNoise
from mpc_erm.mpc.noise import InMpcNoise, Realisation
from mpc_erm.mpc.validation import bound_units
from mpc_erm.mpc.verified_aggregator import VerifiedAggregator
from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.runs import FederatedRun, RunResult, run_for
from parties.owner.intake import OwnerIntake, RoundFrame, intake_threads
from parties.owner.rounds import IntakeAggregator
from parties.owner.sample import pack_owner_bits, uniform_sample_shares
from parties.owner.shares import UNCHECKED_ENV, contributions_checked, owner_margin_bits

from ..context import WorkerContext
from ..logs import os_error_line
from ..session import hosts
from ..spend import party_audit, party_guard, record_refused
from .release import StoredRelease, write_release

__all__ = ["FIRST_ROUND_FACTOR", "LAST_READ_WAIT_S", "OWNER_ROUND_DEADLINE_S", "ServedOwners", "serve_owners"]

log = logging.getLogger(__name__)


#: How long a compute party waits for the owners (unless the job sets round_deadline_s): each
#: round for those enrolled, and the first round FIRST_ROUND_FACTOR× as long for every listed
#: owner to enrol (owners start their clients when they choose).
OWNER_ROUND_DEADLINE_S = 30.0
FIRST_ROUND_FACTOR = 10.0
LAST_READ_WAIT_S = 30.0  # the longest a compute party keeps its intake up for the counted owners' last reads


@dataclass
class ServedOwners:
    """The run's result, the public counters of the owners' rounds, the model's trust statement."""

    result: RunResult
    counters: dict[str, object]
    trust_model: str


def serve_owners(ctx: WorkerContext, comm: GrpcCommunicator, agg: MpcAggregator | VerifiedAggregator,
                 pool: InMpcNoise | DistributedNoise,
                 plan: PrivacyPlan, real: Realisation | None, callers: CallerPolicy) -> ServedOwners:
    """Run the job's rounds with the owners' shares as the contributions (module docstring)."""
    spec, jt = ctx.job.spec, ctx.job.job
    noise = None if real is None else real.spec
    run = run_for(spec, plan, None, features=int(jt.features or 0), noise=noise, pool=None if real is None else pool,
                  owners=len(jt.owners))
    grid = PRECISION_BITS if noise is None else int(pool.precision_bits(noise, run.p))
    drawn: tuple[bytes, ...] = ()
    if isinstance(run, FederatedRun) and run.fed.config.uniform:  # each round's owners: a secret shuffle
        ctx.emit({"phase": "owners", "message": f"drawing {run.fed.config.sample_size} of {len(jt.owners)} owners "
                                                f"for each of {run.rounds} rounds (secret shuffle)"})
        share = uniform_sample_shares(comm, len(jt.owners), run.fed.config.sample_size, run.rounds)
        drawn = () if share is None else pack_owner_bits(share)
    verified = isinstance(agg, VerifiedAggregator)
    checked = contributions_checked()
    if verified and not checked:
        raise ValueError(f'job.security: "malicious" checks every owner\'s proof; this test build\'s '
                         f"{UNCHECKED_ENV} switches the checks off")
    bound = bound_units(plan.member_bound(), grid, run.p) if checked else None
    frame = RoundFrame(ctx.job_id, jt.owners, len(jt.parties), comm.get_rank(), grid,
                       owner_margin_bits(len(jt.owners)), run.p, ctx.job.spec_digest(), sample_shares=drawn,
                       bound_units=bound, replicated=jt.trust == "replicated", verified=verified)
    listen_host, adv_host = hosts(ctx)
    intake = OwnerIntake(ctx.identity, frame, bind=f"{listen_host}:0", callers=callers,
                         max_workers=intake_threads(len(jt.owners), len(jt.parties))).start()
    try:
        ctx.publish_endpoint(f"{adv_host}:{intake.port}", service="owners")
        ctx.emit({"phase": "owners", "message": f"waiting for {len(jt.owners)} data owners to enrol"})
        deadline = jt.round_deadline_s or OWNER_ROUND_DEADLINE_S
        audit = party_audit(ctx)

        def refused_now(t: int, names: list[str]) -> None:
            try:
                record_refused(ctx, audit, t + 1, names, plan.member_bound(), "owners")
            except OSError as exc:  # the job goes on: the refusal is in the log, the events and the result
                log.error("job %s: the audit record of the refused contributions failed: %s", ctx.job_id,
                          os_error_line(exc))

        def extra() -> dict[str, float]:
            return {"owners": rounds.counted[-1], "owners_refused": sum(len(r) for r in rounds.refused)}

        with party_guard(ctx, plan, spends=False, extra=extra) as guard:
            rounds = IntakeAggregator(intake, comm, agg, deadline_s=deadline,
                                      first_wait_s=FIRST_ROUND_FACTOR * deadline,
                                      while_owners_compute=None if noise is None else lambda: pool.top_up(noise, run.p),
                                      check=guard.check, on_refused=refused_now)
            result = run.run(rounds, guard)
        if rounds.last is not None:  # served by the daemon once the intake has stopped (parties.owner.release)
            write_release(ctx.job_dir, StoredRelease(ctx.job_id, ctx.job.spec_digest(), len(rounds.counted) - 1,
                                                     rounds.last, rounds.roster, tuple(rounds.signatures)))
        unread = rounds.wait_last_read(LAST_READ_WAIT_S)  # a fixed 1 s left owners of a loaded 1,000 without it
        if unread:
            ctx.emit({"phase": "owners", "message": f"{len(unread)} counted owners did not read the last release "
                                                    f"from this party within {LAST_READ_WAIT_S:g} s"})
    finally:
        intake.stop()
    counters: dict[str, object] = {"owners_per_round": rounds.counted,
                                   "owners_refused": {str(t + 1): [jt.owners[o] for o in r]
                                                      for t, r in enumerate(rounds.refused) if r},
                                   "round_wait_seconds": rounds.wait_seconds,
                                   "round_mpc_seconds": rounds.mpc_seconds, "round_cpu_seconds": rounds.cpu_seconds}
    trust = (agg.trust_model if not isinstance(run, FederatedRun) else
             f"{jt.trust} among the compute parties {', '.join(jt.parties)}")
    trust += (f"; every owner's contribution proved within its public ℓ2 bound {plan.member_bound():.6g} on its "
              "replicated shares, each proof checked by openings from both holders of each share (one bit revealed "
              "each; a failing one left out)" if verified else
              f"; every owner's contribution checked on its shares against its public ℓ2 bound "
              f"{plan.member_bound():.6g} (one bit revealed each; a failing one left out)" if checked else
              "; CONTRIBUTIONS NOT CHECKED against their bounds (test build)")
    return ServedOwners(result, counters, trust)
