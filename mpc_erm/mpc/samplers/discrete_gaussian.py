"""Discrete Gaussian inside CrypTen: CKS 2020 Algorithm 3 with exact acceptance coins
(see :mod:`.gaussian` for the construction and its exact PMF).

Per batch of n outputs, R·n discrete Laplace candidates are drawn in parallel
(:func:`.discrete_laplace.laplace_parts` gives D and |D|), then, on shares only:
N = (|D| − μ)² (one secure square of integers), its bits (CrypTen A2B), the coins C_i
(bit-sliced comparisons of jointly random k-bit uniforms with public thresholds),
fail_i = n_i ∧ ¬C_i, accept = ⋀_i ¬fail_i (an AND tree), the exclusive prefix
P_r = ⋀_{s<r} ¬accept_s (log-depth scan), the one-hot selection sel_r = P_r ⊕ P_{r+1}
(sel_{R−1} = P_{R−1}: the fallback), then B2A and Σ_r sel_r·D_r (one multiplication).
Nothing about which round accepted is revealed.
"""

from __future__ import annotations

from typing import Any

import torch

from ..crypten_compat import import_crypten
from .discrete_laplace import (
    _LANES,
    _and,
    _b2a_bits,
    _less_than_public,
    _local_words,
    _pack,
    _public_xor,
    _threshold_masks,
    laplace_parts,
)
from .gaussian import DiscreteGaussianParams
from .params import FRAC_BITS

crypten = import_crypten()
from crypten.config import cfg  # noqa: E402  (after the compat shim)
from crypten.mpc.mpc import MPCTensor  # noqa: E402
from crypten.mpc.primitives import arithmetic  # noqa: E402
from crypten.mpc.primitives.arithmetic import ArithmeticSharedTensor  # noqa: E402
from crypten.mpc.primitives.converters import _A2B  # noqa: E402

__all__ = ["sample_discrete_gaussian", "sample_discrete_gaussian_integers"]


def _ones_like(x: torch.Tensor) -> torch.Tensor:
    """XOR shares of all-ones words (rank 0 holds them)."""
    return _public_xor(torch.zeros_like(x), -1)


def _and_reduce(x: torch.Tensor) -> torch.Tensor:
    """⋀ over dim 0 of XOR-shared words, log-depth."""
    while x.size(0) > 1:
        h = x.size(0) // 2
        prod = _and(x[:h], x[h : 2 * h])
        x = torch.cat([prod, x[2 * h :]])
    return x[0]


def _exclusive_prefix_and(q: torch.Tensor) -> torch.Tensor:
    """P_0 = 1, P_r = ⋀_{s<r} q_s for r = 0 … len(q) (Hillis–Steele scan, ⌈log2⌉ rounds)."""
    s = q.clone()
    step = 1
    while step < s.size(0):
        s = torch.cat([s[:step], _and(s[step:], s[:-step])])
        step *= 2
    return torch.cat([_ones_like(q[:1]), s])


def sample_discrete_gaussian_integers(
    params: DiscreteGaussianParams, n: int, device: Any = None
) -> ArithmeticSharedTensor:
    """n discrete Gaussian samples in grid units (ArithmeticSharedTensor, precision 0)."""
    if n < 1:
        raise ValueError("n must be positive")
    device = torch.device("cpu") if device is None else torch.device(device)
    r = params.rounds
    y, mag = laplace_parts(params.laplace, r * n, device, with_magnitude=True)
    assert mag is not None
    y = y.view(r, n)
    if r == 1:
        return ArithmeticSharedTensor.from_shares(y[0], precision=0)
    diff = mag.view(r, n)[: r - 1]  # the last candidate is the fallback: no test needed
    if crypten.communicator.get().get_rank() == 0:
        diff = diff - params.mu
    # The protocol's square directly: AST.square() would also "divide" by the scale 1 through a
    # wraps protocol (harmless, one wasted round).
    sq = getattr(arithmetic, cfg.mpc.protocol).square(ArithmeticSharedTensor.from_shares(diff, precision=0))
    nbin = _A2B(sq).share  # XOR shares of N = (|D| − μ)², (R−1, n)
    nbits = len(params.coin_thresholds)  # bits low_bit … n_bits − 1 of N
    ncmp = params.compared_coins  # the rest have threshold 0: coin ≡ 0, fail_i = n_i
    shifts = torch.arange(params.low_bit, params.n_bits, device=device).view(-1, 1, 1)
    planes = ((nbin.unsqueeze(0) >> shifts) & 1).reshape(nbits * (r - 1), n)
    w = -(-n // _LANES)
    n_words = _pack(planes).view(nbits, r - 1, w)
    u = _local_words((params.k, ncmp, (r - 1) * w), device)
    thresholds = params.coin_thresholds[:ncmp]
    coins = _less_than_public(u, _threshold_masks(thresholds, params.k, device)).view(ncmp, r - 1, w)
    fail = torch.cat([_and(n_words[:ncmp], _public_xor(coins, -1)), n_words[ncmp:]])  # n_i ∧ ¬C_i
    reject = _public_xor(_and_reduce(_public_xor(fail, -1)), -1)  # ¬⋀_i ¬fail_i, (R−1, W)
    prefix = _exclusive_prefix_and(reject)  # (R, W): P_0 … P_{R−1}
    sel = torch.cat([prefix[:-1] ^ prefix[1:], prefix[-1:]])  # one-hot: first accepted, else last
    sel_a = _b2a_bits(sel, n).view(r, n)
    out = ArithmeticSharedTensor.from_shares(sel_a, precision=0).mul(ArithmeticSharedTensor.from_shares(y, precision=0))
    return ArithmeticSharedTensor.from_shares(out.share.sum(0), precision=0)


def sample_discrete_gaussian(params: DiscreteGaussianParams, n: int, device: Any = None) -> MPCTensor:
    """n discrete Gaussian samples in real units (D · 2^-grid_bits) with CrypTen's encoder."""
    ints = sample_discrete_gaussian_integers(params, n, device)
    share = ints.share * (1 << (FRAC_BITS - params.grid_bits))
    return MPCTensor.from_shares(share, precision=FRAC_BITS)
