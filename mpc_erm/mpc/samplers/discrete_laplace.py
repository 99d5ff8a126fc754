"""Discrete Laplace noise sampled inside CrypTen from jointly random bits.

Algorithm (the distribution is fixed by :class:`.params.DiscreteLaplaceParams`; its exact PMF
is :func:`.pmf.log_pmf`):

1. **Jointly random bits.** Every party draws its own local 64-bit words (CrypTen's per-party
   ``local`` generator, seeded from os.urandom) and uses them as its XOR share. The shared value
   is the XOR of all shares: uniform as long as one party's words are, so no proper subset of
   parties controls or knows it (Champion–shelat–Ullman, CCS'19). Each word is one full 64-bit
   output of the generator (torch's full-range ``random_(−2^63, None)`` kernel returns
   ``random64()`` as is), so every word is exactly uniform; CrypTen's
   ``generate_random_ring_element`` is not used: it never produces 2^63 − 1.
2. **Biased coins by comparison with public constants, bit-sliced.** For coin j, U_j < c_j with
   U_j a jointly random k-bit uniform, so P(coin = 1) = c_j/2^k exactly. 64 samples share a word
   (bit plane i of 64 different U's). Two circuits: a chain LSB → MSB with k − 1 ANDs
   (:func:`_less_than_public_chain`, default), or a ⌈log2 k⌉-round tree MSB first with ≈ 2k ANDs:
   leaf lt = ¬u ∧ c, eq = ¬(u ⊕ c) (local: c is public); merge lt = lt_hi ⊕ (eq_hi ∧ lt_lo),
   eq = eq_hi ∧ eq_lo (⊕ suffices: lt_hi and eq_hi exclude each other). Every AND is a binary
   Beaver AND on whole 64-lane words with the provider's triples (:func:`_and_many`: the
   independent ANDs of one round share one triple request and one opening). The chain draws
   each bit plane of the U's when it needs it (planes are independent, so U is still uniform),
   which keeps k − 1 planes out of memory.

   Where the chain's planes come from (:data:`COIN_PLANES`). "local": as in 1. "triple"
   (default): the LSB plane as in 1, every other plane U_i = a ⊕ s with a the first component
   of the Beaver triple of the round that consumes U_i and s public words from CrypTen's
   ``global`` generator (seeded by the computing parties; the dealer does not take part). The
   AND's opening ε = (U_i ⊕ ¬c_i) ⊕ a = s ⊕ ¬c_i is then known without a message, so a round
   opens only δ: half the bytes of the chain, the cost that dominates this sampler. The law is
   the same (a is uniform, independent of the opened δ's and used nowhere else), and so is who
   can know U_i: not a party (a is XOR-shared), not the provider alone (it lacks s), but the
   provider together with any one party — exactly as with local planes, where that coalition
   gets U_i = ε ⊕ a ⊕ ¬c_i from the opened ε. (A malicious provider could choose a; it can
   already flip any AND's output through c.)
3. **Sign × magnitude.** Magnitude bits b_0…b_{B−1}, the "non-zero" coin Z, a fair sign bit S
   (a jointly random bit, exactly 1/2) and V = Z ∧ S (one more word-AND round).
4. **To arithmetic.** The B + 2 bits of each sample are unpacked locally (XOR shares are
   bitwise) and converted with CrypTen's single-bit B2A trick (mask with the provider's random
   bit r, open x ⊕ r — here opened *packed*, 64 bits per word, 64× fewer bytes than CrypTen's
   ``B2A_single_bit`` — then x = r + z − 2rz, computed as (r ⊕ −z) + z: −r = ¬r + 1).
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

import numpy as np
import torch

from ..crypten_compat import import_crypten, plain
from .params import FRAC_BITS, DiscreteLaplaceParams

crypten = import_crypten()
from crypten.mpc.mpc import MPCTensor  # noqa: E402  (after the compat shim)
from crypten.mpc.primitives.arithmetic import ArithmeticSharedTensor  # noqa: E402

__all__ = ["laplace_parts", "ring_to_grid_units", "sample_discrete_laplace", "sample_discrete_laplace_integers"]

_LANES = 64
COMPARISON = "chain"  # "chain": k − 1 ANDs, k − 1 rounds; "tree": ≈ 2k ANDs, ⌈log2 k⌉ rounds
# Where the chain's bit planes of U come from (module docstring, 2): "local": XOR of the parties'
# local words (each AND opens ε and δ); "triple": the round's triple's a ⊕ public words (opens δ
# only; the same law, the same who-can-know-what).
COIN_PLANES = "triple"
_LANE_SHIFTS = torch.arange(_LANES, dtype=torch.long)
_BXOR = torch.distributed.ReduceOp.BXOR
_INT64_MIN = -(1 << 63)


def _rank() -> int:
    return crypten.communicator.get().get_rank()


def _local_words(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Exactly uniform int64 words from this party's private generator (one random64() each)."""
    g = crypten.generators["local"][device]
    return torch.empty(shape, dtype=torch.long, device=device).random_(_INT64_MIN, None, generator=g)


