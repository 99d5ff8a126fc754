"""Privacy amplification by iteration via contraction coefficients (paper 004, Asoodeh–Diaz–
Calmon; docs/explanation/papers.md §004).

Setting (docs/explanation/papers.md §004.5): projected noisy SGD (PNSGD) over a compact convex set 𝕂 of diameter D,
one pass in a fixed order, record i used at step i of n, update
Y_{t+1} = Π_𝕂(Y_t − η[∇ℓ(Y_t, x_{t+1}) + Z_{t+1}]), and ONLY the final iterate is released.
The loss is L-Lipschitz, β-smooth and ρ-strongly convex (0 ≤ ρ ≤ β) and η < 2/(β+ρ), so the
gradient step is M-Lipschitz with M = √(1 − 2ηβρ/(β+ρ)) (Lemma 4, eq. 14).

All guarantees are "(ε, δ)-DP for the i-th input" (replace-one adjacency at position i).

θ_γ(r) = Q(log γ/r − r/2) − γ·Q(log γ/r + r/2) (Definition 1, eq. 10) is the hockey-stick
divergence of two unit Gaussians at distance r, i.e. the δ(ε = log γ) of r-GDP:
the same function as :func:`.gaussian.gdp_delta`, which is reused (one θ implementation,
docs/explanation/papers.md §X).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from scipy.optimize import brentq

from . import _checks
from .gaussian import gdp_log_delta
from .laplace import laplace_hockey_stick

__all__ = [
    "ContractionBound",
    "contraction_factor",
    "feldman_balle_delta",
    "feldman_balle_epsilon",
    "feldman_balle_kappa",
    "log_theta_gamma",
    "pnsgd_best_delta",
    "pnsgd_epsilon",
    "pnsgd_gaussian_delta",
    "pnsgd_gaussian_log_delta",
    "pnsgd_laplace_delta",
    "pnsgd_random_stop_delta",
    "theta_gamma",
]


def log_theta_gamma(gamma: float, r: float) -> float:
    """log θ_γ(r) (−inf where θ = 0, e.g. r = 0)."""
    g = _checks.positive("gamma", gamma)
    if g < 1.0:
        raise ValueError(f"gamma must be >= 1, got {gamma!r}")
    rr = _checks.nonnegative_or_inf("r", r)
    return gdp_log_delta(rr, math.log(g))


def theta_gamma(gamma: float, r: float) -> float:
    """θ_γ(r) = E_γ(N(r·u, I) ‖ N(0, I)), γ ≥ 1, r ≥ 0 (paper 004, eq. 10).

    θ_γ(0) = 0, θ_1(r) = 1 − 2Q(r/2) (total variation), increasing in r, < 1 for finite r.
    """
    return math.exp(log_theta_gamma(gamma, r))


def contraction_factor(eta: float, beta: float, rho: float = 0.0) -> float:
    """M = √(1 − 2ηβρ/(β+ρ)) of Lemma 4 (eq. 14), checking its hypotheses ρ ≤ β and
    η < 2/(β+ρ). The paper's Fig. 3 setting has ρ = 0.4 > β = 0.3, which no real loss satisfies
    (docs/explanation/papers.md §004.9); it is refused here."""
    e = _checks.positive("eta", eta)
    b = _checks.positive("beta", beta)
    r = _checks.nonnegative("rho", rho)
    if r > b:
        raise ValueError(
            "rho must be <= beta (a ρ-strongly convex β-smooth loss has ρ ≤ β), "
            f"got rho={rho!r} > beta={beta!r}"
        )
    if not e < 2.0 / (b + r):
        raise ValueError(f"eta must be < 2/(beta+rho) = {2.0 / (b + r)!r} (Lemma 4), got {eta!r}")
    return math.sqrt(1.0 - 2.0 * e * b * r / (b + r))


def _check_record(i: int, n: int) -> tuple[int, int]:
    nn = _checks.positive_int("n", n)
    ii = _checks.positive_int("i", i)
    if ii > nn:
        raise ValueError(f"i must be in [1, n] = [1, {nn}], got {i!r}")
    return ii, nn


def pnsgd_gaussian_log_delta(
    epsilon: float, i: int, n: int, L: float, sigma: float, eta: float, diameter: float, M: float
) -> float:
    """log δ of Theorem 4: log θ_{e^ε}(2L/σ) + (n − i)·log θ_{e^ε}(M·D/(η·σ)).

    Parameters are those of docs/explanation/papers.md §004.7: L the Lipschitz constant, σ the std of the gradient
    noise Z (so the parameter-space noise is η·σ), η the step size, D the diameter of 𝕂, M from
    :func:`contraction_factor`. Computed in log space (values like 1e-113 occur, docs/explanation/papers.md §004.11).
    """
    eps = _checks.nonnegative("epsilon", epsilon)
    ii, nn = _check_record(i, n)
    lip = _checks.positive("L", L)
    s = _checks.positive("sigma", sigma)
    e = _checks.positive("eta", eta)
    dk = _checks.nonnegative("diameter", diameter)
    m = _checks.nonnegative("M", M)
    if m > 1.0:
        raise ValueError(f"M must lie in [0, 1], got {M!r}")
    gamma = math.exp(eps)
    first = log_theta_gamma(gamma, 2.0 * lip / s)
    k = nn - ii
    if k == 0:  # 0**0 = 1 convention of docs/explanation/papers.md §004.6: the last record gets no amplification
        return first
    step = log_theta_gamma(gamma, m * dk / (e * s))
    if step == -math.inf or first == -math.inf:
        return -math.inf
    return first + k * step


def pnsgd_gaussian_delta(
    epsilon: float, i: int, n: int, L: float, sigma: float, eta: float, diameter: float, M: float
) -> float:
    """δ = θ_{e^ε}(2L/σ)·θ_{e^ε}(M·D/(η·σ))^{n−i} — Theorem 4 of paper 004 (Gaussian PNSGD),
    (ε, δ)-DP for the i-th input for every ε ≥ 0. Independent of the dimension, but degrades
    to no amplification when D ≫ η·σ (docs/explanation/papers.md §004.9 caveat)."""
    return math.exp(pnsgd_gaussian_log_delta(epsilon, i, n, L, sigma, eta, diameter, M))


def feldman_balle_kappa(i: int, n: int, L: float, sigma: float, M: float) -> float:
    """κ of Proposition 1 (main-text version, docs/explanation/papers.md §004.8): PNSGD is (α, κα)-RDP for input i,
    κ = 2L²·M^{n−i+1}/((n−i)·σ²) for i < n and κ = 2L²/σ² for i = n.

    The appendix's variants (no σ², a stray α) are typos (docs/explanation/papers.md §004.8); that section
    also flags as UNCLEAR whether Feldman et al.'s original has n−i+1 in the denominator. The
    paper's formula is used as written.
    """
    ii, nn = _check_record(i, n)
    lip = _checks.positive("L", L)
    s = _checks.positive("sigma", sigma)
    m = _checks.nonnegative("M", M)
    if m > 1.0:
        raise ValueError(f"M must lie in [0, 1], got {M!r}")
    if ii == nn:
        return 2.0 * lip * lip / (s * s)
    k = nn - ii
    return 2.0 * lip * lip * m ** (k + 1) / (k * s * s)


def feldman_balle_delta(epsilon: float, i: int, n: int, L: float, sigma: float, M: float) -> float:
    """δ̃ = exp(−(ε − κ)²/(4κ)) for ε > κ, else 1 — Proposition 1 (eq. 15): the (α, κα)-RDP
    bound converted with δ = exp(−(α−1)(ε − κα)) at the optimal α* = (ε+κ)/(2κ)."""
    eps = _checks.nonnegative("epsilon", epsilon)
    kappa = feldman_balle_kappa(i, n, L, sigma, M)
    if kappa == 0.0:
        return 0.0
    if eps <= kappa:
        return 1.0
    return math.exp(-((eps - kappa) ** 2) / (4.0 * kappa))


def feldman_balle_epsilon(delta: float, i: int, n: int, L: float, sigma: float, M: float) -> float:
    """Inverse of :func:`feldman_balle_delta`: ε = κ + 2√(κ·log(1/δ))."""
    dl = _checks.probability_open("delta", delta)
    kappa = feldman_balle_kappa(i, n, L, sigma, M)
    return kappa + 2.0 * math.sqrt(kappa * math.log(1.0 / dl))


@dataclass(frozen=True)
class ContractionBound:
    """The smaller of two valid (ε, δ) bounds and which one gave it."""

    epsilon: float
    delta: float
    winner: Literal["theorem4", "feldman_balle"]
    delta_theorem4: float
    delta_feldman_balle: float


def pnsgd_best_delta(
    epsilon: float, i: int, n: int, L: float, sigma: float, eta: float, diameter: float, M: float
) -> ContractionBound:
    """min(δ_Thm4, δ̃_Prop1) at ε: both are valid upper bounds for the same mechanism and input,
    so the minimum is too (docs/explanation/papers.md §004.9: Thm 4 wins at small ε / late records, Prop. 1 at large ε
    or large diameter). Ties go to Theorem 4."""
    d4 = pnsgd_gaussian_delta(epsilon, i, n, L, sigma, eta, diameter, M)
    dp = feldman_balle_delta(epsilon, i, n, L, sigma, M)
    winner: Literal["theorem4", "feldman_balle"] = "theorem4" if d4 <= dp else "feldman_balle"
    return ContractionBound(float(epsilon), min(d4, dp), winner, d4, dp)


def pnsgd_epsilon(
    delta: float,
    i: int,
    n: int,
    L: float,
    sigma: float,
    eta: float,
    diameter: float,
    M: float,
    method: Literal["min", "theorem4", "feldman_balle"] = "min",
) -> ContractionBound:
    """Smallest ε whose δ is ≤ ``delta`` under Theorem 4, Prop. 1, or their minimum.

    Both δ curves decrease in ε (E_γ decreases in γ), so ε_min = min(ε_Thm4, ε_Prop1). ε_Thm4
    is 0 when the ε = 0 (total-variation) bound already meets the target (docs/explanation/papers.md §004.11).
    """
    dl = _checks.probability_open("delta", delta)
    meth = _checks.choice("method", method, ("min", "theorem4", "feldman_balle"))
    log_target = math.log(dl)

    def f(e: float) -> float:
        return pnsgd_gaussian_log_delta(e, i, n, L, sigma, eta, diameter, M) - log_target

    if f(0.0) <= 0:
        eps4 = 0.0
    else:
        hi = 1.0
        while f(hi) > 0:
            hi *= 2.0
        eps4 = float(brentq(f, 0.0, hi, xtol=1e-13, rtol=1e-13, maxiter=500))
        while f(eps4) > 0:  # round up to the safe side
            eps4 = math.nextafter(eps4, math.inf)
    epsp = feldman_balle_epsilon(dl, i, n, L, sigma, M)
    if meth == "theorem4" or (meth == "min" and eps4 <= epsp):
        return ContractionBound(
            eps4,
            pnsgd_gaussian_delta(eps4, i, n, L, sigma, eta, diameter, M),
            "theorem4",
            pnsgd_gaussian_delta(eps4, i, n, L, sigma, eta, diameter, M),
            feldman_balle_delta(eps4, i, n, L, sigma, M),
        )
    return ContractionBound(
        epsp,
        feldman_balle_delta(epsp, i, n, L, sigma, M),
        "feldman_balle",
        pnsgd_gaussian_delta(epsp, i, n, L, sigma, eta, diameter, M),
        feldman_balle_delta(epsp, i, n, L, sigma, M),
    )


def pnsgd_random_stop_delta(
    epsilon: float,
    n: int,
    L: float,
    sigma: float,
    eta: float,
    diameter: float,
    M: float,
    *,
    tight: bool = True,
) -> float:
    """δ of randomly-stopped PNSGD (T uniform on [n], output Y_T; Theorem 5), uniform over records.

    ``tight=False``: eq. (16), θ(2L/σ)/(n·(1 − θ_c)) with θ_c = θ_{e^ε}(M·D/(ησ)), capped at 1.
    ``tight=True`` (default): the finite sum of the proof at the worst record i = 1,
    θ(2L/σ)·(1 − θ_c^n)/(n·(1 − θ_c)) — never larger, and finite as θ_c → 1 (docs/explanation/papers.md §004.10).
    """
    eps = _checks.nonnegative("epsilon", epsilon)
    nn = _checks.positive_int("n", n)
    lip = _checks.positive("L", L)
    s = _checks.positive("sigma", sigma)
    e = _checks.positive("eta", eta)
    dk = _checks.nonnegative("diameter", diameter)
    m = _checks.nonnegative("M", M)
    gamma = math.exp(eps)
    first = theta_gamma(gamma, 2.0 * lip / s)
    tc = theta_gamma(gamma, m * dk / (e * s))
    loose = 1.0 if tc >= 1.0 else min(1.0, first / (nn * (1.0 - tc)))
    if not tight:
        return loose
    # Σ_{r=1}^{n} θ_c^{r−1} = (1 − θ_c^n)/(1 − θ_c), with its limits at θ_c ∈ {0, 1}.
    if tc == 0.0:
        geometric = 1.0
    elif tc >= 1.0:
        geometric = float(nn)
    else:
        geometric = -math.expm1(nn * math.log(tc)) / (1.0 - tc)
    return min(loose, first * geometric / nn)  # the min only absorbs rounding


def pnsgd_laplace_delta(
    epsilon: float, i: int, n: int, L: float, v: float, eta: float, a: float, b: float, M: float
) -> float:
    """δ of Theorem 3 (1-D Laplace PNSGD on 𝕂 = [a, b], noise Lap(scale v) times η):
    [1 − e^{ε/2 − L/v}]₊ · [1 − e^{ε/2 − M(b−a)/(2ηv)}]₊^{n−i}, with 0⁰ = 1 at i = n (docs/explanation/papers.md
    §004.6: the paper's "δ = 0 if ε ≥ min{…}" is wrong for i = n)."""
    eps = _checks.nonnegative("epsilon", epsilon)
    ii, nn = _check_record(i, n)
    lip = _checks.positive("L", L)
    vv = _checks.positive("v", v)
    e = _checks.positive("eta", eta)
    if not float(b) > float(a):
        raise ValueError(f"b must be > a, got a={a!r}, b={b!r}")
    m = _checks.nonnegative("M", M)
    first = laplace_hockey_stick(eps, 2.0 * e * lip, e * vv)
    step = laplace_hockey_stick(eps, m * (float(b) - float(a)), e * vv)
    return first * step ** (nn - ii)
