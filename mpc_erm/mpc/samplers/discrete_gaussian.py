"""Discrete Gaussian inside CrypTen: CKS 2020 Algorithm 3 with exact acceptance coins
(see :mod:`.gaussian` for the construction, its exact PMF and why opening acceptance bits is safe).

Revealed rejection (the product's default, :func:`_sample_revealed`), with staircase candidates
(F fair low magnitude bits: free jointly random words, not coins; the square gains the linear
term 2μ·Z·R, see :mod:`.gaussian`): ≈ 1.05/ρ + 3σ candidates
per batch go through the candidate and acceptance circuits below as a single round, their
acceptance bits are opened, and the accepted ones are gathered locally; ≈ 1.3 candidates per
output at ρ ≈ 0.76 instead of R = 26.

Oblivious rounds: per batch of n outputs, R·n discrete Laplace candidates are drawn in parallel, then, on shares
only: N = (|D| − μ)² (one secure square of integers), its bits, the coins C_i (bit-sliced
comparisons of jointly random k-bit uniforms with public thresholds), fail_i = n_i ∧ ¬C_i,
accept = ⋀_i ¬fail_i, the exclusive prefix P_r = ⋀_{s<r} ¬accept_s (log-depth scan), the one-hot
selection sel_r = P_r ⊕ P_{r+1} (sel_{R−1} = P_{R−1}: the fallback), and the output is the
selected candidate. Nothing about which round accepted is revealed.

Schedule (what makes it fast; the circuit computes exactly the same function of the jointly
random bits as the plain description above, so the sampled law is unchanged):

* **One comparison chain for all coins.** The acceptance coins do not depend on the candidates,
  so the Laplace coins of the R candidates and the acceptance coins of the first R − 1 run as
  rows of one bit-sliced chain: k − 1 rounds in all instead of 2(k − 1), one triple request
  and one opening per round. Lanes: candidate (r, s) is lane s mod 64 of word ⌊s/64⌋ of row r.
* **|D| without a multiplication.** |D| = Z·(1 + G) = Z + Σ_j 2^j (Z ∧ b_j): the B ANDs are
  bit-sliced (one round), then |D| is linear in B2A'd bits.
* **Bits of N by a bit-sliced adder, not CrypTen's A2B.** Only bits < n_bits of N are used,
  and N < 2^n_bits, so they are the low bits of the sum of the parties' arithmetic shares
  mod 2^n_bits. Each party bit-slices its own share (local); a carry-save step turns the three
  addends into two (one AND per bit plane), and a ripple-carry adder adds those (one AND per
  bit plane and round). Every AND is on 64-lane words: ≈ 2·n_bits/64 ANDs per candidate,
  against CrypTen's A2B (two 64-bit Kogge–Stone adders, 26 word-ANDs per candidate).
* **Acceptance folded into the adder.** Bit i of N is known in round i of the ripple, so
  fail_i = n_i ∧ ¬C_i and the running ⋀ ¬fail_i are computed in the same rounds (their ANDs
  share the round's triple and opening).
* **Selection in binary.** The chosen candidate's bits (Z ∧ b_j, Z and its sign bit S) are
  ⊕_r sel_r ∧ x_r (one round of bit-sliced ANDs), so only n·(B + 2) bits go through B2A for the
  output (not R·n·(B + 2) plus an R·n-element product), and D = |D| − 2·S·|D| is one product
  of n elements.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..agreement import STALL_BITS, SamplerStall, stall_limit
from ..crypten_compat import import_crypten, plain
from .bits import LANES, and_many, and_words, b2a_bits, local_words, open_words, pack, party_rank, unpack
from .coins import random_coins, threshold_masks
from .discrete_laplace import laplace_parts
from .gaussian import DiscreteGaussianParams, candidates_for, ideal_acceptance_lower_bound
from .params import FRAC_BITS, MPC_MAX_COIN_BITS

crypten = import_crypten()
from crypten.config import cfg  # noqa: E402  (after the compat shim)
from crypten.mpc.mpc import MPCTensor  # noqa: E402
from crypten.mpc.primitives import arithmetic  # noqa: E402
from crypten.mpc.primitives.arithmetic import ArithmeticSharedTensor  # noqa: E402

__all__ = ["sample_discrete_gaussian", "sample_discrete_gaussian_integers"]


def _not(x: torch.Tensor) -> torch.Tensor:
    """XOR shares of ¬x (rank 0 flips its share; a new tensor everywhere)."""
    return ~x if party_rank() == 0 else x.clone()


def _ones_like(x: torch.Tensor) -> torch.Tensor:
    """XOR shares of all-ones words (rank 0 holds them)."""
    return torch.full_like(x, -1) if party_rank() == 0 else torch.zeros_like(x)


def _exclusive_prefix_and(q: torch.Tensor) -> torch.Tensor:
    """P_0 = 1, P_r = ⋀_{s<r} q_s for r = 0 … len(q) (Hillis–Steele scan, ⌈log2⌉ rounds)."""
    s = q.clone()
    step = 1
    while step < s.size(0):
        s = torch.cat([s[:step], and_words(s[step:], s[:-step])])
        step *= 2
    return torch.cat([_ones_like(q[:1]), s])


def _own_bit_planes(share: torch.Tensor, nbits: int) -> torch.Tensor:
    """Bit planes (nbits, rows, W) of this party's own int64 share (rows, n), LSB first, packed
    64 lanes per word like the coins (local, no communication)."""
    rows, n = share.shape
    w = -(-n // LANES)
    nbytes = -(-nbits // 8)
    raw = share.cpu().contiguous().numpy().view(np.uint8).reshape(rows, n, 8)[..., :nbytes]  # little endian
    bits = np.unpackbits(raw, axis=-1, count=nbits, bitorder="little")  # (rows, n, nbits)
    planes = np.zeros((nbits, rows, w * LANES), dtype=np.uint8)
    planes[:, :, :n] = np.moveaxis(bits, -1, 0)
    packed = np.packbits(planes, axis=-1, bitorder="little")  # (nbits, rows, 8W)
    return torch.from_numpy(packed.view(np.int64)).to(share.device)


def _carry_save(addends: list[tuple[torch.Tensor, bool]]) -> list[tuple[torch.Tensor, bool]]:
    """Reduce XOR-shared addends (bit planes LSB first, with a flag "plane 0 is zero") to two, by
    levels of carry-save adders (x, y, z) → (x ⊕ y ⊕ z, maj(x, y, z) << 1), the ANDs of a level
    in one round; maj(x, y, z) = ((x ⊕ z) ∧ (y ⊕ z)) ⊕ z (one AND per plane)."""
    while len(addends) > 2:
        groups = [addends[i : i + 3] for i in range(0, len(addends) - 2, 3)]
        rest = addends[3 * len(groups) :]
        pairs = []
        for (x, _), (y, _), (z, _) in groups:
            top = x.size(0) - 1  # the carry out of the top plane is dropped (mod 2^nbits)
            pairs.append((x[:top] ^ z[:top], y[:top] ^ z[:top]))
        prods = and_many(pairs)
        nxt = []
        for ((x, _), (y, _), (z, _)), p in zip(groups, prods):
            carry = torch.zeros_like(x)
            carry[1:] = p ^ z[:-1]
            nxt.append((x ^ y ^ z, False))
            nxt.append((carry, True))
        addends = nxt + rest
    return addends


def _acceptance(
    sq: torch.Tensor, params: DiscreteGaussianParams, coins: torch.Tensor, coin_index: dict[int, int]
) -> torch.Tensor:
    """XOR shares (rows, W) of accept = ⋀_i ¬(n_i ∧ ¬C_i) over the coin bits i of N = the value
    arithmetically shared in ``sq`` (rows, n); ``coins`` (compared coins, rows, W) with
    ``coin_index`` mapping bit i to its row (bits without an entry have coin ≡ 0).

    Bits of N: the parties' shares are the addends (party p's bit planes; the others hold 0 as
    their XOR share of it), reduced to two by carry-save adders (under replicated sharing made two
    by the provider's ``two_shares`` instead: one word a value, no AND), then added by a ripple-carry
    adder mod 2^n_bits. Round t of the ripple computes carry c_{t+1}, fail_t and one level of the
    running ⋀ over the ¬fail terms: the adder's rounds carry the acceptance test for free.
    """
    nbits = params.n_bits
    world = crypten.communicator.get().get_world_size()
    two_shares = getattr(crypten.mpc.get_default_provider(), "two_shares", None)
    if two_shares is not None:  # replicated sharing: one word a value makes the three shares two
        sq, world = two_shares(sq), 2  # (rss_provider), where a carry-save layer costs an AND a plane
    mine = _own_bit_planes(sq, nbits)
    rank = party_rank()
    addends = [(mine if q == rank else torch.zeros_like(mine), False) for q in range(world)]
    two = _carry_save(addends)
    if len(two) == 1:
        two.append((torch.zeros_like(mine), True))
    (a, _), (b, b0_zero) = two
    terms: list[torch.Tensor] = []  # XOR shares of ¬fail_i still to be ANDed together
    carry: torch.Tensor | None = None  # c_t; None: known to be 0
    for t in range(nbits):
        n_t = a[t] ^ b[t] if carry is None else a[t] ^ b[t] ^ carry
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        want_carry = t < nbits - 1 and not (carry is None and t == 0 and b0_zero)
        if want_carry:
            pairs.append((a[t], b[t]) if carry is None else (a[t] ^ carry, b[t] ^ carry))
        fail_slot = -1
        if t >= params.low_bit:
            row = coin_index.get(t)
            if row is None:  # threshold 0: coin ≡ 0, fail_t = n_t
                terms.append(_not(n_t))
            else:
                fail_slot = len(pairs)
                pairs.append((n_t, _not(coins[row])))
        npairs = len(terms) // 2
        first_term = len(pairs)
        pairs.extend((terms[2 * i], terms[2 * i + 1]) for i in range(npairs))
        out = and_many(pairs)
        new_terms = out[first_term:] + terms[2 * npairs :]
        if fail_slot >= 0:
            new_terms.append(_not(out[fail_slot]))
        terms = new_terms
        if want_carry:
            carry = out[0] if carry is None else out[0] ^ carry
        elif t < nbits - 1:
            carry = None
    while len(terms) > 1:
        npairs = len(terms) // 2
        terms = and_many([(terms[2 * i], terms[2 * i + 1]) for i in range(npairs)]) + terms[2 * npairs :]
    if not terms:  # no coin bits at all: every candidate is accepted
        return _ones_like(coins[0] if coins.size(0) else a[0])
    return terms[0]


def sample_discrete_gaussian_integers(
    params: DiscreteGaussianParams, n: int, device: Any = None
) -> ArithmeticSharedTensor:
    """n discrete Gaussian samples in grid units (ArithmeticSharedTensor, precision 0)."""
    if n < 1:
        raise ValueError("n must be positive")
    if params.k > MPC_MAX_COIN_BITS:
        raise ValueError(f"coin bits: the MPC's circuits compare at most {MPC_MAX_COIN_BITS}-bit coins, got {params.k} "
                         "(wider coins are for distributed noise, sampled by each party in the clear)")
    device = torch.device("cpu") if device is None else torch.device(device)
    if params.revealed:
        return _sample_revealed(params, n, device)
    r = params.rounds
    if r == 1:
        y1, _ = laplace_parts(params.laplace, n, device)
        return ArithmeticSharedTensor.from_shares(y1, precision=0)
    lap = params.laplace
    nb = lap.bits
    w = -(-n // LANES)
    jl = len(lap.thresholds)  # b_0 … b_{B−1}, Z
    coin_index, cmp_thresholds = _coin_rows(params)
    cmp_bits = list(coin_index)
    # 1. Every coin in one chain: rows (j, r) Laplace coin j of candidate round r, then rows
    #    (i, r) acceptance coin of bit i for the first R − 1 rounds.
    masks = torch.cat([
        threshold_masks(lap.thresholds, params.k, device).repeat_interleave(r, dim=1),
        threshold_masks(cmp_thresholds, params.k, device).repeat_interleave(r - 1, dim=1),
    ], dim=1)
    coins = random_coins(masks, w, device)
    lap_coins = coins[: jl * r].view(jl, r, w)
    acc_coins = coins[jl * r :].view(len(cmp_bits), r - 1, w)
    # 2. |D| = Z·(1 + G) = Z + Σ_j 2^j (Z ∧ b_j): the ANDs in binary (one round, 64 lanes a word),
    #    so that |D| is linear in bits: B2A, no multiplication. The sign S is a jointly random bit.
    z = lap_coins[nb]
    zb = and_words(lap_coins[:nb], z.unsqueeze(0))  # (B, R, W)
    sign = local_words((r, w), device)
    # 3. |D| of the first R − 1 candidates (the last is the fallback: no test needed), N's bits.
    abs_bits = b2a_bits(torch.cat([zb[:, : r - 1], z[None, : r - 1]]).reshape(-1, w), n).view(nb + 1, r - 1, n)
    mag = _weighted_sum(abs_bits)
    if party_rank() == 0:
        mag -= params.mu
    # The protocol's square directly: AST.square() would also "divide" by the scale 1 through a
    # wraps protocol (harmless, one wasted round).
    sq = plain(getattr(arithmetic, cfg.mpc.protocol).square(ArithmeticSharedTensor.from_shares(mag, precision=0)).share)
    accept = _acceptance(sq, params, acc_coins, coin_index)  # (R−1, W)
    prefix = _exclusive_prefix_and(_not(accept))  # (R, W): P_0 … P_{R−1}
    sel = torch.cat([prefix[:-1] ^ prefix[1:], prefix[-1:]])  # one-hot: first accepted, else last
    # 4. The selected candidate's bits, in binary: ⊕_r sel_r ∧ x_r (one-hot, so ⊕ = the chosen
    #    one) for x in (Z∧b_j, Z, S); then B2A of n·(B + 2) bits and D = |D|·(1 − 2S).
    planes = torch.cat([zb, z.unsqueeze(0), sign.unsqueeze(0)])  # (B + 2, R, W)
    chosen = _xor_reduce(and_words(planes, sel.unsqueeze(0)))  # (B + 2, W)
    bits = b2a_bits(chosen, n)  # (B + 2, n)
    abs_d = _weighted_sum(bits[: nb + 1].unsqueeze(1))[0]
    s_bit = ArithmeticSharedTensor.from_shares(bits[nb + 1], precision=0)
    s_abs = plain(s_bit.mul(ArithmeticSharedTensor.from_shares(abs_d, precision=0)).share)
    return ArithmeticSharedTensor.from_shares(abs_d - 2 * s_abs, precision=0)


def _coin_rows(params: DiscreteGaussianParams) -> tuple[dict[int, int], tuple[int, ...]]:
    """Bits of N that get a compared coin → their row; and those coins' thresholds."""
    cmp_bits = [i for i, c in enumerate(params.coin_thresholds, start=params.low_bit) if c > 0]
    return ({bit: row for row, bit in enumerate(cmp_bits)},
            tuple(params.coin_thresholds[bit - params.low_bit] for bit in cmp_bits))


def _sample_revealed(params: DiscreteGaussianParams, n: int, device: torch.device) -> ArithmeticSharedTensor:
    """Revealed rejection (:mod:`.gaussian`): per batch, m candidates and their acceptance bits
    exactly as one round of the oblivious sampler (one comparison chain for all coins, |D| by
    B2A of Z ∧ b_j, the bits of N by the bit-sliced adder with the test folded in); then the
    acceptance bits are opened and the accepted candidates kept, in order: selecting them is a
    local gather on shares, and only their signs go through B2A."""
    nc = params.laplace.bits  # compared magnitude bits (G'); the F = fair_bits below them are fair
    f = params.fair_bits
    proposal = params.proposal_thresholds  # G''s bits, then Z
    coin_index, cmp_thresholds = _coin_rows(params)
    masks = torch.cat([threshold_masks(proposal, params.k, device),
                       threshold_masks(cmp_thresholds, params.k, device)], dim=1)
    square = getattr(arithmetic, cfg.mpc.protocol).square
    mags: list[torch.Tensor] = []
    signs: list[torch.Tensor] = []
    need = n
    # half the ideal rate's lower bound: the coins' finite precision moves the real rate far less
    rejected, limit = 0, stall_limit(ideal_acceptance_lower_bound(params.t, params.mu) / 2)
    while need > 0:
        m = candidates_for(need, params, LANES)
        w = m // LANES
        coins = random_coins(masks, w, device)
        z = coins[nc]
        g_bits = coins[:nc] if not f else torch.cat([local_words((f, w), device), coins[:nc]])  # G's B bits
        zb = and_words(g_bits, z.unsqueeze(0))  # (B, W)
        bits = b2a_bits(torch.cat([zb, z[None]]), m).unsqueeze(1)  # (B + 1, 1, m)
        mag = _weighted_sum(bits)  # (1, m): |Y| = Z·(1 + G)
        centred = mag - params.mu if party_rank() == 0 else mag
        sq = plain(square(ArithmeticSharedTensor.from_shares(centred, precision=0)).share)
        if f:  # N = (|Y| − μ)² + 2μ·Z·R, R = G's fair low bits (module docstring of .gaussian)
            sq += 2 * params.mu * _weighted_sum(torch.cat([bits[:f], torch.zeros_like(bits[:1])]))
        accept = _acceptance(sq, params, coins[nc + 1 :].unsqueeze(1), coin_index)  # (1, W)
        idx = torch.nonzero(unpack(open_words(accept), m)[0]).flatten()[:need].to(device)
        if idx.numel() == 0:
            rejected += m
            if rejected > limit:
                raise SamplerStall(f"the discrete Gaussian sampler rejected {rejected} candidates in a row (an honest "
                                   f"run rejects more than {limit} with probability < 2^-{STALL_BITS}): the compute "
                                   "parties' shares or random streams disagree; nothing was revealed")
            continue
        rejected = 0
        sign = local_words((1, w), device)
        signs.append(b2a_bits(pack(unpack(sign, m)[:, idx]), idx.numel())[0])
        mags.append(mag[0, idx])
        need -= idx.numel()
    abs_d = torch.cat(mags)
    s_bit = ArithmeticSharedTensor.from_shares(torch.cat(signs), precision=0)
    s_abs = plain(s_bit.mul(ArithmeticSharedTensor.from_shares(abs_d, precision=0)).share)
    return ArithmeticSharedTensor.from_shares(abs_d - 2 * s_abs, precision=0)


def _weighted_sum(bits: torch.Tensor) -> torch.Tensor:
    """Arithmetic shares of Z + Σ_j 2^j·(Z ∧ b_j) from those of (Z∧b_0, …, Z∧b_{B−1}, Z) (dim 0)."""
    nb = bits.size(0) - 1
    out = bits[nb].clone()
    for j in range(nb):
        out += bits[j] << j
    return out


def _xor_reduce(x: torch.Tensor) -> torch.Tensor:
    """⊕ over dim 1 (local on XOR shares)."""
    out = x[:, 0].clone()
    for i in range(1, x.size(1)):
        out ^= x[:, i]
    return out


def sample_discrete_gaussian(params: DiscreteGaussianParams, n: int, device: Any = None) -> MPCTensor:
    """n discrete Gaussian samples in real units (D · 2^-grid_bits) with CrypTen's encoder."""
    ints = sample_discrete_gaussian_integers(params, n, device)
    share = plain(ints.share) * (1 << (FRAC_BITS - params.grid_bits))
    return MPCTensor.from_shares(share, precision=FRAC_BITS)
