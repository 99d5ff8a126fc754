"""A contributor proves, on shares it deals itself, that its vector's ℓ2 norm is within its public
bound; the compute parties check the proof with linear work on their shares and a few opened field
elements, so a compute party that deviates can be caught by the second holder of each share.

Why this, for the malicious-secure mode: :mod:`.validation` checks the same statement inside the
MPC, with squares and comparisons that a deviating compute party could corrupt (and whose
verification would need proofs over every AND gate). Here the only party that computes anything
non-linear is the one that knows the vector; the compute parties add, multiply by public
constants, and open. It is the design of Prio3/PINE (draft-irtf-cfrg-vdaf; Rothblum et al. 2024)
on 3-party replicated shares.

The statement, for x ∈ F_p^d (p = 2^61 − 1, :mod:`.field`) and a public bound M (grid units), with
τ, K, c_q, K_q, J fixed by (d, M) in :class:`NormSpec`:

1. **No coordinate wraps.** λ public rows r_j ∈ {−1, 0, 1}^d (:mod:`.projections`) keyed by a
   hash of x's shares (Fiat–Shamir: the rows follow from the shares, so they cannot be chosen
   before x is), each y_j = ⟨r_j, x⟩ range-checked by bits, which bounds every |x_i| except with
   probability 2^-λ per hash the prover tries. *Two-sided*: y_j + τ = Σ_k 2^k α_jk and
   y_j + τ + (2^K − 1 − 2τ) = Σ_k 2^k α'_jk, so |y_j| ≤ τ exactly and |x_i| ≤ 2τ; *one-sided*:
   y_j + 2^(K−1) = Σ_k 2^k α_jk, half the bits, |x_i| ≤ 2^K (up to 4τ).
2. **Exact squares.** Chunks of c_q coordinates with c_q·(bound on |x_i|)² < p/2: the FLP's
   square slots (:mod:`.flp`) give each chunk's S_k = Σ_{i∈k} x_i², the integer itself, as sums
   of gadget outputs.
3. **No wrap in their sum.** Either J bits per chunk sum (S_k = Σ_t 2^t γ_kt), or λ rows r'_j
   over the chunks, keyed from the same hash (S follows from x): ⟨r'_j, S⟩ + 2^(K_q−1) =
   Σ_t 2^t γ_jt, which bounds every S_k ≤ 2^K_q. Either way Σ_k S_k < p is the integer ‖x‖².
   :attr:`NormSpec.shape` takes whichever of the four statements costs fewest bits (at
   d = 26,010 and M = 2^23: two-sided with rows, 10,747 bits; one-sided with bits per chunk,
   42,327).
4. **The bound.** M² − Σ_k S_k = Σ_t 2^t s_t (bits).
5. **Bits are bits.** Every bit b: b·(b − 1) = 0, in the FLP's bit slots weighted by two
   independent vectors ρ, ρ' keyed by a hash of the shares of x and of the bits (a wrong bit
   survives a hash with probability ≤ 2/p², so grinding hashes does not help).

The compute parties check (1), (3), (4)'s linear identities and (5)'s gadget outputs with one
random combination C (weights θ from their own coins, drawn after every share and proof is
fixed), and the FLP at a point r from the same coins: they open C, A(r), B(r), Π(r) and accept
iff C = 0 and Π(r) = Σ A_j(r)·B_j(r). An honest contributor's openings are uniform or zero.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from . import field as F
from . import flp
from .keystream import KeyedMasks
from .projections import project, project_transposed, projection_signs, projection_threshold

__all__ = ["NORM_PROJECTIONS", "NormProofError", "NormSpec", "Query", "Submission", "accept", "bits_of", "commitment",
           "SALT_BYTES", "CheckWeights", "DealtInput", "check_weights", "deal_input", "keys_for", "prove_dealt",
           "prove_seeded", "rho_key_for", "seeded_share", "stacked_check_weights",
           "aux_vector", "chunk_squares", "prove_norm", "prove_wires", "q_rows_for", "rho", "rows_for", "split",
           "verifier_share", "verifier_shares", "wires"]

#: λ: rows keyed by a hash, so the bound is 2^-λ per hash a prover tries (2^-60 after 2^40 tries).
NORM_PROJECTIONS = 100
_DOMAIN = b"mpc-erm norm proof v1"
SHARES = 3


class NormProofError(ValueError):
    """A bound that leaves no room for exact squares in F_p, or an honest prover's vector outside it."""


def _bits(n: int) -> int:
    return max(1, int(n).bit_length())


