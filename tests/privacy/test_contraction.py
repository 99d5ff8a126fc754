"""Amplification by iteration (mpc_erm.privacy.contraction) against the values of docs/explanation/papers.md §004.9
and §004.10 (computed there from Theorem 4 / Prop. 1 / Theorem 5 for the paper's Fig. 2 and
Fig. 3 settings), θ_γ against direct integration, and Theorem 3 against a brute-force
computation of the 1-D Laplace chain."""

from __future__ import annotations

import math

import pytest
from scipy import integrate, stats

from mpc_erm.privacy import (
    contraction_factor,
    feldman_balle_delta,
    feldman_balle_epsilon,
    feldman_balle_kappa,
    pnsgd_best_delta,
    pnsgd_epsilon,
    pnsgd_gaussian_delta,
    pnsgd_laplace_delta,
    pnsgd_random_stop_delta,
    theta_gamma,
)

# Fig. 2: σ=2, L=1, β=0.5, η=0.5, ρ=0, D=1, n=40 (M=1). Fig. 3: σ=1, L=1, η=0.7, β=0.3, ρ=0.4,
# D=1, n=40, M=√0.76 (ρ>β is the paper's own inconsistency; M is passed directly).
FIG2 = {"L": 1.0, "sigma": 2.0, "eta": 0.5, "diameter": 1.0, "M": 1.0}
FIG3 = {"L": 1.0, "sigma": 1.0, "eta": 0.7, "diameter": 1.0, "M": math.sqrt(0.76)}
EPS = (0.1, 0.5, 1.0, 2.0, 3.0)

# docs/explanation/papers.md §004.9 table: (setting, i): ([δ Thm 4], [δ̃ Prop 1]) at ε = 0.1, 0.5, 1, 2 (, 3)
TABLE = {
    ("fig2", 1): ([7.55e-19, 1.24e-25, 1.39e-36, 6.69e-68], [0.862, 9.77e-3, 5.58e-9, 3.61e-34]),
    ("fig2", 20): ([3.06e-10, 8.40e-14, 1.50e-19, 5.41e-36], [0.945, 0.105, 7.44e-5, 1.15e-17]),
    ("fig2", 39): ([0.124, 5.68e-2, 1.61e-2, 4.38e-4], [1, 1, 0.883, 0.325]),
    ("fig3", 20): ([4.90e-8, 1.96e-10, 3.35e-14, 1.20e-24], [0.672, 1.84e-5, 6.99e-20, 8.80e-78]),
    ("fig3", 30): (
        [1.81e-4, 1.08e-5, 1.31e-7, 6.31e-13, 1.86e-20],
        [0.983, 0.309, 5.71e-3, 4.03e-10, 3.49e-22],
    ),
    ("fig3", 39): ([0.293, 0.201, 0.112, 2.23e-2], [1, 1, 1, 0.963]),
}


@pytest.mark.parametrize(("key", "values"), list(TABLE.items()))
def test_notes_table_theorem4_and_prop1(key: tuple[str, int], values: tuple[list, list]) -> None:
    setting, i = key
    p = FIG2 if setting == "fig2" else FIG3
    thm4, prop1 = values
    for eps, want4, wantp in zip(EPS, thm4, prop1, strict=False):
        # docs/explanation/papers.md §004.9 prints 3 significant digits (0.883 is exp(−0.125) = 0.88250 rounded up)
        assert pnsgd_gaussian_delta(eps, i, 40, **p) == pytest.approx(want4, rel=6e-3)
        assert feldman_balle_delta(eps, i, 40, p["L"], p["sigma"], p["M"]) == pytest.approx(
            wantp, rel=6e-3
        )


def test_notes_kappas() -> None:
    assert feldman_balle_kappa(1, 40, 1.0, 2.0, 1.0) == pytest.approx(0.0128205, rel=1e-5)
    assert feldman_balle_kappa(20, 40, 1.0, 2.0, 1.0) == pytest.approx(0.025)
    assert feldman_balle_kappa(39, 40, 1.0, 2.0, 1.0) == pytest.approx(0.5)
    m = math.sqrt(0.76)
    assert feldman_balle_kappa(20, 40, 1.0, 1.0, m) == pytest.approx(0.0056046, rel=1e-4)
    assert feldman_balle_kappa(30, 40, 1.0, 1.0, m) == pytest.approx(0.044208, rel=1e-4)
    assert feldman_balle_kappa(39, 40, 1.0, 1.0, m) == pytest.approx(1.52)
    assert FIG3["M"] * FIG3["diameter"] / (FIG3["eta"] * FIG3["sigma"]) == pytest.approx(
        1.2454, abs=1e-4
    )


