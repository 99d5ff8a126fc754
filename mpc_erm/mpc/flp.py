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


@dataclass(frozen=True)
class Layout:
    """How L products are packed: ``width`` c columns, G = ⌈L/c⌉ calls."""

    slots: int
    width: int

    def __post_init__(self) -> None:
        if self.slots < 1 or self.width < 1:
            raise ValueError("a proof layout needs at least one slot and one column")

    @classmethod
    def balanced(cls, slots: int) -> Layout:
        """c ≈ √L: the smallest proof (2c + 2G + 1 elements)."""
        return cls(slots, max(1, math.isqrt(slots - 1) + 1))

    @property
    def calls(self) -> int:
        return -(-self.slots // self.width)

    @property
    def proof_length(self) -> int:
        return 2 * self.width + 2 * self.calls + 1

    @property
    def opened(self) -> int:
        """Field elements opened per proof: A(r), B(r) and Π(r)."""
        return 2 * self.width + 1

    def grid(self, wires: np.ndarray) -> np.ndarray:
        """Slots (L,) → (G, c), the padding slots zero."""
        out = np.zeros(self.calls * self.width, dtype=np.uint64)
        out[: self.slots] = wires
        return out.reshape(self.calls, self.width)

    def outputs(self, proof: np.ndarray) -> np.ndarray:
        """The claimed gadget outputs Π(1..G) (shares, if ``proof`` is a share)."""
        return proof[2 * self.width + 1: 2 * self.width + 1 + self.calls]


def prove(left: np.ndarray, right: np.ndarray, layout: Layout, seeds: np.ndarray | None = None) -> np.ndarray:
    """The proof for the products left·right, slot by slot (module docstring)."""
    c, g = layout.width, layout.calls
    if seeds is None:
        seeds = F.from_words(np.frombuffer(secrets.token_bytes(16 * c), dtype=np.uint64).copy())
    ext = F.extension_matrix(g + 1, 2 * g + 1)  # values at G+1..2G
    if right is left:  # squares: the wires extended once; only the seeds (row 0) differ
        wires = layout.grid(left)
        shared = F.matvec(np.ascontiguousarray(ext[:, 1:]), wires)
        a = np.vstack([seeds[:c], wires, F.add(shared, F.mul(ext[:, :1], seeds[None, :c]))])
        b = np.vstack([seeds[c:2 * c], wires, F.add(shared, F.mul(ext[:, :1], seeds[None, c:2 * c]))])
    else:
        a = np.vstack([seeds[:c], layout.grid(left)])  # values of A_j at 0..G
        b = np.vstack([seeds[c:], layout.grid(right)])
        a = np.vstack([a, F.matvec(ext, a)])
        b = np.vstack([b, F.matvec(ext, b)])
    pi = F.sum_along(F.mul(a, b), axis=1)  # Π at 0..2G
    return np.concatenate([seeds[: 2 * c], pi]).astype(np.uint64)


@dataclass(frozen=True)
class Openings:
    """A party's shares of what the verifiers open for one proof."""

    a: np.ndarray  # A_j(r), (c,)
    b: np.ndarray  # B_j(r), (c,)
    pi: np.uint64  # Π(r)

    def vector(self) -> np.ndarray:
        return np.concatenate([self.a, self.b, [self.pi]]).astype(np.uint64)

    @classmethod
    def from_vector(cls, v: np.ndarray, layout: Layout) -> Openings:
        c = layout.width
        return cls(v[:c], v[c: 2 * c], np.uint64(v[2 * c]))


def check_point(r: int, layout: Layout) -> None:
    if r % F.P <= 2 * layout.calls:
        raise ValueError("the query point must not be one of the proof's nodes 0..2G")


def query_share(left: np.ndarray, right: np.ndarray, proof: np.ndarray, layout: Layout, r: int) -> Openings:
    """This party's shares of A(r), B(r), Π(r), from its shares of the wires and of the proof: all
    linear, so the shares of the parties sum to the values."""
    check_point(r, layout)
    c, g = layout.width, layout.calls
    lam = F.lagrange_at(g + 1, r)
    if right is left:  # squares: the wires' part once; only the seeds (node 0) differ
        shared = F.matvec(layout.grid(left).T, lam[1:])
        a = F.add(shared, F.mul(proof[:c], lam[0]))
        b = F.add(shared, F.mul(proof[c: 2 * c], lam[0]))
    else:
        a = F.matvec(np.vstack([proof[:c], layout.grid(left)]).T, lam)
        b = F.matvec(np.vstack([proof[c: 2 * c], layout.grid(right)]).T, lam)
    pi = F.dot(F.lagrange_at(2 * g + 1, r), proof[2 * c: 2 * c + 2 * g + 1])
    return Openings(a, b, np.uint64(pi))


def accept(opened: Openings) -> bool:
    """The opened values: Π(r) = Σ_j A_j(r)·B_j(r)."""
    return int(F.dot(opened.a, opened.b)) == int(opened.pi)
