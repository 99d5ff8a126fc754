"""The reveal guard orders every run's spend: check, then the ledger's mark, then (once) the audit
charge, then the reveal, then the release record. Checked on real runs of every linear kind and
the federated kind over an aggregator that logs each reveal, with a ledger and an audit log that
log what they are asked and can be made to fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpc_erm.data import Dataset, load_dataset, partition_equal
from mpc_erm.privacy.plan import plan_job, public_sizes
from mpc_erm.protocols import GradientPerturbation, JobSpec, OutputPerturbation
from mpc_erm.runs import ChargeFacts, CurvePoint, GradientRun, OutputRun, RevealGuard, RunRows, run_for
from mpc_erm.simulate import InProcessAggregator


class Log(list):
    """Every call the run makes on the ledger, the audit log, the aggregator and the cancel check."""


class Ledger:
    def __init__(self, log: Log, fail_at: int | None = None) -> None:
        self.log, self.fail_at = log, fail_at

    def mark_revealed(self, job_id, dp_event, *, rounds):
        if rounds == self.fail_at:
            raise OSError("disk full")
        self.log.append(("mark", rounds))


class Audit:
    def __init__(self, log: Log) -> None:
        self.log = log

    def charge(self, job_id, *, dataset, epsilon, delta, spec_digest, dp_event):
        self.log.append(("charge", dataset))

    def release(self, job_id, *, what, value, round, rounds):
        self.log.append(("release", round))


class Aggregator:
    trust_model = "test"

    def __init__(self, log: Log) -> None:
        self.log, self.inner = log, InProcessAggregator(torch.Generator().manual_seed(0))

    def aggregate(self, contributions, weights, noise):
        self.log.append(("reveal", self.inner.rounds + 1))
        return self.inner.aggregate(contributions, weights, noise)


class Progress:
    def __init__(self) -> None:
        self.events: list[dict] = []
        self.points: list[CurvePoint] = []

    def event(self, event):
        self.events.append(event)

    def point(self, point):
        self.points.append(point)


@pytest.fixture(scope="module")
def parts() -> list[Dataset]:
    train, _ = load_dataset("breast_cancer")
    idx = partition_equal(train.n, 3, np.random.default_rng(0))
    return [Dataset(train.X[i], train.y[i], "binary", f"p{j}") for j, i in enumerate(idx)]


def _spec(method: str, T: int = 7) -> JobSpec:
    return JobSpec(method=method, model={"name": "logistic", "lam": 1e-2}, privacy={"epsilon": 1.0, "delta": 1e-5},
                   training={"iterations": T} if method == "gradient" else {})


def _plan(spec: JobSpec, parts: list[Dataset]):
    return plan_job(spec, sizes=public_sizes(spec, [p.n for p in parts]), n_features=parts[0].d)


def _first_party_gradient_run(parts: list[Dataset], T: int) -> tuple:
    """A T-round gradient job's plan, and its run at the first party (its rows, its weight)."""
    spec = _spec("gradient", T=T)
    plan = _plan(spec, parts)
    return plan, GradientRun(spec, plan, RunRows(parts[0]), features=parts[0].d, weight=plan.weight(0, parts[0].n))


def _guard(plan, log: Log, *, fail_at: int | None = None, cancel_at: int | None = None,
           progress: Progress | None = None) -> RevealGuard:
    def check() -> None:
        log.append(("check",))
        if cancel_at is not None and sum(1 for e in log if e[0] == "reveal") >= cancel_at:
            raise RuntimeError("cancelled")

    return RevealGuard(plan, ChargeFacts("j1", "cancer", 1.0, 1e-5, "d" * 64), check=check,
                       ledger=Ledger(log, fail_at), audit=Audit(log), progress=progress)


def _spend(log: Log) -> list[tuple]:
    return [e for e in log if e[0] != "check"]


@pytest.mark.parametrize("method", ["output", "gradient"])
def test_every_reveal_is_marked_and_charged_before_and_recorded_after(parts, method) -> None:
    spec = _spec(method, T=4)
    plan = _plan(spec, parts)
    log, progress = Log(), Progress()
    rows = RunRows(parts[0], test=parts[1])
    run = run_for(spec, plan, rows, features=parts[0].d, weight=plan.weight(0, parts[0].n))
    out = run.run(Aggregator(log), _guard(plan, log, progress=progress))
    T = 1 if method == "output" else 4
    want: list[tuple] = [("mark", 1), ("charge", "cancer"), ("reveal", 1), ("release", 1)]
    for t in range(2, T + 1):
        want += [("mark", t), ("reveal", t), ("release", t)]
    assert _spend(log) == want
    # a cancel check precedes each mark
    assert all(log[i - 1] == ("check",) for i, e in enumerate(log) if e[0] == "mark")
    assert [p.round for p in progress.points] == [p.round for p in out.curve] == ([1] if T == 1 else [4])
    assert out.curve[-1].test is not None and "train" in out.curve[-1].own  # own rows: private part only
    assert "own" not in out.curve[-1].public()
    assert out.curve[-1].epsilon_spent == pytest.approx(plan.guarantee().epsilon)


def test_a_ledger_that_cannot_mark_stops_the_run_before_that_reveal(parts) -> None:
    plan, run = _first_party_gradient_run(parts, T=5)
    log = Log()
    with pytest.raises(OSError, match="disk full"):
        run.run(Aggregator(log), _guard(plan, log, fail_at=3))
    assert [e for e in _spend(log) if e[0] == "reveal"] == [("reveal", 1), ("reveal", 2)]
    assert _spend(log)[-1] == ("release", 2)


