"""The regularised ERM objective of docs/explanation/contracts.md: J(theta) = mean_i l_i(theta) + lam/2 ||theta||^2.

With ``weights`` the mean is the weighted mean sum_i w_i l_i / sum_i w_i (how a party's rows are
re-weighted, or how padded rows are masked out with w_i = 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .losses import Loss

__all__ = ["normalised_weights", "objective_grad", "objective_value"]


def normalised_weights(weights: Tensor | None, n: int, like: Tensor) -> Tensor:
    """w_i / sum w (or 1/n): the per-row weights of the (weighted) mean, on like's device/dtype."""
    if weights is None:
        if n == 0:
            raise ValueError("X: the objective needs at least one row")
        return torch.full((n,), 1.0 / n, dtype=like.dtype, device=like.device)
    w = weights.to(dtype=like.dtype, device=like.device)
    if w.shape != (n,):
        raise ValueError(f"weights: shape {tuple(w.shape)} != ({n},)")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError("weights: must be finite and >= 0")
    total = w.sum()
    if not bool(total > 0):
        raise ValueError("weights: must not all be zero")
    return w / total


def objective_value(
    loss: Loss, theta: Tensor, X: Tensor, y: Tensor, lam: float, weights: Tensor | None = None
) -> Tensor:
    """J(theta) = (weighted) mean loss + lam/2 ||theta||^2, a 0-dim tensor."""
    w = normalised_weights(weights, X.shape[0], X)
    return (w * loss.per_example_loss(theta, X, y)).sum() + 0.5 * lam * (theta * theta).sum()


def objective_grad(
    loss: Loss, theta: Tensor, X: Tensor, y: Tensor, lam: float, weights: Tensor | None = None
) -> Tensor:
    """grad J(theta) (p,), computed as X^T phi'(z) w without forming per-example gradients."""
    w = normalised_weights(weights, X.shape[0], X)
    return loss.weighted_grad(theta, X, y, w) + lam * theta
