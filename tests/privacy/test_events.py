"""mpc_erm.privacy.events: the one composition the ledger, the reports and `report verify` use.

References are computed independently: dp_accounting's RDP accountant called directly on its own
events (not through our grouping), Poisson-free closed forms for pure ε, and the TV-transfer
lemma written out by hand."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from mpc_erm.privacy.events import (
    AdjacencyError,
    ApproxDp,
    GaussianRounds,
    NonPrivate,
    PureDp,
    compose,
    event_from_dict,
    event_from_json,
)


def _rdp(events: list[dp_accounting.DpEvent], delta: float) -> float:
    acc = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    for e in events:
        acc.compose(e)
    return float(acc.get_epsilon(delta))


def test_gaussian_rounds_match_dp_accounting_without_sampler() -> None:
    ev = GaussianRounds(rounds=50, adjacency="replace", sampler_tv=0.0, noise_multiplier=12.0)
    got = compose([ev], 1e-5, "replace")
    want = _rdp([dp_accounting.GaussianDpEvent(12.0)] * 50, 1e-5)
    assert got.epsilon == pytest.approx(want, rel=1e-9) and got.delta_sampler == 0.0 and got.route == "rdp"


def test_sampler_term_is_taken_at_the_composed_epsilon_not_per_job() -> None:
    """Defect 2 of issue 13: Σ over jobs of (1 + e^{ε_j})·τ_j understates (1 + e^{ε_total})·Στ."""
    tv = 1e-9
    jobs = [GaussianRounds(rounds=10, adjacency="replace", sampler_tv=tv, noise_multiplier=10.0) for _ in range(4)]
    got = compose(jobs, 1e-5, "replace")
    tau = 40 * tv
    assert got.delta_sampler == pytest.approx((1 + math.exp(got.epsilon)) * tau, rel=1e-12)
    # the mechanism part is valid at exactly what is left of δ
    want = _rdp([dp_accounting.GaussianDpEvent(10.0)] * 40, 1e-5 - got.delta_sampler)
    assert got.epsilon >= want * (1 - 1e-9)
    one = compose(jobs[:1], 1e-5, "replace")
    assert got.delta_sampler > 4 * (1 + math.exp(one.epsilon)) * 10 * tv  # the per-job sum is too small


def test_pure_events_need_a_delta_for_their_sampler() -> None:
    """Defect 2: a budget whose δ is 0 cannot admit an in-MPC Laplace job (its sampler has δ > 0)."""
    lap = PureDp(rounds=1, adjacency="replace", sampler_tv=1e-14, epsilon=0.5)
    assert compose([lap], 0.0, "replace").epsilon == math.inf
    ok = compose([lap], 1e-10, "replace")
    assert ok.epsilon == 0.5 and ok.route == "pure"
    assert ok.delta_sampler == pytest.approx((1 + math.exp(0.5)) * 1e-14)
    ideal = PureDp(rounds=3, adjacency="replace", sampler_tv=0.0, epsilon=0.5)
    assert compose([ideal], 0.0, "replace").epsilon == pytest.approx(1.5)


def test_mixed_pure_and_gaussian_takes_the_better_valid_route() -> None:
    g = GaussianRounds(rounds=20, adjacency="replace", sampler_tv=0.0, noise_multiplier=8.0)
    p = PureDp(rounds=1, adjacency="replace", sampler_tv=0.0, epsilon=0.3)
    got = compose([g, p], 1e-5, "replace")
    rr = dp_accounting.RandomizedResponseDpEvent(2.0 / (1.0 + math.exp(0.3)), 2)
    via_rdp = _rdp([dp_accounting.GaussianDpEvent(8.0)] * 20 + [rr], 1e-5)
    via_sum = 0.3 + _rdp([dp_accounting.GaussianDpEvent(8.0)] * 20, 1e-5)
    assert got.epsilon == pytest.approx(min(via_rdp, via_sum), rel=1e-9)


def test_replace_budget_converts_add_remove_events_and_refuses_the_reverse() -> None:
    """Defect 4: an add/remove job is a replace-one job with twice the shift."""
    ar = GaussianRounds(rounds=1, adjacency="add_remove", sampler_tv=0.0, noise_multiplier=4.0)
    assert ar.under("replace").noise_multiplier == 2.0
    assert PureDp(rounds=1, adjacency="add_remove", epsilon=0.5).under("replace").epsilon == 1.0
    rep = GaussianRounds(rounds=1, adjacency="replace", sampler_tv=0.0, noise_multiplier=4.0)
    with pytest.raises(AdjacencyError):
        compose([rep], 1e-5, "add_remove")
    both = compose([rep, ar], 1e-5, "replace")
    assert both.epsilon == pytest.approx(
        _rdp([dp_accounting.GaussianDpEvent(4.0), dp_accounting.GaussianDpEvent(2.0)], 1e-5), rel=1e-9)


def test_replace_plus_add_remove_pure_jobs_compose_to_one_point_five() -> None:
    """The audit's example in pure-ε form: replace 0.5 + add/remove 0.5 is 1.5 under replace-one."""
    a = PureDp(rounds=1, adjacency="replace", epsilon=0.5)
    b = PureDp(rounds=1, adjacency="add_remove", epsilon=0.5)
    assert compose([a, b], 0.0, "replace").epsilon == pytest.approx(1.5)


