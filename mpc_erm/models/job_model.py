"""The model a job spec names: its loss, the Lipschitz constant and clip bound the privacy plan
needs, its network, and its parameter count (the plan's dimension).

The constants and a linear model's parameter count come from :mod:`.facts`, without torch, so
planning a linear job (``job submit``'s check, the privacy plan) never imports it; the loss
objects and networks import it when they are asked for."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from mpc_erm.spec import JobSpec

from . import facts

if TYPE_CHECKING:
    from .losses import Loss
    from .networks import NetworkBuilder, NetworkSpec

__all__ = ["clip_for", "federated_network", "label_task", "lipschitz_for", "loss_for", "network_spec",
           "parameter_dim"]


def label_task(spec: JobSpec) -> str:
    """The task a job's labels are read as: regression for ridge, multiclass for softmax or a
    network with more than two classes, else binary — how a party reads its file and how the dry
    run reads the stand-ins, the same."""
    m = spec.model
    if m.name == "ridge":
        return "regression"
    return "multiclass" if m.name == "softmax" or (m.is_network and (m.n_classes or 2) > 2) else "binary"


def loss_for(spec: JobSpec) -> Loss:
    from .losses import get_loss

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


def clip_for(spec: JobSpec) -> float:
    """The per-release contribution bound the plan needs: the gradient clip C (default: the loss's
    Lipschitz constant) or, for output perturbation, the loss's Lipschitz constant G."""
    if spec.method == "gradient" and spec.privacy.clip is not None:
        return float(spec.privacy.clip)  # networks always name it (JobSpec refuses them without)
    lam = spec.model.lam
    return facts.lipschitz(spec.model.name, radius=1.0 / math.sqrt(lam) if lam > 0 else None)


def network_spec(spec: JobSpec) -> NetworkSpec:
    """The :class:`~mpc_erm.models.NetworkSpec` a job's model section names."""
    from .networks import NetworkSpec

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
    from .networks import NetworkSpec

    m = spec.model
    if m.is_network:
        return network_spec(spec)
    return NetworkSpec("mlp", (int(features),), int(m.n_classes or 0), hidden=(), init_seed=int(m.init_seed))


def parameter_dim(spec: JobSpec, n_features: int | None, builder: NetworkBuilder | None = None) -> int | None:
    """The model's parameter count: a linear model's from the feature count, a network's from the
    spec alone (a plugin network's from its ``builder``, which only a party that has it can give);
    None when it cannot be known here (no feature count yet, a plugin without its builder)."""
    m = spec.model
    if m.name == "plugin":  # a party's own network: only its builder knows its shapes
        if builder is None:
            return None
        from .networks import build_network, parameter_count

        return parameter_count(build_network(network_spec(spec), builder=builder))
    if spec.federated is not None and not m.is_network:  # softmax as the mlp with no hidden layer
        return None if n_features is None else facts.network_parameters("mlp", (int(n_features),),
                                                                        int(m.n_classes or 0), hidden=())
    if m.is_network:  # a built-in network: counted from its spec, without torch
        if m.input_shape is None or m.n_classes is None:
            raise ValueError(f"model.name: {m.name!r} is not a network")
        return facts.network_parameters(m.name, tuple(m.input_shape), int(m.n_classes), hidden=tuple(m.hidden),
                                        vocab=m.vocab or 0)
    return None if n_features is None else facts.param_dim(m.name, n_features, m.n_classes)
