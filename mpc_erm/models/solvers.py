"""Exact local solvers for the lam-strongly-convex regularised ERM objectives, with a certificate.

Output perturbation (docs/explanation/privacy.md §2) calibrates noise to the sensitivity 2G/(n lam) of the
*exact* minimiser theta*.  A solver only returns an approximation, so it certifies its error:
J is lam-strongly convex (convex loss + lam/2 ||theta||^2 + a linear term), hence

    ||theta - theta*|| <= ||grad J(theta)|| / lam,

and we stop only when that bound is <= tol (default 1e-9).  The bound uses the gradient as
computed in floating point; its own rounding error (~1e-16 relative to the summed terms) is not
added.  A party whose certificate does not reach ``tol`` within ``max_iter`` raises
``ConvergenceError`` (or is flagged in ``converged`` when ``raise_on_failure=False``).

Algorithm: Newton's method with Armijo backtracking, batched over parties; the Newton system is
solved by Cholesky on the explicit Hessian when m p^2 is small, else by Jacobi-preconditioned
conjugate gradients on Hessian-vector products (Newton-CG; softmax with p = K d in the
thousands).  For the many-small-parties case (m = 50,000 parties with one row each) the
problem is first reduced: the stationarity condition theta* = -(X^T phi'(z) w + b) / lam puts
every row of W* in the span of the party's rows and of b, so with an orthonormal basis Q (d, r),
r = k + K_b < d, theta = C Q^T turns the problem into the same ERM problem on features Q^T x in
dimension r (norms and ||theta|| preserved).  The certificate is always re-computed in the
original space, and any party that misses it there is polished by full-space Newton.

Floating point.  Near the optimum the Newton decrement g^T H^{-1} g drops below the rounding
error of J itself (logsumexp and z = W x lose ~eps |z| absolutely), so Armijo is given a slack
of that size (``value_noise``) and full Newton steps are then accepted -- local quadratic
convergence does the rest.  The gradient has a rounding floor too (~eps L ||theta|| sqrt(d));
a party whose gradient stops improving at that floor is reported as not converged instead of
iterating to ``max_iter``: the certificate ``tol`` must be >= floor / lam (in practice a
concern only for lam below ~1e-5 with tol = 1e-9).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .losses import Loss

__all__ = ["ConvergenceError", "SolveResult", "solve_erm", "solve_erm_batched"]

#: Explicit (m, p, p) Hessians are used while m p^2 stays below this many entries (~400 MB f64) ...
_MAX_HESSIAN_ENTRIES = 50_000_000
#: ... and building them costs at most this many multiply-adds per Newton step.
_MAX_HESSIAN_FLOPS = 20_000_000_000
#: Largest temporary (entries) for building all K^2 softmax Hessian blocks in one matmul.
_MAX_HESSIAN_TEMP = 20_000_000
_ARMIJO_C = 1e-4
_MAX_HALVINGS = 60
_PATIENCE = 3
_FLOOR_HINT = (
    "if the gradient stalled at float64 rounding (about eps*L*||theta||*sqrt(d)), the "
    "certificate cannot go below that divided by lam: raise tol or lam"
)


@dataclass(frozen=True)
class SolveResult:
    """Solver output.  For ``solve_erm``: theta (p,), floats and a bool; for
    ``solve_erm_batched``: theta (m, p) and (m,) tensors for the per-party fields.

    certified_error = grad_norm / lam bounds ||theta - theta*|| (lam-strong convexity).
    """

    theta: Tensor
    grad_norm: float | Tensor
    certified_error: float | Tensor
    iterations: int
    converged: bool | Tensor
    method: str = "newton"

    @property
    def all_converged(self) -> bool:
        c = self.converged
        return bool(c.all()) if isinstance(c, Tensor) else bool(c)

    @property
    def max_certified_error(self) -> float:
        e = self.certified_error
        return float(e.max()) if isinstance(e, Tensor) and e.numel() else float(e)


class ConvergenceError(ValueError):
    """The solver could not certify ||theta - theta*|| <= tol; ``.result`` holds what it got."""

    def __init__(self, message: str, result: SolveResult) -> None:
        super().__init__(message)
        self.result = result


# ----------------------------------------------------------------------------- batched kernels
class _Problem:
    """J_j(theta) = sum_i w_ji phi(W x_ji, y_ji) + lam/2 ||theta||^2 + <b_j, theta> for a batch."""

    def __init__(
        self, loss: Loss, X: Tensor, y: Tensor, w: Tensor, lam: float, b: Tensor | None
    ) -> None:
        self.loss, self.X, self.y, self.w, self.lam, self.b = loss, X, y, w, lam, b
        self.K = loss.n_outputs
        self.d = X.shape[-1]

    def subset(self, idx: Tensor | None) -> _Problem:
        if idx is None:
            return self
        b = None if self.b is None else self.b[idx]
        return _Problem(self.loss, self.X[idx], self.y[idx], self.w[idx], self.lam, b)

    def scores(self, theta: Tensor) -> Tensor:
        return self.loss.scores(theta, self.X)  # (m, k, K)

    def value(self, theta: Tensor, z: Tensor | None = None) -> Tensor:
        z = self.scores(theta) if z is None else z
        v = (self.w * self.loss._phi(z, self.y)).sum(-1) + 0.5 * self.lam * (theta * theta).sum(-1)
        if self.b is not None:
            v = v + (self.b * theta).sum(-1)
        return v

    def grad_floor(self, theta: Tensor, z: Tensor) -> Tensor:
        """Rough size of the rounding error of ``grad`` (per party): eps times the terms summed
        plus the error of z = W x (~ eps ||theta|| ||x|| sqrt(d)) propagated through phi''.
        Below it the certificate cannot be pushed by more iterations."""
        eps = torch.finfo(theta.dtype).eps
        xn = torch.linalg.vector_norm(self.X, dim=-1)  # (m, k)
        dn = torch.linalg.vector_norm(self.loss._dphi(z, self.y), dim=-1)
        tn = torch.linalg.vector_norm(theta, dim=-1)
        terms = (self.w * dn * xn).sum(-1) + self.lam * tn
        if self.b is not None:
            terms = terms + torch.linalg.vector_norm(self.b, dim=-1)
        zerr = self.loss.smoothness * tn * (self.w * xn * xn).sum(-1) * math.sqrt(self.d)
        return eps * (terms + zerr)

    def _back(self, gz: Tensor) -> Tensor:
        """sum_i w_i gz_i x_i^T flattened: (m, k, K) -> (m, p)."""
        g = (gz * self.w.unsqueeze(-1)).transpose(-1, -2) @ self.X
        return g.reshape(g.shape[0], -1)

    def grad(self, theta: Tensor, z: Tensor) -> Tensor:
        g = self._back(self.loss._dphi(z, self.y)) + self.lam * theta
        if self.b is not None:
            g = g + self.b
        return g

    def hvp(self, z: Tensor, v: Tensor) -> Tensor:
        V = v.reshape(v.shape[0], self.K, self.d)
        zv = self.X @ V.transpose(-1, -2)
        return self._back(self.loss._hvp_phi(z, self.y, zv)) + self.lam * v

    def hess_diag(self, z: Tensor) -> Tensor:
        D = self.loss._diag_phi(z, self.y) * self.w.unsqueeze(-1)  # (m, k, K)
        h = D.transpose(-1, -2) @ (self.X * self.X)
        return h.reshape(h.shape[0], -1) + self.lam

    def hessian(self, z: Tensor) -> Tensor:
        m, k, K, d = z.shape[0], z.shape[1], self.K, self.d
        S = self.loss._hess_phi(z, self.y) * self.w[..., None, None]  # (m, k, K, K)
        Xt = self.X.transpose(-1, -2)
        if K == 1:
            H = (Xt * S[:, None, :, 0, 0]) @ self.X
        elif m * k * K * K * d <= _MAX_HESSIAN_TEMP:
            # One batched matmul for all K^2 blocks (many tiny parties: avoid K^2 launches).
            XS = (S.reshape(m, k, K * K, 1) * self.X.unsqueeze(2)).reshape(m, k, K * K * d)
            H = (XS.transpose(-1, -2) @ self.X).reshape(m, K, K, d, d)
            H = H.permute(0, 1, 3, 2, 4).reshape(m, K * d, K * d)
        else:
            H5 = z.new_zeros(m, K, d, K, d)
            for a in range(K):
                for c in range(a, K):
                    blk = (Xt * S[:, None, :, a, c]) @ self.X  # (m, d, d)
                    H5[:, a, :, c, :] = blk
                    if c != a:
                        H5[:, c, :, a, :] = blk.transpose(-1, -2)
            H = H5.reshape(m, K * d, K * d)
        H = H.contiguous()
        H.diagonal(dim1=-2, dim2=-1).add_(self.lam)
        return H

    def value_noise(self, theta: Tensor, z: Tensor, J: Tensor) -> Tensor:
        """Rough rounding error of ``value`` per party: eps times |J|, the scale of the scores
        (logsumexp and z = W x lose eps * |z| absolutely, amplified by |phi'|) and of the
        regulariser/linear terms.  Armijo cannot resolve decreases below it; near the optimum
        the Newton decrement falls below it and the full step must then be accepted."""
        eps = torch.finfo(theta.dtype).eps
        xn = torch.linalg.vector_norm(self.X, dim=-1)  # (m, k)
        tn = torch.linalg.vector_norm(theta, dim=-1)
        dn = torch.linalg.vector_norm(self.loss._dphi(z, self.y), dim=-1)
        zs = math.sqrt(self.d) * tn.unsqueeze(-1) * xn * (1 + dn)
        noise = J.abs() + (self.w * zs).sum(-1) + self.lam * tn * tn
        if self.b is not None:
            noise = noise + (self.b * theta).sum(-1).abs()
        return eps * noise


def _pcg(
    hvp: Callable[[Tensor], Tensor], rhs: Tensor, diag: Tensor, rtol: Tensor, max_iter: int
) -> Tensor:
    """Batched Jacobi-preconditioned CG for H s = rhs, per-row stop at ||r|| <= rtol ||rhs||."""
    x = torch.zeros_like(rhs)
    r = rhs.clone()
    target = rtol * torch.linalg.vector_norm(rhs, dim=-1)
    done = torch.linalg.vector_norm(r, dim=-1) <= target
    zr = r / diag
    p = zr.clone()
    rz = (r * zr).sum(-1)
    for _ in range(max_iter):
        if bool(done.all()):
            break
        Hp = hvp(p)
        pHp = (p * Hp).sum(-1)
        alpha = torch.where(done | (pHp <= 0), torch.zeros_like(rz), rz / pHp)
        x = x + alpha.unsqueeze(-1) * p
        r = r - alpha.unsqueeze(-1) * Hp
        done = done | (torch.linalg.vector_norm(r, dim=-1) <= target)
        zr = r / diag
        rz_new = (r * zr).sum(-1)
        beta = torch.where(done | (rz == 0), torch.zeros_like(rz), rz_new / rz)
        p = zr + beta.unsqueeze(-1) * p
        rz = rz_new
    return x


def _choose_method(method: str, m: int, k: int, p: int) -> str:
    if method not in ("auto", "newton", "newton_cg"):
        raise ValueError(f"method: must be 'auto', 'newton' or 'newton_cg', got {method!r}")
    if method != "auto":
        return method
    if m * p * p <= _MAX_HESSIAN_ENTRIES and m * max(k, 1) * p * p <= _MAX_HESSIAN_FLOPS:
        return "newton"
    return "newton_cg"


def _newton(
    prob: _Problem, theta0: Tensor, tol: float, max_iter: int, method: str
) -> tuple[Tensor, Tensor, int, Tensor]:
    """Batched Newton / Newton-CG with Armijo backtracking and the certified stop.

    Returns (theta, grad_norm, iterations, converged) for every party.
    """
    m, p = theta0.shape
    lam = prob.lam
    gtol = lam * tol
    method = _choose_method(method, m, prob.X.shape[1], p)
    theta = theta0.clone()
    gnorm = torch.full((m,), math.inf, dtype=theta.dtype, device=theta.device)
    converged = torch.zeros(m, dtype=torch.bool, device=theta.device)
    stalled = torch.zeros_like(converged)
    # Parties whose gradient sits at its rounding floor without improving for _PATIENCE steps
    # stop as "stalled" (not converged): more iterations cannot certify a smaller error.
    best = gnorm.clone()
    flat = torch.zeros(m, dtype=torch.int64, device=theta.device)
    iters = 0
    for it in range(max_iter + 1):
        active = ~(converged | stalled)
        if not bool(active.any()):
            break
        idx = None if bool(active.all()) else active.nonzero().squeeze(-1)
        sub = prob.subset(idx)
        th = theta if idx is None else theta[idx]
        z = sub.scores(th)
        g = sub.grad(th, z)
        gn = torch.linalg.vector_norm(g, dim=-1)
        ok = gn <= gtol
        b_old = best if idx is None else best[idx]
        f_old = flat if idx is None else flat[idx]
        improved = gn < 0.5 * b_old
        f_new = torch.where(improved, torch.zeros_like(f_old), f_old + 1)
        at_floor = (~ok) & (f_new >= _PATIENCE) & (gn <= 64 * sub.grad_floor(th, z))
        if idx is None:
            gnorm, converged = gn, ok
            best, flat = torch.minimum(b_old, gn), f_new
            stalled = stalled | at_floor
        else:
            gnorm[idx] = gn
            converged[idx] = ok
            best[idx], flat[idx] = torch.minimum(b_old, gn), f_new
            stalled[idx] = stalled[idx] | at_floor
        ok = ok | at_floor
        if bool(ok.all()) or it == max_iter:
            break
        iters = it + 1
        # Newton direction (converged rows are simply not moved below).
        if method == "newton":
            H = sub.hessian(z)
            L, info = torch.linalg.cholesky_ex(H)
            s = torch.cholesky_solve(-g.unsqueeze(-1), L).squeeze(-1)
            bad = info != 0
            if bool(bad.any()):  # cannot happen for lam > 0 barring overflow: fall back to -g
                s = torch.where(bad.unsqueeze(-1), -g / lam, s)
        else:
            rtol = torch.clamp(torch.sqrt(gn), max=0.5)
            s = _pcg(lambda v, sub=sub, z=z: sub.hvp(z, v), -g, sub.hess_diag(z), rtol,
                     max_iter=max(50, 2 * p))
        # Armijo backtracking per party; the slack absorbs rounding of J near the optimum.
        J0 = sub.value(th, z)
        slope = (g * s).sum(-1)
        slack = 64 * sub.value_noise(th, z, J0)
        t = torch.ones_like(J0)
        accepted = ok.clone()
        for _ in range(_MAX_HALVINGS):
            cand = th + t.unsqueeze(-1) * s
            Jc = sub.value(cand)
            good = (Jc <= J0 + _ARMIJO_C * t * slope + slack) & torch.isfinite(Jc)
            accepted = accepted | good
            if bool(accepted.all()):
                break
            t = torch.where(accepted, t, 0.5 * t)
        step = torch.where((accepted & ~ok).unsqueeze(-1), t.unsqueeze(-1) * s, torch.zeros_like(s))
        new_stalled = ~accepted
        if idx is None:
            theta = theta + step
            stalled = stalled | new_stalled
        else:
            theta[idx] = th + step
            stalled[idx] = stalled[idx] | new_stalled
    return theta, gnorm, iters, converged


# ----------------------------------------------------------------------------- public API
def _check_common(loss: Loss, lam: float, tol: float, max_iter: int, method: str) -> None:
    _choose_method(method, 1, 1, 1)
    if not isinstance(loss, Loss):
        raise TypeError(f"loss: expected a mpc_erm.models.Loss, got {type(loss).__name__}")
    if not (isinstance(lam, numbers.Real) and math.isfinite(lam) and lam > 0):
        raise ValueError(f"lam: must be a finite number > 0 (strong convexity), got {lam!r}")
    if not (isinstance(tol, numbers.Real) and math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol: must be a finite number > 0, got {tol!r}")
    if not (isinstance(max_iter, int) and max_iter >= 0):
        raise ValueError(f"max_iter: must be an int >= 0, got {max_iter!r}")


def _reduce_and_solve(
    loss: Loss,
    X: Tensor,
    y: Tensor,
    w: Tensor,
    lam: float,
    b: Tensor | None,
    theta0: Tensor | None,
    tol: float,
    max_iter: int,
    method: str,
) -> tuple[Tensor, Tensor, int, Tensor, str]:
    m, k, d = X.shape
    K = loss.n_outputs
    p = K * d
    full = _Problem(loss, X, y, w, lam, b)
    kb = 0 if b is None else K
    r = k + kb
    if theta0 is None and r < d:
        # theta* rows lie in span(rows of X_j, rows of B_j): solve in that r-dim subspace.
        rows = X * (w > 0).unsqueeze(-1).to(X.dtype)
        if b is not None:
            rows = torch.cat([rows, b.reshape(m, K, d)], dim=1)
        Q, _ = torch.linalg.qr(rows.transpose(-1, -2))  # (m, d, r), orthonormal columns
        br = None if b is None else (b.reshape(m, K, d) @ Q).reshape(m, K * r)
        red = _Problem(loss, X @ Q, y, w, lam, br)
        mr = _choose_method(method, m, k, K * r)
        c, _, it_red, _ = _newton(red, X.new_zeros(m, K * r), tol, max_iter, mr)
        theta = (c.reshape(m, K, r) @ Q.transpose(-1, -2)).reshape(m, p)
        used = f"reduced-{mr}(r={r})"
    else:
        theta = X.new_zeros(m, p) if theta0 is None else theta0.to(X).reshape(m, p).clone()
        it_red, used = 0, ""
    # Certify in the original space; polish whoever misses it (and solve if not reduced).
    g = full.grad(theta, full.scores(theta))
    gnorm = torch.linalg.vector_norm(g, dim=-1)
    converged = gnorm <= lam * tol
    iters = it_red
    if not bool(converged.all()):
        idx = (~converged).nonzero().squeeze(-1)
        mf = _choose_method(method, idx.numel(), k, p)
        th, gn, it_full, cv = _newton(full.subset(idx), theta[idx], tol, max_iter, mf)
        theta[idx], gnorm[idx], converged[idx] = th, gn, cv
        iters += it_full
        used = f"{used}+{mf}" if used else mf
    return theta, gnorm, iters, converged, used


def solve_erm(
    loss: Loss,
    X: Tensor,
    y: Tensor,
    lam: float,
    tol: float = 1e-9,
    weights: Tensor | None = None,
    linear_term: Tensor | None = None,
    *,
    theta0: Tensor | None = None,
    max_iter: int = 100,
    method: str = "auto",
    raise_on_failure: bool = True,
) -> SolveResult:
    """Minimise (weighted) mean_i l_i(theta) + lam/2 ||theta||^2 + <linear_term, theta>.

    Returns a ``SolveResult`` whose ``certified_error`` = ||grad J|| / lam <= tol bounds the
    distance to the exact minimiser.  ``method``: "auto" (explicit Newton while p^2 and the
    Hessian build are small, else Newton-CG), "newton" or "newton_cg".
    """
    _check_common(loss, lam, tol, max_iter, method)
    if X.dim() != 2:
        raise ValueError(f"X: expected (n, d), got shape {tuple(X.shape)}")
    n, d = X.shape
    if y.shape != (n,):
        raise ValueError(f"y: shape {tuple(y.shape)} != ({n},)")
    loss.check_labels(y)
    if weights is None:
        if n == 0:
            raise ValueError("X: at least one row is needed")
        w = X.new_full((1, n), 1.0 / n)
    else:
        from .objective import normalised_weights

        w = normalised_weights(weights, n, X).unsqueeze(0)
    b = None if linear_term is None else _check_linear(linear_term, 1, loss.param_dim(d), X)
    res = solve_erm_batched_weighted(
        loss, X.unsqueeze(0), y.unsqueeze(0), w, lam, tol, b, theta0=theta0,
        max_iter=max_iter, method=method, raise_on_failure=False,
    )
    out = SolveResult(
        theta=res.theta[0],
        grad_norm=float(res.grad_norm[0]),  # type: ignore[index]
        certified_error=float(res.certified_error[0]),  # type: ignore[index]
        iterations=res.iterations,
        converged=bool(res.converged[0]),  # type: ignore[index]
        method=res.method,
    )
    if raise_on_failure and not out.converged:
        raise ConvergenceError(
            f"tol: solve_erm({loss.name}) certified only ||theta - theta*|| <= "
            f"{out.certified_error:.3e} > tol={tol:g} after {out.iterations} iterations "
            f"(max_iter={max_iter}); {_FLOOR_HINT}",
            out,
        )
    return out


def _check_linear(b: Tensor, m: int, p: int, like: Tensor) -> Tensor:
    b = b.to(dtype=like.dtype, device=like.device)
    if b.numel() != m * p:
        raise ValueError(f"linear_term: expected {m} x {p} entries, got shape {tuple(b.shape)}")
    b = b.reshape(m, p)
    if not bool(torch.isfinite(b).all()):
        raise ValueError("linear_term: must be finite")
    return b


def solve_erm_batched(
    loss: Loss,
    X: Tensor,
    y: Tensor,
    mask: Tensor | None,
    lam: float,
    tol: float = 1e-9,
    linear_term: Tensor | None = None,
    *,
    max_iter: int = 100,
    method: str = "auto",
    raise_on_failure: bool = True,
) -> SolveResult:
    """Solve m independent problems at once (one per party).

    Party j minimises mean over its masked rows of l(theta; x_ji, y_ji) + lam/2 ||theta||^2
    + <b_j, theta>, with X (m, k, d), y (m, k), mask (m, k) bool (None: all rows) and
    linear_term b (m, p) or None (the objective-perturbation baselines).  A party with no
    masked row gets the minimiser of lam/2 ||theta||^2 + <b_j, theta>, i.e. -b_j / lam.
    Returns ``SolveResult`` with theta (m, p) and (m,) grad_norm / certified_error / converged.
    """
    _check_common(loss, lam, tol, max_iter, method)
    if X.dim() != 3:
        raise ValueError(f"X: expected (m, k, d), got shape {tuple(X.shape)}")
    m, k, d = X.shape
    if y.shape != (m, k):
        raise ValueError(f"y: shape {tuple(y.shape)} != ({m}, {k})")
    if mask is None:
        mask = torch.ones((m, k), dtype=torch.bool, device=X.device)
    if mask.shape != (m, k) or mask.dtype != torch.bool:
        raise ValueError(f"mask: expected a bool tensor of shape ({m}, {k}), got "
                         f"{mask.dtype} {tuple(mask.shape)}")
    mask = mask.to(X.device)
    loss.check_labels(y[mask])
    cnt = mask.sum(-1, keepdim=True).clamp(min=1).to(X.dtype)
    w = mask.to(X.dtype) / cnt
    b = None if linear_term is None else _check_linear(linear_term, m, loss.param_dim(d), X)
    # Labels of masked-out rows are never used but must not break the link (e.g. gather).
    y = torch.where(mask, y, torch.ones_like(y) if loss.task != "multiclass" else
                    torch.zeros_like(y))
    return solve_erm_batched_weighted(
        loss, X, y, w, lam, tol, b, max_iter=max_iter, method=method,
        raise_on_failure=raise_on_failure,
    )


def solve_erm_batched_weighted(
    loss: Loss,
    X: Tensor,
    y: Tensor,
    w: Tensor,
    lam: float,
    tol: float,
    b: Tensor | None,
    *,
    theta0: Tensor | None = None,
    max_iter: int = 100,
    method: str = "auto",
    raise_on_failure: bool = True,
) -> SolveResult:
    """Core of both public solvers: per-party row weights ``w`` (m, k), each row summing to 1
    (or 0 for an empty party)."""
    theta, gnorm, iters, converged, used = _reduce_and_solve(
        loss, X, y, w, lam, b, theta0, tol, max_iter, method
    )
    res = SolveResult(theta, gnorm, gnorm / lam, iters, converged, used)
    if raise_on_failure and not res.all_converged:
        bad = (~converged).nonzero().squeeze(-1)
        raise ConvergenceError(
            f"tol: {bad.numel()} of {X.shape[0]} parties (first: {bad[:5].tolist()}) certified "
            f"only ||theta - theta*|| <= {res.max_certified_error:.3e} > tol={tol:g} "
            f"(max_iter={max_iter}); {_FLOOR_HINT}",
            res,
        )
    return res
