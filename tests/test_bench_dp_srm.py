"""The DP-SRM benchmark's own pieces (benchmarks.dp_srm): the a9a encoding of UCI Adult, and the
thesis's σ with the ε our accountant gives it, against dp-accounting directly."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np

from benchmarks import dp_srm


def test_the_a9a_encoding_has_123_binary_features_one_bit_per_column_at_most() -> None:
    X, y, Xt, yt = dp_srm.a9a()
    assert X.shape == (32561, 123) and Xt.shape == (16281, 123)
    assert set(np.unique(X)) <= {0.0, 1.0} and set(np.unique(y)) == {0, 1}
    widths = [5] * len(dp_srm.QUINTILES) + [2] * len(dp_srm.NONZERO)
    at = 0
    for w in widths:  # every binned continuous column: exactly one bit
        assert (X[:, at: at + w].sum(axis=1) == 1).all()
        assert (X[:, at: at + w].sum(axis=0) > 0).all()  # no empty bin: ties moved, five bins each
        at += w
    assert (X[:, at:].sum(axis=1) <= 8).all()  # eight categorical columns: one bit, none when missing
    assert abs(float(y.mean()) - 0.2408) < 1e-3 and abs(float(yt.mean()) - 0.2362) < 1e-3


def test_the_thesis_sigma_and_the_epsilon_our_accountant_gives_it() -> None:
    """Theorem 4.5.1's σ at ε = 0.5 (β = ½), b = 100 of n = 32,561, T = 1,628: the noise multiplier
    over the replace-one sensitivity 2C/b written out, and its ε by dp-accounting's RDP of b of n
    drawn without replacement — below the thesis's ε (its closed-form lemma is loose)."""
    n, b, t, eps = 32561, 100, 1628, 0.5
    got = dp_srm._thesis_sigma_epsilon(eps, n, b, t)
    alpha = math.log(1e5) / (0.5 * eps) + 1
    sigma_over_c = math.sqrt(14 * t * alpha / (0.5 * eps)) / n  # σ/C, σ² = 14T C² α/(β n² ε)
    assert math.isclose(got["noise_multiplier_replace_one"], sigma_over_c / (2 / b), rel_tol=1e-12)
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(
        n, b, dp_accounting.GaussianDpEvent(got["noise_multiplier_replace_one"])), t)
    assert math.isclose(got["our_epsilon_for_it"], acc.get_epsilon(1e-5), rel_tol=1e-3)
    assert got["our_epsilon_for_it"] < eps
