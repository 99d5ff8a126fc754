"""The Gaussian mechanism: classic calibration, and the exact one through Gaussian DP (GDP).

Why GDP: a Gaussian mechanism with ℓ2-sensitivity Δ and noise std σ is exactly μ-GDP with
μ = Δ/σ (Dong–Roth–Su 2019), and T adaptive compositions of it are exactly √T·μ-GDP, i.e. the
same privacy curve as *one* Gaussian mechanism. Its (ε, δ) curve is the hockey-stick divergence
between N(0,1) and N(μ,1) (Balle–Wang 2018, "analytic Gaussian mechanism"):

    δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2)

which is the function θ_{e^ε}(μ) of paper 004 (docs/explanation/papers.md §004.3, Definition 1) and the "exact
alternative" of docs/explanation/papers.md §003.8. So T full-batch gradient steps are calibrated exactly, with no
slack from an RDP/zCDP→(ε,δ) conversion (docs/explanation/privacy.md §4: ~20 % less noise than the thesis's zCDP
route). One implementation serves both uses; :mod:`.contraction` calls :func:`gdp_delta`.

Numerics: δ is computed in log space with ``scipy.special.log_ndtr`` and a log-difference, so
ε/μ ≫ 1 (δ down to ~1e-300) neither overflows e^ε nor cancels to 0. For μ ≤ 1 the log-ratio of
the two Φ terms, which nearly cancels e^ε, is integrated rather than subtracted (see
:func:`_log_phi_ratio`): the subtraction of two ``log_ndtr`` values lost ~1e-11 of log δ there, and
the curve's computed values were not monotone at that scale. Every inverse is solved by
Brent's method on the monotone log-curve and then nudged, if need be, to the *safe* side of the
target (the returned σ never gives δ above the target, the returned ε never below the true one).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.optimize import brentq
from scipy.special import erfcx, log_ndtr

from . import _checks

__all__ = [
    "analytic_gaussian_sigma",
    "classic_gaussian_sigma",
    "gaussian_delta_for_rounds",
    "gaussian_epsilon_for_rounds",
    "gaussian_sigma_for_rounds",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_log_delta",
    "gdp_meets",
    "gdp_mu",
]

_NUDGE_STEPS = 128
_TIGHTEN_ULPS = 16
#: Up to this μ, log Φ(x + μ/2) − log Φ(x − μ/2) is integrated (:func:`_log_phi_ratio`).
_INTEGRATE_MU = 1.0
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(16)


def classic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """σ = Δ·√(2 ln(1.25/δ))/ε (Dwork–Roth 2014, Thm A.1).

    That theorem is proved only for ε < 1, so larger ε is refused rather than silently
    extrapolated. Kept as a baseline: :func:`analytic_gaussian_sigma` is always smaller.
    """
    d = _checks.positive("sensitivity", sensitivity)
    eps = _checks.positive("epsilon", epsilon)
    dl = _checks.probability_open("delta", delta)
    if eps >= 1.0:
        raise ValueError(
            "epsilon must be < 1 for the classic Gaussian mechanism (Dwork–Roth Thm A.1), "
            f"got {epsilon!r}; "
            "use analytic_gaussian_sigma"
        )
    return d * math.sqrt(2.0 * math.log(1.25 / dl)) / eps


def gdp_log_delta(mu: float, epsilon: float) -> float:
    """log δ(ε) of a μ-GDP mechanism (−inf where δ = 0)."""
    m = _checks.nonnegative_or_inf("mu", mu)
    eps = _checks.nonnegative("epsilon", epsilon)
    if m == 0.0:
        return -math.inf
    if math.isinf(m):
        return 0.0
    a = float(log_ndtr(-eps / m + m / 2.0))
    if m <= _INTEGRATE_MU:
        diff = eps - _log_phi_ratio(-eps / m, m / 2.0)  # b − a, without subtracting two log Φ
        if not diff < 0.0 or not math.isfinite(a):
            return -math.inf
        return a + math.log(-math.expm1(diff))
    b = eps + float(log_ndtr(-eps / m - m / 2.0))
    if not b < a:  # rounding in the far tail; the true value is > 0 but below ~1e-300
        return -math.inf
    return a + math.log(-math.expm1(b - a))


def _log_phi_ratio(x: float, h: float) -> float:
    """log Φ(x + h) − log Φ(x − h) = ∫ φ(t)/Φ(t) dt over [x − h, x + h], by 16-point
    Gauss–Legendre (the integrand is analytic and h ≤ ½, so the rule is exact to rounding), with
    φ/Φ = √(2/π)/erfcx(−t/√2), accurate for every t. Why: for small μ, δ's two terms differ by a
    factor e^(ε − this), and this is within a hair of ε; computed as a difference of two
    ``log_ndtr`` values it carried their absolute rounding (≈ 1e-16·|log Φ|) into a tiny result."""
    t = x + h * _GL_NODES
    return float(h * np.sum(_GL_WEIGHTS * (math.sqrt(2.0 / math.pi) / erfcx(-t / math.sqrt(2.0)))))


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) = Φ(−ε/μ+μ/2) − e^ε·Φ(−ε/μ−μ/2) for a μ-GDP mechanism (ε ≥ 0).

    μ = 0 gives 0 (no information released); μ = ∞ gives 1.
    """
    return math.exp(gdp_log_delta(mu, epsilon))


