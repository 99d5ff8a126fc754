"""Certified exact solvers: against scipy, certificate >= true error, batched == per party."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.optimize
import torch

from mpc_erm.models import (
    ConvergenceError,
    LogisticLoss,
    SoftmaxLoss,
    SquaredLoss,
    get_loss,
    objective_grad,
    objective_value,
    solve_erm,
    solve_erm_batched,
)

from ._util import F64, all_losses, labels_for, unit_ball

LOSS_IDS = [repr(loss) for loss in all_losses()]


def _scipy_solve(loss, X, y, lam, weights=None, b=None) -> torch.Tensor:
    p = loss.param_dim(X.shape[1])

    def fg(t: np.ndarray) -> tuple[float, np.ndarray]:
        th = torch.from_numpy(t)
        J = objective_value(loss, th, X, y, lam, weights)
        g = objective_grad(loss, th, X, y, lam, weights)
        if b is not None:
            J, g = J + (b * th).sum(), g + b
        return float(J), g.numpy()

    r = scipy.optimize.minimize(fg, np.zeros(p), jac=True, method="L-BFGS-B",
                                options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 20000,
                                         "maxcor": 30})
    return torch.from_numpy(r.x)


@pytest.mark.parametrize("loss", all_losses(), ids=LOSS_IDS)
@pytest.mark.parametrize("lam", [0.1, 0.01])
def test_matches_scipy(loss, lam: float) -> None:
    gen = torch.Generator().manual_seed(7)
    X = unit_ball(120, 6, gen)
    y = labels_for(loss, X, gen)
    res = solve_erm(loss, X, y, lam)
    assert res.converged and res.certified_error <= 1e-9
    assert res.certified_error == pytest.approx(res.grad_norm / lam)
    ref = _scipy_solve(loss, X, y, lam)
    # scipy's own accuracy is ~ gtol * sqrt(p) / lam.
    assert float((res.theta - ref).norm()) < 1e-7
    g = objective_grad(loss, res.theta, X, y, lam)
    assert float(g.norm()) <= lam * 1e-9


@pytest.mark.parametrize("loss", [LogisticLoss(), get_loss("huber_svm"), SoftmaxLoss(3)], ids=repr)
def test_weights_and_linear_term_match_scipy(loss) -> None:
    gen = torch.Generator().manual_seed(3)
    X = unit_ball(80, 5, gen)
    y = labels_for(loss, X, gen)
    w = torch.rand(80, generator=gen, dtype=F64)
    b = torch.randn(loss.param_dim(5), generator=gen, dtype=F64) * 0.05
    res = solve_erm(loss, X, y, 0.05, weights=w, linear_term=b)
    assert float((res.theta - _scipy_solve(loss, X, y, 0.05, w, b)).norm()) < 1e-7


def test_ridge_closed_form() -> None:
    gen = torch.Generator().manual_seed(5)
    X = unit_ball(50, 8, gen)
    y = labels_for(SquaredLoss(), X, gen)
    lam = 0.01
    res = solve_erm(SquaredLoss(), X, y, lam)
    exact = torch.linalg.solve(X.T @ X / 50 + lam * torch.eye(8, dtype=F64), X.T @ y / 50)
    assert float((res.theta - exact).norm()) <= res.certified_error + 1e-13
    assert res.iterations <= 2


@pytest.mark.parametrize("loss", all_losses(), ids=LOSS_IDS)
def test_certificate_bounds_true_error(loss) -> None:
    """Stopped early on purpose, the certificate ||grad J||/lam still bounds the distance."""
    gen = torch.Generator().manual_seed(11)
    X = unit_ball(100, 6, gen)
    y = labels_for(loss, X, gen)
    lam = 0.02
    star = solve_erm(loss, X, y, lam, tol=1e-12).theta
    for max_iter in (0, 1, 2, 3):
        r = solve_erm(loss, X, y, lam, max_iter=max_iter, raise_on_failure=False)
        err = float((r.theta - star).norm())
        assert err <= r.certified_error * (1 + 1e-9) + 1e-12
        assert r.iterations <= max_iter
    for tol in (1e-2, 1e-4, 1e-6):
        r = solve_erm(loss, X, y, lam, tol=tol)
        assert float((r.theta - star).norm()) <= r.certified_error + 1e-12 <= tol + 1e-12


def test_nonconvergence_raises_or_flags() -> None:
    gen = torch.Generator().manual_seed(2)
    X = unit_ball(40, 4, gen)
    y = labels_for(LogisticLoss(), X, gen)
    with pytest.raises(ConvergenceError, match="tol") as e:
        solve_erm(LogisticLoss(), X, y, 0.01, max_iter=1)
    assert e.value.result.converged is False and isinstance(e.value, ValueError)
    r = solve_erm(LogisticLoss(), X, y, 0.01, max_iter=1, raise_on_failure=False)
    assert not r.converged and r.certified_error > 1e-9
    Xb, yb = X.reshape(4, 10, 4), y.reshape(4, 10)
    with pytest.raises(ConvergenceError):
        solve_erm_batched(LogisticLoss(), Xb, yb, None, 0.01, max_iter=1)
    rb = solve_erm_batched(LogisticLoss(), Xb, yb, None, 0.01, max_iter=1, raise_on_failure=False)
    assert rb.converged.dtype == torch.bool and not rb.all_converged


def test_input_validation() -> None:
    X = torch.zeros(3, 2, dtype=F64)
    y = torch.ones(3, dtype=F64)
    for kw, field in (({"lam": 0.0}, "lam"), ({"lam": -1.0}, "lam"), ({"tol": 0.0}, "tol")):
        args = {"lam": 0.1, "tol": 1e-9, **kw}
        with pytest.raises(ValueError, match=field):
            solve_erm(LogisticLoss(), X, y, **args)
    with pytest.raises(ValueError, match="y"):
        solve_erm(LogisticLoss(), X, torch.zeros(3, dtype=F64), 0.1)
    with pytest.raises(ValueError, match="linear_term"):
        solve_erm(LogisticLoss(), X, y, 0.1, linear_term=torch.zeros(5, dtype=F64))
    with pytest.raises(ValueError, match="mask"):
        solve_erm_batched(LogisticLoss(), X[None], y[None], torch.ones(1, 3), 0.1)
    with pytest.raises(ValueError, match="method"):
        solve_erm(LogisticLoss(), X, y, 0.1, method="bfgs")


def _per_party(loss, X, y, mask, lam, b) -> torch.Tensor:
    out = []
    for j in range(X.shape[0]):
        sel = mask[j]
        bj = None if b is None else b[j]
        if not bool(sel.any()):
            out.append(-bj / lam if bj is not None else torch.zeros(loss.param_dim(X.shape[2]),
                                                                    dtype=F64))
            continue
        # theta0 given: the full-space Newton, independent of the span reduction used in batch.
        th0 = torch.zeros(loss.param_dim(X.shape[2]), dtype=F64)
        r = solve_erm(loss, X[j][sel], y[j][sel], lam, linear_term=bj, theta0=th0)
        assert "reduced" not in r.method
        out.append(r.theta)
    return torch.stack(out)


@pytest.mark.parametrize("loss", all_losses(), ids=LOSS_IDS)
@pytest.mark.parametrize("k,d,with_b", [(1, 10, False), (1, 10, True), (3, 10, True),
                                         (20, 6, False), (20, 6, True)])
def test_batched_equals_per_party(loss, k: int, d: int, with_b: bool) -> None:
    gen = torch.Generator().manual_seed(100 * k + d)
    m, lam = 12, 0.03
    X = unit_ball(m * k, d, gen).reshape(m, k, d)
    y = labels_for(loss, X.reshape(-1, d), gen).reshape(m, k)
    mask = torch.rand(m, k, generator=gen) < 0.7
    mask[0] = True
    mask[1] = False  # an empty party
    if k > 1:
        mask[2] = False
        mask[2, 0] = True
    b = (torch.randn(m, loss.param_dim(d), generator=gen, dtype=F64) * 0.05) if with_b else None
    res = solve_erm_batched(loss, X, y, mask, lam, linear_term=b)
    assert res.theta.shape == (m, loss.param_dim(d))
    assert res.all_converged and res.max_certified_error <= 1e-9
    ref = _per_party(loss, X, y, mask, lam, b)
    torch.testing.assert_close(res.theta, ref, rtol=0, atol=3e-9)


@pytest.mark.parametrize("method", ["newton", "newton_cg"])
def test_methods_agree(method: str) -> None:
    gen = torch.Generator().manual_seed(9)
    loss = SoftmaxLoss(4)
    X = unit_ball(300, 12, gen)
    y = labels_for(loss, X, gen)
    r = solve_erm(loss, X, y, 0.01, method=method)
    r0 = solve_erm(loss, X, y, 0.01, method="newton")
    assert float((r.theta - r0.theta).norm()) <= r.certified_error + r0.certified_error


def _timing_data(m: int, k: int, d: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    X = unit_ball(m * k, d, gen).reshape(m, k, d)
    y = labels_for(LogisticLoss(), X.reshape(-1, d), gen).reshape(m, k)
    return X, y


@pytest.mark.parametrize("m,k", [(50_000, 1), (100, 500)])
def test_batched_timing_sanity(m: int, k: int) -> None:
    """The thesis scales: m = 50,000 parties with one row, and m = 100 with 500 rows; d = 122."""
    X, y = _timing_data(m, k, 122, seed=m)
    t0 = time.perf_counter()
    res = solve_erm_batched(LogisticLoss(), X, y, None, 0.01)
    dt = time.perf_counter() - t0
    print(f"solve_erm_batched logistic m={m} k={k} d=122 lam=0.01: {dt:.2f} s, "
          f"{res.iterations} its, max cert {res.max_certified_error:.1e}, {res.method}")
    assert res.all_converged
    assert dt < 60
    # Spot-check a few parties against the single-party solver.
    for j in (0, m // 2, m - 1):
        torch.testing.assert_close(res.theta[j], solve_erm(LogisticLoss(), X[j], y[j], 0.01).theta,
                                   rtol=0, atol=3e-9)


def test_softmax_many_single_row_parties() -> None:
    """Regression: one-row softmax parties at small lam, where Armijo on J cannot resolve the
    Newton decrement (J's rounding ~ eps |z|), must still converge (full steps accepted)."""
    gen = torch.Generator().manual_seed(4)
    loss = SoftmaxLoss(10)
    m, d = 3000, 122
    X = unit_ball(m, d, gen).reshape(m, 1, d)
    y = labels_for(loss, X.reshape(m, d), gen).reshape(m, 1)
    t0 = time.perf_counter()
    res = solve_erm_batched(loss, X, y, None, 1e-4)
    print(f"softmax K=10 m={m} k=1 lam=1e-4: {time.perf_counter() - t0:.2f} s ({res.method})")
    assert res.all_converged
    for j in (0, m - 1):
        ref = solve_erm(loss, X[j], y[j], 1e-4, theta0=torch.zeros(loss.param_dim(d), dtype=F64))
        torch.testing.assert_close(res.theta[j], ref.theta, rtol=0, atol=3e-9)


def test_unreachable_tol_stops_at_rounding_floor() -> None:
    gen = torch.Generator().manual_seed(8)
    X = unit_ball(200, 10, gen)
    y = labels_for(LogisticLoss(), X, gen)
    r = solve_erm(LogisticLoss(), X, y, 0.01, tol=1e-300, raise_on_failure=False)
    assert not r.converged and r.certified_error < 1e-12
    assert r.iterations < 30  # stalled at the float64 floor instead of burning max_iter
    with pytest.raises(ConvergenceError, match="rounding"):
        solve_erm(LogisticLoss(), X, y, 0.01, tol=1e-300)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_inputs_stay_on_device() -> None:
    gen = torch.Generator().manual_seed(1)
    loss = SoftmaxLoss(3)
    X = unit_ball(40, 5, gen)
    y = labels_for(loss, X, gen)
    r_cpu = solve_erm(loss, X, y, 0.05)
    r = solve_erm(loss, X.cuda(), y.cuda(), 0.05)
    assert r.theta.device.type == "cuda"
    torch.testing.assert_close(r.theta.cpu(), r_cpu.theta, rtol=0, atol=1e-8)
    rb = solve_erm_batched(loss, X.cuda().reshape(4, 10, 5), y.cuda().reshape(4, 10), None, 0.05)
    assert rb.theta.device.type == "cuda" and rb.all_converged
    g = loss.per_example_grad(r.theta, X.cuda(), y.cuda())
    assert g.device.type == "cuda"
