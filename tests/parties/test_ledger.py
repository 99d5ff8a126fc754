"""Budget ledger: reservation semantics, refusal, crash recovery, concurrency across processes,
RDP composition against an independent dp_accounting computation, and a property test."""

from __future__ import annotations

import math
import os
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import parties
from mpc_erm.privacy.events import ApproxDp, GaussianRounds, PureDp
from parties.ledger import (
    LEDGER_FILE,
    SLACK,
    AlreadyRevealed,
    BudgetExceeded,
    JobConflict,
    Ledger,
    LedgerError,
    UnknownDataset,
    UnknownJob,
    normalise_dp_event,
)
from tests.parties.dp_reference import gaussian_under_replace, rdp_curve, rdp_epsilon, with_sampler
from tests.procs import preloaded_context

# Child processes import this module: dp_accounting and pydantic are imported inside the tests that need
# them (parties.ledger itself imports mpc_erm.privacy.events, and with it mpc_erm.privacy).
BUDGETS = {"adult": (1.0, 1e-5), "pure": (2.0, 0.0)}


def epsilon_for(*args: object) -> float:
    from mpc_erm.privacy.accountants import epsilon_for as eps

    return eps(*args)


@pytest.fixture
def ledger(tmp_path: Path):
    with Ledger.in_state_dir(tmp_path / "state", BUDGETS) as led:
        yield led


def gauss(z: float, rounds: int, *, tv: float = 0.0, adjacency: str = "replace") -> GaussianRounds:
    return GaussianRounds(rounds=rounds, adjacency=adjacency, sampler_tv=tv, noise_multiplier=z)  # type: ignore[arg-type]


def pure(eps: float, rounds: int = 1, *, tv: float = 0.0, adjacency: str = "replace") -> PureDp:
    return PureDp(rounds=rounds, adjacency=adjacency, sampler_tv=tv, epsilon=eps)  # type: ignore[arg-type]


def test_one_wal_file_in_state_dir(ledger: Ledger, tmp_path: Path) -> None:
    assert ledger.path == tmp_path / "state" / LEDGER_FILE and ledger.path.is_file()
    with sqlite3.connect(ledger.path) as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert [r.dataset for r in ledger.show()] == ["adult", "pure"]


def test_reserve_until_refused(ledger: Ledger) -> None:
    r = ledger.reserve("j1", "adult", 0.4, 1e-6, "sha256:aa")
    assert (r.state, r.revealed, r.epsilon, r.delta) == ("reserved", False, 0.4, 1e-6)
    ledger.reserve("j2", "adult", 0.4, 1e-6, "sha256:bb")
    ledger.commit("j1")
    with pytest.raises(BudgetExceeded) as info:
        ledger.reserve("j3", "adult", 0.3, 1e-6, "sha256:cc")
    msg = str(info.value)
    for part in ("dataset 'adult'", "requests ε=0.3, δ=1e-06", "spent ε=0.4", "reserved ε=0.4", "total ε=1",
                 "δ: 2e-06 in use of 1e-05"):
        assert part in msg, msg
    assert (info.value.spent, info.value.reserved, info.value.total) == (0.4, 0.4, (1.0, 1e-5))
    assert ledger.get("j3") is None  # refused: nothing reserved
    ledger.reserve("j4", "adult", 0.2, 1e-6, "sha256:dd")  # exactly fills the budget
    row = ledger.show()[0]
    assert (row.epsilon_spent, row.epsilon_reserved, row.epsilon_remaining, row.jobs) == (0.4, 0.6, 0.0, 3)
    assert row.accountant == "basic" and row.delta_spent == 1e-6 and row.delta_reserved == pytest.approx(2e-6)


def test_delta_budget_is_enforced_too(ledger: Ledger) -> None:
    ledger.reserve("a", "adult", 0.1, 6e-6, "d")
    with pytest.raises(BudgetExceeded, match="δ: 6e-06 in use of 1e-05"):
        ledger.reserve("b", "adult", 0.1, 6e-6, "d")
    with pytest.raises(BudgetExceeded):
        ledger.reserve("c", "pure", 0.1, 1e-9, "d")  # a δ > 0 job on a pure-DP budget
    ledger.reserve("c", "pure", 0.1, 0.0, "d")


