"""Validated contributions: every contribution checked on its shares against its public ℓ2 bound
before it enters a sum, one bit (valid / invalid) revealed per contribution.

Why: an additive share is uniform, so no compute party can look at what a contributor sent. One
data owner sending 10⁶× its bound, a NaN bit pattern, or its share of another round (a uniform
ring value once the other parties' derived shares are added) used to move the release by up to
10¹⁴ and the job "succeeded". The noise does not depend on the inputs, so a bad contribution
spends nobody's privacy (the DP guarantee of an honest member holds whatever the others send);
what it destroys is the model. This module is the integrity check.

Setting. The compute parties hold additive int64 shares ``X_i`` (n × p) of n contributions
``x_o ∈ Z_{2^64}^p`` on the job's grid (units of 2^-g) and one public bound ``M_o`` (grid units)
per contribution; an honest contribution's centred representative x̃_o ∈ [−2^63, 2^63)^p has
‖x̃_o‖₂ ≤ M_o. The check (:func:`check_contributions`, one batch for a round's contributions):

1. **Challenge.** A key no contributor can predict: each compute party's fresh 32 bytes,
   all-gathered *after* the contributions are fixed (the round closed), hashed. From it, λ public
   projection rows r_j ∈ {−1, 0, +1}^p (P = ¼, ½, ¼).
2. **Projections**, local: y_oj = ⟨r_j, x_o⟩ in the ring, each party on its own shares.
3. **Squared norm**, in the MPC, in chunks of c coordinates: S_ok = Σ_{i∈chunk k} x_oi²
   (CrypTen's square: a Beaver square pair from the dealer, or local cross terms under RSS), and a
   tree of partial sums over them, G at a time (G·M² < 2^62), up to the whole norm.
4. **One comparison batch** over the flags y > τ, −y > τ, S_ok > M² and every partial sum > M²:
   their signs on bit planes, 64 flags a word (:func:`_signs`), OR-ed per contribution by a tree
   of ANDs; that bit alone is opened.

Soundness (a contribution that passes has ‖x̃‖₂ ≤ M, except with probability ≤ 2^-λ). The
cyclic distance |·|_c on Z_{2^64} obeys the triangle inequality. Fix a coordinate i with
|x̃_i| > 2τ and condition on the other coefficients of r_j: y ∈ {c − x_i, c, c + x_i}. If
|c|_c ≤ τ then |c ± x_i|_c > τ, so y passes only when r_ji = 0 (probability ½); if |c|_c > τ it
passes only when r_ji ≠ 0 (½). So a vector with ‖x̃‖_∞ > 2τ passes λ independent rows with
probability ≤ 2^-λ — whatever its 2-adic structure (a projection with ±1 coefficients alone is
fooled by x_i = 2^63). Otherwise every |x̃_i| ≤ 2τ, the chunk size keeps c·(2τ)² < 2^62, so each
S_ok is the exact integer, in [0, 2^62). A partial sum adds at most G values each checked to be
an integer in [0, M²], so it is exact too (G·M² < 2^62), in [0, G·M²], and checked ≤ M² in its
turn: by induction up the tree every node is the exact integer it stands for, and the root's
check "Σ S ≤ M²" is exactly ‖x̃‖₂ ≤ M. (Summing the chunks at once, as the check did before,
needed ⌈p/c⌉·M² < 2^62: a million coordinates at a useful grid did not fit.) A NaN bit pattern,
a replayed or foreign share (uniform in the ring once added to fresh derived shares) and 10⁶×
the bound all fail.

Completeness (an honest contribution always passes): |⟨r, x̃⟩| ≤ ‖r‖₂·‖x̃‖₂ ≤ √nnz(r)·M
(Cauchy–Schwarz), so τ = ⌊√(nnz·M²)⌋ never refuses one. For large p that τ wastes headroom, and
τ = ⌈T·M⌉, T = √(2 ln 2^81), is used where smaller: the projection is a sum of independent
symmetric terms with |r_i x̃_i| ≤ |x̃_i|, so Hoeffding gives P(|y| > τ) ≤ 2^-80 per row.

What is revealed: one bit per contribution, always 1 for an honest one. Each compute party's
comparisons and squares are CrypTen's, under the job's trust model (semi-honest compute parties:
with a dealer, or 3-party replicated sharing). The contributors may deviate arbitrarily in what
they send; a compute party that deviates from this protocol is not caught here.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass

import torch

from mpc_erm.privacy.plan import PrivacyPlan

from .agreement import agree_on
from .crypten_compat import import_crypten
from .projections import projection_rows, projection_threshold

crypten = import_crypten()
from crypten.config import cfg  # noqa: E402  (after the compat shim)
from crypten.mpc.primitives import beaver, replicated  # noqa: E402
from crypten.mpc.primitives.arithmetic import ArithmeticSharedTensor  # noqa: E402

from .samplers.bits import LANES, and_many, local_words, open_words, pack, public_xor, unpack  # noqa: E402

__all__ = ["CHECK_PROJECTIONS", "CheckPlan", "RoundCheck", "ValidationError", "bound_units", "check_contributions",
           "projection_rows"]

#: λ: a contribution outside its bound passes with probability ≤ 2^-λ (module docstring).
CHECK_PROJECTIONS = 48
_ROOM = 1 << 62  # exact integers: every intermediate stays below 2^62 in the int64 ring
#: Coordinates squared at a time (bounds the MPC's temporaries: ≈ 5 int64 tensors of this size).
BATCH_ELEMENTS = 1 << 21
#: Coordinates squared at a time by the local (replicated) square: a buffer that stays in cache.
LOCAL_ELEMENTS = 1 << 18
_DOMAIN = b"mpc-erm contribution check v1"


class ValidationError(ValueError):
    """The bounds of a job do not fit the check's exact ring arithmetic (nothing was run)."""


