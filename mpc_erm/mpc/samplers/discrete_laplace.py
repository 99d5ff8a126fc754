"""Discrete Laplace noise sampled inside CrypTen from jointly random bits.

Algorithm (the distribution is fixed by :class:`.params.DiscreteLaplaceParams`; its exact PMF
is :func:`.pmf.log_pmf`):

1. **Jointly random bits.** Every party draws its own local 64-bit words (CrypTen's per-party
   ``local`` generator, seeded from os.urandom) and uses them as its XOR share. The shared value
   is the XOR of all shares: uniform as long as one party's words are, so no proper subset of
   parties controls or knows it (Champion–shelat–Ullman, CCS'19). Words are drawn as two exact
   32-bit halves: CrypTen's ``generate_random_ring_element`` never produces 2^63 − 1.
2. **Biased coins by comparison with public constants, bit-sliced.** For coin j, U_j < c_j with
   U_j a jointly random k-bit uniform, so P(coin = 1) = c_j/2^k exactly. 64 samples share a word
   (bit plane i of 64 different U's). Two circuits: a chain LSB → MSB with k − 1 ANDs
   (:func:`_less_than_public_chain`, default), or a ⌈log2 k⌉-round tree MSB first with ≈ 2k ANDs:
   leaf lt = ¬u ∧ c, eq = ¬(u ⊕ c) (local: c is public); merge lt = lt_hi ⊕ (eq_hi ∧ lt_lo),
   eq = eq_hi ∧ eq_lo (⊕ suffices: lt_hi and eq_hi exclude each other). Every AND is one
   CrypTen binary Beaver AND on whole 64-lane words.
3. **Sign × magnitude.** Magnitude bits b_0…b_{B−1}, the "non-zero" coin Z, a fair sign bit S
   (a jointly random bit, exactly 1/2) and V = Z ∧ S (one more word-AND round).
4. **To arithmetic.** The B + 2 bits of each sample are unpacked locally (XOR shares are
   bitwise) and converted with CrypTen's single-bit B2A trick (mask with the provider's random
   bit r, open x ⊕ r — here opened *packed*, 64 bits per word, 64× fewer bytes than CrypTen's
   ``B2A_single_bit`` — then x = r + z − 2rz).
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

from ..crypten_compat import import_crypten
from .params import FRAC_BITS, DiscreteLaplaceParams

crypten = import_crypten()
from crypten.mpc.mpc import MPCTensor  # noqa: E402  (after the compat shim)
from crypten.mpc.primitives import beaver  # noqa: E402
from crypten.mpc.primitives.arithmetic import ArithmeticSharedTensor  # noqa: E402
from crypten.mpc.primitives.binary import BinarySharedTensor  # noqa: E402

__all__ = ["laplace_parts", "ring_to_grid_units", "sample_discrete_laplace", "sample_discrete_laplace_integers"]

_LANES = 64
COMPARISON = "chain"  # "chain": k − 1 ANDs, k − 1 rounds; "tree": ≈ 2k ANDs, ⌈log2 k⌉ rounds
_LANE_SHIFTS = torch.arange(_LANES, dtype=torch.long)


def _local_words(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Exactly uniform int64 words from this party's private generator."""
    g = crypten.generators["local"][device]
    hi = torch.randint(0, 1 << 32, shape, generator=g, dtype=torch.long, device=device)
    lo = torch.randint(0, 1 << 32, shape, generator=g, dtype=torch.long, device=device)
    return (hi << 32) | lo


def _bst(share: torch.Tensor) -> BinarySharedTensor:
    return BinarySharedTensor.from_shares(share, precision=0)