def test_non_private_event_is_infinite_and_fewer_rounds_cost_less() -> None:
    assert compose([NonPrivate(rounds=1, adjacency="replace")], 1e-5, "replace").epsilon == math.inf
    assert compose([NonPrivate(rounds=0, adjacency="replace")], 1e-5, "replace").epsilon == 0.0
    g = GaussianRounds(rounds=2000, adjacency="replace", sampler_tv=0.0, noise_multiplier=30.0)
    part = compose([g.with_rounds(235)], 1e-5, "replace").epsilon
    assert part < compose([g], 1e-5, "replace").epsilon
    assert part == pytest.approx(_rdp([dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(30.0), 235)],
                                      1e-5), rel=1e-9)


def test_approx_events_compose_by_basic_composition() -> None:
    a = ApproxDp(rounds=1, adjacency="replace", epsilon=0.4, delta=1e-6)
    g = GaussianRounds(rounds=5, adjacency="replace", sampler_tv=0.0, noise_multiplier=5.0)
    got = compose([a, g], 1e-5, "replace")
    assert got.epsilon == pytest.approx(0.4 + _rdp([dp_accounting.GaussianDpEvent(5.0)] * 5, 9e-6), rel=1e-9)
    assert compose([a], 5e-7, "replace").epsilon == math.inf  # its δ alone exceeds the budget


@pytest.mark.parametrize("ev", [
    GaussianRounds(rounds=7, adjacency="add_remove", sampler_tv=1e-12, noise_multiplier=2.5),
    PureDp(rounds=1, adjacency="replace", sampler_tv=3e-13, epsilon=0.7),
    ApproxDp(rounds=1, adjacency="replace", epsilon=1.0, delta=1e-6),
    NonPrivate(rounds=1, adjacency="replace"),
])
def test_json_round_trip(ev) -> None:  # type: ignore[no-untyped-def]
    assert event_from_json(ev.to_json()) == ev


@pytest.mark.parametrize("bad, field", [
    ({"kind": "gaussian", "rounds": 1, "adjacency": "replace", "sampler_tv": 0.0}, "noise_multiplier"),
    ({"kind": "laplace", "epsilon": 1.0}, "dp_event.kind"),
    ({"kind": "pure", "rounds": 1, "adjacency": "swap", "sampler_tv": 0.0, "epsilon": 1.0}, "adjacency"),
    ({"kind": "pure", "rounds": -1, "adjacency": "replace", "sampler_tv": 0.0, "epsilon": 1.0}, "rounds"),
    ({"kind": "pure", "rounds": 1, "adjacency": "replace", "sampler_tv": 0.0, "epsilon": float("inf")}, "epsilon"),
])
def test_bad_event_dicts_are_refused_naming_the_field(bad, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=field):
        event_from_dict(bad)