def bound_units(bound: float, grid_bits: int, dim: int) -> int:
    """M in grid units for a real ℓ2 bound: an honest ``round(v·2^g)`` with ‖v‖₂ ≤ ``bound``
    has ‖·‖₂ ≤ bound·2^g + √p/2 (each coordinate rounds by ≤ ½); ``PrivacyPlan.BOUND_SLACK`` and
    one unit more for the float arithmetic of the clip."""
    if not (bound >= 0 and math.isfinite(bound)):
        raise ValueError(f"bound: a finite non-negative ℓ2 bound expected, got {bound!r}")
    return math.ceil(bound * (1.0 + PrivacyPlan.BOUND_SLACK) * 2.0**grid_bits) + math.ceil(math.sqrt(dim) / 2.0) + 1


@dataclass(frozen=True)
class CheckPlan:
    """The public parameters of one round's check, the same at every compute party."""

    dim: int
    bounds: tuple[int, ...]  # M_o, grid units, one per contribution (in the order of the shares)
    projections: int = CHECK_PROJECTIONS

    def __post_init__(self) -> None:
        if self.dim < 1 or self.projections < 1:
            raise ValueError("dim and projections must be positive")
        if any(m < 0 for m in self.bounds):
            raise ValueError("bounds must be non-negative")
        top = max(self.bounds, default=0)
        tau = self.threshold(top, self.dim)
        if 4 * tau * tau >= _ROOM:
            raise ValidationError(f"a contribution bound of {top} grid units leaves no room for the exact squared norm "
                                  "in the int64 ring (|projection| ≤ 2^30 needed): use a coarser grid")
        if 2 * top * top >= _ROOM:
            raise ValidationError(f"a contribution bound of {top} grid units leaves no room for two squared norms "
                                  "in the int64 ring (M² < 2^61 needed): use a coarser grid")

    @staticmethod
    def threshold(m: int, nnz: int) -> int:
        """τ for a row with ``nnz`` non-zero coefficients and a bound of ``m`` units (module doc)."""
        return projection_threshold(m, nnz)

    @property
    def chunk(self) -> int:
        """c: coordinates per exact partial sum, c·(2τ)² < 2^62 for the largest τ."""
        tau = self.threshold(max(self.bounds, default=0), self.dim)
        return max(1, min(self.dim, (_ROOM - 1) // max(1, 4 * tau * tau)))

    @property
    def chunks(self) -> int:
        return -(-self.dim // self.chunk)

    @property
    def fan_in(self) -> int:
        """G: partial sums added at a time up the tree, G·M² < 2^62 for the largest M (≥ 2)."""
        top = max(self.bounds, default=0)
        return max(2, (_ROOM - 1) // max(1, top * top))

    def levels(self) -> list[int]:
        """The widths of the partial-sum tree's levels above the chunks, ending with the root (1);
        empty with one chunk (its flag is the whole norm's)."""
        out, width = [], self.chunks
        while width > 1:
            width = -(-width // self.fan_in)
            out.append(width)
        return out


def _joint_key(comm: object) -> bytes:
    """A key no contributor can know in advance: every compute party's fresh 32 bytes, exchanged
    now (after the contributions are fixed), hashed in rank order."""
    mine = torch.frombuffer(bytearray(secrets.token_bytes(32)), dtype=torch.long).clone()
    every = comm.all_gather(mine)  # type: ignore[attr-defined]
    h = hashlib.sha256(_DOMAIN)
    for part in every:
        h.update(part.numpy().tobytes())
    return h.digest()


def _square(x: ArithmeticSharedTensor) -> ArithmeticSharedTensor:
    """Shares of x² (integers, no truncation) by the job's protocol."""
    protocol = replicated if cfg.mpc.protocol == "replicated" else beaver
    return protocol.square(x)


def _public(values: torch.Tensor) -> torch.Tensor:
    """A public int64 tensor as this party's additive share of it (rank 0 holds it)."""
    return values if crypten.communicator.get().get_rank() == 0 else torch.zeros_like(values)


def _group_sums(values: torch.Tensor, group: int) -> torch.Tensor:
    """(rows, k) → (rows, ⌈k/group⌉): the sums of ``group`` consecutive columns (the last group may
    be shorter), in the ring like the shares — a chunk's squares (group c) and each level of the
    partial-sum tree (group G) alike."""
    rows, k = values.shape
    if group >= k:
        return values.sum(1, keepdim=True)
    full = (k // group) * group
    sums = values[:, :full].reshape(rows, -1, group).sum(-1)
    return sums if full == k else torch.cat([sums, values[:, full:].sum(1, keepdim=True)], dim=1)


def _chunk_squares(shares: torch.Tensor, plan: CheckPlan, following: torch.Tensor | None) -> torch.Tensor:
    """This party's shares of S_ok (n × chunks).

    With ``following`` (replicated sharing, the next party's shares at hand) this party's share
    of x² is x_i² + 2·x_i·x_{i+1} — the three parties' terms add up to (x_0 + x_1 + x_2)² — and
    the chunk sums are re-randomised with a pseudo-random sharing of zero (ABY3's α_i): no
    message. It is computed a few rows at a time in one reused buffer (:data:`LOCAL_ELEMENTS`):
    over a whole block at once, the temporaries' page faults cost 9× the arithmetic. Without
    ``following``: CrypTen's square (a dealer's Beaver pair, or its replicated product),
    :data:`BATCH_ELEMENTS` at a time."""
    n, p = shares.shape
    out = torch.empty(n, plan.chunks, dtype=torch.long)
    if following is None:
        step = max(1, BATCH_ELEMENTS // p)
        for a in range(0, n, step):
            z = _square(ArithmeticSharedTensor.from_shares(shares[a:a + step], precision=0)).share
            out[a:a + step] = _group_sums(z, plan.chunk)
        return out
    step = max(1, LOCAL_ELEMENTS // p)
    buf = torch.empty(min(step, n), p, dtype=torch.long)
    for a in range(0, n, step):
        x = shares[a:a + step]
        z = buf[:x.shape[0]]
        torch.add(x, following[a:a + step], alpha=2, out=z)  # wraps in the ring like the shares
        z.mul_(x)
        out[a:a + step] = _group_sums(z, plan.chunk)
    return out + ArithmeticSharedTensor.PRZS((n, plan.chunks)).share


#: The masks of a 64 × 64 bit-matrix transpose's six swap steps: bits c with c & j == 0.
#: (Bit 63 is never among them: each mask is a non-negative int64.)
_TRANSPOSE_STEPS = tuple((j, sum(1 << c for c in range(64) if not c & j)) for j in (32, 16, 8, 4, 2, 1))


def _planes(values: torch.Tensor) -> torch.Tensor:
    """(64, W) words: plane j holds bit j of each of the N int64 ``values``, packed 64 a word
    (lane l of word w is value w·64 + l, as :func:`~.samplers.bits.pack` packs).

    Every 64 values are a 64 × 64 bit matrix (row l = value l, column j = bit j), transposed in
    place by six block swaps (Hacker's Delight §7-3): rows k and k + j exchange the bits c with
    c & j set in row k against those with c & j clear in row k + j. Ten times faster than
    unpacking every bit to a byte."""
    n = int(values.numel())
    w = -(-n // LANES)
    a = torch.zeros(w * LANES, dtype=torch.long)
    a[:n] = values.reshape(-1)
    for j, mask in _TRANSPOSE_STEPS:
        pairs = a.view(w, LANES // (2 * j), 2, j)
        lo, hi = pairs[:, :, 0, :], pairs[:, :, 1, :]
        t = ((lo >> j) ^ hi) & mask  # the arithmetic shift's sign bits fall in c & j ≠ 0: masked away
        hi ^= t
        lo ^= t << j
    return a.view(w, LANES).t().contiguous()


def _junk_padding(words: torch.Tensor, n: int) -> torch.Tensor:
    """``words`` (C, W) with the lanes past the n-th of the last word XORed with this party's own
    random bits. Lanes never mix (every gate is lane-wise), so those lanes' values are never read;
    random ones make every word of every message a full-entropy word, where zero padding would
    send low-entropy words that look like small numbers."""
    pad = words.shape[-1] * LANES - n
    if pad > 0:
        junk = local_words(tuple(words.shape[:-1]), words.device) & ~((1 << (LANES - pad)) - 1)
        words[..., -1] ^= junk
    return words


def _ones(shape: tuple[int, ...]) -> torch.Tensor:
    """An XOR sharing of all-ones words (rank 0 holds them)."""
    return public_xor(torch.zeros(shape, dtype=torch.long), -1)


def _signs(values: torch.Tensor) -> torch.Tensor:
    """XOR shares of the sign bits of the N ring values whose additive shares (this party's) are
    ``values``, packed 64 a word (W,) — a comparison with zero on bit planes, 64 values per word.

    Each party's share is a trivially XOR-shared input (its bit planes here, zero elsewhere). Under
    3-party replicated sharing one message first makes the three shares two (the provider's
    ``two_shares``); otherwise three or more inputs are cut to two by carry-save adders
    (s = a ⊕ b ⊕ c, carry = maj(a, b, c) one plane up: one AND round each level). Then only the
    carry into bit 63 of u + v is computed: generate g = u ∧ v, propagate p = u ⊕ v on planes
    0–62, combined by a tree (G, P) ∘ (G', P') = (G ⊕ P∧G', P∧P'): six rounds. The sign is
    u₆₃ ⊕ v₆₃ ⊕ that carry. About 3 word-ANDs per value (5 with a carry-save layer) where
    CrypTen's A2B (a full 64-bit adder on one value per word, then a B2A) needs 24 and more."""
    comm = crypten.communicator.get()
    world, rank = comm.get_world_size(), comm.get_rank()
    two = getattr(crypten.mpc.get_default_provider(), "two_shares", None)
    if two is not None:  # 3-party replicated sharing: one message makes the three inputs two
        values, world = two(values.reshape(-1)), 2
    n = int(values.numel())
    terms = [_junk_padding(_planes(values), n) if r == rank else torch.zeros(64, -(-n // LANES), dtype=torch.long)
             for r in range(world)]
    while len(terms) > 2:  # carry-save: every group of three in one AND round
        groups = [terms[i:i + 3] for i in range(0, len(terms) - len(terms) % 3, 3)]
        rest = terms[len(groups) * 3:]
        ands = and_many([p for a, b, c in groups for p in ((a, b), (c, a ^ b))])
        terms = list(rest)
        for i, (a, b, c) in enumerate(groups):
            maj = ands[2 * i] ^ ands[2 * i + 1]
            carry = torch.zeros_like(maj)
            carry[1:] = maj[:-1]  # one plane up; the carry out of bit 63 wraps away (mod 2^64)
            terms += [a ^ b ^ c, carry]
    u, v = terms
    g = and_many([(u[:63], v[:63])])[0]
    p = u[:63] ^ v[:63]
    # pad to 64 groups with the identity (G = 0, P = 1) on top, then halve six times
    big_g = torch.cat([g, torch.zeros_like(g[:1])])
    big_p = torch.cat([p, _ones(tuple(p[:1].shape))])
    while big_g.shape[0] > 1:
        lo_g, hi_g, lo_p, hi_p = big_g[0::2], big_g[1::2], big_p[0::2], big_p[1::2]
        pg, pp = and_many([(hi_p, lo_g), (hi_p, lo_p)])
        big_g, big_p = hi_g ^ pg, pp
    return u[63] ^ v[63] ^ big_g[0]


def _any_positive(v: torch.Tensor) -> list[bool]:
    """For shares ``v`` (n × K): whether any entry of each row is > 0, one opened bit per row —
    the signs of −v (:func:`_signs`), OR-ed along each row by a tree of ANDs on packed words
    (any = ¬ ∧_k ¬f_k, ⌈log₂ K⌉ rounds); only each row's OR is opened."""
    n, k = v.shape
    flags = unpack(_signs((-v).reshape(-1)).unsqueeze(0), n * k)[0].reshape(n, k)  # XOR shares of bits
    rows = _junk_padding(pack(flags.t().contiguous()), n)  # (K, ⌈n/64⌉): flag k of every row, packed
    rows = public_xor(rows, -1)  # ¬f
    while rows.shape[0] > 1:
        if rows.shape[0] % 2:
            rows = torch.cat([rows, _ones(tuple(rows[:1].shape))])
        rows = and_many([(rows[0::2], rows[1::2])])[0]
    anyone = public_xor(rows, -1)  # ¬∧¬f = ∨f
    return [bool(b) for b in unpack(open_words(anyone), n)[0].tolist()]


class RoundCheck:
    """One round's check of contributions that arrive in blocks (a block's shares in memory at
    once): one challenge for the round, each block's flags computed as it comes (local under
    replicated sharing), then one comparison batch and one opening for all of them — its rounds
    of messages paid once a round, not once a block. Every compute party adds the same blocks in
    the same order. The challenge is drawn when this object is made: after the contributions are
    fixed (the round closed)."""

    def __init__(self, comm: object, dim: int, projections: int = CHECK_PROJECTIONS) -> None:
        self.dim, self.comm = dim, comm
        self.rows = projection_rows(_joint_key(comm), dim, projections)
        self._nnz = [int(z) for z in (self.rows != 0).sum(0).tolist()]
        self._flags: list[torch.Tensor] = []

    def add(self, shares: torch.Tensor, plan: CheckPlan, following: torch.Tensor | None = None) -> None:
        """Flags of a block: this party's shares (n × p) of n contributions, ``plan`` their bounds,
        ``following`` as in :func:`check_contributions`."""
        if plan.dim != self.dim or plan.projections != self.rows.shape[1]:
            raise ValueError(f"plan: dim {plan.dim} and {plan.projections} projections, the round's check has "
                             f"{self.dim} and {self.rows.shape[1]}")
        if shares.dtype != torch.long or shares.ndim != 2 or tuple(shares.shape)[1] != plan.dim:
            raise ValueError(f"shares: int64 (n, {plan.dim}) expected, got {shares.dtype} of shape "
                             f"{tuple(shares.shape)}")
        n = int(shares.shape[0])
        if n != len(plan.bounds):
            raise ValueError(f"shares: {n} contributions, plan: {len(plan.bounds)} bounds")
        if following is not None and (cfg.mpc.protocol != "replicated"
                                      or tuple(following.shape) != tuple(shares.shape)):
            raise ValueError("following: the next party's shares, of the same shape, under replicated sharing only")
        if n == 0:
            return
        y = shares @ self.rows  # (n, λ), wraps in the ring like the shares
        per_bound = {mo: [plan.threshold(mo, z) for z in self._nnz] for mo in set(plan.bounds)}  # a round's are alike
        tau = torch.tensor([per_bound[mo] for mo in plan.bounds], dtype=torch.long)
        s = _chunk_squares(shares, plan, following)
        m = torch.tensor(plan.bounds, dtype=torch.long)
        m2 = (m * m).unsqueeze(1)
        parts = [y - _public(tau), -y - _public(tau), s - _public(m2.expand_as(s))]
        level = s
        for _width in plan.levels():  # the partial sums, G at a time, up to the whole norm (module doc)
            level = _group_sums(level, plan.fan_in)
            parts.append(level - _public(m2.expand_as(level)))
        self._flags.append(torch.cat(parts, dim=1))

    def verdicts(self) -> list[bool]:
        """Whether each contribution added (in order) is within its bound: the same list at every
        compute party, one opened bit each. Blocks with fewer flags (fewer chunks) are padded with
        flags that pass (a public −1)."""
        if not self._flags:
            return []
        width = max(int(f.shape[1]) for f in self._flags)
        flags = torch.cat([f if f.shape[1] == width else
                           torch.cat([f, _public(torch.full((f.shape[0], width - f.shape[1]), -1, dtype=torch.long))],
                                     dim=1) for f in self._flags])
        self._flags = []
        bad = _any_positive(flags)
        agree_on(self.comm, f"contribution check of {len(bad)} contributions", torch.tensor(bad))
        return [not b for b in bad]


def check_contributions(shares: torch.Tensor, plan: CheckPlan, comm: object,
                        following: torch.Tensor | None = None) -> list[bool]:
    """Which of the n contributions (this party's int64 shares, n × p) are within their bounds:
    the same list at every compute party, one opened bit each (module docstring). Every compute
    party calls it with its shares of the same contributions in the same order. ``following``:
    under 3-party replicated sharing, the next party's shares of the same contributions, which
    this party holds too (then the squares need no message); None: CrypTen's square. One block:
    :class:`RoundCheck` checks a round's contributions block by block."""
    if shares.dtype != torch.long or shares.ndim != 2 or tuple(shares.shape)[1] != plan.dim:
        raise ValueError(f"shares: int64 (n, {plan.dim}) expected, got {shares.dtype} of shape {tuple(shares.shape)}")
    if int(shares.shape[0]) == 0 and not plan.bounds:
        return []
    check = RoundCheck(comm, plan.dim, plan.projections)
    check.add(shares, plan, following)
    return check.verdicts()
