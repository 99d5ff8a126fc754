"""The one-run audit's bound (Steinke–Nasr–Jagielski 2023): valid — an ε-DP mechanism is never
shown above its ε more often than the level allows — and with power — a mechanism far above its
claim is caught — checked on randomized response, whose guesses are exactly the bound's
binomial, and against a direct computation of the binomial tail."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mpc_erm.privacy.audit_bound import epsilon_lower_bound, p_value


def _tail(r: int, v: int, q: float) -> float:
    return sum(math.comb(r, j) * q**j * (1 - q) ** (r - j) for j in range(v, r + 1))


def test_without_delta_the_bound_is_the_randomized_response_tail() -> None:
    for eps, r, v in [(0.0, 40, 20), (1.0, 40, 30), (2.0, 100, 95), (0.5, 10, 10)]:
        q = math.exp(eps) / (1 + math.exp(eps))
        assert p_value(100, r, v, eps, 0.0) == pytest.approx(_tail(r, v, q), rel=1e-9)


def test_delta_only_adds_and_the_bound_grows_with_epsilon() -> None:
    base = p_value(1000, 200, 150, 1.0, 0.0)
    assert p_value(1000, 200, 150, 1.0, 1e-5) > base
    ps = [p_value(1000, 200, 150, e, 1e-5) for e in np.linspace(0, 3, 13)]
    assert all(a <= b for a, b in zip(ps, ps[1:], strict=False))
    eps = epsilon_lower_bound(1000, 200, 150, 1e-5, 0.05)
    assert p_value(1000, 200, 150, eps, 1e-5) < 0.05 <= p_value(1000, 200, 150, eps + 1e-3, 1e-5)


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_randomized_response_is_not_shown_above_its_epsilon_more_often_than_alpha(eps: float) -> None:
    """ε-DP randomized response on each canary's bit, guessed from its output: the bound exceeds
    ε in at most ~α of 200 seeded runs (binomial slack allowed), and comes near ε (power)."""
    rng = np.random.default_rng(7)
    m, alpha = 1000, 0.05
    keep = math.exp(eps) / (1 + math.exp(eps))
    over, bounds = 0, []
    for _ in range(200):
        bits = rng.random(m) < 0.5
        told = np.where(rng.random(m) < keep, bits, ~bits)
        v = int((told == bits).sum())
        lb = epsilon_lower_bound(m, m, v, 0.0, alpha)
        over += lb > eps
        bounds.append(lb)
    assert over <= 0.05 * 200 + 3 * math.sqrt(200 * 0.05 * 0.95), over
    assert np.median(bounds) > 0.7 * eps  # power: with every canary guessed, the bound approaches ε


def test_a_run_with_every_guess_right_is_far_above_a_small_claim() -> None:
    assert epsilon_lower_bound(1000, 1000, 1000, 1e-5, 0.05) > 4.0
    assert epsilon_lower_bound(1000, 100, 50, 1e-5, 0.05) == 0.0  # chance level proves nothing
    with pytest.raises(ValueError, match="0 ≤ correct ≤ guesses ≤ canaries"):
        epsilon_lower_bound(10, 20, 5, 0.0)
    with pytest.raises(ValueError, match="level"):
        epsilon_lower_bound(10, 10, 5, 0.0, alpha=1.5)
