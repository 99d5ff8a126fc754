"""Closed-form losses: values, gradients vs autograd, layouts, and the constants G and L."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from mpc_erm.models import (
    HuberSVMLoss,
    LogisticLoss,
    SoftmaxLoss,
    SquaredLoss,
    get_loss,
    objective_grad,
    objective_value,
    ridge_lipschitz_for,
    solve_erm,
)

from ._util import F64, all_losses, labels_for, unit_ball

LOSS_IDS = [repr(loss) for loss in all_losses()]


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


# ----------------------------------------------------------------------------- registry
def test_get_loss_names_and_kwargs() -> None:
    assert isinstance(get_loss("logistic"), LogisticLoss)
    assert isinstance(get_loss("ridge"), SquaredLoss)
    h = get_loss("huber_svm", h=0.25)
    assert isinstance(h, HuberSVMLoss) and h.h == 0.25 and h.smoothness == 2.0
    s = get_loss("softmax", n_classes=10)
    assert isinstance(s, SoftmaxLoss) and s.param_dim(784) == 7840
    assert get_loss("logistic").param_dim(122) == 122


def test_get_loss_unknown_lists_valid_names() -> None:
    with pytest.raises(ValueError) as e:
        get_loss("hinge")
    for name in ("logistic", "huber_svm", "ridge", "softmax"):
        assert name in str(e.value)
    with pytest.raises(ValueError, match="n_classes"):
        get_loss("softmax")
    with pytest.raises(ValueError, match="h"):
        get_loss("huber_svm", h=0.0)


def test_constants() -> None:
    assert LogisticLoss().lipschitz() == 1.0 and LogisticLoss().smoothness == 0.25
    assert HuberSVMLoss().lipschitz() == 1.0 and HuberSVMLoss(0.5).smoothness == 1.0
    assert SoftmaxLoss(5).lipschitz() == pytest.approx(math.sqrt(2)) and SoftmaxLoss(5).smoothness == 0.5
    sq = SquaredLoss()
    assert sq.smoothness == 1.0 and sq.lipschitz(radius=3.0) == 4.0
    with pytest.raises(ValueError, match="radius"):
        sq.lipschitz()
    assert ridge_lipschitz_for(0.01) == pytest.approx(11.0) == sq.lipschitz_for(0.01)
    with pytest.raises(ValueError, match="lam"):
        ridge_lipschitz_for(0.0)


# ----------------------------------------------------------------------------- values
def test_values_against_reference_formulas(gen: torch.Generator) -> None:
    X = unit_ball(50, 7, gen)
    th = torch.randn(7, generator=gen, dtype=F64) * 2
    yb = labels_for(LogisticLoss(), X, gen)
    z = X @ th
    torch.testing.assert_close(LogisticLoss().per_example_loss(th, X, yb),
                               torch.log1p(torch.exp(-yb * z)))
    m = yb * z
    h = 0.3
    ref = torch.where(m > 1 + h, 0 * m, torch.where(m < 1 - h, 1 - m, (1 + h - m) ** 2 / (4 * h)))
    torch.testing.assert_close(HuberSVMLoss(h).per_example_loss(th, X, yb), ref)
    yr = labels_for(SquaredLoss(), X, gen)
    torch.testing.assert_close(SquaredLoss().per_example_loss(th, X, yr), 0.5 * (yr - z) ** 2)


def test_logistic_is_stable_for_huge_margins() -> None:
    X = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=F64)
    y = torch.tensor([1.0, 1.0], dtype=F64)
    th = torch.tensor([1000.0, 0.0], dtype=F64)
    val = LogisticLoss().per_example_loss(th, X, y)
    assert torch.isfinite(val).all() and val[0] == 0.0 and val[1] == pytest.approx(1000.0)
    g = LogisticLoss().per_example_grad(th, X, y)
    assert torch.isfinite(g).all()


def test_softmax_layout_matches_nn_linear(gen: torch.Generator) -> None:
    K, d, n = 4, 6, 30
    loss = SoftmaxLoss(K)
    X = unit_ball(n, d, gen)
    y = labels_for(loss, X, gen)
    lin = nn.Linear(d, K, bias=False).double()
    theta = lin.weight.detach().flatten().clone()
    ref = F.cross_entropy(lin(X), y, reduction="none")
    torch.testing.assert_close(loss.per_example_loss(theta, X, y), ref)
    # Per-example gradient is laid out like weight.grad.flatten().
    for i in (0, 7):
        lin.zero_grad()
        F.cross_entropy(lin(X[i : i + 1]), y[i : i + 1]).backward()
        torch.testing.assert_close(loss.per_example_grad(theta, X, y)[i], lin.weight.grad.flatten())


# ----------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("loss", all_losses(), ids=LOSS_IDS)
def test_per_example_grad_matches_autograd(loss, gen: torch.Generator) -> None:
    n, d = 40, 5
    X = unit_ball(n, d, gen)
    y = labels_for(loss, X, gen)
    theta = torch.randn(loss.param_dim(d), generator=gen, dtype=F64) * 1.5
    jac = torch.autograd.functional.jacobian(lambda t: loss.per_example_loss(t, X, y), theta)
    torch.testing.assert_close(loss.per_example_grad(theta, X, y), jac, rtol=1e-10, atol=1e-12)
    # Batched leading dimension gives the same thing.
    Xb, yb = X.reshape(4, 10, d), y.reshape(4, 10)
    thb = theta.expand(4, -1)
    torch.testing.assert_close(loss.per_example_grad(thb, Xb, yb).reshape(n, -1), jac,
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("loss", all_losses(), ids=LOSS_IDS)
def test_objective_value_and_grad(loss, gen: torch.Generator) -> None:
    n, d, lam = 30, 4, 0.05
    X = unit_ball(n, d, gen)
    y = labels_for(loss, X, gen)
    theta = torch.randn(loss.param_dim(d), generator=gen, dtype=F64).requires_grad_(True)
    w = torch.rand(n, generator=gen, dtype=F64)
    for weights in (None, w):
        J = objective_value(loss, theta, X, y, lam, weights)
        (g_auto,) = torch.autograd.grad(J, theta)
        g = objective_grad(loss, theta.detach(), X, y, lam, weights)
        torch.testing.assert_close(g, g_auto, rtol=1e-10, atol=1e-13)
    ww = w / w.sum()
    ref = (ww * loss.per_example_loss(theta, X, y)).sum() + lam / 2 * theta.pow(2).sum()
    torch.testing.assert_close(objective_value(loss, theta, X, y, lam, w), ref)
    with pytest.raises(ValueError, match="weights"):
        objective_value(loss, theta, X, y, lam, -w)


# ----------------------------------------------------------------------------- Lipschitz G
def _max_grad_norm(loss, X, y, thetas) -> float:
    return max(float(torch.linalg.vector_norm(loss.per_example_grad(t, X, y), dim=1).max())
               for t in thetas)


@pytest.mark.parametrize("loss", [LogisticLoss(), HuberSVMLoss(), HuberSVMLoss(0.1),
                                  SoftmaxLoss(2), SoftmaxLoss(5)], ids=repr)
def test_lipschitz_bound_holds_and_is_approached(loss, gen: torch.Generator) -> None:
    d = 6
    X = torch.cat([unit_ball(500, d, gen), unit_ball(500, d, gen, on_sphere=True)])
    y = labels_for(loss, X, gen, noise=3.0)  # plenty of misclassified rows
    G = loss.lipschitz()
    # theta anywhere: random directions at radii 0.1 .. 1000 (large radii push the margin of
    # misclassified rows to -inf, where the bound is approached).
    thetas = [torch.randn(loss.param_dim(d), generator=gen, dtype=F64) * r
              for r in (0.1, 1.0, 10.0, 100.0, 1000.0)]
    worst = _max_grad_norm(loss, X, y, thetas)
    assert worst <= G * (1 + 1e-12)
    assert worst >= 0.99 * G, (worst, G)


def test_ridge_lipschitz_on_ball(gen: torch.Generator) -> None:
    loss, d = SquaredLoss(), 5
    X = torch.cat([unit_ball(400, d, gen), unit_ball(400, d, gen, on_sphere=True)])
    y = torch.rand(800, generator=gen, dtype=F64) * 2 - 1
    y[::2] = torch.sign(y[::2])  # |y| = 1 rows
    for R in (0.5, 3.0, 1 / math.sqrt(0.01)):
        th = torch.randn(50, d, generator=gen, dtype=F64)
        th = th / th.norm(dim=1, keepdim=True) * R * torch.rand(50, 1, generator=gen, dtype=F64)
        th[0] = X[-1] / X[-1].norm() * R  # x aligned with theta, y = -sign: attains R + 1
        Xa, ya = X[-1:], -torch.ones(1, dtype=F64)
        worst = max(_max_grad_norm(loss, X, y, list(th)), _max_grad_norm(loss, Xa, ya, [th[0]]))
        assert worst <= loss.lipschitz(R) * (1 + 1e-12)
        assert worst >= 0.999 * loss.lipschitz(R)


@pytest.mark.parametrize("lam", [1.0, 0.1, 0.01, 1e-3])
def test_ridge_minimiser_lies_in_ball(lam: float, gen: torch.Generator) -> None:
    """||theta*|| <= 1/sqrt(lam), which makes ridge_lipschitz_for(lam) honest."""
    d = 8
    X = unit_ball(60, d, gen, on_sphere=True)
    w = torch.randn(d, generator=gen, dtype=F64)
    y = torch.sign(X @ w)  # extreme targets |y| = 1
    res = solve_erm(SquaredLoss(), X, y, lam)
    assert float(res.theta.norm()) <= 1 / math.sqrt(lam) + res.certified_error
    # The gradient bound at theta* is within G = 1 + 1/sqrt(lam).
    gmax = SquaredLoss().per_example_grad(res.theta, X, y).norm(dim=1).max()
    assert float(gmax) <= ridge_lipschitz_for(lam)


# ----------------------------------------------------------------------------- smoothness L
@pytest.mark.parametrize("loss", all_losses(), ids=LOSS_IDS)
def test_smoothness_by_finite_differences(loss, gen: torch.Generator) -> None:
    d = 5
    X = torch.cat([unit_ball(300, d, gen), unit_ball(300, d, gen, on_sphere=True)])
    y = labels_for(loss, X, gen, noise=2.0)
    p = loss.param_dim(d)
    L = loss.smoothness
    worst = 0.0
    for r in (0.01, 0.5, 2.0, 5.0):
        th = torch.randn(p, generator=gen, dtype=F64) * r
        for delta in (1e-4, 1e-1, 1.0):
            u = torch.randn(p, generator=gen, dtype=F64)
            u = u / u.norm()
            dg = loss.per_example_grad(th + delta * u, X, y) - loss.per_example_grad(th, X, y)
            worst = max(worst, float(dg.norm(dim=1).max()) / delta)
    assert worst <= L * (1 + 1e-6)


def test_smoothness_is_attained() -> None:
    """At the point of maximal curvature the finite-difference ratio reaches L."""
    x = torch.tensor([[0.6, 0.8]], dtype=F64)
    delta = 1e-6
    # logistic: z = 0, direction x.
    th0 = torch.zeros(2, dtype=F64)
    yb = torch.ones(1, dtype=F64)
    for loss, th in ((LogisticLoss(), th0), (SquaredLoss(), th0),
                     (HuberSVMLoss(0.5), x[0] * 1.0), (HuberSVMLoss(0.2), x[0] * 1.0)):
        g = lambda t, lo=loss: lo.per_example_grad(t, x, yb)[0]
        ratio = float((g(th + delta * x[0]) - g(th)).norm()) / delta
        assert ratio == pytest.approx(loss.smoothness, rel=1e-5)
    sm = SoftmaxLoss(2)
    u = torch.cat([x[0], -x[0]]) / math.sqrt(2)
    g = lambda t: sm.per_example_grad(t, x, torch.tensor([0]))[0]
    ratio = float((g(delta * u) - g(torch.zeros(4, dtype=F64))).norm()) / delta
    assert ratio == pytest.approx(0.5, rel=1e-5)


# ----------------------------------------------------------------------------- predict/score
def test_predict_and_score(gen: torch.Generator) -> None:
    X = unit_ball(200, 3, gen)
    th = torch.tensor([2.0, -1.0, 0.5], dtype=F64)
    y = torch.where(X @ th >= 0, 1.0, -1.0).to(F64)
    lo = LogisticLoss()
    assert torch.equal(lo.predict(th, X), y)
    assert lo.score(th, X, y) == 1.0 and lo.score(-th, X, y) < 0.05
    assert lo.predict(th, torch.zeros(1, 3, dtype=F64)).item() == 1.0  # tie -> +1
    sq = SquaredLoss()
    yr = X @ th * 0.1
    assert sq.score(th * 0.1, X, yr) == pytest.approx(0.0, abs=1e-30)
    assert sq.score(th * 0.0, X, yr) == pytest.approx(float((yr**2).mean()))
    sm = SoftmaxLoss(3)
    W = torch.randn(3, 3, generator=gen, dtype=F64)
    ym = (X @ W.T).argmax(1)
    assert sm.predict(W.flatten(), X).dtype == torch.int64
    assert sm.score(W.flatten(), X, ym) == 1.0


def test_label_checks() -> None:
    with pytest.raises(ValueError, match="y"):
        LogisticLoss().check_labels(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="y"):
        SoftmaxLoss(3).check_labels(torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="y"):
        SoftmaxLoss(3).check_labels(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="y"):
        SquaredLoss().check_labels(torch.tensor([1.5]))
    with pytest.raises(ValueError, match="theta"):
        LogisticLoss().per_example_loss(torch.zeros(3, dtype=F64), torch.zeros(2, 4, dtype=F64),
                                        torch.ones(2, dtype=F64))


def test_per_example_grad_runs_at_simulator_scale(gen: torch.Generator) -> None:
    """The simulator calls this on 50,000 x 122 every round; it must be a few vector ops."""
    import time

    X = unit_ball(50_000, 122, gen)
    y = labels_for(LogisticLoss(), X, gen)
    th = torch.randn(122, generator=gen, dtype=F64)
    t0 = time.perf_counter()
    for _ in range(5):
        G = LogisticLoss().per_example_grad(th, X, y)
    per_call = (time.perf_counter() - t0) / 5
    assert G.shape == (50_000, 122)
    print(f"per_example_grad 50000x122: {per_call * 1e3:.1f} ms")
    assert per_call < 1.0
