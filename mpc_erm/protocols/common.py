"""Pieces both protocols share: public party sizes, the aggregation weights, the loss and its
Lipschitz constant, and the data-independent projection onto the unit ball."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mpc_erm.data import Dataset
from mpc_erm.models import Loss, NetworkSpec, build_network, get_loss, parameter_count
from mpc_erm.privacy.plan import PrivacyPlan, PublicSizes, Sampler
from mpc_erm.privacy.report import SIMULATION_SAMPLER_NOTE, PrivacyReport
from mpc_erm.protocols.aggregation import NoiseSpec
from mpc_erm.protocols.spec import JobSpec


@dataclass(frozen=True)
class PartySizes:
    """Row counts n_j of the parties: public (all parties learn them before a job starts)."""

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


def loss_for(spec: JobSpec) -> Loss:
    kw: dict[str, object] = {}
    if spec.model.name == "softmax":
        kw["n_classes"] = spec.model.n_classes
    if spec.model.name == "huber_svm":
        kw["h"] = spec.model.huber_h
    return get_loss(spec.model.name, **kw)


def lipschitz_for(loss: Loss, lam: float) -> float:
    """G on the region where the λ-regularised minimisers live.

    For globally Lipschitz losses the radius is ignored. Squared loss is not globally Lipschitz:
    J(θ*) ≤ J(0) ≤ ½ (|y| ≤ 1) gives ‖θ*‖ ≤ 1/√λ, so G = 1 + 1/√λ (models.ridge_lipschitz_for).
    """
    radius = 1.0 / math.sqrt(lam) if lam > 0 else None
    return loss.lipschitz(radius=radius)


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


def clip_for(spec: JobSpec) -> float:
    """The per-release contribution bound the plan needs: the gradient clip C (default: the loss's
    Lipschitz constant) or, for output perturbation, the loss's Lipschitz constant G."""
    if spec.method == "gradient" and spec.privacy.clip is not None:
        return float(spec.privacy.clip)  # networks always name it (JobSpec refuses them without)
    return lipschitz_for(loss_for(spec), spec.model.lam)


def network_spec(spec: JobSpec) -> NetworkSpec:
    """The :class:`~mpc_erm.models.NetworkSpec` a job's model section names."""
    m = spec.model
    if not m.is_network or m.input_shape is None or m.n_classes is None:
        raise ValueError(f"model.name: {m.name!r} is not a network")
    name = f"plugin:{m.plugin}" if m.name == "plugin" else m.name
    return NetworkSpec(name, tuple(m.input_shape), int(m.n_classes), hidden=tuple(m.hidden), vocab=m.vocab or 0,
                       init_seed=m.init_seed)


def federated_network(spec: JobSpec, features: int) -> NetworkSpec:
    """A federated job's model (``[federated]``), which every member builds bit for bit from its
    seed: a built-in network, or ``softmax`` as the ``mlp`` with no hidden layer (multinomial
    logistic regression with a bias per class, from ``model.init_seed``)."""
    m = spec.model
    if m.is_network:
        return network_spec(spec)
    return NetworkSpec("mlp", (int(features),), int(m.n_classes or 0), hidden=(), init_seed=int(m.init_seed))


def plan_job(spec: JobSpec, *, sampler: Sampler = "ideal", test_no_noise: bool = False,
             sizes: PublicSizes | None = None, n_features: int | None = None, builder: Any = None) -> PrivacyPlan:
    """The job's :class:`PrivacyPlan`: what the daemon reserves at admission (no sizes yet), and,
    bound with the agreed sizes and the model's dimension, what the protocol and the report use
    (a network's dimension is its parameter count, known from the spec alone — for a plugin
    network, from its ``builder``, which only a party that has it can give)."""
    if spec.model.name == "plugin" and builder is None:
        dim: int | None = None
    elif spec.federated is not None and not spec.model.is_network:
        dim = None if n_features is None else parameter_count(build_network(federated_network(spec, n_features)))
    elif spec.model.is_network:
        dim = parameter_count(build_network(network_spec(spec), builder=builder))
    else:
        dim = None if n_features is None else loss_for(spec).param_dim(n_features)
    return PrivacyPlan.make(spec, clip=clip_for(spec), sampler=sampler, test_no_noise=test_no_noise, sizes=sizes,
                            dim=dim)


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


def public_sizes(spec: JobSpec, parties: PartySizes | None) -> PublicSizes:
    """What the plan may use about the counts: the exact ones (replace), n̂ (add_remove)."""
    if spec.privacy.adjacency == "add_remove":
        return PublicSizes(public_n=spec.privacy.public_n)
    if parties is None:
        raise ValueError("sizes: a replace-one job needs the parties' agreed counts")
    return PublicSizes(counts=parties.sizes)


def network_rows(ds: Dataset, spec: JobSpec, dev: Any) -> tuple[torch.Tensor, torch.Tensor]:
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
