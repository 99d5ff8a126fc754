"""One typed run per job kind, behind one reveal guard.

A run is built from the job's :class:`~mpc_erm.privacy.plan.PrivacyPlan`, its spec, this member's
rows (or none: a compute party serving data owners) and the noise the engine realises; ``run``
takes a :class:`~mpc_erm.protocols.aggregation.SecureAggregator` and a :class:`RevealGuard` and
returns a :class:`RunResult`. The protocol's own round loop runs inside; the guard
(:mod:`mpc_erm.runs.guard`) is the one place where check, then reveal, then charge happens.

Hosts: a party daemon's job worker (``parties.worker``), a data owner's process (``parties.owner.process``),
and the simulator (:mod:`mpc_erm.simulate.forecast`) — the same classes, so a simulated run
predicts a daemon's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from mpc_erm.models.networks import NetworkBuilder
from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.protocols.aggregation import NoiseSpec
from mpc_erm.protocols.row_draws import RowDraws
from mpc_erm.spec import JobSpec

from .curve import CurvePoint, ModelFacts, ModelWriter, RunResult
from .federated import FederatedRun
from .guard import AuditTrail, ChargeFacts, ProgressSink, RevealGuard, SpendLedger
from .inputs import NoisePool, RunRows, concurrently
from .linear import PROGRESS_EVERY, GradientRun, OutputRun, TransferRun, linear_run_class
from .network import NetworkRun

__all__ = ["PROGRESS_EVERY", "AuditTrail", "ChargeFacts", "CurvePoint", "FederatedRun", "GradientRun", "JobRun",
           "ModelFacts", "ModelWriter", "NetworkRun", "NoisePool", "OutputRun", "ProgressSink", "RevealGuard",
           "RunResult", "RunRows", "SpendLedger", "TransferRun", "concurrently", "linear_run_class", "run_for"]

JobRun = OutputRun | TransferRun | GradientRun | NetworkRun | FederatedRun


def run_for(spec: JobSpec, plan: PrivacyPlan, rows: RunRows | None, *, features: int, weight: float = 1.0,
            noise: NoiseSpec | None = None, pool: NoisePool | None = None, device: torch.device | str = "cpu",
            builder: NetworkBuilder | None = None, owners: int | None = None,
            drawn: Callable[[int], Sequence[bool]] | None = None, draws: RowDraws | None = None) -> JobRun:
    """The run of ``spec``'s kind. ``rows`` None: this member hands in no row (a compute party
    whose aggregator collects the data owners' shares); ``owners``: the job's count of data owners
    when they hold the rows; ``weight``: this member's public weight (:meth:`PrivacyPlan.weight`)."""
    if spec.federated is not None:
        if owners is None:
            raise ValueError("federated: a DP-Fed job runs with data owners")
        return FederatedRun(spec, plan, rows, features=features, noise=noise, pool=pool, device=device,
                            owners=owners, drawn=drawn)
    if spec.model.is_network:
        if rows is None:
            raise ValueError("model.name: a network job with data owners needs a [federated] table")
        return NetworkRun(spec, plan, rows, noise=noise, pool=pool, device=device, builder=builder, draws=draws)
    if spec.transfer is not None and owners is not None:
        raise ValueError("transfer: knowledge transfer runs on parties holding their rows, not data owners")
    kind = linear_run_class(spec)
    return kind(spec, plan, rows, features=features, weight=weight, noise=noise, pool=pool, device=device,
                owners=owners)
