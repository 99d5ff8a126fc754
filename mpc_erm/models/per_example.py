"""Per-example gradients of any torch model via torch.func (functional_call + vmap(grad)).

Gradient perturbation clips every example's gradient before the secure sum (docs/explanation/architecture.md §1), so a
per-example gradient is needed for models other than the closed-form linear losses.  vmap over a
single-example loss is the standard way to get them in one batched pass.

Restrictions (those of torch.func): the model must not rely on in-place batch statistics (e.g.
BatchNorm in training mode -- use GroupNorm/LayerNorm, which are per-example and DP-compatible);
random layers such as Dropout need ``randomness=`` handling and are rejected by vmap by default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

__all__ = ["flatten_grads", "per_example_grads"]


def per_example_grads(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    X: Tensor,
    y: Tensor,
    chunk_size: int | None = None,
) -> dict[str, Tensor]:
    """{name: (n, *param.shape)} gradients of loss_fn(model(x_i[None]), y_i[None]) per example.

    ``loss_fn(output, target)`` must return a scalar; it is called on a batch of one, so
    reduction "mean" and "sum" agree.  Only parameters with ``requires_grad`` are
    differentiated; the dict follows ``model.named_parameters()`` order.  ``chunk_size`` bounds
    vmap's memory (rows processed at once).
    """
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"y: {y.shape[0]} labels for {X.shape[0]} rows of X")
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    frozen = {k: v.detach() for k, v in model.named_parameters() if not v.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def one_loss(p: dict[str, Tensor], x: Tensor, t: Tensor) -> Tensor:
        out = functional_call(model, ({**p, **frozen}, buffers), (x.unsqueeze(0),))
        return loss_fn(out, t.unsqueeze(0))

    return vmap(grad(one_loss), in_dims=(None, 0, 0), chunk_size=chunk_size)(params, X, y)


def flatten_grads(grads: Mapping[str, Tensor], model: nn.Module | None = None) -> Tensor:
    """Concatenate per-example gradients to (n, p), each tensor flattened row-major.

    The order is ``model.named_parameters()`` if a model is given (skipping names absent from
    ``grads``), else the mapping's own order -- which for ``per_example_grads`` output is the
    same.  This is the layout of ``torch.nn.utils.parameters_to_vector``.
    """
    if model is not None:
        names = [k for k, _ in model.named_parameters() if k in grads]
    else:
        names = list(grads)
    if not names:
        raise ValueError("grads: no gradients to flatten")
    n = grads[names[0]].shape[0]
    return torch.cat([grads[k].reshape(n, -1) for k in names], dim=1)
