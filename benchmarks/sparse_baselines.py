"""The baselines of the thesis's Fig. 2.1 (ch. 2) for DP sparse linear and logistic regression, in
the clear on one machine (comparators for :mod:`benchmarks.dp_ight`, not product features):

* **Frank–Wolfe** (Talwar, Thakurta, Zhang 2015): private Frank–Wolfe over the ℓ1 ball of radius
  λ. Each step picks a vertex ±λe_j by report-noisy-max over the 2d values ⟨v, ∇L(θ)⟩ with
  Laplace noise, then θ ← (1 − μ_t)θ + μ_t v, μ_t = 2/(t + 2). Each example's residual is clipped
  to [−R, R] so that one example moves any ⟨v, ∇L⟩ by at most Δ = 2λR·max|x_ij|/n (replace-one);
  the noise is Laplace(2Δ/ε₀), which makes each step ε₀-DP (report-noisy-max, non-monotone
  queries), and T steps compose by the advanced composition theorem (Dwork, Rothblum, Vadhan
  2010) to (ε, δ).
* **Two-stage** (the structure of Kifer, Smith, Thakurta 2012: private support selection, then a
  private estimate on the support). KST12's own stages (stability-based selection over
  subsampled LASSO fits, objective perturbation) are replaced by the mechanisms now standard for
  each stage: the support by *peeling* (Dwork, Su, Zhang 2021: s rounds of report-noisy-max of
  |X_jᵀ clip(y)|/n with Laplace noise, (ε/2, δ/2)-DP), then least squares on the support by
  *sufficient statistics perturbation* (Gaussian noise on X_SᵀX_S and X_Sᵀ clip(y), calibrated
  by dp-accounting's PLD to (ε/2, δ/2); Wang 2018). Say so wherever the numbers are quoted.

Both take a row-wise bound on |x_ij| (public: the synthetic design's) and, as for DP-IGHT, their
hyperparameters are chosen on a separate draw (:func:`benchmarks.dp_ight.choose` does the same).

For **logistic** regression (labels ±1; the thesis applies both baselines "without theory"):
Frank–Wolfe takes the logistic loss's per-example residual −y·σ(−y⟨x, θ⟩) in place of ⟨x, θ⟩ − y
(the same clip and sensitivity: |residual| ≤ 1 already); the two-stage estimator keeps peeling on
|X_jᵀ y|/n for the support and fits the support by noisy full-batch gradient descent (each
example's gradient clipped to C, Gaussian noise, the steps composed by dp-accounting's PLD to
(ε/2, δ/2)), the stage-2 analogue of SSP for a loss without sufficient statistics.
"""

from __future__ import annotations

import functools
import math

import dp_accounting
import numpy as np

__all__ = ["advanced_composition_epsilon", "frank_wolfe", "logistic_residual", "peel_support", "per_step_epsilon",
           "ssp_noise_multiplier", "two_stage", "two_stage_logistic"]


def advanced_composition_epsilon(eps0: float, steps: int, delta: float) -> float:
    """ε of ``steps`` ε₀-DP mechanisms at δ (Dwork–Rothblum–Vadhan), capped by plain composition."""
    advanced = math.sqrt(2 * steps * math.log(1 / delta)) * eps0 + steps * eps0 * math.expm1(eps0)
    return min(steps * eps0, advanced)


def per_step_epsilon(epsilon: float, steps: int, delta: float) -> float:
    """The largest ε₀ whose ``steps``-fold composition is within ``epsilon`` at ``delta``."""
    lo, hi = 0.0, epsilon
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if advanced_composition_epsilon(mid, steps, delta) <= epsilon else (lo, mid)
    return lo


