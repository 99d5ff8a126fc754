"""Laplacian smoothing A_sigma^{-1} (DP-LSSGD / DP-Fed-LS; docs/explanation/papers.md §0).

A_sigma = I + sigma L with L the 1-D periodic (cycle-graph) Laplacian, stencil [-1, 2, -1]
(Paper A writes I - sigma L' with L' = -L; same matrix, docs/explanation/papers.md §0.1).  A_sigma is circulant, so
its eigenvectors are the Fourier modes and (docs/explanation/papers.md §0.2-0.3)

    A_sigma^{-1} v = ifft( fft(v) / (1 + 2 sigma (1 - cos(2 pi k / p))) ),   k = 0..p-1,

with divisor 1 + 4 sigma sin^2(pi k / p) >= 1 (never zero; the DC mode k = 0 is untouched, so
the mean of v is preserved).  For real v we use rfft/irfft (half the work, real output).

It is applied to the *noisy* gradient: post-processing, no privacy cost (docs/explanation/papers.md §A7,
docs/explanation/privacy.md §7).

Small p (neither paper defines these, docs/explanation/papers.md §0.5).  We take the operator the FFT formula gives,
which is the dense matrix obtained by *accumulating* the periodic stencil (A[i, i] += 2 sigma,
A[i, (i +- 1) mod p] -= sigma):
  * p = 1: both neighbours are the element itself, L = 2 - 1 - 1 = 0, A = [1]: the identity.
  * p = 2: both neighbours of i are the other element, L = [[2, -2], [-2, 2]] (the cycle graph
    on 2 nodes with its two edges), A = [[1 + 2 sigma, -2 sigma], [-2 sigma, 1 + 2 sigma]],
    eigenvalues 1 (mean) and 1 + 4 sigma (difference) = the FFT divisors at k = 0, 1.
  The authors' dp-fed-ls code instead overwrites the kernel to [-2, 1], giving divisors 1 + sigma
  and 1 + 3 sigma, i.e. [[1 + 2 sigma, -sigma], [-sigma, 1 + 2 sigma]], which is not a Laplacian
  (it shrinks the mean); we do not follow it.  It skips numel == 1 tensors, which agrees with ours.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import overload

import numpy as np
import torch
from torch import Tensor

__all__ = ["laplacian_smooth", "ls_constants", "ls_divisors", "smooth_parameters"]


def _check_sigma(sigma: float) -> float:
    real = isinstance(sigma, numbers.Real) and not isinstance(sigma, bool)
    if not (real and math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma: must be a finite real number >= 0, got {sigma!r}")
    return float(sigma)


def ls_divisors(p: int, sigma: float, *, device: torch.device | str | None = None,
                dtype: torch.dtype = torch.float64) -> Tensor:
    """Eigenvalues of A_sigma for the rfft bins k = 0..p//2: 1 + 4 sigma sin^2(pi k / p).

    (1 - cos 2x = 2 sin^2 x, which avoids cancellation for small k / p.)
    """
    sigma = _check_sigma(sigma)
    k = torch.arange(p // 2 + 1, device=device, dtype=dtype)
    return 1.0 + 4.0 * sigma * torch.sin(math.pi * k / p) ** 2


def laplacian_smooth(v: Tensor, sigma: float) -> Tensor:
    """A_sigma^{-1} applied along the last dimension of v, batched over leading dimensions.

    sigma = 0, p <= 1 (0-dim, empty or single-element last dimension) return ``v`` itself:
    the operator is exactly the identity there, so DP-GD is reproduced bit for bit (the result
    aliases the input; do not modify it in place if you still need v).  Real floating input
    only; output has v's dtype and device (CPU or CUDA; no host round trip).
    """
    sigma = _check_sigma(sigma)
    if not isinstance(v, Tensor):
        raise TypeError(f"v: expected a torch.Tensor, got {type(v).__name__}")
    if not v.is_floating_point():
        raise ValueError(f"v: expected a real floating tensor, got dtype {v.dtype}")
    if sigma == 0.0 or v.dim() == 0 or v.shape[-1] <= 1:
        return v
    p = v.shape[-1]
    # Divisors in float64 (exact enough for any input precision), then in v's precision.
    div = ls_divisors(p, sigma, device=v.device).to(v.dtype)
    return torch.fft.irfft(torch.fft.rfft(v, dim=-1) / div, n=p, dim=-1)


@overload
def smooth_parameters(tensors: Mapping[str, Tensor], sigma: float) -> dict[str, Tensor]: ...
@overload
def smooth_parameters(tensors: Sequence[Tensor], sigma: float) -> list[Tensor]: ...


def smooth_parameters(
    tensors: Sequence[Tensor] | Mapping[str, Tensor], sigma: float
) -> list[Tensor] | dict[str, Tensor]:
    """Smooth each parameter tensor separately, flattened in PyTorch's natural (row-major) order
    and reshaped back (Paper B's layer-wise LS, docs/explanation/papers.md §0.5; weights and biases separately).

    A mapping gives a dict with the same keys/order, a sequence a list.  sigma = 0 returns the
    same tensor objects.
    """
    sigma = _check_sigma(sigma)

    def one(t: Tensor) -> Tensor:
        if sigma == 0.0:
            return t
        return laplacian_smooth(t.reshape(-1), sigma).reshape(t.shape)

    if isinstance(tensors, Mapping):
        return {k: one(t) for k, t in tensors.items()}
    if isinstance(tensors, Tensor):
        raise TypeError("tensors: expected a sequence or mapping of tensors; for one tensor "
                         "use laplacian_smooth(t.reshape(-1), sigma)")
    return [one(t) for t in tensors]


def ls_constants(d: int, sigma: float) -> tuple[float, float]:
    """(gamma, beta) of DP-LSSGD (Paper A, Theorems 4 and 7; docs/explanation/papers.md §0.3):

        gamma = (1/d) sum_{i=1}^d 1 / (1 + 2 sigma - 2 sigma cos(2 pi i / d))
        beta  = (1/d) sum_{i=1}^d 1 / (1 + 2 sigma - 2 sigma cos(2 pi i / d))^2,

    the normalised traces of A_sigma^{-1} and A_sigma^{-2} (gamma = d_sigma / d of Paper B).
    They reproduce Paper A's Tables 3 and 4; for large d they tend to 1/sqrt(1 + 4 sigma) and
    (1 + 2 sigma)/(1 + 4 sigma)^{3/2}.
    """
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise ValueError(f"d: must be an int >= 1, got {d!r}")
    sigma = _check_sigma(sigma)
    i = np.arange(int(d), dtype=np.float64)  # i = 0..d-1 is i = 1..d modulo d
    lam = 1.0 / (1.0 + 4.0 * sigma * np.sin(np.pi * i / d) ** 2)
    return float(lam.mean()), float((lam * lam).mean())
