"""Pieces the protocols share: the parties' row counts as a caller knows them (the simulator; the
agreed counts under replace-one adjacency), the data-independent projection onto the unit ball,
a network's rows, and the report of a run in process. The job's plan and what it may use of the
counts are :func:`mpc_erm.privacy.plan.plan_job` and :class:`~mpc_erm.privacy.plan.PublicSizes`;
the model a spec names is :mod:`mpc_erm.models.job_model`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mpc_erm.data import Dataset
from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.privacy.report import SIMULATION_SAMPLER_NOTE, PrivacyReport
from mpc_erm.protocols.aggregation import NoiseSpec
from mpc_erm.spec import JobSpec


@dataclass(frozen=True)
class PartySizes:
    """Row counts n_j of the parties, as the caller knows them. What the plan may use of them is a
    :class:`~mpc_erm.privacy.plan.PublicSizes` (:func:`~mpc_erm.privacy.plan.public_sizes`): the
    counts themselves under replace-one adjacency, only n̂ under add/remove."""

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ValueError("sizes: at least one party is needed")
        bad = [s for s in self.sizes if int(s) != s or s < 1]
        if bad:
            raise ValueError(f"sizes: every party needs at least one row, got {bad[:5]}")

    @classmethod
    def of(cls, sizes: Sequence[int]) -> PartySizes:
        return cls(tuple(int(s) for s in sizes))

    @property
    def m(self) -> int:
        return len(self.sizes)

    @property
    def n(self) -> int:
        return sum(self.sizes)

    @property
    def n_min(self) -> int:
        return min(self.sizes)


def project_to_unit_ball(X: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Scale rows with ‖x‖ > 1 onto the sphere; return the rows and how many were moved.

    The privacy analysis assumes ‖x‖ ≤ 1. Projection is row-wise and data-independent, so each
    party can apply it to its own rows without weakening anything.
    """
    norms = X.norm(dim=-1, keepdim=True)
    outside = norms > 1.0
    moved = int(outside.sum())
    if moved == 0:
        return X, 0
    return torch.where(outside, X / norms, X), moved


def run_report(plan: PrivacyPlan | None, noise: NoiseSpec | None, trust_model: str, parties: PartySizes | None,
               parameters: dict[str, Any]) -> PrivacyReport:
    """The privacy report of a protocol run in process: the plan's report (the one a daemon
    writes, there with the engine's realisation of the noise), at the noise the run added.
    The ideal sampler's report says that its floating-point sampler is not bounded."""
    assert plan is not None and noise is not None
    ideal = plan.sampler == "ideal" and plan.mechanism != "none"
    return plan.report(noise_scale=noise.scale, realisation=None, trust_model=trust_model,
                       parties=None if parties is None else parties.m, parameters=parameters,
                       notes=(SIMULATION_SAMPLER_NOTE,) if ideal else ())


def network_rows(ds: Dataset, spec: JobSpec, dev: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """A data set's rows as the network's inputs (n, *input_shape) on ``dev`` and class indices
    0..K−1 (a federated softmax: rows of the data set's own width). The worker, the owner and
    the forecast all feed a network through this."""
    shape = tuple(spec.model.input_shape or (ds.X.shape[1],))
    X = np.asarray(ds.X, dtype=np.float32)
    if X.shape[1] != math.prod(shape):
        raise ValueError(f"model.input_shape: {list(shape)} takes {math.prod(shape)} values per row, the data set "
                         f"has {X.shape[1]} features")
    y = np.asarray(ds.y)
    if ds.task == "binary":
        y = (y > 0).astype(np.int64)  # {-1, +1} → {0, 1}: output 1 is the positive class
    return (torch.as_tensor(X, device=dev).reshape(X.shape[0], *shape),
            torch.as_tensor(y.astype(np.int64), device=dev))
