"""Shared helpers for the models tests: data in the unit ball and valid labels per loss."""

from __future__ import annotations

import torch
from torch import Tensor

from mpc_erm.models import Loss

F64 = torch.float64


def unit_ball(n: int, d: int, gen: torch.Generator, on_sphere: bool = False) -> Tensor:
    """n points uniform in (or on) the unit ball of R^d, float64."""
    X = torch.randn(n, d, generator=gen, dtype=F64)
    X = X / torch.linalg.vector_norm(X, dim=1, keepdim=True)
    if not on_sphere:
        X = X * torch.rand(n, 1, generator=gen, dtype=F64) ** (1.0 / d)
    return X


def labels_for(loss: Loss, X: Tensor, gen: torch.Generator, noise: float = 0.5) -> Tensor:
    """Labels in the task's domain, correlated with a random linear model (plus noise)."""
    n, d = X.shape
    if loss.task == "multiclass":
        K = loss.n_outputs
        W = torch.randn(K, d, generator=gen, dtype=F64) * 3
        Z = X @ W.T + noise * torch.randn(n, K, generator=gen, dtype=F64)
        return Z.argmax(dim=1)
    w = torch.randn(d, generator=gen, dtype=F64) * 3
    z = X @ w + noise * torch.randn(n, generator=gen, dtype=F64)
    if loss.task == "binary":
        one = torch.ones((), dtype=F64)
        return torch.where(z >= 0, one, -one)
    return torch.tanh(z)


def all_losses() -> list[Loss]:
    from mpc_erm.models import get_loss

    return [
        get_loss("logistic"),
        get_loss("huber_svm"),
        get_loss("huber_svm", h=0.1),
        get_loss("ridge"),
        get_loss("softmax", n_classes=3),
    ]