# docs/explanation/papers.md §004.9: ε at δ = 1e-5 via (Thm 4, Prop 1)
EPS_TABLE = {
    ("fig2", 1): (0.0, 0.781),
    ("fig2", 20): (0.0, 1.098),
    ("fig2", 39): (2.754, 5.299),
    ("fig2", 40): (4.377, 5.299),
    ("fig3", 20): (0.0, 0.514),
    ("fig3", 30): (0.510, 1.471),
    ("fig3", 39): (4.678, 9.887),
    ("fig3", 40): (9.997, 11.597),
}


@pytest.mark.parametrize(("key", "want"), list(EPS_TABLE.items()))
def test_notes_epsilon_at_delta(key: tuple[str, int], want: tuple[float, float]) -> None:
    setting, i = key
    p = FIG2 if setting == "fig2" else FIG3
    b4 = pnsgd_epsilon(1e-5, i, 40, **p, method="theorem4")
    bp = pnsgd_epsilon(1e-5, i, 40, **p, method="feldman_balle")
    assert b4.epsilon == pytest.approx(want[0], abs=1e-3)
    assert bp.epsilon == pytest.approx(want[1], abs=1e-3)
    assert b4.delta <= 1e-5 and bp.delta <= 1e-5 * (1 + 1e-9)
    best = pnsgd_epsilon(1e-5, i, 40, **p)
    assert best.epsilon == min(b4.epsilon, bp.epsilon)
    assert best.winner == ("theorem4" if b4.epsilon <= bp.epsilon else "feldman_balle")
    assert feldman_balle_epsilon(1e-5, i, 40, p["L"], p["sigma"], p["M"]) == pytest.approx(
        bp.epsilon
    )


def test_best_delta_reports_winner() -> None:
    # Fig. 3, i = 20: Thm 4 wins at ε = 0.1, Prop. 1 at ε = 1 (docs/explanation/papers.md §004.9)
    small = pnsgd_best_delta(0.1, 20, 40, **FIG3)
    large = pnsgd_best_delta(1.0, 20, 40, **FIG3)
    assert small.winner == "theorem4" and small.delta == pytest.approx(4.90e-8, rel=6e-3)
    assert large.winner == "feldman_balle" and large.delta == pytest.approx(6.99e-20, rel=6e-3)
    # large diameter: Thm 4 gives almost nothing (docs/explanation/papers.md §004.9: D=5 → 5.7e-2 vs 5.6e-9)
    big = pnsgd_best_delta(1.0, 1, 40, **(FIG2 | {"diameter": 5.0}))
    assert big.delta_theorem4 == pytest.approx(5.7e-2, rel=0.01)
    assert big.winner == "feldman_balle" and big.delta == pytest.approx(5.58e-9, rel=6e-3)
    two = pnsgd_best_delta(1.0, 1, 40, **(FIG2 | {"diameter": 2.0}))
    assert two.winner == "theorem4" and two.delta == pytest.approx(4.9e-13, rel=0.01)


def test_random_stop_theorem5_notes_values() -> None:
    fig2 = [1.36e-2, 7.83e-3, 3.63e-3, 5.34e-4]
    fig3 = [2.98e-2, 2.25e-2, 1.63e-2, 8.90e-3]
    for eps, w2, w3 in zip(EPS, fig2, fig3, strict=False):
        assert pnsgd_random_stop_delta(eps, 40, **FIG2, tight=False) == pytest.approx(w2, rel=6e-3)
        assert pnsgd_random_stop_delta(eps, 40, **FIG3, tight=False) == pytest.approx(w3, rel=6e-3)
        assert pnsgd_random_stop_delta(eps, 40, **FIG2) <= pnsgd_random_stop_delta(
            eps, 40, **FIG2, tight=False
        )
    # θ_c → 1 (huge diameter): eq. (16) degenerates to 1, the finite sum stays ≤ θ(2L/σ)
    assert pnsgd_random_stop_delta(1.0, 40, **(FIG2 | {"diameter": 1e6}), tight=False) == 1.0
    assert (
        pnsgd_random_stop_delta(1.0, 40, **(FIG2 | {"diameter": 1e6}))
        <= theta_gamma(math.e, 1.0) + 1e-15
    )