def gdp_meets(mu: float, epsilon: float, delta: float) -> bool:
    """δ(ε) ≤ δ for a μ-GDP mechanism, in log space and after exponentiation alike: the one test
    every calibration here lands on, so that a σ calibrated for (ε, δ) gives back ε at most (the
    two spellings of the same inequality can disagree by an ulp near the target)."""
    lv = gdp_log_delta(mu, epsilon)
    return lv <= math.log(delta) and math.exp(lv) <= delta


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ ``delta`` for a μ-GDP mechanism.

    δ(ε) is strictly decreasing in ε (the hockey-stick divergence E_γ decreases in γ), so the
    root is unique; the result is rounded up so that ``gdp_delta(mu, eps) <= delta``.
    """
    m = _checks.nonnegative("mu", mu)
    dl = _checks.probability_open("delta", delta)
    log_target = math.log(dl)
    if gdp_log_delta(m, 0.0) <= log_target:
        return 0.0

    def f(e: float) -> float:
        return gdp_log_delta(m, e) - log_target

    def ok(e: float) -> bool:
        return gdp_meets(m, e, dl)

    # Classic tail bound: μ-GDP is (μ²/2 + μ·√(2 ln(1/δ)), δ)-DP, so the root lies below.
    hi = m * m / 2.0 + m * math.sqrt(2.0 * math.log(1.0 / dl)) + 1.0
    while f(hi) > 0:
        hi *= 2.0
    eps = _brent(f, 0.0, hi)
    return _nudge(eps, ok, up=True)


def gdp_mu(epsilon: float, delta: float) -> float:
    """Largest μ such that a μ-GDP mechanism is (ε, δ)-DP.

    δ(μ) is strictly increasing in μ (θ_γ is increasing, docs/explanation/papers.md §004.3), so the root is unique;
    the result is rounded down so that ``gdp_delta(mu, epsilon) <= delta``.
    """
    eps = _checks.nonnegative("epsilon", epsilon)
    dl = _checks.probability_open("delta", delta)
    log_target = math.log(dl)

    def f(m: float) -> float:
        return gdp_log_delta(m, eps) - log_target

    def ok(m: float) -> bool:
        return gdp_meets(m, eps, dl)

    hi = 1.0
    while f(hi) < 0:
        hi *= 2.0
    lo = hi / 2.0  # f(0) = −inf: walk down to a positive μ whose δ is below the target
    while f(lo) >= 0:
        lo /= 2.0
    mu = _brent(f, lo, hi)
    return _nudge(mu, ok, up=False)


def analytic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest σ for which N(0, σ²) noise on a Δ-sensitive query is (ε, δ)-DP (Balle–Wang 2018).

    Valid for every ε > 0 (unlike :func:`classic_gaussian_sigma`), and exact: at the returned σ
    the hockey-stick divergence equals δ up to rounding.
    """
    return gaussian_sigma_for_rounds(sensitivity, 1, epsilon, delta)


