"""The Poisson-subsampled discrete Gaussian's RDP (mpc_erm.privacy.subsampled), against independent
computations: the exact Rényi divergences, both directions, of the subsampled discrete Gaussian
summed over the lattice in 60-digit arithmetic (one and two dimensions, integer and fractional
orders), which the exact curve must bound and, removing a record at integer orders, equal;
dp_accounting's curve of the subsampled continuous Gaussian, which it equals at integer orders;
the lemma behind the addition direction on random pairs an involution swaps; and, for events
written before the exact analysis, autodp's implementation of the general Zhu–Wang bound."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from mpc_erm.privacy.subsampled import (
    RDP_ORDERS,
    discrete_gaussian_curve,
    discrete_gaussian_rdp,
    poisson_subsampled_rdp,
    subsampled_discrete_gaussian_rdp,
)

CASES = [(0.01, 1.0), (256 / 60_000, 1.2), (0.05, 2.0), (0.1, 0.8), (0.3, 4.0), (1.0, 1.5)]


@pytest.mark.parametrize(("q", "z"), CASES)
def test_the_general_bound_is_autodps_general_upper_bound(q: float, z: float) -> None:
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


def _exact_subsampled_discrete_gaussian(alpha: float, q: float, sigma: float,
                                       shift: tuple[int, ...]) -> tuple[float, float]:
    """D_α(M‖P) and D_α(P‖M) for P = N_Z(0, σ²)^d, M = (1−q)·P + q·N_Z(shift, σ²)^d (d = len(shift)),
    summed over the lattice box in 60-digit arithmetic (the mass beyond ±(|shift| + 40σ) per
    coordinate is below 10⁻³⁰⁰)."""
    import itertools

    mpmath.mp.dps = 60
    k = int(max(map(abs, shift)) + 40 * sigma) + 1
    line = range(-k, k + 1)
    one = {x: mpmath.exp(-mpmath.mpf(x) ** 2 / (2 * sigma**2)) for x in range(-2 * k, 2 * k + 1)}
    zed = mpmath.fsum(one[x] for x in line) ** len(shift)
    remove, add = [], []
    for xs in itertools.product(line, repeat=len(shift)):
        p = mpmath.fprod(one[x] for x in xs) / zed
        m = (1 - q) * p + q * mpmath.fprod(one[x - s] for x, s in zip(xs, shift)) / zed
        remove.append(m**alpha * p ** (1 - alpha))
        add.append(p**alpha * m ** (1 - alpha))
    return (float(mpmath.log(mpmath.fsum(remove)) / (alpha - 1)), float(mpmath.log(mpmath.fsum(add)) / (alpha - 1)))


def _curve_at(alpha: float, q: float, z: float) -> float:
    """The exact curve at one order (it is computed on RDP_ORDERS; these tests pick orders there)."""
    return float(discrete_gaussian_curve(q, z)[RDP_ORDERS.index(float(alpha))])


@pytest.mark.parametrize(("alpha", "q", "sigma", "shift"),
                         [(2, 0.05, 3.0, (3,)), (4, 0.1, 2.0, (2,)), (8, 0.01, 5.0, (4,)), (16, 0.004, 1.2, (1,)),
                          (3, 0.5, 1.0, (1,)), (6, 0.2, 7.5, (5,)), (2.5, 0.3, 1.5, (2,)), (1.5, 0.25, 0.8, (1,)),
                          (7.3, 0.1, 2.0, (3,)), (3, 0.25, 1.0, (1, 1)), (5, 0.1, 1.3, (2, 1)),
                          (2.4, 0.5, 0.9, (1, -1)), (10, 0.05, 1.6, (1, 2))])
def test_both_directions_of_the_real_subsampled_discrete_gaussian_stay_under_the_exact_curve(
        alpha: float, q: float, sigma: float, shift: tuple[int, ...]) -> None:
    """What the MPC samples (integer shift μ in grid units, one or two coordinates, σ down to 0.8
    where the lattice is far from continuous): its exact Rényi divergences with the record and
    without, each way, are at most the curve for z = σ/‖μ‖; removing a record at an integer order
    it is the curve (docs/explanation/privacy.md §4)."""
    remove, add = _exact_subsampled_discrete_gaussian(alpha, q, sigma, shift)
    z = sigma / math.sqrt(sum(s * s for s in shift))
    curve = _curve_at(alpha, q, z)
    assert remove <= curve * (1 + 1e-9) and add <= remove * (1 + 1e-12)
    if float(alpha).is_integer():
        assert remove == pytest.approx(curve, rel=1e-9)
        assert curve <= float(subsampled_discrete_gaussian_rdp([alpha], q, z)[0]) * (1 + 1e-12)  # ≤ the general


@pytest.mark.parametrize(("q", "z"), [c for c in CASES if c[0] < 1.0])
def test_the_exact_curve_is_dp_accountings_sum_at_integer_orders_and_bounds_it_between(q: float, z: float) -> None:
    """At integer orders the exact curve is the continuous Gaussian's (dp_accounting's
    _compute_log_a_int, an independent evaluation of the same sum); at fractional orders the
    interpolation is never below the continuous Gaussian's own divergence, integrated here in
    30-digit arithmetic (dp_accounting's fractional series is itself an upper bound, and at large q
    above the interpolation: 0.00647 against 0.00634 and the true 0.00609 at q = 0.3, z = 4, α = 2.1)."""
    from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_poisson_subsampled_gaussian

    orders = [a for a in RDP_ORDERS if a <= 1024]
    ours = discrete_gaussian_curve(q, z)[: len(orders)]
    whole = [i for i, a in enumerate(orders) if float(a).is_integer()]
    theirs = np.array([_compute_rdp_poisson_subsampled_gaussian(q, z, [orders[i]])[0] for i in whole])
    np.testing.assert_allclose(ours[whole], theirs, rtol=1e-10)
    mpmath.mp.dps = 30
    for alpha in (1.5, 2.1, 4.5, 10.3):
        def density(x: mpmath.mpf, a: float = alpha) -> mpmath.mpf:
            return mpmath.npdf(x, 0, z) * (1 - q + q * mpmath.exp((2 * x - 1) / (2 * z * z))) ** a

        moment = mpmath.quad(density, [-mpmath.inf, -30 * z, 0, 30 * z, mpmath.inf])
        assert _curve_at(alpha, q, z) >= float(mpmath.log(moment)) / (alpha - 1) * (1 - 1e-12)


def test_the_addition_direction_never_exceeds_the_removal_one_for_a_swapped_pair() -> None:
    """The lemma of the module docstring, step 2, on 3,000 random pairs (Q, P = Q reversed: the
    involution x ↦ n − 1 − x swaps them) at random rates and real orders: D_α(Q‖M) ≤ D_α(M‖Q)."""
    rng = np.random.default_rng(7)
    for _ in range(3000):
        n = int(rng.integers(2, 9))
        qd = rng.dirichlet(np.full(n, rng.uniform(0.2, 3.0)))
        pd = qd[::-1]
        rate, alpha = rng.uniform(0.001, 0.999), rng.uniform(1.05, 30.0)
        m = (1 - rate) * qd + rate * pd
        remove = np.log(np.sum(np.exp(alpha * np.log(m) + (1 - alpha) * np.log(qd))))
        add = np.log(np.sum(np.exp(alpha * np.log(qd) + (1 - alpha) * np.log(m))))
        assert add <= remove + 1e-9 * abs(remove) + 1e-15, (qd, rate, alpha)


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


def test_the_mnist_setting_states_the_continuous_gaussians_epsilon() -> None:
    """TF-Privacy's MNIST tutorial (q = 256/60,000, z = 1.2, 10 epochs = 2,344 rounds, δ = 1e-5):
    ε = 0.93 for the in-MPC discrete Gaussian as for the continuous one; the general bound, which
    earlier versions used, states 1.02 (docs/how-to/benchmarks.md)."""
    from mpc_erm.privacy import epsilon_for

    q = 256 / 60_000
    disc = epsilon_for("rdp", 1.2, 2344, 1e-5, q, "add_remove", discrete=True)
    cont = epsilon_for("rdp", 1.2, 2344, 1e-5, q, "add_remove")
    general = epsilon_for("rdp", 1.2, 2344, 1e-5, q, "add_remove", discrete=True, subsampled_rdp="general")
    assert disc == pytest.approx(0.9318, abs=1e-3) and cont == pytest.approx(0.9318, abs=1e-3)
    assert general == pytest.approx(1.0195, abs=1e-3)


def test_events_written_before_the_exact_analysis_are_recomputed_as_they_were_stated() -> None:
    """A stored subsampled discrete event without ``subsampled_rdp`` (ledgers and reports of earlier
    versions) is the general bound's; a new one says "exact" and round-trips; "general" applies to
    Poisson-subsampled discrete rounds only."""
    from mpc_erm.privacy.events import GaussianRounds, compose, event_from_dict

    old = {"kind": "gaussian", "rounds": 2344, "adjacency": "add_remove", "sampler_tv": 0.0,
           "noise_multiplier": 1.2, "sampling_rate": 256 / 60_000, "discrete": True}
    legacy = event_from_dict(old)
    assert isinstance(legacy, GaussianRounds) and legacy.subsampled_rdp == "general"
    new = GaussianRounds(**{k: v for k, v in old.items() if k != "kind"})
    assert new.as_dict()["subsampled_rdp"] == "exact" and event_from_dict(new.as_dict()) == new
    assert compose([legacy], 1e-5, "add_remove").epsilon == pytest.approx(1.0195, abs=1e-3)
    assert compose([new], 1e-5, "add_remove").epsilon == pytest.approx(0.9318, abs=1e-3)
    assert "subsampled_rdp" not in GaussianRounds(rounds=3, adjacency="add_remove", noise_multiplier=2.0,
                                                  discrete=True).as_dict()
    with pytest.raises(ValueError, match="subsampled_rdp"):
        GaussianRounds(rounds=3, adjacency="add_remove", noise_multiplier=2.0, discrete=True, subsampled_rdp="general")
    with pytest.raises(ValueError, match="subsampled_rdp"):
        event_from_dict({**old, "subsampled_rdp": "loose"})