def _and(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """XOR shares of x ∧ y (one Beaver AND round on whole words)."""
    return beaver.AND(_bst(x), _bst(y)).share  # what BinarySharedTensor.__and__ runs, minus its clones


def _public_xor(share: torch.Tensor, public: torch.Tensor | int) -> torch.Tensor:
    """XOR a public value into a shared one: only rank 0 applies it."""
    if crypten.communicator.get().get_rank() == 0:
        return share ^ public
    return share.clone() if isinstance(public, int) else share ^ torch.zeros_like(public)


def _threshold_masks(thresholds: tuple[int, ...], k: int, device: torch.device) -> torch.Tensor:
    """(k, J, 1) int64: plane i (MSB first) is all-ones where bit k−1−i of c_j is set."""
    planes = [[-1 if (c >> (k - 1 - i)) & 1 else 0 for c in thresholds] for i in range(k)]
    return torch.tensor(planes, dtype=torch.long, device=device).unsqueeze(-1)


def _less_than_public_chain(u: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """[U < c] with k − 1 ANDs in k − 1 rounds (half the ANDs of the tree; the default, since
    batches are large and a round costs little next to the triples).

    LSB first, r = [U mod 2^i < c mod 2^i]: r_0 = ¬u_0 ∧ c_0 (local);
    r_i = c_i ? ¬u_i ∨ r : ¬u_i ∧ r, which is (α ∧ β) ⊕ c_i with α = u_i ⊕ ¬c_i, β = r ⊕ c_i.
    """
    k = u.size(0)
    r = _public_xor(u[k - 1], -1) & masks[k - 1]
    for i in range(k - 2, -1, -1):
        alpha = _public_xor(u[i], ~masks[i])
        beta = _public_xor(r, masks[i])
        r = _public_xor(_and(alpha, beta), masks[i])
    return r


def _less_than_public(u: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """[U < c]: the configured circuit (:data:`COMPARISON`)."""
    if COMPARISON == "tree":
        return _less_than_public_tree(u, masks)
    return _less_than_public_chain(u, masks)


def _less_than_public_tree(u: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """XOR shares of the 64-lane words [U < c] from bit planes u (k, J, W) of U (MSB first):
    ⌈log2 k⌉ rounds, ≈ 2k ANDs (for high-latency links)."""
    lt = _public_xor(u, -1) & masks  # ¬u ∧ c: AND with a public value is local on XOR shares
    eq = _public_xor(u, ~masks)  # ¬(u ⊕ c) = u ⊕ ¬c
    while lt.size(0) > 1:
        n = lt.size(0)
        h = n // 2
        lt_hi, lt_lo = lt[0 : 2 * h : 2], lt[1 : 2 * h : 2]
        eq_hi, eq_lo = eq[0 : 2 * h : 2], eq[1 : 2 * h : 2]
        if n == 2:  # last merge: eq no longer needed
            new_lt = lt_hi ^ _and(eq_hi, lt_lo)
            new_eq = eq_hi
        else:
            prod = _and(torch.cat([eq_hi, eq_hi]), torch.cat([lt_lo, eq_lo]))
            new_lt, new_eq = lt_hi ^ prod[:h], prod[h:]
        if n % 2:
            new_lt = torch.cat([new_lt, lt[-1:]])
            new_eq = torch.cat([new_eq, eq[-1:]])
        lt, eq = new_lt, new_eq
    return lt[0]


def _unpack(words: torch.Tensor, n: int) -> torch.Tensor:
    """(C, W) words → (C, n) bits (lane l of word w is element w·64 + l). Works on XOR shares
    and on public words alike."""
    bits = (words.unsqueeze(-1) >> _LANE_SHIFTS.to(words.device)) & 1
    return bits.reshape(words.size(0), -1)[:, :n]


def _pack(bits: torch.Tensor) -> torch.Tensor:
    """(C, n) bits → (C, W) words, the inverse of :func:`_unpack` (zero-padded lanes)."""
    c, n = bits.shape
    w = -(-n // _LANES)
    padded = torch.zeros(c, w * _LANES, dtype=torch.long, device=bits.device)
    padded[:, :n] = bits
    return (padded.reshape(c, w, _LANES) << _LANE_SHIFTS.to(bits.device)).sum(-1)


def _b2a_bits(words: torch.Tensor, n: int) -> torch.Tensor:
    """Arithmetic shares (C, n) of the bits held XOR-shared in ``words`` (C, W).

    CrypTen's single-bit B2A (the provider's random bit r as both arithmetic rA and binary rB;
    open x ⊕ r; x = rA + z − 2·z·rA), with x ⊕ r opened packed 64 per word.
    """
    provider = crypten.mpc.get_default_provider()
    size = (words.size(0), n)
    r_a, r_b = provider.B2A_rng(torch.Size(size), device=words.device)
    # XOR share of the r bit: bit 0 of each party's share. Padding lanes (≥ n) carry r = 0 and so
    # open their x: those are coins of samples that do not exist, independent of every used one.
    masked = words ^ _pack(r_b.share & 1)
    z = _unpack(_bst(masked).reveal(), n)
    share = r_a.share * (1 - 2 * z)
    if crypten.communicator.get().get_rank() == 0:
        share = share + z
    return share


def laplace_parts(
    params: DiscreteLaplaceParams, n: int, device: Any = None, with_magnitude: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This party's arithmetic shares (precision 0) of n samples D and, if asked, of |D|
    (the discrete Gaussian's acceptance test needs |D|; one batched multiplication gives both)."""
    if n < 1:
        raise ValueError("n must be positive")
    device = torch.device("cpu") if device is None else torch.device(device)
    w = -(-n // _LANES)
    j = len(params.thresholds)  # B magnitude coins + the Z coin
    u = _local_words((params.k, j, w), device)
    coins = _less_than_public(u, _threshold_masks(params.thresholds, params.k, device))  # (J, W)
    sign = _local_words((1, w), device)  # jointly random fair bits
    v = _and(coins[-1:], sign)  # Z ∧ S
    bits = _b2a_bits(torch.cat([coins, v]), n)  # (B + 2, n): b_0…b_{B−1}, Z, V
    weights = torch.ones(params.bits, 1, dtype=torch.long, device=device) << torch.arange(
        params.bits, device=device
    ).unsqueeze(-1)
    mag = (bits[: params.bits] * weights).sum(0)
    if crypten.communicator.get().get_rank() == 0:
        mag = mag + 1
    z = bits[params.bits]
    signed = z - 2 * bits[params.bits + 1]  # Z − 2V ∈ {−1, 0, 1}
    if with_magnitude:
        a = ArithmeticSharedTensor.from_shares(torch.stack([signed, z]), precision=0)
        b = ArithmeticSharedTensor.from_shares(torch.stack([mag, mag]), precision=0)
        prod = a.mul(b).share
        return prod[0], prod[1]
    a = ArithmeticSharedTensor.from_shares(signed, precision=0)
    b = ArithmeticSharedTensor.from_shares(mag, precision=0)
    return a.mul(b).share, None


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
    share = ints.share * (1 << (FRAC_BITS - params.grid_bits))
    return MPCTensor.from_shares(share, precision=FRAC_BITS)


def ring_to_grid_units(revealed: torch.Tensor, grid_bits: int) -> torch.Tensor:
    """Decode a revealed ring value exactly into grid units (CrypTen's decode is off by one
    step for some negative values; see tests/mpc/test_grpc_communicator.py::_ring)."""
    return torch.div(revealed, 1 << (FRAC_BITS - grid_bits), rounding_mode="floor")