def gaussian_sigma_for_rounds(
    sensitivity: float, rounds: int, epsilon: float, delta: float
) -> float:
    """σ such that T Gaussian steps (each Δ-sensitive, std σ) are jointly (ε, δ)-DP.

    T full-batch steps compose to one √T·Δ/σ-GDP mechanism (exactly; Dong–Roth–Su Cor. 3.3),
    so σ = √T·Δ/μ(ε, δ). Adaptivity is allowed: each step may depend on earlier outputs.
    """
    d = _checks.positive("sensitivity", sensitivity)
    t = _checks.positive_int("rounds", rounds)
    eps = _checks.positive("epsilon", epsilon)
    dl = _checks.probability_open("delta", delta)
    mu = gdp_mu(eps, dl)
    sigma = math.sqrt(t) * d / mu
    # μ was rounded down, but σ = √T·Δ/μ rounds again: make sure the composed μ does not exceed it.
    return _nudge(sigma, lambda s: gdp_meets(math.sqrt(t) * d / s, eps, dl), up=True)


def gaussian_epsilon_for_rounds(
    sensitivity: float, sigma: float, rounds: int, delta: float
) -> float:
    """ε at ``delta`` of T Gaussian steps with sensitivity Δ and std σ (μ = √T·Δ/σ)."""
    d = _checks.positive("sensitivity", sensitivity)
    s = _checks.positive("sigma", sigma)
    t = _checks.positive_int("rounds", rounds)
    return gdp_epsilon(math.sqrt(t) * d / s, delta)


def gaussian_delta_for_rounds(
    sensitivity: float, sigma: float, rounds: int, epsilon: float
) -> float:
    """δ at ``epsilon`` of T Gaussian steps with sensitivity Δ and std σ."""
    d = _checks.positive("sensitivity", sensitivity)
    s = _checks.positive("sigma", sigma)
    t = _checks.positive_int("rounds", rounds)
    return gdp_delta(math.sqrt(t) * d / s, epsilon)


def _brent(f: Callable[[float], float], lo: float, hi: float) -> float:
    """Root of a monotone ``f`` bracketed by [lo, hi]; infinite end values (log δ = −inf in the
    far tail) are first bisected away, since Brent's interpolation cannot use them."""
    flo, fhi = f(lo), f(hi)
    for _ in range(2000):
        if math.isfinite(flo) and math.isfinite(fhi):
            break
        mid = 0.5 * (lo + hi)
        fm = f(mid)
        if fm == 0.0:
            return mid
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi, fhi = mid, fm
    return float(brentq(f, lo, hi, xtol=1e-300, rtol=1e-15, maxiter=1000))


def _nudge(x: float, ok: Callable[[float], bool], *, up: bool) -> float:
    """The value nearest ``x`` on the safe side (``up``: the smallest above, else the largest
    below) with ``ok``: root finders stop within a tolerance on either side of the root, and a
    calibration must land on the side that keeps the guarantee. It steps by ulps first (then by
    growing steps), and then takes the tightest ``ok`` value within :data:`_TIGHTEN_ULPS` ulps back:
    the computed curve is not monotone at the scale of an ulp, so the first safe value met is not
    always the tightest (a σ calibrated for ε then read back a hair above ε)."""
    toward, back = (math.inf, 0.0) if up else (0.0, math.inf)
    for i in range(_NUDGE_STEPS):
        if ok(x):
            break
        x = math.nextafter(x, toward) if i < _NUDGE_STEPS // 2 else (x * (1 + 1e-14) if up else x * (1 - 1e-14))
    else:
        if not ok(x):
            raise ArithmeticError("calibration could not reach the safe side of the target")  # pragma: no cover
    best = y = x
    for _ in range(_TIGHTEN_ULPS):
        y = math.nextafter(y, back)
        if y <= 0.0:
            break
        if ok(y):
            best = y
    return best