@pytest.mark.parametrize(
    ("gamma", "r"), [(1.0, 1.0), (math.e, 0.5), (math.e, 5.0), (3.0, 2.0), (1.5, 0.1)]
)
def test_theta_gamma_matches_integration(gamma: float, r: float) -> None:
    val = integrate.quad(
        lambda x: max(0.0, stats.norm.pdf(x, loc=r) - gamma * stats.norm.pdf(x)),
        -15,
        15 + r,
        points=[math.log(gamma) / r + r / 2],
        limit=400,
        epsabs=1e-14,
    )[0]
    assert theta_gamma(gamma, r) == pytest.approx(val, abs=1e-11)


def test_theta_gamma_special_values() -> None:
    assert theta_gamma(2.0, 0.0) == 0.0
    assert theta_gamma(1.0, 1.0) == pytest.approx(1 - 2 * stats.norm.sf(0.5))
    assert theta_gamma(math.e, 5.0) == pytest.approx(0.980, abs=5e-4)
    assert theta_gamma(math.e, 10.0) == pytest.approx(0.999999, abs=1e-6)
    assert theta_gamma(math.e, 1.0) < theta_gamma(math.e, 2.0) < 1.0


def test_last_record_gets_plain_gaussian() -> None:
    # i = n: no contraction steps, δ = θ_{e^ε}(2L/σ) (0⁰ = 1 convention)
    assert pnsgd_gaussian_delta(1.0, 40, 40, **FIG2) == pytest.approx(theta_gamma(math.e, 1.0))


def _laplace_chain_delta_bruteforce(
    eps: float, shift0: float, contraction_shift: float, v: float, steps: int
) -> float:
    """Theorem 3's bound from Lemma 1 evaluated by quadrature of each hockey-stick factor."""
    gamma = math.exp(eps)

    def e_gamma(shift: float) -> float:
        p, q = stats.laplace(loc=shift, scale=v), stats.laplace(scale=v)
        return integrate.quad(
            lambda x: max(0.0, p.pdf(x) - gamma * q.pdf(x)),
            -60 * v,
            60 * v + shift,
            points=[0.0, shift],
            limit=400,
            epsabs=1e-13,
        )[0]

    return e_gamma(shift0) * e_gamma(contraction_shift) ** steps


def test_laplace_theorem3() -> None:
    L, v, eta, a, b, M, n = 1.0, 0.8, 0.5, 0.0, 1.0, 0.9, 10
    for i, eps in [(3, 0.2), (9, 0.5), (10, 0.5), (1, 1.0)]:
        want = _laplace_chain_delta_bruteforce(eps, 2 * eta * L, M * (b - a), eta * v, n - i)
        assert pnsgd_laplace_delta(eps, i, n, L, v, eta, a, b, M) == pytest.approx(want, abs=1e-9)
    # i = n with ε ≥ M(b−a)/(ηv) but ε < 2L/v: δ ≠ 0 (the paper's "min" rule is wrong at i = n)
    eps = 2.3  # M(b−a)/(ηv) = 2.25 ≤ ε < 2L/v = 2.5
    assert pnsgd_laplace_delta(eps, n, n, L, v, eta, a, b, M) > 0
    assert pnsgd_laplace_delta(eps, n - 1, n, L, v, eta, a, b, M) == 0.0


def test_contraction_factor_and_validation() -> None:
    assert contraction_factor(0.5, 0.5, 0.0) == 1.0
    assert contraction_factor(0.5, 1.0, 0.5) == pytest.approx(
        math.sqrt(1 - 2 * 0.5 * 1.0 * 0.5 / 1.5)
    )
    with pytest.raises(ValueError, match="^rho "):
        contraction_factor(0.7, 0.3, 0.4)  # the paper's Fig. 3 parameters
    with pytest.raises(ValueError, match="^eta "):
        contraction_factor(5.0, 0.5, 0.0)
    with pytest.raises(ValueError, match="^i "):
        pnsgd_gaussian_delta(1.0, 41, 40, **FIG2)
    with pytest.raises(ValueError, match="^M "):
        pnsgd_gaussian_delta(1.0, 1, 40, **(FIG2 | {"M": 1.5}))
    with pytest.raises(ValueError, match="^gamma "):
        theta_gamma(0.5, 1.0)
    with pytest.raises(ValueError, match="^delta "):
        pnsgd_epsilon(0.0, 1, 40, **FIG2)
    with pytest.raises(ValueError, match="^b "):
        pnsgd_laplace_delta(1.0, 1, 10, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0)
