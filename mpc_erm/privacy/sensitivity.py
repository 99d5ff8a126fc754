"""ℓ2 (and ℓ1) sensitivities of the two aggregates the MPC perturbs (docs/explanation/privacy.md §2).

Setting (docs/explanation/contracts.md, thesis ch. 6): m parties, party j holds n_j records, n = Σ n_j.
The loss ℓ(·, x, y) is convex and G-Lipschitz in θ (so every per-example gradient, or clipped
gradient, has norm ≤ G), the regulariser is N(θ) = ½‖θ‖², and the local objective
J_j(θ) = (1/n_j)·Σ_{i∈D_j} ℓ_i(θ) + λN(θ) is λ-strongly convex.

Two weightings of the parties:
- ``"pooled"`` (product default): weights n_j/n, i.e. every record counts equally;
- ``"thesis"``: weights 1/m, as in thesis Thms 6.3.1/6.3.4 — worse when sizes are unequal,
  since the sensitivity is driven by the smallest party n₍₁₎ = min_j n_j.

Two adjacency relations (docs/explanation/contracts.md): ``"replace"`` (replace one record; default) and
``"add_remove"`` (add or remove one record).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from . import _checks

Weighting = Literal["pooled", "thesis"]
Adjacency = Literal["replace", "add_remove"]
WEIGHTINGS = ("pooled", "thesis")

__all__ = [
    "Adjacency",
    "Weighting",
    "gradient_sensitivity",
    "l1_from_l2",
    "output_perturbation_sensitivity",
]


def output_perturbation_sensitivity(
    G: float,
    lam: float,
    sizes: Sequence[int],
    weighting: Weighting = "pooled",
    adjacency: Adjacency = "replace",
) -> float:
    """ℓ2-sensitivity of the aggregated model A = Σ_j w_j·θ̂⁽ʲ⁾ of local regularised minimisers.

    Key fact (Chaudhuri–Monteleoni–Sarwate 2011, Cor. 8; thesis Lemma 6.5.2): if two objectives
    are λ-strongly convex and their difference has gradient norm ≤ g, their minimisers are
    ≤ g/λ apart. Also every local minimiser has ‖θ̂⁽ʲ⁾‖ ≤ G/λ, since λθ̂ = −mean ∇ℓ.

    Replace (record of party j): J_j changes by (ℓ_z' − ℓ_z)/n_j, gradient ≤ 2G/n_j, so
    θ̂⁽ʲ⁾ moves ≤ 2G/(n_j·λ) and no other party's model moves.
      pooled w_j = n_j/n:  Δ = (n_j/n)·2G/(n_j·λ) = 2G/(n·λ);
      thesis w_j = 1/m:    Δ = 2G/(m·n_j·λ) ≤ 2G/(m·n₍₁₎·λ)  (thesis Thm 6.3.1).

    Add/remove, thesis weighting (weights 1/m do not depend on sizes): adding z to party j
    changes J_j by (ℓ_z − mean_{D_j} ℓ)/(n_j+1), gradient ≤ 2G/(n_j+1); removing one from a
    party of n_j records moves θ̂⁽ʲ⁾ by ≤ 2G/(n_j·λ). So Δ = 2G/(m·n₍₁₎·λ), as for replace.

    Add/remove, pooled weighting: Δ = 4G/(n·λ) — twice the replace value. The short argument
    "with D' = D∪{z}, ‖∇(J_D' − J_D)‖ ≤ 2G/(n+1), so 2G/(nλ) remains valid" holds for the
    minimiser of the *pooled* objective (1/n)Σℓ + λN, but A is a weighted average of *local*
    minimisers whose weights n_j/n change with the record as well. Exactly:
        A' − A = [(n_j+1)·(θ̂'⁽ʲ⁾ − θ̂⁽ʲ⁾) + (θ̂⁽ʲ⁾ − A)] / (n+1),
    whose first term is ≤ 2G/λ (above) and second ≤ 2G/λ (all models lie in the G/λ ball), so
    ‖A' − A‖ ≤ 4G/((n+1)λ) for adding and ≤ 4G/(n·λ) for removing (swap the roles). The two
    terms can add up beyond 2G/λ: ``tests/privacy/test_sensitivity.py`` builds a smooth convex
    G-Lipschitz instance with ‖A' − A‖ ≈ 2.33·G/((n+1)λ) > 2G/(nλ). So 2G/(nλ) is NOT valid
    for this aggregate under add/remove; 4G/(nλ) is, with n the size of the dataset at hand.
    The product does not release this aggregate under add/remove (its n would have to be public):
    it releases Σ_j (n_j/n̂)·θ̂⁽ʲ⁾ with a public n̂, bounded by :class:`.plan.PrivacyPlan`.
    """
    g = _checks.positive("G", G)
    lm = _checks.positive("lam", lam)
    ns = _checks.sizes("sizes", sizes)
    w = _checks.choice("weighting", weighting, WEIGHTINGS)
    adj = _checks.adjacency("adjacency", adjacency)
    if w == "thesis":
        return 2.0 * g / (len(ns) * min(ns) * lm)
    n = sum(ns)
    return (2.0 if adj == "replace" else 4.0) * g / (n * lm)


def gradient_sensitivity(
    G: float,
    sizes: Sequence[int],
    weighting: Weighting = "pooled",
    adjacency: Adjacency = "replace",
) -> float:
    """ℓ2-sensitivity of the normalised aggregated clipped gradient (one round of MPC Grad P).

    The aggregate is Σ_j w_j·(1/n_j)·Σ_{i∈D_j} clip_G(∇ℓ_i(θ_t)) at the public θ_t; each clipped
    gradient has norm ≤ G.
      pooled (w_j = n_j/n, i.e. (1/n)·Σ_all clip(g_i)):
        replace:    2G/n  (one summand changes from g to g', ‖g − g'‖ ≤ 2G);
        add_remove: G/n   with n treated as PUBLIC: the protocol divides by the agreed n, not by
                    the realised count, so adding/removing changes the sum by ≤ G. (Dividing by
                    the realised count instead gives (g − S/n)/(n+1), ≤ 2G/(n+1): use "replace".)
      thesis (w_j = 1/m, thesis Thm 6.3.4 proof):
        replace:    2G/(m·n₍₁₎);
        add_remove: G/(m·n₍₁₎), again with every n_j public.
    """
    g = _checks.positive("G", G)
    ns = _checks.sizes("sizes", sizes)
    w = _checks.choice("weighting", weighting, WEIGHTINGS)
    adj = _checks.adjacency("adjacency", adjacency)
    factor = 2.0 if adj == "replace" else 1.0
    if w == "thesis":
        return factor * g / (len(ns) * min(ns))
    return factor * g / sum(ns)


def l1_from_l2(delta2: float, dim: int) -> float:
    """ℓ1-sensitivity implied by an ℓ2 bound in d dimensions: Δ₁ = √d·Δ₂ (Cauchy–Schwarz; tight
    for a difference along (1,…,1)/√d). Per-coordinate Laplace needs Δ₁ (docs/explanation/papers.md §T6)."""
    d2 = _checks.positive("delta2", delta2)
    d = _checks.positive_int("dim", dim)
    return math.sqrt(d) * d2