def test_a_cancel_stops_the_run_before_the_next_reveal(parts) -> None:
    plan, run = _first_party_gradient_run(parts, T=5)
    log = Log()
    with pytest.raises(RuntimeError, match="cancelled"):
        run.run(Aggregator(log), _guard(plan, log, cancel_at=2))
    assert max(e[1] for e in log if e[0] == "reveal") == 2 and ("mark", 3) not in log


def test_a_failed_first_mark_charges_nothing(parts) -> None:
    spec = _spec("output")
    plan = _plan(spec, parts)
    log = Log()
    guard = _guard(plan, log, fail_at=1)
    with pytest.raises(OSError):
        OutputRun(spec, plan, RunRows(parts[0]), features=parts[0].d, weight=plan.weight(0, parts[0].n)).run(
            Aggregator(log), guard)
    assert _spend(log) == [] and not guard.charged


@pytest.mark.parametrize("method", ["output", "gradient"])
def test_the_simulator_runs_the_daemons_run_and_the_protocol_loop_unchanged(parts, method) -> None:
    """The in-process run (every party a member) releases what the protocol's own loop releases
    over the same aggregator and seed: the simulator predicts the daemons."""
    spec = _spec(method, T=6)
    plan = _plan(spec, parts)
    run = (OutputRun if method == "output" else GradientRun).in_process(spec, plan, parts)
    got = run.run(InProcessAggregator(torch.Generator().manual_seed(5)), RevealGuard.unrecorded(plan)).model
    d = parts[0].d
    tensors = [(torch.as_tensor(np.array(p.X)), torch.as_tensor(np.array(p.y))) for p in parts]
    weights = torch.tensor([plan.weight(j, p.n) for j, p in enumerate(parts)], dtype=torch.float64)
    agg = InProcessAggregator(torch.Generator().manual_seed(5))
    if method == "output":
        proto = OutputPerturbation(spec, None, d, plan=plan)
        want = proto.release(agg, torch.stack([proto.local_model(X, y) for X, y in tensors]), weights)
    else:
        proto = GradientPerturbation(spec, None, d, plan=plan)
        want = proto.train(agg, lambda th: (torch.cat([proto.local_contribution(th, X, y) for X, y in tensors]),
                                            weights))
    assert torch.equal(got, want)


def test_a_federated_run_at_an_owner_and_at_a_compute_party_is_guarded_the_same(parts) -> None:
    """DP-Fed-LS: a data owner's run (its rows, its coin) and a compute party's (no rows) go through
    the same guard order; each release recorded is the aggregate the round revealed."""
    from tests.simulate.test_forecast import _fed_spec

    spec = _fed_spec(4, T=3, tau=1.0)
    plan = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, None), n_features=5)
    rows = RunRows(Dataset(parts[0].X[:, :5], parts[0].y, "binary", "o0"))
    for member in (rows, None):
        log = Log()
        run = run_for(spec, plan, member, features=5, owners=4)
        out = run.run(Aggregator(log), _guard(plan, log))
        want: list[tuple] = [("mark", 1), ("charge", "cancer"), ("reveal", 1), ("release", 1)]
        want += [e for t in (2, 3) for e in (("mark", t), ("reveal", t), ("release", t))]
        assert _spend(log) == want
        assert out.curve == [] and out.model.shape == (run.p,)  # no progress sink: no curve points
        assert run.joined == ([1, 2, 3] if member is not None else [])  # τ = 1: the owner joins every round


class CheckingAggregator(Aggregator):
    """An aggregator that checks each round's messages before it opens anything (the
    malicious-secure mode's order): its checks fail at round ``fail_at``, before the opening."""

    def __init__(self, log: Log, fail_at: int | None = None) -> None:
        super().__init__(log)
        self.fail_at = fail_at
        self.before_open = None

    def aggregate(self, contributions, weights, noise):
        t = self.inner.rounds + 1
        self.log.append(("checks", t))
        if t == self.fail_at:
            raise RuntimeError(f"round {t}: a deviation detected")
        self.before_open()
        return super().aggregate(contributions, weights, noise)


def _deferred_run(parts, fail_at: int) -> tuple[Log, RevealGuard]:
    """A 5-round gradient run whose aggregator marks each round just before it opens, its checks
    failing at round ``fail_at``."""
    plan, run = _first_party_gradient_run(parts, T=5)
    log = Log()
    guard = _guard(plan, log)
    agg = CheckingAggregator(log, fail_at=fail_at)
    agg.before_open = guard.defer_marks()
    with pytest.raises(RuntimeError, match=f"round {fail_at}: a deviation detected"):
        run.run(agg, guard)
    return log, guard


def test_deferred_marks_charge_only_the_rounds_whose_checks_passed(parts) -> None:
    log, _ = _deferred_run(parts, fail_at=3)
    assert _spend(log) == [("checks", 1), ("mark", 1), ("charge", "cancer"), ("reveal", 1), ("release", 1),
                           ("checks", 2), ("mark", 2), ("reveal", 2), ("release", 2), ("checks", 3)]


def test_a_deferred_first_round_that_fails_its_checks_charges_nothing(parts) -> None:
    log, guard = _deferred_run(parts, fail_at=1)
    assert _spend(log) == [("checks", 1)] and not guard.charged


def test_a_deferred_mark_with_no_round_announced_refuses_to_open(parts) -> None:
    plan, _run = _first_party_gradient_run(parts, T=2)
    mark = _guard(plan, Log()).defer_marks()
    with pytest.raises(RuntimeError, match="no round announced"):
        mark()
