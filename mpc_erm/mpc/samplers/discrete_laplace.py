"""Discrete Laplace noise sampled inside CrypTen from jointly random bits.

Algorithm (the distribution is fixed by :class:`.params.DiscreteLaplaceParams`; its exact PMF
is :func:`.pmf.log_pmf`):

1. **Jointly random bits** (:mod:`.bits`). Every party draws its own local 64-bit words
   (CrypTen's per-party ``local`` generator, seeded from os.urandom) and uses them as its XOR
   share. The shared value is the XOR of all shares: uniform as long as one party's words are,
   so no proper subset of parties controls or knows it (Champion–shelat–Ullman, CCS'19). Each
   word is one full 64-bit output of the generator (torch's full-range ``random_(−2^63, None)``
   kernel returns ``random64()`` as is), so every word is exactly uniform; CrypTen's
   ``generate_random_ring_element`` is not used: it never produces 2^63 − 1.
2. **Biased coins by comparison with public constants, bit-sliced** (:mod:`.coins`). For coin
   j, U_j < c_j with U_j a jointly random k-bit uniform, so P(coin = 1) = c_j/2^k exactly. 64
   samples share a word (bit plane i of 64 different U's). A chain LSB → MSB with k − 1 ANDs
   (default) or a ⌈log2 k⌉-round tree with ≈ 2k ANDs; every AND is a binary Beaver AND on whole
   64-lane words with the provider's triples (:func:`.bits.and_many`: the independent ANDs of one
   round share one triple request and one opening). By default every plane of U but the LSB is
   the round's triple's first component XOR public words, so a round opens δ only: half the
   bytes of the chain, the same law and the same who-can-know-what (:mod:`.coins` has the
   argument).
3. **Sign × magnitude.** Magnitude bits b_0…b_{B−1}, the "non-zero" coin Z, a fair sign bit S
   (a jointly random bit, exactly 1/2) and V = Z ∧ S (one more word-AND round).
4. **To arithmetic.** The B + 2 bits of each sample are unpacked locally (XOR shares are
   bitwise) and converted with CrypTen's single-bit B2A trick (mask with the provider's random
   bit r, open x ⊕ r — here opened *packed*, 64 bits per word, 64× fewer bytes than CrypTen's
   ``B2A_single_bit`` — then x = r + z − 2rz, computed as (r ⊕ −z) + z: −r = ¬r + 1;
   :func:`.bits.b2a_bits`).
5. **D = (Z − 2V)·(1 + Σ_j b_j 2^j)**: one Beaver multiplication of integers (precision 0, no
   truncation), then the ring integer is read as a fixed-point value on the grid 2^-grid_bits
   (scaled by the public 2^{16 − grid_bits}, exact).

Rounds per batch: k − 1 (chain; ⌈log2 k⌉ with the tree) + 1 (Z ∧ S) + 1 (B2A) + 1 (mul),
independent of the batch size, so they amortise over large offline batches; CrypTen's own
``randn`` needs ~270 rounds (log, sqrt, cos by iteration) and is 10× slower here. Keller et al.
(ePrint 2023/1594) build the discrete Laplace/Gaussian in MPC the same way from finite-precision
Bernoulli coins; we differ by accounting for the exact implemented PMF (:mod:`.accounting`).
Nothing here logs or returns plaintext noise.
"""

from __future__ import annotations

from typing import Any

import torch

from ..crypten_compat import import_crypten, plain
from .bits import LANES, and_words, b2a_bits, local_words, party_rank
from .coins import random_coins, threshold_masks
from .params import FRAC_BITS, MPC_MAX_COIN_BITS, DiscreteLaplaceParams

crypten = import_crypten()
from crypten.mpc.mpc import MPCTensor  # noqa: E402  (after the compat shim)
from crypten.mpc.primitives.arithmetic import ArithmeticSharedTensor  # noqa: E402

__all__ = ["laplace_parts", "ring_to_grid_units", "sample_discrete_laplace", "sample_discrete_laplace_integers"]


