"""The privacy plan against what the protocols release, on neighbouring data sets.

Issue 13, defect 1: the add/remove sensitivity C/n assumed a public n while the protocol divided by
the realised counts, so one removed row moved the released gradient by ≈ 2C/n. These tests do not
check a formula against itself: they build D and its neighbour D' (a row added, removed or
replaced), run the protocol's own aggregation (the weights and contributions the MPC sums; noise
off), and compare the distance between the two released aggregates with the sensitivity the plan
states. tests/parties/test_worker.py does the same through the real worker processes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpc_erm.privacy.plan import PlanError, PublicSizes, plan_job
from mpc_erm.protocols import GradientPerturbation, OutputPerturbation, PartySizes
from mpc_erm.spec import JobSpec


def _data(n: int = 240, d: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = np.random.default_rng(seed)
    X = g.normal(size=(n, d)) + 0.8  # correlated rows: a large mean gradient, the worst case for normalising by n
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = np.where(X @ np.ones(d) + 0.3 * g.normal(size=n) > 0, 1.0, -1.0)
    return torch.tensor(X), torch.tensor(y)


def _spec(method: str, adjacency: str, public_n: int | None = None, **training: object) -> JobSpec:
    privacy: dict[str, object] = {"epsilon": 1.0, "delta": 1e-5, "adjacency": adjacency, "clip": 0.25}
    if method == "output":
        privacy = {"epsilon": 1.0, "delta": 1e-5, "adjacency": adjacency, "mechanism": "gaussian"}
    if public_n is not None:
        privacy["public_n"] = public_n
    return JobSpec.model_validate({"method": method, "model": {"name": "logistic", "lam": 0.05},
                                   "privacy": privacy, "training": {"iterations": 1, **training}})


def _split(n: int, m: int = 3) -> list[np.ndarray]:
    return np.array_split(np.arange(n), m)


def _gradient_release(spec: JobSpec, X: torch.Tensor, y: torch.Tensor, parts: list[np.ndarray],
                      theta: torch.Tensor) -> torch.Tensor:
    sizes = PartySizes.of([len(p) for p in parts])
    proto = GradientPerturbation(spec, sizes, X.shape[1])
    contribs = torch.cat([proto.local_contribution(theta, X[p], y[p]) for p in parts])
    return (proto.weights[:, None] * contribs).sum(0)


def _worst_row(spec: JobSpec, X: torch.Tensor, y: torch.Tensor, theta: torch.Tensor) -> int:
    """The row whose clipped gradient is farthest from the mean: removing it moves a count-normalised
    mean the most."""
    proto = GradientPerturbation(spec, PartySizes.of([len(X)]), X.shape[1])
    from mpc_erm.models import clip_rows

    g = clip_rows(proto.loss.per_example_grad(theta, X, y), proto.clip)
    return int((g - g.mean(0)).norm(dim=1).argmax())


@pytest.mark.parametrize("change", ["remove", "add"])
def test_add_remove_gradient_release_moves_at_most_the_stated_sensitivity(change: str) -> None:
    X, y = _data()
    n = len(X)
    spec = _spec("gradient", "add_remove", public_n=n)
    theta = torch.full((X.shape[1],), 0.3, dtype=torch.float64)
    z = _worst_row(spec, X, y, theta)
    if change == "remove":
        keep = np.array([i for i in range(n) if i != z])
        X2, y2 = X[keep], y[keep]
    else:
        X2, y2 = torch.cat([X, X[z:z + 1]]), torch.cat([y, y[z:z + 1]])
    a = _gradient_release(spec, X, y, _split(n), theta)
    b = _gradient_release(spec, X2, y2, _split(len(X2)), theta)
    plan = plan_job(spec, sizes=PublicSizes(public_n=n), n_features=X.shape[1])
    moved = float((a - b).norm())
    assert moved <= plan.sensitivity_l2() * (1 + 1e-9)
    assert moved >= 0.9 * plan.sensitivity_l2()  # tight: the clipped row has norm C
    # what the code did before the fix: the same sums divided by the realised counts n and n ± 1,
    # against the C/n it reported — the released value moved further than the report said
    by_count = (a * n) / n - (b * n) / len(X2)
    assert float(by_count.norm()) > 1.2 * plan.sensitivity_l2()


def test_replace_gradient_release_moves_at_most_2c_over_n() -> None:
    X, y = _data(seed=1)
    spec = _spec("gradient", "replace")
    theta = torch.zeros(X.shape[1], dtype=torch.float64)
    a = _gradient_release(spec, X, y, _split(len(X)), theta)
    y2 = y.clone()
    y2[7] = -y2[7]  # the same features with the opposite label: the gradient flips
    b = _gradient_release(spec, X, y2, _split(len(X)), theta)
    plan = plan_job(spec, sizes=PublicSizes(counts=tuple(len(p) for p in _split(len(X)))), n_features=X.shape[1])
    assert float((a - b).norm()) <= plan.sensitivity_l2() * (1 + 1e-9)


def _output_release(spec: JobSpec, X: torch.Tensor, y: torch.Tensor, parts: list[np.ndarray]) -> torch.Tensor:
    """Each party solves locally and weights its model by n_j/n̂ itself (add/remove)."""
    plan = plan_job(spec, sizes=PublicSizes(public_n=spec.privacy.public_n), n_features=X.shape[1])
    proto = OutputPerturbation(spec, None, X.shape[1], plan=plan)
    out = torch.zeros(proto.p, dtype=torch.float64)
    for j, p in enumerate(parts):
        out += plan.weight(j, len(p)) * proto.local_model(X[p], y[p])
    return out


def test_add_remove_output_release_stays_within_3g_over_n_lambda() -> None:
    X, y = _data(n=150, seed=2)
    n = len(X)
    spec = _spec("output", "add_remove", public_n=n)
    plan = plan_job(spec, sizes=PublicSizes(public_n=n), n_features=X.shape[1])
    base = _output_release(spec, X, y, _split(n))
    worst = 0.0
    d = X.shape[1]
    eye = torch.eye(d, dtype=torch.float64)
    cands = [(v, s) for k in range(d) for v in (eye[k], -eye[k]) for s in (1.0, -1.0)]
    cands.append((-X.mean(0) / X.mean(0).norm(), 1.0))
    for v, s in cands:  # add a row at party 0 (its count and weight change with it)
        parts = _split(n)
        X2 = torch.cat([v[None], X])
        y2 = torch.cat([torch.tensor([s], dtype=torch.float64), y])
        parts2 = [np.concatenate([[0], parts[0] + 1]), parts[1] + 1, parts[2] + 1]
        worst = max(worst, float((_output_release(spec, X2, y2, parts2) - base).norm()))
    for z in range(0, n, 15):  # remove a row
        keep = np.array([i for i in range(n) if i != z])
        parts = [np.array([i for i in range(len(keep)) if keep[i] in set(p)]) for p in _split(n)]
        worst = max(worst, float((_output_release(spec, X[keep], y[keep], parts) - base).norm()))
    assert 0.1 * plan.sensitivity_l2() < worst <= plan.sensitivity_l2()


def test_what_is_public_is_refused_when_it_cannot_hold() -> None:
    with pytest.raises(PlanError, match="privacy.public_n"):
        plan_job(_spec("gradient", "add_remove"))
    with pytest.raises(PlanError, match="privacy.public_n"):
        plan_job(_spec("gradient", "replace", public_n=100))
    with pytest.raises(PlanError, match="training.weighting"):
        plan_job(_spec("gradient", "add_remove", public_n=100, weighting="thesis"))
    with pytest.raises(PlanError, match="training.ls_sigma"):
        plan_job(_spec("output", "replace", ls_sigma=1.0))


def test_mpc_plans_refuse_continuous_only_accountants() -> None:
    """Defect 6: 'gdp'/'pld' were silently replaced by RDP in the daemons."""
    for acc in ("gdp", "pld"):
        spec = JobSpec.model_validate({"method": "gradient",
                                       "privacy": {"epsilon": 1, "delta": 1e-5, "accountant": acc}})
        with pytest.raises(PlanError, match="privacy.accountant"):
            plan_job(spec, sampler="mpc")
        assert plan_job(spec, sampler="ideal").accountant == acc  # the simulator's continuous noise: honoured
    spec = JobSpec.model_validate({"method": "gradient", "privacy": {"epsilon": 1, "delta": 1e-5}})
    assert plan_job(spec, sampler="mpc").accountant == "rdp"


def test_the_event_does_not_depend_on_what_is_bound_later() -> None:
    """The daemon reserves the event before the sizes are agreed; the worker's bound plan must match."""
    spec = _spec("gradient", "replace")
    early = plan_job(spec, sampler="mpc")
    late = plan_job(spec, sampler="mpc", sizes=PublicSizes(counts=(10, 20, 30)), n_features=6)
    assert early.event == late.event
    assert late.guarantee().epsilon <= 1.0 and late.guarantee().delta <= 1e-5
