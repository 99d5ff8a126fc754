"""Convex losses of linear predictors with the constants the privacy layer needs.

Every loss here is a loss of a *linear* model: the parameter vector ``theta`` (length p) is
reshaped to ``W = theta.reshape(K_out, d)`` (``K_out = 1`` for binary/regression, ``K`` for
softmax, i.e. ``nn.Linear(d, K, bias=False).weight`` flattened row-major, docs/explanation/contracts.md) and
the loss depends on ``theta`` only through the scores ``z = W x`` (length ``K_out``).  So each
concrete loss only supplies the scalar/vector *link* ``phi(z, y)`` and its first two derivatives
in ``z``; gradients, Hessian-vector products and the batched solver (solvers.py) are written
once in terms of them.  With ||x|| <= 1 (the data contract) the chain rule gives

    ||grad_theta l|| = ||phi'(z, y)|| * ||x|| <= sup ||phi'||             (Lipschitz G)
    ||hess_theta l|| = ||phi''(z, y)|| * ||x||^2 <= sup ||phi''||          (smoothness L),

which is how each class below justifies its ``lipschitz()`` and ``smoothness``.

Everything is torch, works on whatever device/dtype the inputs carry (float64 by convention),
and accepts any number of leading batch dimensions: ``theta`` (..., p) with ``X`` (..., n, d).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import Tensor
from torch.nn import functional as F

from . import facts

__all__ = [
    "LOSSES",
    "HuberSVMLoss",
    "LogisticLoss",
    "Loss",
    "SoftmaxLoss",
    "SquaredLoss",
    "get_loss",
    "ridge_lipschitz_for",
]


class Loss(ABC):
    """A convex loss l(theta; x, y) = phi(W x, y) of a linear predictor (see module docstring).

    Subclasses implement the link ``_phi`` and its derivatives ``_dphi`` / ``_hvp_phi`` /
    ``_diag_phi`` in the scores ``z`` (shape (..., n, K_out)); the public methods below are
    generic.  Public methods take ``theta`` (..., p), ``X`` (..., n, d), ``y`` (..., n).
    """

    name: ClassVar[str]
    task: ClassVar[str]  # "binary" | "regression" | "multiclass" (same words as mpc_erm.data)

    # ------------------------------------------------------------------ constants
    @abstractmethod
    def lipschitz(self, radius: float | None = None) -> float:
        """G with ||grad_theta l(theta; x, y)|| <= G for ||x|| <= 1, valid y (and ||theta|| <= radius
        for losses that are not globally Lipschitz)."""

    @property
    @abstractmethod
    def smoothness(self) -> float:
        """L with ||hess_theta l|| <= L (gradient L-Lipschitz) for ||x|| <= 1."""

    @property
    def n_outputs(self) -> int:
        """K_out: number of rows of W (1 except for softmax)."""
        return 1

    def param_dim(self, d: int) -> int:
        """Length p of theta for d features."""
        return self.n_outputs * int(d)

    # ------------------------------------------------------------------ link (z-space)
    @abstractmethod
    def _phi(self, z: Tensor, y: Tensor) -> Tensor:
        """Loss from scores z (..., n, K_out) -> (..., n)."""

    @abstractmethod
    def _dphi(self, z: Tensor, y: Tensor) -> Tensor:
        """d phi / d z -> (..., n, K_out)."""

    @abstractmethod
    def _hvp_phi(self, z: Tensor, y: Tensor, v: Tensor) -> Tensor:
        """(d^2 phi / d z^2) v for v (..., n, K_out) -> (..., n, K_out)."""

    @abstractmethod
    def _diag_phi(self, z: Tensor, y: Tensor) -> Tensor:
        """Diagonal of d^2 phi / d z^2 -> (..., n, K_out) (Jacobi preconditioner, Newton)."""

    def _hess_phi(self, z: Tensor, y: Tensor) -> Tensor:
        """Full d^2 phi / d z^2 -> (..., n, K_out, K_out).  Default: diagonal (K_out = 1)."""
        return self._diag_phi(z, y).unsqueeze(-1)

    # ------------------------------------------------------------------ helpers
    def weight_matrix(self, theta: Tensor, d: int) -> Tensor:
        """theta (..., p) -> W (..., K_out, d), the row-major layout of docs/explanation/contracts.md."""
        if theta.shape[-1] != self.param_dim(d):
            raise ValueError(
                f"theta: last dimension {theta.shape[-1]} != param_dim({d}) = "
                f"{self.param_dim(d)} for loss {self.name!r}"
            )
        return theta.reshape(*theta.shape[:-1], self.n_outputs, d)

    def scores(self, theta: Tensor, X: Tensor) -> Tensor:
        """z = W x for every row: (..., n, K_out)."""
        W = self.weight_matrix(theta, X.shape[-1])
        return X @ W.transpose(-1, -2)

    def check_labels(self, y: Tensor) -> None:  # noqa: B027 - a valid default: any label
        """Raise ValueError naming ``y`` if labels are outside this task's domain (CONTRACTS)."""

    # ------------------------------------------------------------------ public API
    def per_example_loss(self, theta: Tensor, X: Tensor, y: Tensor) -> Tensor:
        """l(theta; x_i, y_i) for every row -> (..., n)."""
        return self._phi(self.scores(theta, X), y)

    def per_example_grad(self, theta: Tensor, X: Tensor, y: Tensor) -> Tensor:
        """grad_theta l(theta; x_i, y_i) for every row -> (..., n, p), closed form.

        One matmul for the scores and one broadcast product phi'(z_i) x_i^T: this is what the
        gradient-perturbation simulator calls every round on all rows (then clips).
        """
        gz = self._dphi(self.scores(theta, X), y)  # (..., n, K)
        g = gz.unsqueeze(-1) * X.unsqueeze(-2)  # (..., n, K, d)
        return g.reshape(*g.shape[:-2], -1)

    def weighted_grad(self, theta: Tensor, X: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """sum_i w_i grad l_i -> (..., p) without forming the (n, p) matrix."""
        gz = self._dphi(self.scores(theta, X), y) * w.unsqueeze(-1)  # (..., n, K)
        g = gz.transpose(-1, -2) @ X  # (..., K, d)
        return g.reshape(*g.shape[:-2], -1)

    def clipped_weighted_grad(self, theta: Tensor, X: Tensor, y: Tensor, w: Tensor, C: float,
                              x_norms: Tensor | None = None) -> Tensor:
        """sum_i w_i clip_C(grad l_i) -> (..., p) without forming the (n, p) matrix.

        grad l_i = phi'(z_i) x_i^T is rank one, so ||grad l_i|| = ||phi'(z_i)|| * ||x_i||: the clip
        factor min(1, C/||grad l_i||) is known per row before any p-sized product. Equals
        ``w @ clip_rows(per_example_grad(...), C)`` (tests/models/test_clipping.py); the
        gradient-perturbation simulator calls it every round on all rows, passing the constant
        row norms ``x_norms`` = ||x_i|| to save one pass over X (the round is memory-bound).
        """
        gz = self._dphi(self.scores(theta, X), y)  # (..., n, K)
        norms = gz.norm(dim=-1) * (X.norm(dim=-1) if x_norms is None else x_norms)
        factor = torch.where(norms > C, C / torch.where(norms > C, norms, torch.ones_like(norms)),
                             torch.ones_like(norms))
        g = (gz * (w * factor).unsqueeze(-1)).transpose(-1, -2) @ X  # (..., K, d)
        return g.reshape(*g.shape[:-2], -1)

    def predict(self, theta: Tensor, X: Tensor) -> Tensor:
        """Predicted labels (binary: +-1 in X.dtype, ties -> +1; multiclass: int64 argmax;
        regression: the real prediction)."""
        z = self.scores(theta, X)[..., 0]
        if self.task == "binary":
            one = torch.ones((), dtype=z.dtype, device=z.device)
            return torch.where(z >= 0, one, -one)
        return z

    def score(self, theta: Tensor, X: Tensor, y: Tensor) -> float:
        """Accuracy for classification, mean squared error for regression."""
        pred = self.predict(theta, X)
        if self.task == "regression":
            return float(((pred - y.to(pred.dtype)) ** 2).mean())
        return float((pred == y.to(pred.dtype)).to(torch.float64).mean())

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _float_labels(y: Tensor, z: Tensor) -> Tensor:
    return y.to(dtype=z.dtype, device=z.device)


def _check_pm1(y: Tensor, name: str) -> None:
    if y.numel() and not bool(((y == 1) | (y == -1)).all()):
        raise ValueError(f"y: labels for loss {name!r} must be in {{-1, +1}}")


class LogisticLoss(Loss):
    """l = log(1 + exp(-y theta^T x)), y in {-1, +1}.

    phi(z) = softplus(-y z); phi' = -y sigmoid(-y z) in (-1, 1) so G = 1 (approached as
    y z -> -inf with ||x|| = 1); phi'' = sigmoid(z) sigmoid(-z) <= 1/4 (at z = 0) so L = 1/4.
    softplus keeps the value finite for |z| large.
    """

    name = "logistic"
    task = "binary"

    def lipschitz(self, radius: float | None = None) -> float:
        return facts.lipschitz(self.name)

    @property
    def smoothness(self) -> float:
        return facts.smoothness(self.name)

    def check_labels(self, y: Tensor) -> None:
        _check_pm1(y, self.name)

    def _phi(self, z: Tensor, y: Tensor) -> Tensor:
        return F.softplus(-_float_labels(y, z) * z[..., 0])

    def _dphi(self, z: Tensor, y: Tensor) -> Tensor:
        yf = _float_labels(y, z)
        return (-yf * torch.sigmoid(-yf * z[..., 0])).unsqueeze(-1)

    def _diag_phi(self, z: Tensor, y: Tensor) -> Tensor:
        s = torch.sigmoid(z)
        return s * (1 - s)

    def _hvp_phi(self, z: Tensor, y: Tensor, v: Tensor) -> Tensor:
        return self._diag_phi(z, y) * v


class HuberSVMLoss(Loss):
    """Huberised hinge loss of Chaudhuri, Monteleoni & Sarwate (JMLR 2011, eq. 7), m = y theta^T x:

        0                      if m > 1 + h
        (1 + h - m)^2 / (4h)   if |1 - m| <= h
        1 - m                  if m < 1 - h

    d/dm in [-1, 0] so G = 1 (attained for m < 1 - h, ||x|| = 1); d^2/dm^2 = 1/(2h) on the
    quadratic piece and 0 elsewhere, so the gradient is 1/(2h)-Lipschitz: L = 1/(2h).  The loss
    is C^1 but not C^2 at m = 1 +- h; the solver uses the one-sided second derivative (a valid
    generalised Hessian), which is enough for semismooth Newton with line search.
    """

    name = "huber_svm"
    task = "binary"

    def __init__(self, h: float = 0.5) -> None:
        facts.smoothness(self.name, h)  # a width that is not a finite number > 0 is refused there
        self.h = float(h)

    def __repr__(self) -> str:
        return f"HuberSVMLoss(h={self.h})"

    def lipschitz(self, radius: float | None = None) -> float:
        return facts.lipschitz(self.name)

    @property
    def smoothness(self) -> float:
        return facts.smoothness(self.name, self.h)

    def check_labels(self, y: Tensor) -> None:
        _check_pm1(y, self.name)

    def _margin(self, z: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        yf = _float_labels(y, z)
        return yf * z[..., 0], yf

    def _phi(self, z: Tensor, y: Tensor) -> Tensor:
        m, _ = self._margin(z, y)
        h = self.h
        quad = (1 + h - m) ** 2 / (4 * h)
        out = torch.where(m < 1 - h, 1 - m, quad)
        return torch.where(m > 1 + h, torch.zeros_like(m), out)

    def _dphi(self, z: Tensor, y: Tensor) -> Tensor:
        m, yf = self._margin(z, y)
        h = self.h
        dm = (-(1 + h - m) / (2 * h)).clamp(-1.0, 0.0)  # -1 below 1-h, 0 above 1+h: exact
        return (yf * dm).unsqueeze(-1)

    def _diag_phi(self, z: Tensor, y: Tensor) -> Tensor:
        m, _ = self._margin(z, y)
        h = self.h
        inside = (m >= 1 - h) & (m <= 1 + h)
        return (inside.to(z.dtype) / (2 * h)).unsqueeze(-1)

    def _hvp_phi(self, z: Tensor, y: Tensor, v: Tensor) -> Tensor:
        return self._diag_phi(z, y) * v


def ridge_lipschitz_for(lam: float) -> float:
    """Honest G for ridge output perturbation: 1 + 1/sqrt(lam).

    The squared loss is not globally Lipschitz, but the lam-regularised minimiser satisfies
    lam/2 ||theta*||^2 <= J(theta*) <= J(0) = mean y^2 / 2 <= 1/2 (|y| <= 1), so
    ||theta*|| <= 1/sqrt(lam), and on that ball ||grad|| = |theta^T x - y| ||x|| <= R + 1.
    The output-perturbation sensitivity argument only evaluates gradients at minimisers of
    neighbouring data sets, both inside the ball, so G(1/sqrt(lam)) is the constant to use.
    """
    return facts.ridge_lipschitz_for(lam)


class SquaredLoss(Loss):
    """Ridge loss l = 1/2 (y - theta^T x)^2, y in [-1, 1].

    Not globally Lipschitz: ||grad|| = |theta^T x - y| ||x|| <= ||theta|| + 1, so
    G(R) = R + 1 on ||theta|| <= R (attained with x = theta/R, y = -1).  For output perturbation
    use ``ridge_lipschitz_for(lam)`` = 1 + 1/sqrt(lam) (minimisers lie in ||theta|| <= 1/sqrt(lam)).
    Hessian x x^T has norm ||x||^2 <= 1: L = 1.
    """

    name = "ridge"
    task = "regression"

    def lipschitz(self, radius: float | None = None) -> float:
        return facts.lipschitz(self.name, radius)

    def lipschitz_for(self, lam: float) -> float:
        """Same as ``ridge_lipschitz_for(lam)``."""
        return ridge_lipschitz_for(lam)

    @property
    def smoothness(self) -> float:
        return facts.smoothness(self.name)

    def check_labels(self, y: Tensor) -> None:
        if y.numel() and not bool((y.abs() <= 1 + 1e-9).all()):
            raise ValueError("y: regression targets for loss 'ridge' must lie in [-1, 1]")

    def _phi(self, z: Tensor, y: Tensor) -> Tensor:
        return 0.5 * (z[..., 0] - _float_labels(y, z)) ** 2

    def _dphi(self, z: Tensor, y: Tensor) -> Tensor:
        return (z[..., 0] - _float_labels(y, z)).unsqueeze(-1)

    def _diag_phi(self, z: Tensor, y: Tensor) -> Tensor:
        return torch.ones_like(z)

    def _hvp_phi(self, z: Tensor, y: Tensor, v: Tensor) -> Tensor:
        return v


class SoftmaxLoss(Loss):
    """Multinomial logistic (cross-entropy) loss, y in {0..K-1}, theta = W (K, d) row-major.

    l = logsumexp(W x) - (W x)_y.  grad_W = (p - e_y) x^T with p = softmax(W x), so
    ||grad||_F = ||p - e_y|| ||x|| and ||p - e_y||^2 = (1 - p_y)^2 + sum_{k != y} p_k^2
    <= 2 (1 - p_y)^2 <= 2: G = sqrt(2) (approached when p puts all mass on one wrong class).
    Hessian = (diag p - p p^T) (x) x x^T; for a unit u, u^T (diag p - p p^T) u = Var_p(u_k)
    <= (max u - min u)^2 / 4 <= 2/4 (Popoviciu; |u_i - u_j| <= sqrt 2 for a unit u), so
    L = 1/2 (attained for K = 2, p = (1/2, 1/2), u = (1, -1)/sqrt 2, ||x|| = 1).
    """

    name = "softmax"
    task = "multiclass"

    def __init__(self, n_classes: int) -> None:
        facts.outputs(self.name, n_classes)  # a count that is not an int >= 2 is refused there
        self.n_classes = n_classes

    def __repr__(self) -> str:
        return f"SoftmaxLoss(n_classes={self.n_classes})"

    @property
    def n_outputs(self) -> int:
        return self.n_classes

    def lipschitz(self, radius: float | None = None) -> float:
        return facts.lipschitz(self.name)

    @property
    def smoothness(self) -> float:
        return facts.smoothness(self.name)

    def check_labels(self, y: Tensor) -> None:
        if y.is_floating_point() or y.is_complex():
            raise ValueError(f"y: softmax labels must be integers, got dtype {y.dtype}")
        if y.numel() and not bool(((y >= 0) & (y < self.n_classes)).all()):
            raise ValueError(f"y: softmax labels must lie in 0..{self.n_classes - 1}")

    def _onehot(self, y: Tensor, z: Tensor) -> Tensor:
        return F.one_hot(y.to(device=z.device, dtype=torch.int64), self.n_classes).to(z.dtype)

    def _phi(self, z: Tensor, y: Tensor) -> Tensor:
        zy = torch.gather(z, -1, y.to(device=z.device, dtype=torch.int64).unsqueeze(-1))
        return torch.logsumexp(z, dim=-1) - zy[..., 0]

    def _dphi(self, z: Tensor, y: Tensor) -> Tensor:
        return torch.softmax(z, dim=-1) - self._onehot(y, z)

    def _diag_phi(self, z: Tensor, y: Tensor) -> Tensor:
        p = torch.softmax(z, dim=-1)
        return p * (1 - p)

    def _hvp_phi(self, z: Tensor, y: Tensor, v: Tensor) -> Tensor:
        p = torch.softmax(z, dim=-1)
        pv = p * v
        return pv - p * pv.sum(dim=-1, keepdim=True)

    def _hess_phi(self, z: Tensor, y: Tensor) -> Tensor:
        p = torch.softmax(z, dim=-1)
        return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)

    def predict(self, theta: Tensor, X: Tensor) -> Tensor:
        return self.scores(theta, X).argmax(dim=-1)

    def score(self, theta: Tensor, X: Tensor, y: Tensor) -> float:
        pred = self.predict(theta, X)
        return float((pred == y.to(pred.device, torch.int64)).to(torch.float64).mean())


#: Registry used by ``get_loss``: name -> class.
LOSSES: dict[str, type[Loss]] = {
    "logistic": LogisticLoss,
    "huber_svm": HuberSVMLoss,
    "ridge": SquaredLoss,
    "softmax": SoftmaxLoss,
}


def get_loss(name: str, **kwargs: object) -> Loss:
    """Build a loss by name (``logistic``, ``huber_svm``, ``ridge``, ``softmax``).

    kwargs go to the constructor (``h`` for huber_svm, ``n_classes`` for softmax).
    """
    try:
        cls = LOSSES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"loss: unknown name {name!r}; valid names are {sorted(LOSSES)}"
        ) from None
    try:
        return cls(**kwargs)  # type: ignore[arg-type]
    except TypeError as e:
        raise ValueError(f"loss {name!r}: bad arguments {kwargs}: {e}") from None