def _laplace_values(
    params: DiscreteLaplaceParams, coins: torch.Tensor, n: int, magnitude_rows: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Arithmetic shares (G, n) of D from XOR-shared coin words ``coins`` (J, G, W) (row g holds
    n samples in its lanes), and of |D| for the first ``magnitude_rows`` rows (one multiplication
    gives both)."""
    device = coins.device
    b = params.bits
    g, w = coins.size(1), coins.size(2)
    sign = local_words((g, w), device)  # jointly random fair bits
    v = and_words(coins[-1], sign)  # Z ∧ S
    bits = b2a_bits(torch.cat([coins, v.unsqueeze(0)]).view(-1, w), n).view(b + 2, g, n)  # b_0…b_{B−1}, Z, V
    mag = bits[0].clone()
    for j in range(1, b):
        mag += bits[j] << j
    if party_rank() == 0:
        mag += 1
    z = bits[b]
    signed = z - 2 * bits[b + 1]  # Z − 2V ∈ {−1, 0, 1}
    if magnitude_rows:
        m = magnitude_rows
        x = torch.cat([signed.reshape(-1), z[:m].reshape(-1)])
        y = torch.cat([mag.reshape(-1), mag[:m].reshape(-1)])
        prod = plain(ArithmeticSharedTensor.from_shares(x, precision=0).mul(
            ArithmeticSharedTensor.from_shares(y, precision=0)
        ).share)
        return prod[: g * n].view(g, n), prod[g * n :].view(m, n)
    a = ArithmeticSharedTensor.from_shares(signed, precision=0)
    return plain(a.mul(ArithmeticSharedTensor.from_shares(mag, precision=0)).share), None


def laplace_parts(
    params: DiscreteLaplaceParams, n: int, device: Any = None, with_magnitude: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This party's arithmetic shares (precision 0) of n samples D and, if asked, of |D|
    (the discrete Gaussian's acceptance test needs |D|; one batched multiplication gives both)."""
    if n < 1:
        raise ValueError("n must be positive")
    if params.k > MPC_MAX_COIN_BITS:
        raise ValueError(f"coin bits: the MPC's circuits compare at most {MPC_MAX_COIN_BITS}-bit coins, got {params.k}")
    device = torch.device("cpu") if device is None else torch.device(device)
    w = -(-n // LANES)
    coins = random_coins(threshold_masks(params.thresholds, params.k, device), w, device)  # (J, W)
    d, mag = _laplace_values(params, coins.unsqueeze(1), n, magnitude_rows=1 if with_magnitude else 0)
    return d[0], (mag[0] if mag is not None else None)


def sample_discrete_laplace_integers(
    params: DiscreteLaplaceParams, n: int, device: Any = None
) -> ArithmeticSharedTensor:
    """n discrete Laplace samples in grid units as an ArithmeticSharedTensor (precision 0)."""
    share, _ = laplace_parts(params, n, device)
    return ArithmeticSharedTensor.from_shares(share, precision=0)


def sample_discrete_laplace(params: DiscreteLaplaceParams, n: int, device: Any = None) -> MPCTensor:
    """n discrete Laplace samples (real units: D · 2^-grid_bits) as a CrypTen MPCTensor with
    CrypTen's default encoder, ready to be added to a shared aggregate."""
    ints = sample_discrete_laplace_integers(params, n, device)
    share = plain(ints.share) * (1 << (FRAC_BITS - params.grid_bits))
    return MPCTensor.from_shares(share, precision=FRAC_BITS)


def ring_to_grid_units(revealed: torch.Tensor, grid_bits: int) -> torch.Tensor:
    """Decode a revealed ring value exactly into grid units (CrypTen's decode is off by one
    step for some negative values; see tests/mpc/test_grpc_communicator.py::_ring)."""
    return torch.div(revealed, 1 << (FRAC_BITS - grid_bits), rounding_mode="floor")