def test_decimal_rounding_does_not_refuse_an_exact_fill(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db", {"d": (0.3, 0.0)}) as led:
        for i in range(3):
            led.reserve(f"j{i}", "d", 0.1, 0.0, "x")  # 0.1 + 0.1 + 0.1 > 0.3 in binary
        with pytest.raises(BudgetExceeded):
            led.reserve("j4", "d", 1e-6, 0.0, "x")


def test_bad_arguments(ledger: Ledger) -> None:
    with pytest.raises(UnknownDataset, match="'mnist'"):
        ledger.reserve("j", "mnist", 0.1, 0.0, "d")
    for eps, delta in ((0.0, 0.0), (-1.0, 0.0), (math.inf, 0.0), (math.nan, 0.0), (True, 0.0), (0.1, 1.0),
                       (0.1, -1e-9)):
        with pytest.raises(ValueError):
            ledger.reserve("j", "adult", eps, delta, "d")
    with pytest.raises(ValueError):
        ledger.reserve("", "adult", 0.1, 0.0, "d")
    with pytest.raises(ValueError):
        ledger.reserve("j", "adult", 0.1, 0.0, "")
    for op in (ledger.mark_revealed, ledger.commit, lambda j: ledger.release(j, "x")):
        with pytest.raises(UnknownJob):
            op("nope")
    with pytest.raises(UnknownDataset):
        ledger.spent("mnist")


def test_reserve_is_idempotent_by_job_id(ledger: Ledger) -> None:
    first = ledger.reserve("j", "adult", 0.5, 1e-6, "d", gauss(10.0, 2))  # the event is charged: z = 10 fits
    assert ledger.reserve("j", "adult", 0.5, 1e-6, "d", gauss(10, 2)) == first  # same numbers: no-op
    assert ledger.reserve("j", "adult", 0.5, 1e-6, "d", gauss(10.0, 2).as_dict()) == first  # its dict form too
    assert ledger.show()[0].jobs == 1
    for args in (("adult", 0.6, 1e-6, "d", gauss(10.0, 2)), ("adult", 0.5, 0.0, "d", gauss(10.0, 2)),
                 ("pure", 0.5, 1e-6, "d", gauss(10.0, 2)), ("adult", 0.5, 1e-6, "e", gauss(10.0, 2)),
                 ("adult", 0.5, 1e-6, "d", gauss(10.0, 3)), ("adult", 0.5, 1e-6, "d", gauss(10.0, 2, tv=1e-12)),
                 ("adult", 0.5, 1e-6, "d", gauss(10.0, 2, adjacency="add_remove")), ("adult", 0.5, 1e-6, "d", None)):
        with pytest.raises(JobConflict, match="different numbers"):
            ledger.reserve("j", *args)
    ledger.mark_revealed("j")
    assert ledger.reserve("j", "adult", 0.5, 1e-6, "d", gauss(10.0, 2)).state == "revealed"


def test_release_before_reveal_gives_the_budget_back(ledger: Ledger) -> None:
    ledger.reserve("j", "adult", 0.9, 0.0, "d")
    with pytest.raises(BudgetExceeded):
        ledger.reserve("k", "adult", 0.5, 0.0, "d")
    r = ledger.release("j", "peer bob unreachable")
    assert (r.state, r.reason, r.revealed) == ("released", "peer bob unreachable", False)
    assert ledger.release("j", "again").reason == "peer bob unreachable"  # idempotent
    row = ledger.show()[0]
    assert (row.epsilon_spent, row.epsilon_reserved, row.epsilon_remaining, row.jobs) == (0.0, 0.0, 1.0, 0)
    ledger.reserve("k", "adult", 0.5, 0.0, "d")
    with pytest.raises(JobConflict, match="single-use"):
        ledger.reserve("j", "adult", 0.1, 0.0, "d")
    for op in (ledger.mark_revealed, ledger.commit):  # a released job must never reveal
        with pytest.raises(LedgerError, match="released"):
            op("j")


def test_no_release_after_reveal(ledger: Ledger) -> None:
    ledger.reserve("j", "adult", 0.3, 0.0, "d")
    r = ledger.mark_revealed("j")
    assert r.state == "revealed" and r.revealed_at is not None
    assert ledger.mark_revealed("j") == r  # idempotent
    with pytest.raises(AlreadyRevealed, match="cannot be released"):
        ledger.release("j", "abort after reveal")
    assert ledger.spent("adult") == 0.3
    c = ledger.commit("j")
    assert (c.state, c.revealed_at) == ("committed", r.revealed_at) and c.finished_at is not None
    assert ledger.commit("j") == c and ledger.mark_revealed("j") == c
    with pytest.raises(AlreadyRevealed):
        ledger.release("j", "too late")
    # commit straight from reserved: the job has revealed by then
    ledger.reserve("k", "adult", 0.1, 0.0, "d")
    assert ledger.commit("k").revealed_at is not None
    assert ledger.spent("adult") == pytest.approx(0.4) and ledger.open_reservations() == []


def _crash_mid_job(path: str) -> None:
    led = Ledger(path)
    led.reserve("never-revealed", "adult", 0.2, 0.0, "d")
    led.reserve("revealed", "adult", 0.3, 0.0, "d")
    led.mark_revealed("revealed")
    led.reserve("done", "adult", 0.1, 0.0, "d")
    led.commit("done")
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")
    raw.execute("INSERT INTO jobs (job_id, dataset, epsilon, delta, spec_digest, state, reserved_at) "
                "VALUES ('half-written', 'adult', 0.1, 0, 'd', 'reserved', 0)")
    os._exit(3)  # no commit, no close: the daemon dies


def test_crash_recovery(tmp_path: Path) -> None:
    path = tmp_path / "state" / LEDGER_FILE
    Ledger.in_state_dir(tmp_path / "state", BUDGETS).close()
    proc = preloaded_context().Process(target=_crash_mid_job, args=(str(path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 3
    with Ledger(path, BUDGETS) as led:
        opened = led.open_reservations()
        assert [(r.job_id, r.revealed) for r in opened] == [("never-revealed", False), ("revealed", True)]
        assert led.get("half-written") is None  # the uncommitted transaction was rolled back
        row = led.show()[0]
        assert (row.epsilon_spent, row.epsilon_reserved) == (pytest.approx(0.4), pytest.approx(0.2))
        released, kept = led.recover()
        assert [r.job_id for r in released] == ["never-revealed"] and [r.job_id for r in kept] == ["revealed"]
        assert released[0].reason == "daemon restarted before the first reveal"
    with Ledger(path) as led:  # and it stays that way across another reopen
        assert [r.job_id for r in led.open_reservations()] == ["revealed"]
        assert led.show()[0].epsilon_spent == pytest.approx(0.4) and led.show()[0].epsilon_reserved == 0.0
        assert led.recover() == ([], led.open_reservations())


def test_close_and_reopen_keeps_open_reservations(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.db", BUDGETS)
    led.reserve("a", "adult", 0.2, 0.0, "d", gauss(20.0, 3))
    led.close()
    with Ledger(tmp_path / "l.db") as again:
        (r,) = again.open_reservations("adult")
        assert (r.job_id, r.dp_event, r.state) == ("a", gauss(20.0, 3), "reserved")
        assert normalise_dp_event(gauss(20.0, 3).as_dict()) == r.dp_event and r.revealed_rounds is None
        assert again.open_reservations("pure") == []


def _reserve_many(path: str, worker: int, jobs: int, barrier, results) -> None:
    with Ledger(path, timeout=60) as led:
        barrier.wait()
        ok = 0
        for i in range(jobs):
            try:
                led.reserve(f"w{worker}-{i}", "adult", 0.1, 0.0, f"spec-{worker}-{i}")
                ok += 1
            except BudgetExceeded:
                pass
        results.put(ok)


def test_concurrent_processes_take_exactly_the_affordable_number(tmp_path: Path) -> None:
    path = str(tmp_path / LEDGER_FILE)
    Ledger(path, {"adult": (1.0, 0.0)}).close()
    ctx = preloaded_context()
    workers, per_worker = 6, 4
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_reserve_many, args=(path, w, per_worker, barrier, results))
             for w in range(workers)]
    for p in procs:
        p.start()
    counts = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sum(counts) == 10  # 24 attempts at ε = 0.1 on a budget of 1.0
    with Ledger(path) as led:
        row = led.show()[0]
        assert row.jobs == 10 and row.epsilon_reserved == pytest.approx(1.0) and row.epsilon_remaining < 1e-12


def test_concurrent_threads_share_one_ledger(ledger: Ledger) -> None:
    ok: list[str] = []
    start = threading.Barrier(8)

    def work(i: int) -> None:
        start.wait()
        try:
            ledger.reserve(f"t{i}", "pure", 0.5, 0.0, "d")
            ok.append(f"t{i}")
        except BudgetExceeded:
            pass

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ok) == 4 and len(ledger.open_reservations("pure")) == 4


def test_accountant_beats_basic_composition_and_matches_dp_accounting(tmp_path: Path) -> None:
    z, rounds, d_job, total = 4.0, 10, 1e-6, (6.0, 1e-5)
    e_job = epsilon_for("rdp", z, rounds, d_job)  # what one job reports: its own ε at its own δ
    with Ledger(tmp_path / "l.db", {"g": total}) as led:
        n = 0
        while True:
            try:
                led.reserve(f"g{n}", "g", e_job, d_job, "d", gauss(z, rounds))
            except BudgetExceeded:
                break
            n += 1
            led.commit(f"g{n - 1}")
        assert n > int(total[0] / e_job)  # more jobs than basic composition would allow
        spent = led.spent("g")
        assert spent <= n * e_job and spent <= total[0]
        # independently: n·T Gaussian rounds, via the project's own RDP accountant path (add/remove)
        assert spent == pytest.approx(epsilon_for("rdp", z, n * rounds, total[1]), rel=1e-9)
        assert spent == pytest.approx(rdp_epsilon([("gaussian", z, rounds)] * n, total[1]), rel=1e-9)
        assert rdp_epsilon([("gaussian", z, rounds)] * (n + 1), total[1]) > total[0]  # why the next was refused
        assert led.show()[0].accountant == "rdp"
        assert led.spent("g", 1e-3) < spent  # at a larger δ, smaller ε
        assert led.spent("g", 0.0) == math.inf  # no valid bound at δ = 0 (RDP needs δ > 0)


def test_accountant_with_pure_events_and_sampler_delta(tmp_path: Path) -> None:
    """Six pure-ε releases and a Gaussian job whose sampler is within TV τ = 4·tv of the ideal one.
    The samplers' δ is (1 + e^ε)·τ at the ε of the whole composition: the old test expected a flat
    ``delta_extra`` taken off δ, i.e. the sampler term at each job's own ε (issue 13 item 2)."""
    tv, total = 2e-9, (10.0, 1e-5)  # (1 + e^ε)·τ ≈ 2e-6 at the composed ε ≈ 5.6
    gaussian = [("gaussian", 3.0, 4)]
    every = [("pure", 0.5, 1)] * 6 + gaussian
    with Ledger(tmp_path / "l.db", {"m": total}) as led:
        for i in range(6):
            led.reserve(f"l{i}", "m", 0.5, 0.0, "d", pure(0.5))
        led.reserve("g", "m", 3.0, 1e-6, "d", gauss(3.0, 4, tv=tv))
        # two valid bounds, the smaller counts: RDP of every release, or Σε of the pure ones plus
        # the Gaussian's RDP ε (basic composition of the two parts)
        curve, gauss_curve = rdp_curve(every), rdp_curve(gaussian)
        by_rdp, d_s = with_sampler(curve, 4 * tv, total[1])
        by_sum, d_s_sum = with_sampler(lambda d: 6 * 0.5 + gauss_curve(d), 4 * tv, total[1])
        expected, d_sampler = min((by_rdp, d_s), (by_sum, d_s_sum))
        assert expected < 6 * 0.5 + gauss_curve(total[1])  # RDP of everything beats Σε + RDP here
        both = led.composition("m", include_reserved=True)
        assert both.epsilon == pytest.approx(expected, rel=1e-6) and both.route == "rdp"
        assert both.delta_sampler == pytest.approx(d_sampler, rel=1e-6) == (1 + math.exp(both.epsilon)) * 4 * tv
        assert both.delta == total[1]
        assert led.spent("m", include_reserved=True) == both.epsilon
        assert led.spent("m") == 0.0  # nothing revealed yet
        # A job without an event is an (ε, δ) release composed by basic composition with the others'
        # bound. (The old ledger fell back to Σε of *every* job as soon as one had no event.)
        led.reserve("plain", "m", 0.25, 0.0, "d")
        assert led.spent("m", include_reserved=True) == pytest.approx(0.25 + expected, rel=1e-6)
        assert led.show()[0].accountant == "basic+rdp"
        led.reserve("plain-delta", "m", 0.25, 2e-6, "d")  # its δ is what the others' bound may not use
        rest, _ = with_sampler(curve, 4 * tv, total[1] - 2e-6)
        assert led.spent("m", include_reserved=True) == pytest.approx(0.5 + rest, rel=1e-6)


def test_accountant_only_bound_when_deltas_do_not_add_up(tmp_path: Path) -> None:
    z, rounds, delta = 6.0, 5, 1e-5
    e_job = epsilon_for("rdp", z, rounds, delta)
    with Ledger(tmp_path / "l.db", {"g": (3 * e_job, delta)}) as led:
        for i in range(3):  # Σδ = 3e-5 > δ_total: basic composition is invalid, RDP at δ_total is not
            led.reserve(f"g{i}", "g", e_job, delta, "d", gauss(z, rounds))
        rdp3 = rdp_epsilon([("gaussian", z, rounds)] * 3, delta)
        assert led.spent("g", include_reserved=True) == pytest.approx(rdp3, rel=1e-9)
        assert led.spent("g", include_reserved=True) == pytest.approx(epsilon_for("rdp", z, 3 * rounds, delta))
        # A job without an event: basic composition of its (ε, δ) with the Gaussians' RDP bound. The
        # old ledger refused it (one job without an event left no valid bound at all), so admission
        # depended on whether a job happened to carry an event (issue 13 item 5).
        led.reserve("plain", "g", 1e-3, 0.0, "d")
        assert led.spent("g", include_reserved=True) == pytest.approx(rdp3 + 1e-3, rel=1e-9)
        with pytest.raises(BudgetExceeded, match="reserved ε="):
            led.reserve("plain-delta", "g", 1e-3, delta, "d")  # its δ would leave the Gaussians none
        with pytest.raises(BudgetExceeded):
            led.reserve("plain-big", "g", 3 * e_job - rdp3, 0.0, "d")  # 1e-3 over the budget


@pytest.mark.parametrize(("event", "match"), [
    ({"kind": "exponential", "epsilon": 1.0}, "dp_event.kind"),
    # the old event dicts are no longer accepted as input
    ({"kind": "gaussian", "noise_multiplier": 1.0, "rounds": 2}, "dp_event of kind 'gaussian' needs exactly"),
    ({"kind": "gaussian", "noise_multiplier": 1.0, "rounds": 2, "delta_extra": 0.0}, "dp_event of kind"),
    ({"kind": "laplace", "epsilon": 1.0}, "dp_event.kind"),
    # a Poisson-subsampled event is accounted under add/remove only (mpc_erm.privacy.events)
    (gauss(1.0, 2).as_dict() | {"sampling_rate": 0.1}, "dp_event.sampling_rate < 1: .* add/remove"),
    (gauss(1.0, 2).as_dict() | {"sampling_rate": 1.5}, "dp_event.sampling_rate must be in"),
    ({k: v for k, v in gauss(1.0, 2).as_dict().items() if k != "adjacency"}, "dp_event of kind"),
    (gauss(1.0, 2).as_dict() | {"rounds": True}, "rounds"),
    (gauss(1.0, 2).as_dict() | {"rounds": -1}, "rounds"),
    (gauss(1.0, 2).as_dict() | {"noise_multiplier": -1.0}, "noise_multiplier"),
    (gauss(1.0, 2).as_dict() | {"noise_multiplier": math.nan}, "noise_multiplier"),
    (gauss(1.0, 2).as_dict() | {"sampler_tv": 1.0}, "sampler_tv"),
    (gauss(1.0, 2).as_dict() | {"adjacency": "neighbour"}, "adjacency"),
    (pure(1.0).as_dict() | {"epsilon": math.inf}, "epsilon"),
    (["gaussian"], "dp_event must be a JSON object"),
])
def test_bad_dp_events_are_refused(ledger: Ledger, event: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ledger.reserve("j", "adult", 0.1, 0.0, "d", event)  # type: ignore[arg-type]
    assert ledger.get("j") is None


def test_for_config_uses_state_dir_and_budgets(tmp_path: Path) -> None:
    from parties.config import load_party_config

    shutil.copy(Path(parties.__file__).parent / "example-party.toml", tmp_path / "p.toml")
    (tmp_path / "pki").mkdir()
    for f in ("alice.crt", "alice.key", "ca.crt"):
        (tmp_path / "pki" / f).write_text("x")
    cfg = load_party_config(tmp_path / "p.toml")
    with Ledger.for_config(cfg) as led:
        assert led.path == tmp_path / "state" / LEDGER_FILE
        (row,) = led.show()
        assert (row.dataset, row.epsilon_total, row.delta_total) == ("adult", 4.0, 1e-5)


EVENTS = [None, None, gauss(8.0, 3), gauss(20.0, 1), gauss(16.0, 2, adjacency="add_remove"), pure(0.25),
          pure(0.1, 2, adjacency="add_remove")]
OPS = st.one_of(
    st.tuples(st.just("reserve"), st.sampled_from(["a", "b"]), st.sampled_from([0.05, 0.1, 0.25, 0.3, 0.7]),
              st.sampled_from([0.0, 1e-7, 2e-6, 4e-6]), st.sampled_from(range(len(EVENTS)))),
    st.tuples(st.sampled_from(["release", "reveal", "commit"]), st.integers(0, 40), st.sampled_from([None, 1, 2])),
)
TOTALS = {"a": (1.0, 1e-5), "b": (0.6, 5e-6)}


def _upper_bound(jobs: list[tuple[float, float, int, int | None, str]], delta_total: float) -> float:
    """An independent upper bound of what the ledger charges a data set's live jobs (stated ε, stated δ,
    event index, rounds revealed, state): basic composition of the jobs without an event, of Σε of the
    pure events and of the RDP ε of the Gaussian ones, every event stated under replace-one (the
    ledger takes the smaller of this and other valid bounds)."""
    epsilons, deltas, gaussians = [], [], []
    for eps, delta, ev_i, revealed, state in jobs:
        ev = EVENTS[ev_i]
        if ev is None:
            epsilons.append(eps)
            deltas.append(delta)
            continue
        rounds = min(revealed, ev.rounds) if state == "committed" and revealed is not None else ev.rounds
        if isinstance(ev, GaussianRounds):
            gaussians.append(("gaussian", gaussian_under_replace(ev.noise_multiplier, ev.adjacency), rounds))
        else:
            epsilons.append(rounds * ev.epsilon * (2 if ev.adjacency == "add_remove" else 1))
    delta_left = delta_total - math.fsum(deltas)
    if delta_left < 0 or (gaussians and delta_left <= 0):
        return math.inf
    return math.fsum(epsilons) + (rdp_epsilon(gaussians, delta_left) if gaussians else 0.0)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=25))
def test_spent_plus_reserved_never_exceeds_total(ops) -> None:
    with tempfile.TemporaryDirectory() as d, Ledger(Path(d) / LEDGER_FILE, TOTALS) as led:
        # job -> [state, dataset, ε, δ, event index, rounds revealed]
        model: dict[str, list] = {}
        tried: list[str] = []
        last_spent = dict.fromkeys(TOTALS, 0.0)
        for op in ops:
            may_shrink = False  # a job that revealed only some of its rounds ends: its charge shrinks
            if op[0] == "reserve":
                _, ds, eps, delta, ev = op
                job = f"j{len(tried)}"
                tried.append(job)
                live = [(e, dl, i, r, s) for s, x, e, dl, i, r in model.values() if x == ds and s != "released"]
                bound = _upper_bound([*live, (eps, delta, ev, None, "reserved")], TOTALS[ds][1])
                try:
                    led.reserve(job, ds, eps, delta, "d", EVENTS[ev])
                    model[job] = ["reserved", ds, eps, delta, ev, None]
                except BudgetExceeded:
                    assert bound > TOTALS[ds][0] * (1 - 1e-9)  # whatever this bound allows is allowed
            elif tried:
                job = tried[op[1] % len(tried)]
                rounds = op[2]
                state = model[job][0] if job in model else "unknown"
                move = {"release": ("reserved", "released"), "reveal": ("reserved", "revealed"),
                        "commit": ("reserved", "committed")}[op[0]]
                call = {"release": lambda j: led.release(j, "test"),
                        "reveal": lambda j, r=rounds: led.mark_revealed(j, rounds=r), "commit": led.commit}[op[0]]
                if state == "unknown":
                    with pytest.raises(UnknownJob):
                        call(job)
                    continue
                if state == "revealed" and op[0] in ("commit", "reveal"):
                    move = ("revealed", "committed" if op[0] == "commit" else "revealed")
                if state == move[0]:
                    got = call(job)
                    assert got.state == move[1]
                    model[job][0] = move[1]
                    if op[0] == "reveal":  # the count only grows, up to the planned rounds
                        planned = 1 if EVENTS[model[job][4]] is None else EVENTS[model[job][4]].rounds
                        want = planned if rounds is None else min(rounds, planned)
                        model[job][5] = max(model[job][5] or 0, want)
                    assert got.revealed_rounds == model[job][5]
                    if op[0] == "commit" and state == "revealed":
                        may_shrink = True
                elif state in ("revealed", "committed") and op[0] == "release":
                    with pytest.raises(AlreadyRevealed):
                        call(job)
                elif state == "released" and op[0] != "release":
                    with pytest.raises(LedgerError):
                        call(job)
                else:
                    assert call(job).state == state  # repeated call: no-op
            for row in led.show():
                total = row.epsilon_total
                assert row.epsilon_spent + row.epsilon_reserved <= total * (1 + SLACK) + 1e-12
                if not may_shrink:  # spending is permanent (a running job counts all its rounds)
                    assert row.epsilon_spent >= last_spent[row.dataset] - 1e-12
                assert row.epsilon_reserved >= -1e-12 and row.epsilon_remaining >= 0
                last_spent[row.dataset] = row.epsilon_spent
                assert row.jobs == sum(1 for s, x, *_ in model.values() if x == row.dataset and s != "released")
                live = [(e, dl, i, r, s) for s, x, e, dl, i, r in model.values()
                        if x == row.dataset and s != "released"]
                assert row.epsilon_spent + row.epsilon_reserved <= _upper_bound(live, row.delta_total) * (1 + 1e-9)
        assert {r.job_id for r in led.open_reservations()} == {
            j for j, (s, *_) in model.items() if s in ("reserved", "revealed")}


def test_the_reserved_event_is_what_is_charged(tmp_path: Path) -> None:
    """The job's event is planned before the reservation and reserved with it; the reveal must carry
    the same event. (This test used to check that an event attached only at the first reveal tightened
    later compositions while admission stayed basic composition — issue 13 item 5: the ledger now
    admits by the event it will charge, and a worker with another plan must not reveal.)"""
    z, rounds, d_job, total = 8.0, 10, 1e-6, (6.0, 1e-5)
    e_job = epsilon_for("rdp", z, rounds, d_job)
    with Ledger(tmp_path / "l.db", {"g": total}) as led:
        led.reserve("a", "g", e_job, d_job, "d", gauss(z, rounds))
        led.reserve("b", "g", e_job, d_job, "d")  # no event: an (ε, δ) release, basic composition
        assert led.show()[0].accountant == "basic+rdp"
        with pytest.raises(LedgerError, match="not the one reserved"):
            led.mark_revealed("a", gauss(z, 2 * rounds))  # another plan: refused, nothing changes
        assert led.get("a").state == "reserved" and led.get("a").dp_event == gauss(z, rounds)
        assert led.mark_revealed("a", gauss(z, rounds)).state == "revealed"
        led.commit("a")
        led.mark_revealed("b", gauss(z, rounds))  # reserved without an event: this one is not adopted
        assert led.get("b").dp_event == ApproxDp(rounds=1, adjacency="replace", epsilon=e_job, delta=d_job)
        led.commit("b")
        expected = e_job + rdp_epsilon([("gaussian", z, rounds)], total[1] - d_job)
        assert led.spent("g") == pytest.approx(expected, rel=1e-9) and led.spent("g") < 2 * e_job
        with pytest.raises(ValueError, match="dp_event"):
            led.reserve("c", "g", 0.1, 0.0, "d")
            led.mark_revealed("c", {"kind": "gaussian"})
        assert led.get("c").state == "reserved"  # a bad event changes nothing
        # reserved as (0.5, 0) without an event; a worker's event that costs more (its sampler's TV
        # needs δ > 0, a larger ε) must not reveal under it, or the ledger keeps charging (0.5, 0)
        led.reserve("d", "g", 0.5, 0.0, "d")
        for costlier in (PureDp(rounds=1, adjacency="replace", epsilon=0.5, sampler_tv=1e-12),
                         PureDp(rounds=2, adjacency="replace", epsilon=0.5), gauss(z, rounds)):
            with pytest.raises(LedgerError, match="not the one reserved"):
                led.mark_revealed("d", costlier)
            assert led.get("d").state == "reserved"
        assert led.mark_revealed("d", PureDp(rounds=1, adjacency="replace", epsilon=0.5)).state == "revealed"