def logistic_residual(X: np.ndarray, y: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """d/dm of log(1 + e^(−y·m)) at m = ⟨x_i, θ⟩, per example (labels ±1): in [−1, 1]."""
    return -y / (1.0 + np.exp(np.clip(y * (X @ theta), -700.0, 700.0)))


def frank_wolfe(X: np.ndarray, y: np.ndarray, *, epsilon: float, delta: float, radius: float, steps: int,
                residual_clip: float, x_max: float, rng: np.random.Generator, loss: str = "ridge") -> np.ndarray:
    """Private Frank–Wolfe over {‖θ‖₁ ≤ radius} for least squares, or ``loss`` "logistic"
    (module docstring)."""
    n, d = X.shape
    eps0 = per_step_epsilon(epsilon, steps, delta)
    sensitivity = 2.0 * radius * residual_clip * x_max / n
    scale = 2.0 * sensitivity / eps0
    theta = np.zeros(d)
    for t in range(steps):
        raw = logistic_residual(X, y, theta) if loss == "logistic" else X @ theta - y
        r = np.clip(raw, -residual_clip, residual_clip)
        grad = X.T @ r / n
        scores = np.concatenate([radius * grad, -radius * grad])  # ⟨v, ∇L⟩ for v = +λe_j, then −λe_j
        pick = int(np.argmin(scores + rng.laplace(0.0, scale, 2 * d)))
        vertex = np.zeros(d)
        vertex[pick % d] = radius if pick < d else -radius
        mu = 2.0 / (t + 2.0)
        theta = (1.0 - mu) * theta + mu * vertex
    return theta


@functools.lru_cache(maxsize=64)
def ssp_noise_multiplier(epsilon: float, delta: float, releases: int = 2) -> float:
    """z such that ``releases`` Gaussian mechanisms of noise z·Δ each are (ε, δ)-DP together (PLD)."""
    def eps_of(z: float) -> float:
        acc = dp_accounting.pld.PLDAccountant()
        acc.compose(dp_accounting.GaussianDpEvent(z), releases)
        return float(acc.get_epsilon(delta))

    lo, hi = 0.05, 200.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps_of(mid) <= epsilon else (mid, hi)
    return hi


def peel_support(X: np.ndarray, y: np.ndarray, label_bound: float, *, sparsity: int, epsilon: float, delta: float,
                 x_max: float, rng: np.random.Generator) -> np.ndarray:
    """The two-stage estimators' stage 1, (ε, δ)-DP: s rounds of report-noisy-max of |X_jᵀ y|/n
    (peeling, Dwork–Su–Zhang) over the coordinates not yet chosen; one example moves each score by
    at most 2·``label_bound``·x_max/n (|y_i| ≤ ``label_bound``). The chosen support, sorted."""
    n, d = X.shape
    sens = 2.0 * label_bound * x_max / n
    lam = 2.0 * sens * math.sqrt(3 * sparsity * math.log(1 / delta)) / epsilon
    scores = np.abs(X.T @ y) / n
    support: list[int] = []
    free = np.ones(d, dtype=bool)
    for _ in range(sparsity):
        j = int(np.argmax(np.where(free, scores + rng.laplace(0.0, lam, d), -np.inf)))
        support.append(j)
        free[j] = False
    return np.array(sorted(support))


def two_stage(X: np.ndarray, y: np.ndarray, *, epsilon: float, delta: float, sparsity: int, label_clip: float,
              ridge: float, x_max: float, rng: np.random.Generator) -> np.ndarray:
    """Peeling for the support, then sufficient statistics perturbation on it (module docstring)."""
    n, d = X.shape
    yc = np.clip(y, -label_clip, label_clip)
    S = peel_support(X, yc, label_clip, sparsity=sparsity, epsilon=epsilon / 2, delta=delta / 2, x_max=x_max, rng=rng)
    XS = X[:, S]
    # stage 2: XᵀX and Xᵀy on the support, each released once with Gaussian noise (replace-one:
    # ‖x_S x_Sᵀ‖_F ≤ ‖x_S‖² ≤ s·x_max², ‖x_S y‖ ≤ √s·x_max·Y, each moved by at most twice that)
    z = ssp_noise_multiplier(epsilon / 2, delta / 2)
    s = len(S)
    d_a, d_b = 2.0 * s * x_max**2, 2.0 * math.sqrt(s) * x_max * label_clip
    noise = rng.normal(0.0, z * d_a, (s, s))
    A = XS.T @ XS + np.triu(noise) + np.triu(noise, 1).T  # a symmetric draw: one release
    b = XS.T @ yc + rng.normal(0.0, z * d_b, s)
    ridge_n = ridge * n
    theta_s = np.linalg.solve(A + ridge_n * np.eye(s) + _psd_shift(A, ridge_n), b)
    theta = np.zeros(d)
    theta[S] = theta_s
    return theta


def _psd_shift(A: np.ndarray, ridge: float) -> np.ndarray:
    """Post-processing: shift the noisy XᵀX up to positive definiteness if the noise broke it."""
    low = float(np.linalg.eigvalsh(A).min())
    return (max(0.0, -low) + 1e-12) * np.eye(len(A)) if low + ridge <= 0 else np.zeros_like(A)


def two_stage_logistic(X: np.ndarray, y: np.ndarray, *, epsilon: float, delta: float, sparsity: int, clip: float,
                       steps: int, lr: float, x_max: float, rng: np.random.Generator) -> np.ndarray:
    """Peeling for the support (labels ±1, so |y| ≤ 1), then noisy full-batch gradient descent of
    the logistic loss on it (module docstring)."""
    n, d = X.shape
    S = peel_support(X, y, 1.0, sparsity=sparsity, epsilon=epsilon / 2, delta=delta / 2, x_max=x_max, rng=rng)
    XS = X[:, S]
    z = ssp_noise_multiplier(epsilon / 2, delta / 2, steps)  # replace-one: one clipped gradient moves the sum by 2C
    theta_s = np.zeros(len(S))
    for _ in range(steps):
        g = XS * logistic_residual(XS, y, theta_s)[:, None]
        norms = np.linalg.norm(g, axis=1, keepdims=True)
        g = g * np.minimum(1.0, clip / np.maximum(norms, 1e-300))
        theta_s = theta_s - lr * (g.sum(0) + rng.normal(0.0, z * 2.0 * clip, len(S))) / n
    theta = np.zeros(d)
    theta[S] = theta_s
    return theta
