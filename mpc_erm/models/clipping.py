"""Per-example clipping (Abadi et al. 2016): the step that makes per-round sensitivity 2C/n.

Each row is scaled by min(1, C / ||row||) -- exactly the formula, so rows already inside the ball
are returned bit for bit and zero rows stay zero (no 0/0).  In floating point a scaled row's
norm is C up to a few ulps (relative ~1e-16), far below anything the noise calibration sees.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

__all__ = ["clip_rows"]


def clip_rows(grads: Tensor, C: float) -> Tensor:
    """Scale each row (first dimension indexes rows; norm over all remaining dims) to norm <= C."""
    if not (isinstance(C, numbers.Real) and not isinstance(C, bool) and math.isfinite(C) and C >= 0):
        raise ValueError(f"C: clipping norm must be a finite number >= 0, got {C!r}")
    if grads.dim() < 2:
        raise ValueError(f"grads: expected (n, p), got shape {tuple(grads.shape)}")
    dims = tuple(range(1, grads.dim()))
    norms = torch.linalg.vector_norm(grads, dim=dims, keepdim=True)
    one = torch.ones((), dtype=norms.dtype, device=norms.device)
    # where(norm > C, C/norm, 1): never divides by zero where it matters (norm > C >= 0).
    factor = torch.where(norms > C, C / norms, one)
    return grads * factor
