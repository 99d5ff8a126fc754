"""A fully linear proof that L products were computed right, checked on additive shares of the
proof with linear work and a few opened field elements (Boneh–Boyle–Corrigan-Gibbs–Gilboa–Ishai,
CRYPTO 2019, §4 and the ParallelSum gadget of Prio3, draft-irtf-cfrg-vdaf).

Why: a compute party that may deviate cannot be trusted to multiply shares (the input check's
squares) or to compare them; a contributor, who knows its own vector, can prove the products
itself, and the compute parties' part of the check becomes linear — which replicated sharing
makes verifiable by comparing each component's result between its two holders. No product is
computed in the MPC at all.

Setting. The prover knows L pairs (a_l, b_l) of F_p elements (:mod:`.field`) and claims the
gadget outputs o_g = Σ_{j<c} a_{g,j}·b_{g,j}, one per *call* g = 1..G of a ParallelSum gadget of
width c (slot l is column l mod c of call ⌊l/c⌋ + 1; G = ⌈L/c⌉, unused slots are 0).

- **Prover.** For each column j, the wire polynomials A_j, B_j of degree ≤ G through
  A_j(0) = s_j (a fresh uniform seed) and A_j(g) = a_{g,j}; the proof polynomial
  Π = Σ_j A_j·B_j, degree ≤ 2G, sent by its values at 0..2G. Proof: 2c seeds + 2G + 1 values.
- **Verifier**, on its additive share of the wires (which are linear in the shared input, so each
  party computes them) and of the proof, at a query point r ∉ {0..2G} chosen after the proof is
  fixed: its shares of A_j(r), B_j(r) (Lagrange, linear) and of Π(r); the gadget outputs are
  the shares Π(1..G). The parties open A(r), B(r), Π(r) and accept iff Π(r) = Σ_j A_j(r)·B_j(r).
  The caller checks the outputs Π(g) against its circuit with one more opened linear combination.

Wide circuits. When the circuit fixes c (the squares' chunks) and leaves G ≫ c, the calls are
split into pieces, each a proof of the above over its own calls with its own seeds
(:class:`Layout`): the prover's extension then costs O(L·G/pieces) instead of O(L·G), and each
piece adds 2c + 1 opened elements.

Soundness: if Π ≠ Σ A_j B_j as polynomials, their difference (degree ≤ 2G) vanishes at r with
probability ≤ 2G/(p − 2G − 1) < 2^-50 for G < 2^10; if they are equal, Π(g) is the true output of
call g. Zero knowledge (an honest prover): each opened A_j(r) = λ_0(r)·s_j + (wires) with
λ_0(r) ≠ 0 is uniform, and Π(r) follows from them.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np

from . import field as F

__all__ = ["Layout", "Openings", "accept", "prove", "query_share"]


#: The fewest calls a piece of a wide proof holds (:meth:`Layout.of_width`): a prover extends its
#: wires at O(slots · calls per piece), a piece adds 2c + 1 opened elements.
MIN_PIECE_CALLS = 128


@dataclass(frozen=True)
class Layout:
    """How L products are packed: ``width`` c columns, G = ⌈L/c⌉ calls, in ``pieces`` proofs of
    ⌈G/pieces⌉ calls each (one piece: the proof of the module docstring). A piece is a proof of
    its own over its calls, with its own seeds; all are checked at the same point r, so the
    soundness error stays ≤ 2G/(p − 2G − 1) in all (a union bound over the pieces)."""

    slots: int
    width: int
    pieces: int = 1

    def __post_init__(self) -> None:
        if self.slots < 1 or self.width < 1:
            raise ValueError("a proof layout needs at least one slot and one column")
        if not 1 <= self.pieces <= self.calls or (self.pieces - 1) * self.piece_calls >= self.calls:
            raise ValueError(f"{self.pieces} pieces do not split {self.calls} calls without an empty piece")

    @classmethod
    def balanced(cls, slots: int) -> Layout:
        """c ≈ √L: the smallest proof (2c + 2G + 1 elements)."""
        return cls(slots, max(1, math.isqrt(slots - 1) + 1))

    @classmethod
    def of_width(cls, slots: int, width: int) -> Layout:
        """A width fixed by the circuit (the squares' chunks): when it leaves G ≫ c, the calls in
        pieces of about max(c, :data:`MIN_PIECE_CALLS`), so that extending the wires costs
        O(L·G/pieces) instead of O(L·G) (4 pieces: 2.7× faster at d = 26,010, c = 36)."""
        calls = -(-slots // width)
        per = min(calls, max(width, MIN_PIECE_CALLS))
        pieces = -(-calls // per)
        while pieces > 1 and (pieces - 1) * -(-calls // pieces) >= calls:
            pieces -= 1
        return cls(slots, width, pieces)

    @property
    def calls(self) -> int:
        return -(-self.slots // self.width)

    @property
    def piece_calls(self) -> int:
        """g: the calls of each piece (the last padded with zero calls)."""
        return -(-self.calls // self.pieces)

    @property
    def piece_length(self) -> int:
        return 2 * self.width + 2 * self.piece_calls + 1

    @property
    def proof_length(self) -> int:
        return self.pieces * self.piece_length

    @property
    def nodes(self) -> int:
        """The query point must exceed this: each piece's evaluation nodes are 0..2g."""
        return 2 * self.piece_calls

    @property
    def opened(self) -> int:
        """Field elements opened per proof: A(r), B(r) and Π(r) of each piece."""
        return self.pieces * (2 * self.width + 1)

    def grid(self, wires: np.ndarray) -> np.ndarray:
        """Slots (..., L) → (..., pieces, g, c), the padding slots zero (leading axes: a batch)."""
        lead = wires.shape[:-1]
        out = np.zeros((*lead, self.pieces * self.piece_calls * self.width), dtype=np.uint64)
        out[..., : self.slots] = wires
        return out.reshape(*lead, self.pieces, self.piece_calls, self.width)

    def outputs(self, proof: np.ndarray) -> np.ndarray:
        """The claimed gadget outputs Π(1..g) of every piece, G in all (shares, if ``proof`` is a
        share; leading axes: a batch of proofs)."""
        c, g, lead = self.width, self.piece_calls, proof.shape[:-1]
        pieces = proof.reshape(*lead, self.pieces, self.piece_length)[..., 2 * c + 1: 2 * c + 1 + g]
        return pieces.reshape(*lead, -1)[..., : self.calls]


def prove(left: np.ndarray, right: np.ndarray, layout: Layout, seeds: np.ndarray | None = None) -> np.ndarray:
    """The proof for the products left·right, slot by slot (module docstring): each piece's seeds,
    then its Π at 0..2g."""
    c, g, k = layout.width, layout.piece_calls, layout.pieces
    if seeds is None:
        seeds = F.from_words(np.frombuffer(secrets.token_bytes(16 * c * k), dtype=np.uint64).copy())
    seeds = seeds.reshape(k, 2 * c)
    wires = layout.grid(left)
    if right is left:  # squares: the wires extended once (through 0 at node 0); only the seeds differ
        ext0 = F.extension_matrix(g + 1, 2 * g + 1)[:, :1]  # the seed's weight at g+1..2g
        shared = _extend(np.concatenate([np.zeros((k, 1, c), dtype=np.uint64), wires], axis=1))
        a = np.concatenate([seeds[:, None, :c], wires, F.add(shared, F.mul(ext0[None], seeds[:, None, :c]))], 1)
        b = np.concatenate([seeds[:, None, c:], wires, F.add(shared, F.mul(ext0[None], seeds[:, None, c:]))], 1)
    else:
        a = np.concatenate([seeds[:, None, :c], wires], axis=1)  # values of A_j at 0..g, by piece
        b = np.concatenate([seeds[:, None, c:], layout.grid(right)], axis=1)
        a, b = (np.concatenate([v, _extend(v)], axis=1) for v in (a, b))
    pi = F.sum_along(F.mul(a, b), axis=2)  # Π at 0..2g, (pieces, 2g+1)
    return np.concatenate([seeds, pi], axis=1).reshape(-1).astype(np.uint64)


def _extend(values: np.ndarray) -> np.ndarray:
    """(pieces, g+1, c) values at the nodes 0..g → (pieces, g, c) values at g+1..2g
    (:func:`~.field.extend`), every piece's columns side by side in one pass."""
    k, n, c = values.shape
    flat = np.ascontiguousarray(values.transpose(1, 0, 2).reshape(n, k * c))
    return F.extend(flat, n - 1).reshape(-1, k, c).transpose(1, 0, 2)


@dataclass(frozen=True)
class Openings:
    """A party's shares of what the verifiers open for one proof, by piece (leading axes: a batch
    of proofs)."""

    a: np.ndarray  # A_j(r), (..., pieces, c)
    b: np.ndarray  # B_j(r), (..., pieces, c)
    pi: np.ndarray  # Π(r), (..., pieces)

    def vector(self) -> np.ndarray:
        lead = self.pi.shape[:-1]
        return np.concatenate([self.a, self.b, self.pi[..., None]], axis=-1).reshape(*lead, -1).astype(np.uint64)

    @classmethod
    def from_vector(cls, v: np.ndarray, layout: Layout) -> Openings:
        c = layout.width
        m = np.asarray(v, dtype=np.uint64).reshape(layout.pieces, 2 * c + 1)
        return cls(m[:, :c], m[:, c: 2 * c], m[:, 2 * c])


def check_point(r: int, layout: Layout) -> None:
    if r % F.P <= layout.nodes:
        raise ValueError("the query point must not be one of the proof's nodes 0..2g")


def query_share(left: np.ndarray, right: np.ndarray, proof: np.ndarray, layout: Layout, r: int) -> Openings:
    """This party's shares of A(r), B(r), Π(r) of every piece, from its shares of the wires and of
    the proof: all linear, so the shares of the parties sum to the values. Leading axes are a
    batch (many contributors' shares checked at one point in a few products)."""
    check_point(r, layout)
    c, g, k = layout.width, layout.piece_calls, layout.pieces
    lead = proof.shape[:-1]
    lam = F.lagrange_at(g + 1, r)  # the same for every piece: each has the nodes 0..g
    pieces = proof.reshape(*lead, k, layout.piece_length)
    seeds = pieces[..., : 2 * c]

    def at_r(wires: np.ndarray) -> np.ndarray:  # (..., L) wires → their part of the (..., k, c) values at r
        flat = np.ascontiguousarray(np.swapaxes(layout.grid(wires), -1, -2)).reshape(-1, g)
        return F.rowdot(flat, lam[1:]).reshape(*lead, k, c)

    left_part = at_r(left)
    right_part = left_part if right is left else at_r(right)  # squares: the wires' part once
    a = F.add(left_part, F.mul(seeds[..., :c], lam[0]))
    b = F.add(right_part, F.mul(seeds[..., c:], lam[0]))
    values = np.ascontiguousarray(pieces[..., 2 * c:]).reshape(-1, 2 * g + 1)
    pi = F.rowdot(values, F.lagrange_at(2 * g + 1, r)).reshape(*lead, k)
    return Openings(a, b, pi)


def accept(opened: Openings) -> bool:
    """The opened values: Π(r) = Σ_j A_j(r)·B_j(r), for every piece."""
    return bool(np.array_equal(F.sum_along(F.mul(opened.a, opened.b), axis=1), opened.pi))