@dataclass(frozen=True)
class Shape:
    """One way to state ‖x‖₂ ≤ M exactly in F_p: the projections' ranges one- or two-sided (the
    coordinate bound 2^K or 2τ), and the chunks' square sums bounded by J bits each or by λ rows."""

    two_sided: bool
    chunk_rows: bool
    proj_bits: int
    square_width: int
    chunk: int
    chunks: int
    q_bits: int
    bit_count: int

    @classmethod
    def of(cls, dim: int, bound: int, lam: int, tau: int, sum_bits: int, two_sided: bool,
           chunk_rows: bool) -> Shape | None:
        k = _bits(2 * tau) if two_sided else _bits(tau) + 1
        coordinate = 2 * tau if two_sided else 1 << k  # every |x_i| once the projections pass
        max_chunk = (F.P - 1) // (2 * coordinate * coordinate)  # each chunk's sum below p/2
        if max_chunk < 1:
            return None
        width = max(1, min(flp.Layout.balanced(dim).width, max_chunk))
        chunk = max(1, min(max_chunk // width, -(-dim // width))) * width
        chunks = -(-dim // chunk)
        if chunk_rows:
            if chunks == 1:
                return None  # one sum: its bound is the slack's
            q_bits = _bits(projection_threshold(bound * bound, chunks)) + 1
            room, q_total = chunks << q_bits, lam * q_bits
        else:
            q_bits = sum_bits
            room, q_total = (chunks << q_bits) if chunks > 1 else F.P // 2, (chunks * q_bits if chunks > 1 else 0)
        if room + (1 << sum_bits) >= F.P:
            return None
        bits = (2 if two_sided else 1) * lam * k + q_total + sum_bits
        return cls(two_sided, chunk_rows, k, width, chunk, chunks, q_bits, bits)


@dataclass(frozen=True)
class NormSpec:
    """The public statement: ‖x‖₂ ≤ ``bound`` (grid units) for x of ``dim`` coordinates."""

    dim: int
    bound: int
    projections: int = NORM_PROJECTIONS

    def __post_init__(self) -> None:
        if self.dim < 1 or self.bound < 1 or self.projections < 1:
            raise ValueError("dim, bound and projections must be positive")
        _ = self.shape  # a statement that fits, or NormProofError now

    @cached_property
    def tau(self) -> int:
        """τ: every honest projection has |y| ≤ τ (Cauchy–Schwarz, or Hoeffding at 2^-80)."""
        return projection_threshold(self.bound, self.dim)

    @cached_property
    def sum_bits(self) -> int:
        """J: 2^J > M², the range of the slack (and of each chunk's sum, when bounded by bits)."""
        return _bits(self.bound * self.bound)

    @cached_property
    def shape(self) -> Shape:
        """The cheapest statement (fewest bits) of the four that fit F_p: one- or two-sided
        projection ranges, chunk sums bounded by bits or by projections (module docstring)."""
        fits = [sh for two in (False, True) for proj in (False, True)
                if (sh := Shape.of(self.dim, self.bound, self.projections, self.tau, self.sum_bits, two, proj))]
        if not fits:
            raise NormProofError(f"a bound of {self.bound} grid units over {self.dim} coordinates leaves no room for "
                                 "the exact squared norm in F_p: use a coarser grid")
        return min(fits, key=lambda sh: sh.bit_count)

    @property
    def two_sided(self) -> bool:
        return self.shape.two_sided

    @property
    def proj_bits(self) -> int:
        """K, the width of each projection's decomposition(s)."""
        return self.shape.proj_bits

    @property
    def projection_offsets(self) -> tuple[int, ...]:
        """What each decomposition adds to a projection y: τ and τ + (2^K − 1 − 2τ) (two-sided),
        or 2^(K−1) (one-sided); each y + offset must lie in [0, 2^K)."""
        k = self.proj_bits
        return (self.tau, self.tau + (1 << k) - 1 - 2 * self.tau) if self.two_sided else (1 << (k - 1),)

    @property
    def square_width(self) -> int:
        return self.shape.square_width

    @property
    def chunk(self) -> int:
        return self.shape.chunk

    @property
    def chunks(self) -> int:
        return self.shape.chunks

    @property
    def q_projections(self) -> int:
        """λ_q: rows over the chunks' square sums (0: each sum bounded by its own J bits)."""
        return self.projections if self.shape.chunk_rows else 0

    @property
    def q_bits(self) -> int:
        """Per chunk-sum row (K_q), or per chunk sum (J)."""
        return self.shape.q_bits

    @property
    def q_count(self) -> int:
        """How many values the chunk sums' bits decompose: λ_q rows, or the n_q sums themselves."""
        return self.q_projections if self.q_projections else self.chunks

    @property
    def bit_count(self) -> int:
        return self.shape.bit_count

    @property
    def aux_length(self) -> int:
        """The auxiliary vector: every bit (α, α' if two-sided, γ, s)."""
        return self.bit_count

    @cached_property
    def square_layout(self) -> flp.Layout:
        """The squares' proof: call g sums the squares of ``square_width`` coordinates, so each
        chunk is ``chunk / square_width`` whole calls."""
        return flp.Layout.of_width(self.chunks * self.chunk, self.square_width)

    @cached_property
    def bit_layout(self) -> flp.Layout:
        """The bits' proof: two weighted copies of every bit check, balanced."""
        return flp.Layout.balanced(2 * self.bit_count)

    @property
    def proof_length(self) -> int:
        return self.square_layout.proof_length + self.bit_layout.proof_length

    @property
    def nodes(self) -> int:
        """The query point must exceed this (both proofs' evaluation nodes)."""
        return max(self.square_layout.nodes, self.bit_layout.nodes)

    @property
    def residuals(self) -> int:
        """Identities combined into C: the projection ranges, the chunk sums' ranges, the slack, the bit calls."""
        ranges = (2 if self.two_sided else 1) * self.projections
        return ranges + (self.q_count if self.chunks > 1 else 0) + 1 + self.bit_layout.calls

    @property
    def opened(self) -> int:
        return 1 + self.square_layout.opened + self.bit_layout.opened

    @property
    def submission_length(self) -> int:
        """Field elements a contributor deals per share: x, aux and the proof."""
        return self.dim + self.aux_length + self.proof_length


#: Bytes of the salt each share is committed with.
SALT_BYTES = 32


@dataclass(frozen=True)
class Submission:
    """What a contributor deals: three additive shares each of x, aux and the proof, and one salt
    per share (sent with it to both its holders)."""

    x: tuple[np.ndarray, ...]
    aux: tuple[np.ndarray, ...]
    proof: tuple[np.ndarray, ...]
    salts: tuple[bytes, ...]
    seeds: tuple[bytes, ...] = ()  # of shares 0 and 1 when they were drawn from seeds (:func:`split`)

    def commitments(self) -> tuple[list[bytes], list[bytes]]:
        """(x, aux) commitments by share: what :func:`keys_for` takes."""
        return ([commitment(i, s, self.salts[i]) for i, s in enumerate(self.x)],
                [commitment(i, s, self.salts[i], b"aux") for i, s in enumerate(self.aux)])


def seeded_share(seed: bytes, part: int, n: int) -> np.ndarray:
    """n field elements of a share drawn from a 32-byte seed (AES-256-CTR, nonce ``part``: 0 for x,
    1 for aux, 2 for the proof): what a holder expands from the seed it was sent."""
    return F.from_words(KeyedMasks().words(seed, part, n).numpy().copy())


def split(value: np.ndarray, shares: int = SHARES, seeds: Sequence[bytes] = (),
          part: int = 0) -> tuple[np.ndarray, ...]:
    """Additive shares of a field vector: all but the last uniform — drawn from ``seeds`` (one per
    share but the last) when given, so that those shares travel as 32 bytes each."""
    if seeds and len(seeds) != shares - 1:
        raise ValueError(f"{shares - 1} seeds expected, got {len(seeds)}")
    parts = ([seeded_share(seed, part, value.size) for seed in seeds] if seeds else
             [F.from_words(np.frombuffer(secrets.token_bytes(8 * value.size), dtype=np.uint64).copy())
              for _ in range(shares - 1)])
    last = value.astype(np.uint64)
    for share in parts:
        last = F.sub(last, share)
    return (*parts, last)


def commitment(index: int, share: np.ndarray, salt: bytes, part: bytes = b"x") -> bytes:
    """The hash a share is bound by; each share's two holders compute it and must agree. The salt,
    known to the share's holders only, keeps it hiding: the party that does not hold the share
    cannot test guesses of the contribution against it."""
    if len(salt) != SALT_BYTES:
        raise ValueError(f"a share's salt has {SALT_BYTES} bytes, not {len(salt)}")
    return hashlib.sha256(_DOMAIN + b"share" + part + index.to_bytes(1, "big") + salt
                          + share.astype(np.uint64).tobytes()).digest()


def keys_for(context: bytes, x_commitments: Sequence[bytes], aux_commitments: Sequence[bytes]) -> tuple[bytes, bytes]:
    """(rows key, ρ key): Fiat–Shamir over the shares, bound to the job, round and contributor."""
    rows_key = hashlib.sha256(_DOMAIN + b"rows" + len(context).to_bytes(4, "big") + context
                              + b"".join(x_commitments)).digest()
    return rows_key, rho_key_for(rows_key, aux_commitments)


def rho_key_for(rows_key: bytes, aux_commitments: Sequence[bytes]) -> bytes:
    """The bit checks' key: a hash of the rows' key and of the aux shares (made after the rows)."""
    return hashlib.sha256(_DOMAIN + b"rho" + rows_key + b"".join(aux_commitments)).digest()


@functools.lru_cache(maxsize=3)  # one per dealer of a round: both shares a party holds use the same rows
def rows_for(rows_key: bytes, spec: NormSpec) -> np.ndarray:
    """The projection rows, (λ × d) float32 in {−1, 0, 1}: a transposed view of the (d × λ) signs
    as drawn (no copy to transpose: the verifiers' Rᵀθ reads them in that order, the prover's R·x
    through BLAS's transposed product). float32: half the bytes to draw and to read, and still
    exact for Rᵀθ's sums of λ limbs (:func:`~.field.small_matvec` narrows its limbs to fit)."""
    rows = projection_signs(rows_key, spec.dim, spec.projections, np.float32)
    rows.flags.writeable = False  # cached
    return rows.T


def _q_rows_key(rows_key: bytes) -> bytes:
    return hashlib.sha256(_DOMAIN + b"chunk rows" + rows_key).digest()


@functools.lru_cache(maxsize=3)
def q_rows_for(rows_key: bytes, spec: NormSpec) -> np.ndarray:
    """The rows over the chunks' square sums, (λ_q × n_q) float32 in {−1, 0, 1} (a transposed view,
    as :func:`rows_for`)."""
    rows = projection_signs(_q_rows_key(rows_key), spec.chunks, spec.q_projections, np.float32)
    rows.flags.writeable = False  # cached
    return rows.T


@functools.lru_cache(maxsize=3)  # one per dealer of a round, as the rows
def rho(rho_key: bytes, spec: NormSpec) -> np.ndarray:
    """(2, bits) weights of the bit checks."""
    words = KeyedMasks().words(rho_key, 0, 2 * spec.bit_count).numpy().copy()
    weights = F.from_words(words).reshape(2, spec.bit_count)
    weights.flags.writeable = False  # cached
    return weights


def bits_of(values: np.ndarray, width: int) -> np.ndarray:
    """(n,) non-negative integers < 2^width → (n, width) bits, least significant first."""
    return ((values.astype(np.uint64)[:, None] >> np.arange(width, dtype=np.uint64)) & np.uint64(1)).astype(np.uint64)


def chunk_squares(x: np.ndarray, spec: NormSpec) -> np.ndarray:
    """S_k for an honest x (int64: |x_i| ≤ M, so every sum is below 2^62)."""
    padded = np.zeros(spec.chunks * spec.chunk, dtype=np.int64)
    padded[: spec.dim] = x
    return (padded * padded).reshape(spec.chunks, spec.chunk).sum(axis=1)


def aux_vector(x: np.ndarray, spec: NormSpec, rows_key: bytes) -> np.ndarray:
    """The honest auxiliary vector for integer x (int64): α (and α'), γ, s (module docstring)."""
    top = int(np.abs(x).max(initial=0))
    if spec.dim * max(top, 1) < 1 << 62:  # exact in int64
        y = project(rows_key, spec.dim, spec.projections, x)
    else:
        y = rows_for(rows_key, spec).astype(np.int64).astype(object) @ x.astype(object)  # exact integers
    if (np.abs(y) > spec.tau).any():  # an honest vector: probability ≤ 2^-80 per row
        raise NormProofError("a projection of this vector falls outside its proof range: prove it again "
                             "(fresh shares give fresh rows)")
    sums = chunk_squares(x, spec)
    slack = spec.bound * spec.bound - int(sums.sum())
    if slack < 0 or top > spec.bound:
        raise NormProofError("the vector is outside its bound: an honest contributor clips before it proves")
    parts = [bits_of(y + off, spec.proj_bits).ravel() for off in spec.projection_offsets]
    if spec.chunks > 1 and spec.q_projections:
        half = 1 << (spec.q_bits - 1)
        z = q_rows_for(rows_key, spec).astype(np.int64) @ sums + half
        if (z < 0).any() or (z >= 2 * half).any():
            raise NormProofError("a projection of this vector's square sums falls outside its proof range: prove it "
                                 "again (fresh shares give fresh rows)")
        parts.append(bits_of(z, spec.q_bits).ravel())
    elif spec.chunks > 1:
        parts.append(bits_of(sums, spec.q_bits).ravel())
    parts.append(bits_of(np.array([slack]), spec.sum_bits).ravel())
    return np.concatenate(parts).astype(np.uint64)


def square_wires(x: np.ndarray, spec: NormSpec) -> np.ndarray:
    """The squares' slots from a share of x (..., d): x, zero-padded (each slot's product is x_i·x_i)."""
    out = np.zeros((*x.shape[:-1], spec.square_layout.slots), dtype=np.uint64)
    out[..., : spec.dim] = x
    return out


def bit_wires(aux: np.ndarray, weights: np.ndarray, spec: NormSpec, first: bool) -> tuple[np.ndarray, np.ndarray]:
    """(left, right) bit-check slots from a share of aux (..., bits) and its weights (..., 2, bits):
    ρ·b and b − 1, twice (linear; ``first``: the share that carries public constants)."""
    minus = F.sub(aux, np.full(aux.shape[-1], int(first), dtype=np.uint64))
    left = np.concatenate([F.mul(weights[..., 0, :], aux), F.mul(weights[..., 1, :], aux)], axis=-1)
    return left, np.concatenate([minus, minus], axis=-1)


def wires(x: np.ndarray, aux: np.ndarray, weights: np.ndarray, spec: NormSpec,
          first: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every proof's slots: (squares, bits' left, bits' right)."""
    return (square_wires(x, spec), *bit_wires(aux, weights, spec, first))


def _split_proof(proof: np.ndarray, spec: NormSpec) -> tuple[np.ndarray, np.ndarray]:
    n = spec.square_layout.proof_length
    return proof[..., :n], proof[..., n:]


def prove_wires(squares: np.ndarray, left: np.ndarray, right: np.ndarray, spec: NormSpec) -> np.ndarray:
    """Both proofs, concatenated: the squares', then the bits'."""
    return np.concatenate([flp.prove(squares, squares, spec.square_layout),
                           flp.prove(left, right, spec.bit_layout)])


def _powers_of_two(width: int) -> np.ndarray:
    return np.array([1 << t for t in range(width)], dtype=np.uint64)


def _residuals(x: np.ndarray, aux: np.ndarray, proof: np.ndarray, rows_key: bytes, spec: NormSpec,
               first: bool) -> np.ndarray:
    """This share of every identity that must be zero (module docstring), in a fixed order: the
    statement written out. The verifiers compute its θ-combination folded (:func:`check_weights`);
    the tests check the two against each other."""
    k_bits, lam = spec.proj_bits, spec.projections
    one = int(first)  # public constants ride on share 0 only
    y = F.small_matvec(rows_for(rows_key, spec), x, coeff_max=1)
    res, at = [], 0
    for off in spec.projection_offsets:
        alpha = aux[at: at + lam * k_bits].reshape(lam, k_bits)
        at += lam * k_bits
        shifted = F.add(y, np.full(lam, one * off, dtype=np.uint64))
        res.append(F.sub(shifted, F.matvec(alpha, _powers_of_two(k_bits))))
    square_proof, bit_proof = _split_proof(proof, spec)
    outputs = spec.square_layout.outputs(square_proof).reshape(spec.chunks, spec.chunk // spec.square_width)
    sums = F.sum_along(outputs, axis=1)  # S_k, this share
    if spec.chunks > 1:
        n = spec.q_count
        gamma = aux[at: at + n * spec.q_bits].reshape(n, spec.q_bits)
        at += n * spec.q_bits
        if spec.q_projections:
            z = F.small_matvec(q_rows_for(rows_key, spec), sums, coeff_max=1)
            z = F.add(z, np.full(n, one << (spec.q_bits - 1), dtype=np.uint64))
        else:
            z = sums
        res.append(F.sub(z, F.matvec(gamma, _powers_of_two(spec.q_bits))))
    slack_bits = aux[at:]
    total = F.add(F.sum_along(sums, axis=0), np.uint64(F.dot(slack_bits, _powers_of_two(spec.sum_bits))))
    res.append(F.sub(np.array([one * (spec.bound * spec.bound) % F.P], dtype=np.uint64), np.array([total])))
    res.append(spec.bit_layout.outputs(bit_proof))
    return np.concatenate(res).astype(np.uint64)


@dataclass(frozen=True)
class Query:
    """The compute parties' challenge, drawn from their own coins after every share is fixed. One
    key may serve every contributor of a round: its point does not depend on the statement, so
    the Lagrange coefficients at it are computed once for all (each contributor's proof was fixed
    before the coins, which is all its soundness needs)."""

    point: int
    weights: np.ndarray  # θ, one per identity
    key: bytes  # what it was drawn from (its folded weights are cached by it)

    @classmethod
    def from_key(cls, key: bytes, spec: NormSpec) -> Query:
        if spec.nodes >= _POINT_FLOOR:
            raise NormProofError(f"a proof of {spec.nodes} nodes is beyond the query's range")
        words = F.from_words(KeyedMasks().words(key, 2, 8).numpy().copy())
        point = next(int(w) for w in words if int(w) > _POINT_FLOOR)  # fails with prob. ≈ 2^-168
        weights = F.from_words(KeyedMasks().words(key, 1, spec.residuals).numpy().copy())
        weights.flags.writeable = False
        return cls(point, weights, key)


#: The query point is drawn above this (every proof's nodes are far below it): uniform over
#: (2^40, p), so a wrong proof polynomial of degree 2g vanishes there with probability ≤ 2g/(p − 2^40).
_POINT_FLOOR = 1 << 40


@dataclass(frozen=True)
class CheckWeights:
    """C = θ·residuals (:func:`_residuals`) folded into one weight vector per part of a share:
    C = ⟨w_x, x⟩ + ⟨w_aux, aux⟩ + ⟨w_sums, S⟩ + ⟨θ_bits, bit outputs⟩ + [share 0] const, with S the
    share's chunk square sums. The projections enter only as w_x = Rᵀ·(Σ θ over the range blocks)
    (and Qᵀθ_q over the chunk sums), computed once for every share checked against the same rows
    and query: each share then costs dot products, not λ·d projections."""

    x: np.ndarray
    aux: np.ndarray
    sums: np.ndarray
    bits: np.ndarray
    const: np.uint64


@dataclass(frozen=True)
class _QueryWeights:
    """The parts of :class:`CheckWeights` that follow from the query alone (the same for every
    rows key): what multiplies the rows (Σθ over the range blocks, θ_q) and everything else."""

    proj: np.ndarray  # Σ_o θ_o, (λ,): w_x = Rᵀ·proj
    q_theta: np.ndarray  # θ_q, (λ_q,) or (chunks,) or empty
    aux: np.ndarray
    slack: np.uint64
    bits: np.ndarray
    const: np.uint64


@functools.lru_cache(maxsize=3)
def _query_weights(spec: NormSpec, query_key: bytes) -> _QueryWeights:
    theta = Query.from_key(query_key, spec).weights
    lam, k_bits = spec.projections, spec.proj_bits
    powers = _powers_of_two(k_bits)
    aux_parts, at, proj = [], 0, np.zeros(lam, dtype=np.uint64)
    const = 0
    for off in spec.projection_offsets:  # θ_o·(R x + off − Σ_k 2^k α_ok)
        t = theta[at: at + lam]
        at += lam
        proj = F.add(proj, t)
        const = (const + off * int(F.sum_along(t, axis=0))) % F.P
        aux_parts.append(F.neg(F.mul(t[:, None], powers[None, :])).ravel())
    q_theta = np.zeros(0, dtype=np.uint64)
    if spec.chunks > 1:  # θ_q·(Q S + half − Σ_t 2^t γ_t), or θ_q·(S − Σ_t 2^t γ_t)
        q_theta = theta[at: at + spec.q_count].copy()
        at += spec.q_count
        if spec.q_projections:
            const = (const + (1 << (spec.q_bits - 1)) * int(F.sum_along(q_theta, axis=0))) % F.P
        aux_parts.append(F.neg(F.mul(q_theta[:, None], _powers_of_two(spec.q_bits)[None, :])).ravel())
    t_slack = theta[at]  # θ_s·(M² − Σ_k S_k − Σ_t 2^t s_t)
    at += 1
    aux_parts.append(F.neg(F.mul(np.full(spec.sum_bits, t_slack, dtype=np.uint64), _powers_of_two(spec.sum_bits))))
    const = (const + int(t_slack) * (spec.bound * spec.bound % F.P)) % F.P
    out = _QueryWeights(proj, q_theta, np.concatenate(aux_parts).astype(np.uint64), np.uint64(t_slack),
                        theta[at:].copy(), np.uint64(const))
    for a in (out.proj, out.q_theta, out.aux, out.bits):
        a.flags.writeable = False  # cached
    return out


def _rows_weights(rows_key: bytes, spec: NormSpec, q: _QueryWeights) -> tuple[np.ndarray, np.ndarray]:
    """(w_x, w_sums): the parts of :class:`CheckWeights` that follow from the rows."""
    w_x = project_transposed(rows_key, spec.dim, spec.projections, q.proj)  # Rᵀ·Σθ_o
    if spec.chunks > 1 and spec.q_projections:
        w_sums = project_transposed(_q_rows_key(rows_key), spec.chunks, spec.q_projections, q.q_theta)
    elif spec.chunks > 1:
        w_sums = q.q_theta.copy()
    else:
        w_sums = np.zeros(spec.chunks, dtype=np.uint64)
    return w_x, F.sub(w_sums, np.full(spec.chunks, q.slack, dtype=np.uint64))


@functools.lru_cache(maxsize=3)  # one per dealer of a round, as the rows
def check_weights(rows_key: bytes, spec: NormSpec, query_key: bytes) -> CheckWeights:
    """The folded weights of :class:`CheckWeights` for the rows of ``rows_key`` and the query of
    ``query_key`` (:meth:`Query.from_key`)."""
    q = _query_weights(spec, query_key)
    w_x, w_sums = _rows_weights(rows_key, spec, q)
    out = CheckWeights(w_x, q.aux, w_sums, q.bits, q.const)
    for a in (out.x, out.sums):
        a.flags.writeable = False  # cached
    return out


def _folded_check(x: np.ndarray, aux: np.ndarray, proof: np.ndarray, spec: NormSpec, weights: CheckWeights,
                  first: bool) -> np.ndarray:
    """This share of C from the folded weights (the same number as θ·:func:`_residuals`), for a
    batch of shares (n, ·) → (n,)."""
    square_proof, bit_proof = _split_proof(proof, spec)
    n = x.shape[0]
    outputs = spec.square_layout.outputs(square_proof).reshape(n, spec.chunks, spec.chunk // spec.square_width)
    sums = F.sum_along(outputs, axis=2)  # S_k, this share, (n, chunks)
    pairs = ((x, weights.x), (aux, weights.aux), (sums, weights.sums),
             (spec.bit_layout.outputs(bit_proof), weights.bits))
    terms = [F.sum_along(F.mul(part, w), axis=1) for part, w in pairs]
    return F.sum_along(np.stack([*terms, np.full(n, weights.const if first else 0, dtype=np.uint64)]), axis=0)


def verifier_share(index: int, x: np.ndarray, aux: np.ndarray, proof: np.ndarray, spec: NormSpec,
                   keys: tuple[bytes, bytes], query: Query) -> np.ndarray:
    """One share's part of what is opened: [C, then A(r), B(r), Π(r) of the squares' proof and of
    the bits']. Linear in the share, so two holders of the same share compute the same vector, and
    the three parts sum to the opened one."""
    return verifier_shares(index, x[None], aux[None], proof[None], spec, keys[0], rho(keys[1], spec)[None], query)[0]


def stacked_check_weights(rows_keys: Sequence[bytes], spec: NormSpec, query_key: bytes) -> CheckWeights:
    """:func:`check_weights` of many contributors, each with its own rows (Fiat–Shamir), against
    one query: the parts that follow from the rows (w_x, and w_sums over chunk rows) stacked by
    contributor, the parts that follow from the query alone shared (they are the same for every
    rows key). What :func:`verifier_shares` takes as ``check`` to check them all at once."""
    q = _query_weights(spec, query_key)
    every = [_rows_weights(k, spec, q) for k in rows_keys]  # one use each: not cached
    return CheckWeights(np.stack([w[0] for w in every]), q.aux, np.stack([w[1] for w in every]), q.bits, q.const)


def verifier_shares(index: int, x: np.ndarray, aux: np.ndarray, proof: np.ndarray, spec: NormSpec,
                    rows_key: bytes, weights: np.ndarray, query: Query, check: CheckWeights | None = None
                    ) -> np.ndarray:
    """:func:`verifier_share` for n contributors' share ``index`` at once, against one set of rows
    and one query: x (n, d), aux (n, bits), proof (n, ·), their bit checks' ρ (n, 2, bits) →
    (n, opened). The work is a few products over the stacked shares, not a few dozen small ones
    per contributor (what makes checking many data owners' proofs cost about what adding their
    shares does)."""
    first = index == 0
    # the folded weights, shared by every share checked against these rows and this query (or, as
    # ``check``, each contributor's own: :func:`stacked_check_weights`)
    c = _folded_check(x, aux, proof, spec, check if check is not None else check_weights(rows_key, spec, query.key),
                      first)
    squares, left, right = wires(x, aux, weights, spec, first)
    square_proof, bit_proof = _split_proof(proof, spec)
    sq = flp.query_share(squares, squares, np.ascontiguousarray(square_proof), spec.square_layout, query.point)
    bits = flp.query_share(left, right, np.ascontiguousarray(bit_proof), spec.bit_layout, query.point)
    return np.concatenate([c[:, None], sq.vector(), bits.vector()], axis=1).astype(np.uint64)


def accept(opened: np.ndarray, spec: NormSpec) -> bool:
    """The opened vector (the sum of the three parts) passes iff C = 0 and the FLP holds at r."""
    n = spec.square_layout.opened
    return (int(opened[0]) == 0 and flp.accept(flp.Openings.from_vector(opened[1: 1 + n], spec.square_layout))
            and flp.accept(flp.Openings.from_vector(opened[1 + n:], spec.bit_layout)))


@dataclass(frozen=True)
class DealtInput:
    """The first half of a proof whose rows are drawn by the verifiers rather than by Fiat–Shamir:
    the vector's three shares (0 and 1 from seeds) and their salts, committed before any row is
    known. The aux and proof shares follow from the same seeds once the rows are (:func:`prove_dealt`)."""

    x: tuple[np.ndarray, ...]
    salts: tuple[bytes, ...]
    seeds: tuple[bytes, ...]

    def commitments(self) -> list[bytes]:
        return [commitment(i, s, self.salts[i]) for i, s in enumerate(self.x)]


def deal_input(x: np.ndarray, spec: NormSpec) -> DealtInput:
    """Shares of x (int64 grid units) and their salts: what a contributor commits to first."""
    x = np.asarray(x, dtype=np.int64)
    if x.shape != (spec.dim,):
        raise ValueError(f"a vector of {spec.dim} coordinates expected, got shape {x.shape}")
    seeds = tuple(secrets.token_bytes(SALT_BYTES) for _ in range(SHARES - 1))
    xs = split(F.from_signed(x), seeds=seeds, part=0)
    return DealtInput(xs, tuple(secrets.token_bytes(SALT_BYTES) for _ in xs), seeds)


def prove_dealt(dealt: DealtInput, x: np.ndarray, spec: NormSpec, rows_key: bytes) -> Submission:
    """The proof for committed shares of x against the rows of ``rows_key``: the verifiers' key,
    drawn after ``dealt`` was committed, or the Fiat–Shamir one (:func:`prove_norm`)."""
    x = np.asarray(x, dtype=np.int64)
    aux = aux_vector(x, spec, rows_key)
    auxs = split(aux, seeds=dealt.seeds, part=1)
    rho_key = rho_key_for(rows_key, [commitment(i, s, dealt.salts[i], b"aux") for i, s in enumerate(auxs)])
    proof = prove_wires(*wires(F.from_signed(x), aux, rho(rho_key, spec), spec, first=True), spec)
    return Submission(dealt.x, auxs, split(proof, seeds=dealt.seeds, part=2), dealt.salts, dealt.seeds)


def prove_norm(x: np.ndarray, spec: NormSpec, context: bytes) -> Submission:
    """An honest contributor: shares of x (int64 grid units, ‖x‖₂ ≤ M), of its aux and proof, the
    rows keyed by Fiat–Shamir over the shares of x (one message, no interaction)."""
    dealt = deal_input(x, spec)
    rows_key, _ = keys_for(context, dealt.commitments(), [])
    return prove_dealt(dealt, x, spec, rows_key)


def prove_seeded(x: np.ndarray, spec: NormSpec, context: bytes, seeds: Mapping[int, bytes],
                 salts: Sequence[bytes]) -> Submission:
    """:func:`prove_norm` for a contributor whose shares but one are drawn from seeds it gave their
    holders beforehand (a data owner: the key it enrolled with, expanded per round): ``seeds``
    maps two share indices to their seeds, the third share is computed (the one that travels);
    ``salts`` are the three shares' salts by index (the seeded ones known to their holders too).
    The rows are keyed by Fiat–Shamir over the shares, as in :func:`prove_norm`."""
    x = np.asarray(x, dtype=np.int64)
    if x.shape != (spec.dim,):
        raise ValueError(f"a vector of {spec.dim} coordinates expected, got shape {x.shape}")
    explicit = set(range(SHARES)) - set(seeds)
    if len(seeds) != SHARES - 1 or len(explicit) != 1 or len(salts) != SHARES:
        raise ValueError(f"seeds of {SHARES - 1} of the {SHARES} shares and {SHARES} salts expected")
    e = explicit.pop()

    def deal(value: np.ndarray, part: int) -> tuple[np.ndarray, ...]:
        out: list[np.ndarray] = [np.empty(0, dtype=np.uint64)] * SHARES
        rest = value.astype(np.uint64)
        for i, seed in seeds.items():
            out[i] = seeded_share(seed, part, value.size)
            rest = F.sub(rest, out[i])
        out[e] = rest
        return tuple(out)

    xs = deal(F.from_signed(x), 0)
    rows_key, _ = keys_for(context, [commitment(i, s, salts[i]) for i, s in enumerate(xs)], [])
    aux = aux_vector(x, spec, rows_key)
    auxs = deal(aux, 1)
    rho_key = rho_key_for(rows_key, [commitment(i, s, salts[i], b"aux") for i, s in enumerate(auxs)])
    proof = prove_wires(*wires(F.from_signed(x), aux, rho(rho_key, spec), spec, first=True), spec)
    return Submission(xs, auxs, deal(proof, 2), tuple(salts))
