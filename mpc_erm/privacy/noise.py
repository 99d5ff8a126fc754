"""Plaintext noise samplers for the in-process simulator.

These draw the *ideal* continuous distributions in float64, seeded only through the caller's
``torch.Generator`` (so a simulation is reproducible from its seed). They are NOT the MPC
sampler: the MPC engine samples inside CrypTen, and a float sampler carries no DP proof on its
own grid (Mironov, CCS'12; docs/explanation/privacy.md §5, "The sampler is part of the mechanism"). Reports made
from simulator runs therefore state ``delta_sampler = 0.0`` for the ideal mechanism and a
trusted, in-process trust model.

Only generator-aware torch primitives are used (``torch.randn``, ``torch.rand``,
``Tensor.exponential_``): ``torch.distributions`` and ``torch._standard_gamma`` cannot take a
generator. Gamma(d) for the ℓ2-Laplace norm is drawn by Marsaglia–Tsang (2000) rejection from
those primitives; its output is checked against SciPy's Gamma CDF in the tests.

Sampling is always done in float64 and cast to ``dtype`` at the end, so the same seed gives the
same noise (up to rounding) whatever the requested dtype.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Literal

import torch

from . import _checks

Mechanism = Literal["none", "gaussian", "laplace", "l2_laplace"]
MECHANISMS = ("none", "gaussian", "laplace", "l2_laplace")

__all__ = ["MECHANISMS", "Mechanism", "sample_gamma", "sample_noise"]


def sample_noise(
    mechanism: Mechanism,
    scale: float,
    shape: int | Sequence[int] | torch.Size,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Draw noise of ``shape`` for ``mechanism``.

    - ``"none"``: zeros (``scale`` must be 0 or is ignored; any finite value ≥ 0 is accepted).
    - ``"gaussian"``: i.i.d. N(0, σ²), ``scale`` = σ.
    - ``"laplace"``: i.i.d. Lap(b) per coordinate, ``scale`` = b (as E₁ − E₂ of two
      independent Exponential(1/b); exact Laplace, no log(0) edge case).
    - ``"l2_laplace"``: one vector per row of the last dimension d = shape[-1] with density
      ∝ exp(−‖z‖/s), ``scale`` = s = Δ₂/ε: norm ~ Gamma(d, s), direction uniform (a normalised
      standard normal vector).
    """
    mech = _checks.choice("mechanism", mechanism, MECHANISMS)
    s = _checks.nonnegative("scale", scale)
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    size = _shape(shape)
    f64 = torch.float64
    if mech == "none" or s == 0.0:
        if mech == "l2_laplace" and len(size) == 0:
            raise ValueError("shape must have at least one dimension for l2_laplace, got ()")
        return torch.zeros(size, dtype=dtype)
    if mech == "gaussian":
        out = torch.randn(size, generator=generator, dtype=f64).mul_(s)
    elif mech == "laplace":
        e1 = torch.empty(size, dtype=f64).exponential_(1.0, generator=generator)
        e2 = torch.empty(size, dtype=f64).exponential_(1.0, generator=generator)
        out = (e1 - e2).mul_(s)
    else:
        if len(size) == 0:
            raise ValueError("shape must have at least one dimension for l2_laplace, got ()")
        d = size[-1]
        rows = size[:-1]
        if d == 0:
            return torch.zeros(size, dtype=dtype)
        direction = torch.randn(size, generator=generator, dtype=f64)
        norms = direction.norm(dim=-1, keepdim=True)
        # P(‖N(0, I_d)‖ = 0) = 0, but guard the float event anyway by redrawing.
        while bool((norms == 0).any()):  # pragma: no cover
            bad = (norms == 0).squeeze(-1)
            direction[bad] = torch.randn((int(bad.sum()), d), generator=generator, dtype=f64)
            norms = direction.norm(dim=-1, keepdim=True)
        radius = sample_gamma(float(d), rows, generator).mul_(s)
        out = direction.div_(norms).mul_(radius.unsqueeze(-1))
    return out.to(dtype)


def sample_gamma(
    shape_k: float, size: Sequence[int] | torch.Size, generator: torch.Generator
) -> torch.Tensor:
    """Gamma(k, scale=1) samples, float64, for k ≥ 1, by Marsaglia–Tsang (ACM TOMS 26(3), 2000).

    With a = k − 1/3 and c = 1/√(9a): draw x ~ N(0,1), v = (1 + c·x)³; accept a·v when v > 0
    and log U < x²/2 + a − a·v + a·log v. The acceptance rate is > 95 % for k ≥ 1, so a few
    vectorised passes suffice. Exact (not an approximation) for every k ≥ 1.
    """
    k = _checks.positive("shape_k", shape_k)
    if k < 1.0:
        raise ValueError(f"shape_k must be >= 1 for this sampler, got {shape_k!r}")
    size = torch.Size(size)
    total = math.prod(size)
    out = torch.empty(total, dtype=torch.float64)
    a = k - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * a)
    filled = 0
    while filled < total:
        need = total - filled
        batch = need + need // 10 + 16
        x = torch.randn(batch, generator=generator, dtype=torch.float64)
        u = torch.rand(batch, generator=generator, dtype=torch.float64)
        v = (1.0 + c * x) ** 3
        pos = v > 0
        logv = torch.log(torch.where(pos, v, torch.ones_like(v)))
        accept = pos & (torch.log(u) < 0.5 * x * x + a - a * v + a * logv)
        got = (a * v)[accept][:need]
        out[filled : filled + got.numel()] = got
        filled += got.numel()
    return out.reshape(size)


def _shape(shape: int | Sequence[int] | torch.Size) -> torch.Size:
    err = f"shape must be an int or a sequence of non-negative ints, got {shape!r}"
    if isinstance(shape, bool):
        raise ValueError(err)
    try:
        dims = (
            (operator.index(shape),)
            if not isinstance(shape, Sequence)
            else tuple(operator.index(s) for s in shape)
        )
    except TypeError:
        raise ValueError(err) from None
    if any(isinstance(s, bool) for s in (shape if isinstance(shape, Sequence) else ())) or any(
        d < 0 for d in dims
    ):
        raise ValueError(err)
    return torch.Size(dims)