def _and_many(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """XOR shares of x ∧ y for every (x, y) in ``pairs``: independent ANDs of one round with ONE
    binary triple from the provider and ONE opening (CrypTen's ``beaver.AND`` per pair would make
    one provider request and one all-reduce each).

    Beaver: open ε = x ⊕ a, δ = y ⊕ b; party p keeps c_p ⊕ (ε ∧ y_p) ⊕ (a_p ∧ δ), whose XOR over
    the parties is ab ⊕ ε(δ ⊕ b) ⊕ aδ = (ε ⊕ a)(δ ⊕ b) = x ∧ y. Same openings as CrypTen's AND.
    """
    if not pairs:
        return []
    shapes = []
    xs, ys = [], []
    for x, y in pairs:
        x, y = torch.broadcast_tensors(x, y)
        shapes.append(x.shape)
        xs.append(x.reshape(-1))
        ys.append(y.reshape(-1))
    x = xs[0] if len(xs) == 1 else torch.cat(xs)
    y = ys[0] if len(ys) == 1 else torch.cat(ys)
    provider = crypten.mpc.get_default_provider()
    native = getattr(provider, "and_shares", None)
    if native is not None:  # replicated sharing: no triple, half the bytes (rss_provider)
        return _split(native(x, y), shapes)
    a, b, c = (plain(t.share) for t in provider.generate_binary_triple(x.size(), y.size(), device=x.device))
    m = x.numel()
    # ε and δ travel as ONE tensor: the transport's cost per message (not per byte) dominates
    # rounds of small and medium size.
    masked = torch.empty(2 * m, dtype=x.dtype, device=x.device)
    torch.bitwise_xor(x, a, out=masked[:m])
    torch.bitwise_xor(y, b, out=masked[m:])
    opened = _open(masked)
    eps, delta = opened[:m], opened[m:]
    z = torch.bitwise_and(eps, y)
    z ^= c
    z ^= torch.bitwise_and(a, delta, out=a)  # a is ours (fresh from the provider)
    return _split(z, shapes)


def _split(z: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    """The flat result of :func:`_and_many` cut back into its pairs' shapes."""
    if len(shapes) == 1:
        return [z.view(shapes[0])]
    out, off = [], 0
    for s in shapes:
        m = s.numel()
        out.append(z[off : off + m].view(s))
        off += m
    return out


def _open(share: torch.Tensor) -> torch.Tensor:
    """Reveal an XOR-shared tensor to every party (one all-reduce)."""
    return crypten.communicator.get().all_reduce(share, op=_BXOR)


def _and(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """XOR shares of x ∧ y (one Beaver AND round on whole words)."""
    return _and_many([(x, y)])[0]


def _public_xor(share: torch.Tensor, public: torch.Tensor | int) -> torch.Tensor:
    """XOR a public value into a shared one: only rank 0 applies it."""
    if _rank() == 0:
        return share ^ public
    return share.clone() if isinstance(public, int) else share ^ torch.zeros_like(public)


def _threshold_masks(thresholds: tuple[int, ...], k: int, device: torch.device) -> torch.Tensor:
    """(k, J, 1) int64: plane i (MSB first) is all-ones where bit k−1−i of c_j is set."""
    planes = [[-1 if (c >> (k - 1 - i)) & 1 else 0 for c in thresholds] for i in range(k)]
    return torch.tensor(planes, dtype=torch.long, device=device).view(k, len(thresholds), 1)


def _less_than_public_chain(u: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """[U < c] with k − 1 ANDs in k − 1 rounds (half the ANDs of the tree; the default, since
    batches are large and a round costs little next to the triples).

    LSB first, r = [U mod 2^i < c mod 2^i]: r_0 = ¬u_0 ∧ c_0 (local);
    r_i = c_i ? ¬u_i ∨ r : ¬u_i ∧ r, which is (α ∧ β) ⊕ c_i with α = u_i ⊕ ¬c_i, β = r ⊕ c_i.
    """
    k = u.size(0)
    return _chain(lambda i: u[i], masks, k)


def _chain(plane: Any, masks: torch.Tensor, k: int) -> torch.Tensor:
    """The chain of :func:`_less_than_public_chain` on bit planes ``plane(i)`` (i = 0 is the MSB),
    asked for LSB first; rank 0 applies the public constants (in place on fresh tensors)."""
    rank0 = _rank() == 0
    u = plane(k - 1)
    r = (~u if rank0 else u) & masks[k - 1]
    for i in range(k - 2, -1, -1):
        u = plane(i)
        if rank0:
            alpha = u ^ ~masks[i]
            r ^= masks[i]
        else:
            alpha = u
        r = _and(alpha, r)
        if rank0:
            r ^= masks[i]
    return r


def _public_words(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Exactly uniform int64 words that every party draws identically from CrypTen's ``global``
    generator (its seed is shared by the computing parties only: the dealer does not take part
    in CrypTen's seed set-up, rank ≥ world size)."""
    g = crypten.generators["global"][device]
    return torch.empty(shape, dtype=torch.long, device=device).random_(_INT64_MIN, None, generator=g)


def _chain_triple_planes(masks: torch.Tensor, words: int, device: torch.device) -> torch.Tensor:
    """The chain of :func:`_less_than_public_chain` where plane i < k − 1 of U is a ⊕ s: a the
    first component of the round's Beaver triple (uniform; its XOR shares are held by the
    parties, its value known to the provider only) and s public words (:func:`_public_words`,
    known to the parties only). Then α = U_i ⊕ ¬c_i has ε = α ⊕ a = s ⊕ ¬c_i: public without any
    message, and each round opens δ = β ⊕ b only (half the bytes, no local words drawn).

    The law is unchanged: a is uniform and used nowhere else, so U_i = a ⊕ s is uniform and
    independent of everything opened (the δ's, masked by the b's). The knowledge is unchanged
    too: U_i is known to a coalition holding a and s (the provider with a party) and to no one
    alone — as with local planes, whose opened ε = U_i ⊕ ¬c_i ⊕ a gives U_i to the same
    coalition. The LSB plane needs no AND and stays a local-words plane.
    """
    k, j = masks.size(0), masks.size(1)
    rank0 = _rank() == 0
    provider = crypten.mpc.get_default_provider()
    u = _local_words((j, words), device)
    r = (~u if rank0 else u) & masks[k - 1]
    size = torch.Size((j, words))
    for i in range(k - 2, -1, -1):
        a, b, c = (plain(t.share) for t in provider.generate_binary_triple(size, size, device=device))
        eps = _public_words((j, words), device)
        eps ^= ~masks[i]
        if rank0:
            r ^= masks[i]  # β = r ⊕ c_i
        b ^= r
        delta = _open(b)
        z = torch.bitwise_and(eps, r, out=eps)  # ε ∧ β_p
        z ^= c
        z ^= torch.bitwise_and(a, delta, out=a)
        if rank0:
            z ^= masks[i]
        r = z
    return r


def _chain_replicated_planes(masks: torch.Tensor, words: int, device: torch.device, provider: Any) -> torch.Tensor:
    """The chain of :func:`_less_than_public_chain` under replicated sharing: each round's plane
    U_i comes replicated from the pair keystreams inside ``provider.and_random``, which
    returns (U_i ⊕ ¬c_i) ∧ β with only β sent, to one party (rss_provider, native ANDs): half the
    bytes of :func:`_chain_triple_planes`, and no triple. Same law: every U_i is exactly uniform,
    independent of the other planes and of everything sent (β under the zero sharing); no party
    holds all three components of any U_i (honest majority, the RSS trust model). The LSB plane
    needs no AND and stays a local-words plane."""
    k, j = masks.size(0), masks.size(1)
    rank0 = _rank() == 0
    u = _local_words((j, words), device)
    r = (~u if rank0 else u) & masks[k - 1]
    for i in range(k - 2, -1, -1):
        if rank0:
            r ^= masks[i]  # β = r ⊕ c_i
        r = provider.and_random(r, ~masks[i])  # α = U_i ⊕ ¬c_i
        if rank0:
            r ^= masks[i]
    return r


def _random_coins(masks: torch.Tensor, words: int, device: torch.device) -> torch.Tensor:
    """XOR shares (J, words) of bit-sliced coins [U < c_j], U fresh jointly random k-bit uniforms
    (k = masks.size(0)), with the configured circuit; the chain draws each plane when it needs it."""
    k, j = masks.size(0), masks.size(1)
    if COMPARISON == "tree":
        return _less_than_public_tree(_local_words((k, j, words), device), masks)
    provider = crypten.mpc.get_default_provider()
    if hasattr(provider, "and_random"):  # replicated sharing: planes made without a message
        return _chain_replicated_planes(masks, words, device, provider)
    if COIN_PLANES == "triple":
        return _chain_triple_planes(masks, words, device)
    return _chain(lambda i: _local_words((j, words), device), masks, k)


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
            p_lt, p_eq = _and_many([(eq_hi, lt_lo), (eq_hi, eq_lo)])
            new_lt, new_eq = lt_hi ^ p_lt, p_eq
        if n % 2:
            new_lt = torch.cat([new_lt, lt[-1:]])
            new_eq = torch.cat([new_eq, eq[-1:]])
        lt, eq = new_lt, new_eq
    return lt[0]


def _unpack(words: torch.Tensor, n: int) -> torch.Tensor:
    """(C, W) words → (C, n) bits (lane l of word w is element w·64 + l). Works on XOR shares
    and on public words alike."""
    if words.device.type == "cpu":
        return torch.from_numpy(_unpack_u8(words, n)).long()
    bits = (words.unsqueeze(-1) >> _LANE_SHIFTS.to(words.device)) & 1
    return bits.reshape(words.size(0), -1)[:, :n]


def _unpack_u8(words: torch.Tensor, n: int) -> np.ndarray:
    """(C, W) int64 words → (C, n) uint8 bits (CPU; little-endian lanes: lane l is bit l)."""
    raw = words.contiguous().numpy().view(np.uint8)  # (C, 8W): byte b of word w = bits 8b … 8b+7
    return np.unpackbits(raw, axis=-1, count=n, bitorder="little")


def _pack(bits: torch.Tensor) -> torch.Tensor:
    """(C, n) bits (0/1, any integer dtype) → (C, W) words, the inverse of :func:`_unpack`
    (zero-padded lanes)."""
    c, n = bits.shape
    w = -(-n // _LANES)
    if bits.device.type == "cpu":
        b8 = bits.to(torch.uint8)
        if n != w * _LANES:
            b8 = torch.nn.functional.pad(b8, (0, w * _LANES - n))
        packed = np.packbits(b8.numpy(), axis=-1, bitorder="little")  # (C, 8W) uint8, contiguous
        return torch.from_numpy(packed.view(np.int64))
    padded = torch.zeros(c, w * _LANES, dtype=torch.long, device=bits.device)
    padded[:, :n] = bits
    return (padded.reshape(c, w, _LANES) << _LANE_SHIFTS.to(bits.device)).sum(-1)


B2A_CHUNK = 1 << 19  # bits converted at a time: bounds the int64 temporaries (≈ 5 × 4 MiB)


def _b2a_bits(words: torch.Tensor, n: int) -> torch.Tensor:
    """Arithmetic shares (C, n) of the bits held XOR-shared in ``words`` (C, W).

    CrypTen's single-bit B2A (the provider's random bit r as both arithmetic rA and binary rB;
    open x ⊕ r; x = rA + z − 2·z·rA), with x ⊕ r opened packed 64 per word. Rows are converted
    in chunks of about :data:`B2A_CHUNK` bits (a 2^17-sample Gaussian batch converts ≈ 4·10^6:
    one chunk would hold ≈ 150 MB of int64 temporaries per party).
    """
    rows = words.size(0)
    per = max(1, B2A_CHUNK // max(1, n))
    if rows > per:
        out = torch.empty((rows, n), dtype=torch.long, device=words.device)
        for i in range(0, rows, per):
            out[i : i + per] = _b2a_bits(words[i : i + per], n)
        return out
    provider = crypten.mpc.get_default_provider()
    size = (words.size(0), n)
    r_a, r_b = provider.B2A_rng(torch.Size(size), device=words.device)
    # XOR share of the r bit: bit 0 of each party's share. Padding lanes (≥ n) carry r = 0 and so
    # open their x: those are coins of samples that do not exist, independent of every used one.
    masked = words ^ _pack(plain(r_b.share) & 1)
    z = _open(masked)
    # x = rA + z − 2·z·rA is rA where z = 0 and 1 − rA where z = 1. Per share, with m = −z (0 or
    # all ones): rA ⊕ m is rA or ¬rA = −rA − 1, so (rA ⊕ m) − m is rA or −rA; rank 0 then adds
    # z = −m once more.
    if words.device.type == "cpu":
        m = torch.from_numpy(_unpack_u8(z, n)).long().neg_()
    else:
        m = _unpack(z, n).neg_()
    share = plain(r_a.share) ^ m
    share -= m
    if _rank() == 0:
        share -= m
    return share


def _laplace_values(
    params: DiscreteLaplaceParams, coins: torch.Tensor, n: int, magnitude_rows: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Arithmetic shares (G, n) of D from XOR-shared coin words ``coins`` (J, G, W) (row g holds
    n samples in its lanes), and of |D| for the first ``magnitude_rows`` rows (one multiplication
    gives both)."""
    device = coins.device
    b = params.bits
    g, w = coins.size(1), coins.size(2)
    sign = _local_words((g, w), device)  # jointly random fair bits
    v = _and(coins[-1], sign)  # Z ∧ S
    bits = _b2a_bits(torch.cat([coins, v.unsqueeze(0)]).view(-1, w), n).view(b + 2, g, n)  # b_0…b_{B−1}, Z, V
    mag = bits[0].clone()
    for j in range(1, b):
        mag += bits[j] << j
    if _rank() == 0:
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
    device = torch.device("cpu") if device is None else torch.device(device)
    w = -(-n // _LANES)
    coins = _random_coins(_threshold_masks(params.thresholds, params.k, device), w, device)  # (J, W)
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


