"""The member's view of rounds on a batch drawn without replacement from pooled rows
(mpc_erm.privacy.member_view), against dp_accounting and against the mixture written out."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_sample_wor_gaussian, compute_epsilon
from scipy.stats import hypergeom

from mpc_erm.privacy.member_view import member_view_curve, pooled_rows_curve, wor_log_moments
from mpc_erm.privacy.subsampled import DP_ACCOUNTING_ORDERS, RDP_ORDERS, wor_gaussian_curve

ORDERS = np.asarray(DP_ACCOUNTING_ORDERS)


@pytest.mark.parametrize("z", [0.7, 1.37, 3.18, 20.0])
@pytest.mark.parametrize("gamma", [1e-4, 0.003, 0.05, 0.5, 0.97])
def test_the_log_moments_are_dp_accountings_at_every_order(z: float, gamma: float) -> None:
    ours = wor_log_moments(z, [gamma])[:, 0] / (ORDERS - 1)
    theirs = _compute_rdp_sample_wor_gaussian(gamma, z, DP_ACCOUNTING_ORDERS)
    finite = np.isfinite(theirs)
    assert np.array_equal(finite, np.isfinite(ours))
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-12, atol=0)


def test_the_ends_are_no_sampling_and_the_unsampled_gaussian() -> None:
    m = wor_log_moments(2.0, [0.0, 1.0])
    assert np.all(m[:, 0] == 0.0)
    np.testing.assert_allclose(m[:, 1], (ORDERS - 1) * ORDERS / 8.0, rtol=1e-15)


def test_an_outside_observer_sees_dp_accountings_curve() -> None:
    got = member_view_curve(3.18, 32_561, 100, 0)
    np.testing.assert_allclose(got, wor_gaussian_curve(3.18, 32_561, 100), rtol=1e-12)


def test_a_members_view_is_the_mixture_over_how_many_of_its_rows_were_drawn() -> None:
    """The mixture written out term by term (every third order), each term from dp_accounting itself."""
    from scipy.special import logsumexp

    z, n_all, b, mine = 1.37, 600, 40, 250
    others = n_all - mine
    picked = range(0, len(ORDERS), 3)
    want = []
    for j in picked:
        a = float(ORDERS[j])
        terms = []
        for k in range(0, b + 1):
            g = (b - k) / others
            r = 0.0 if g == 0 else float(_compute_rdp_sample_wor_gaussian(g, z, [a])[0])
            terms.append(hypergeom(n_all, mine, b).logpmf(k) + (a - 1) * r)
        want.append(float(logsumexp(terms)) / (a - 1))
    got = member_view_curve(z, n_all, b, mine)[list(picked)]
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_knowing_its_own_draws_costs_a_member_a_little_and_more_the_more_rows_it_holds() -> None:
    """Table 4.2's setting (a9a, b = 100 of 32,561, 4 passes at σ = 3.18 × the replace-one
    shift): ε for an outside observer, then for a party with a third, a half and three quarters
    of the rows (measured 0.2661, 0.2668, 0.2676, 0.2710)."""
    z, n_all, b, delta = 3.18, 32_561, 100, 1e-5
    rounds = 4 * n_all // b
    eps = [float(compute_epsilon(RDP_ORDERS, rounds * member_view_curve(z, n_all, b, n), delta)[0])
           for n in (0, n_all // 3, n_all // 2, 3 * n_all // 4)]
    assert eps == sorted(eps) and eps[0] < eps[1]
    assert eps[1] < 1.01 * eps[0] and eps[3] < 1.05 * eps[0]
    pooled = pooled_rows_curve(z, n_all, b, (n_all // 3, n_all // 2, n_all - n_all // 3 - n_all // 2))
    assert float(compute_epsilon(RDP_ORDERS, rounds * pooled, delta)[0]) == pytest.approx(eps[2], rel=1e-12)


def test_a_member_that_holds_all_but_the_batch_sees_the_others_drawn_for_certain() -> None:
    """N − n = b: every other row is drawn whenever none of the member's is; the view is then no
    better than the mixture of 'no sample' and the unsampled Gaussian, and above the observer."""
    z, n_all, b = 2.0, 200, 10
    view = member_view_curve(z, n_all, b, n_all - b)
    assert np.all(view >= member_view_curve(z, n_all, b, 0) - 1e-15)
    p0 = hypergeom(n_all, n_all - b, b).pmf(0)  # the member's rows all missed: the others' b are all drawn
    a = ORDERS
    floor = np.logaddexp(math.log1p(-p0), math.log(p0) + (a - 1) * a / (2 * z * z)) / (a - 1)
    assert np.all(view[: len(a)] >= floor * (1 - 1e-12))


@pytest.mark.parametrize("args", [(1.0, 100, 0, 10), (1.0, 100, 100, 10), (1.0, 100, 10, 100), (1.0, 100, 10, -1)])
def test_impossible_sizes_are_refused_naming_them(args: tuple[float, int, int, int]) -> None:
    with pytest.raises(ValueError, match="sample_size|member_rows"):
        member_view_curve(*args)


@pytest.mark.parametrize("z", [0.7, 1.9, 8.0])
def test_one_forward_difference_table_per_noise_multiplier_is_dp_accountings_per_order_bit_for_bit(z: float) -> None:
    """The member views read every order's forward differences off one table computed at n = 256:
    each order's prefix must be what dp_accounting computes for that order alone, exactly."""
    from dp_accounting.rdp.rdp_privacy_accountant import _get_forward_diffs

    from mpc_erm.privacy.member_view import _cgf, _forward_diffs

    table = _forward_diffs(z)
    for alpha in (2, 3, 17, 64, 255, 256):
        alone, _ = _get_forward_diffs(_cgf(z), alpha)
        assert np.array_equal(table[: alpha + 2], alone), alpha

