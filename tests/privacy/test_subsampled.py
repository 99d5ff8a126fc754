"""The Poisson-subsampled discrete Gaussian's RDP bound (mpc_erm.privacy.subsampled), against
independent computations: autodp's implementation of the same Zhu–Wang theorem; the exact Rényi
divergences, both directions, of the subsampled 1-D discrete Gaussian summed over the integers;
and dp_accounting's exact curve of the subsampled continuous Gaussian, which the general bound
must not undercut."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from mpc_erm.privacy.subsampled import discrete_gaussian_rdp, poisson_subsampled_rdp, subsampled_discrete_gaussian_rdp

CASES = [(0.01, 1.0), (256 / 60_000, 1.2), (0.05, 2.0), (0.1, 0.8), (0.3, 4.0), (1.0, 1.5)]


@pytest.mark.parametrize(("q", "z"), CASES)
def test_the_bound_is_autodps_general_upper_bound(q: float, z: float) -> None:
    """autodp (Zhu & Wang's own code) sums the ℓ > 50 terms with ε(α) ≥ ε(ℓ): equal up to α = 51,
    ours no larger beyond."""
    autodp = pytest.importorskip("autodp.rdp_acct")
    orders = [2, 3, 4, 7, 10, 20, 33, 51, 64, 128]
    ours = subsampled_discrete_gaussian_rdp(orders, q, z)
    for a, mine in zip(orders, ours):
        if q == 1.0:
            assert mine == pytest.approx(a / (2 * z * z), rel=1e-12)
            continue
        theirs = autodp.general_upperbound(lambda x: discrete_gaussian_rdp(x, z), a, q) / (a - 1)
        if a <= 51:
            assert mine == pytest.approx(theirs, rel=1e-9, abs=1e-15)
        else:
            assert mine <= theirs * (1 + 1e-9)


def _exact_subsampled_discrete_gaussian(alpha: int, q: float, sigma: float, shift: int) -> tuple[float, float]:
    """D_α(M‖P) and D_α(P‖M) for P = N_Z(0, σ²), M = (1−q)·P + q·N_Z(shift, σ²), summed over the
    integers in 60-digit arithmetic (the tails beyond ±(shift + 40σ) are below 10⁻³⁰⁰)."""
    mpmath.mp.dps = 60
    k = int(shift + 40 * sigma) + 1
    xs = range(-k, k + 1)
    w = [mpmath.exp(-mpmath.mpf(x) ** 2 / (2 * sigma**2)) for x in xs]
    zed = mpmath.fsum(w)
    p = [v / zed for v in w]
    qd = [mpmath.exp(-mpmath.mpf(x - shift) ** 2 / (2 * sigma**2)) / zed for x in xs]
    m = [(1 - q) * a + q * b for a, b in zip(p, qd)]
    remove = mpmath.log(mpmath.fsum(mi**alpha * pi ** (1 - alpha) for mi, pi in zip(m, p))) / (alpha - 1)
    add = mpmath.log(mpmath.fsum(pi**alpha * mi ** (1 - alpha) for mi, pi in zip(m, p))) / (alpha - 1)
    return float(remove), float(add)


@pytest.mark.parametrize(("alpha", "q", "sigma", "shift"),
                         [(2, 0.05, 3.0, 3), (4, 0.1, 2.0, 2), (8, 0.01, 5.0, 4), (16, 0.004, 1.2, 1),
                          (3, 0.5, 1.0, 1), (6, 0.2, 7.5, 5)])
def test_both_directions_of_the_real_subsampled_discrete_gaussian_stay_under_the_bound(
        alpha: int, q: float, sigma: float, shift: int) -> None:
    """What the MPC samples (1-D, integer shift = Δ in grid units): its exact Rényi divergences
    with the record and without, each way, are at most the bound for z = σ/Δ; and the removal
    direction equals the binomial sum of the continuous Gaussian at integer α (docs/explanation/privacy.md §4)."""
    remove, add = _exact_subsampled_discrete_gaussian(alpha, q, sigma, shift)
    z = sigma / shift
    bound = float(subsampled_discrete_gaussian_rdp([alpha], q, z)[0])
    assert remove <= bound * (1 + 1e-9) and add <= bound * (1 + 1e-9)
    binomial = math.log(math.fsum(math.comb(alpha, j) * (1 - q) ** (alpha - j) * q**j
                                  * math.exp(j * (j - 1) / (2 * z * z)) for j in range(alpha + 1))) / (alpha - 1)
    assert remove == pytest.approx(binomial, rel=1e-9)


@pytest.mark.parametrize(("q", "z"), [c for c in CASES if c[0] < 1.0])
def test_the_general_bound_never_undercuts_the_exact_continuous_gaussian(q: float, z: float) -> None:
    """dp_accounting's subsampled Gaussian RDP is exact for the continuous Gaussian; a valid general
    bound applied to the same RDP curve can only be larger, and by at most log(3)/(α−1) plus the
    1 + O(q) the theorem concedes (here: within 3× in e^{(α−1)ε'})."""
    from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_poisson_subsampled_gaussian

    orders = [2.0, 3.0, 5.0, 8.0, 12.0, 20.0, 32.0]
    ours = subsampled_discrete_gaussian_rdp(orders, q, z)
    exact = np.array([_compute_rdp_poisson_subsampled_gaussian(q, z, [a])[0] for a in orders])
    assert np.all(ours >= exact * (1 - 1e-9))
    assert np.all((np.array(orders) - 1) * (ours - exact) <= math.log(3.0) + 1e-9)


def test_non_integer_orders_are_infinite_and_bad_rates_refused() -> None:
    got = poisson_subsampled_rdp([1.5, 2.0, 2.5], 0.1, lambda a: a / 2.0)
    assert math.isinf(got[0]) and math.isfinite(got[1]) and math.isinf(got[2])
    with pytest.raises(ValueError, match="sampling rate"):
        poisson_subsampled_rdp([2.0], 0.0, lambda a: a)


def test_the_mnist_setting_states_epsilon_1_02() -> None:
    """TF-Privacy's MNIST tutorial (q = 256/60,000, z = 1.2, 10 epochs = 2,344 rounds, δ = 1e-5):
    ε = 1.02 for the in-MPC discrete Gaussian, 0.93 for the continuous one (the figure in docs/how-to/benchmarks.md)."""
    from mpc_erm.privacy import epsilon_for

    q = 256 / 60_000
    disc = epsilon_for("rdp", 1.2, 2344, 1e-5, q, "add_remove", discrete=True)
    cont = epsilon_for("rdp", 1.2, 2344, 1e-5, q, "add_remove")
    assert disc == pytest.approx(1.0195, abs=1e-3) and cont == pytest.approx(0.9318, abs=1e-3)
