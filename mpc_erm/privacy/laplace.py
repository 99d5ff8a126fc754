"""Laplace-type mechanisms for output perturbation (pure ε-DP).

Two mechanisms, both ε-DP, for a d-dimensional query f with sensitivity Δ:

* per-coordinate Laplace: i.i.d. Lap(b) on each coordinate, b = Δ₁/ε, where Δ₁ is the
  **ℓ1**-sensitivity (Dwork et al. 2006). With only an ℓ2 bound, Δ₁ = √d·Δ₂.
* ℓ2-Laplace ("Gamma-norm"; Chaudhuri–Monteleoni 2009, CMS11 Alg. 1): density
  p(b) ∝ exp(−ε‖b‖₂/Δ₂). For neighbours, p(x − f(D))/p(x − f(D')) =
  exp(ε(‖x − f(D')‖ − ‖x − f(D)‖)/Δ₂) ≤ exp(ε‖f(D) − f(D')‖/Δ₂) ≤ e^ε by the triangle
  inequality. In polar coordinates the density of r = ‖b‖ is ∝ r^{d−1}·e^{−r/s} with s = Δ₂/ε,
  i.e. ‖b‖ ~ Gamma(shape=d, scale=s), and the direction is uniform on the sphere.
  Moments: E‖b‖ = d·s, E‖b‖² = Var + mean² = d·s² + d²·s² = d(d+1)s², so by symmetry each
  coordinate has variance (d+1)·s², std √(d+1)·s.

Comparison at equal ε with Δ₂ known: per-coordinate Laplace with Δ₁ = √d·Δ₂ has coordinate std
√2·√d·Δ₂/ε, ℓ2-Laplace √(d+1)·Δ₂/ε — about √2 less noise, which is why the product offers it.

Thesis note (docs/explanation/privacy.md §3, thesis Thm 6.3.1, Table 6.1): the thesis writes "Lap(Δ/ε)" with Δ
an **ℓ2** sensitivity. Its proof bounds a ratio of exp(·‖θ‖) terms, i.e. it is the ℓ2-Laplace
argument; but Table 6.1's "generated noise" std (1150e-3 for scale 800e-3 ≈ √2·scale) shows
per-coordinate Laplace(Δ₂/ε) was sampled. That literal mechanism is NOT ε-DP: its worst-case
privacy loss is ε·‖f(D) − f(D')‖₁/Δ₂ ≤ √d·ε (:func:`per_coordinate_laplace_epsilon`).
"""

from __future__ import annotations

import math

from . import _checks

__all__ = [
    "l2_laplace_coordinate_std",
    "l2_laplace_epsilon",
    "l2_laplace_norm_mean",
    "l2_laplace_norm_second_moment",
    "l2_laplace_scale",
    "laplace_coordinate_std",
    "laplace_hockey_stick",
    "laplace_scale",
    "per_coordinate_laplace_epsilon",
]


def laplace_scale(l1_sensitivity: float, epsilon: float) -> float:
    """Per-coordinate Laplace scale b = Δ₁/ε (ε-DP for an ℓ1-sensitivity Δ₁)."""
    return _checks.positive("l1_sensitivity", l1_sensitivity) / _checks.positive("epsilon", epsilon)


def laplace_coordinate_std(scale: float) -> float:
    """Std of Lap(b): √2·b."""
    return math.sqrt(2.0) * _checks.positive("scale", scale)


def per_coordinate_laplace_epsilon(scale: float, l2_sensitivity: float, dim: int) -> float:
    """The ε actually achieved by i.i.d. Lap(b) per coordinate when only ‖f(D) − f(D')‖₂ ≤ Δ₂
    is known: √d·Δ₂/b (the ℓ1 norm of a vector in the Δ₂ ball reaches √d·Δ₂). For the
    thesis's literal b = Δ₂/ε this is √d·ε, not ε."""
    b = _checks.positive("scale", scale)
    d2 = _checks.positive("l2_sensitivity", l2_sensitivity)
    d = _checks.positive_int("dim", dim)
    return math.sqrt(d) * d2 / b


def l2_laplace_scale(l2_sensitivity: float, epsilon: float) -> float:
    """Gamma scale s = Δ₂/ε of the ℓ2-Laplace mechanism (density ∝ exp(−‖b‖/s))."""
    return _checks.positive("l2_sensitivity", l2_sensitivity) / _checks.positive("epsilon", epsilon)


def l2_laplace_epsilon(scale: float, l2_sensitivity: float) -> float:
    """ε = Δ₂/s of the ℓ2-Laplace mechanism with scale s."""
    return _checks.positive("l2_sensitivity", l2_sensitivity) / _checks.positive("scale", scale)


def l2_laplace_norm_mean(dim: int, scale: float) -> float:
    """E‖b‖ = d·s (Gamma(d, s) mean)."""
    return _checks.positive_int("dim", dim) * _checks.positive("scale", scale)


def l2_laplace_norm_second_moment(dim: int, scale: float) -> float:
    """E‖b‖² = d(d+1)·s²."""
    d = _checks.positive_int("dim", dim)
    s = _checks.positive("scale", scale)
    return d * (d + 1) * s * s


def l2_laplace_coordinate_std(dim: int, scale: float) -> float:
    """Per-coordinate std √(d+1)·s (E‖b‖²/d by symmetry)."""
    d = _checks.positive_int("dim", dim)
    return math.sqrt(d + 1) * _checks.positive("scale", scale)


def laplace_hockey_stick(epsilon: float, shift: float, scale: float) -> float:
    """E_{e^ε}(Lap(m₁, v) ‖ Lap(m₂, v)) = [1 − exp(ε/2 − |m₁ − m₂|/(2v))]₊ in one dimension
    (paper 004, Lemma 1, docs/explanation/papers.md §004.3; also the δ(ε) curve of the 1-D Laplace mechanism)."""
    eps = _checks.nonnegative("epsilon", epsilon)
    sh = _checks.nonnegative("shift", shift)
    v = _checks.positive("scale", scale)
    return max(0.0, -math.expm1(eps / 2.0 - sh / (2.0 * v)))
