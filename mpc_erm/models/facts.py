"""The public facts of each linear loss, without torch: its Lipschitz and smoothness constants and
its parameter count. The loss classes (:mod:`.losses`, where each constant's derivation is
written) read them from here, and so do the privacy plan and ``job submit``'s check, which must
not pay torch's import (seconds) to plan a job.
"""

from __future__ import annotations

import math
import numbers

__all__ = ["LOSS_NAMES", "lipschitz", "outputs", "param_dim", "ridge_lipschitz_for", "smoothness"]

#: Every linear loss a job can name.
LOSS_NAMES = ("logistic", "huber_svm", "ridge", "softmax")
_GLOBAL_LIPSCHITZ = {"logistic": 1.0, "huber_svm": 1.0, "softmax": math.sqrt(2.0)}


def _known(name: str) -> None:
    if name not in LOSS_NAMES:
        raise ValueError(f"model.name: unknown loss {name!r}; expected one of {', '.join(LOSS_NAMES)}")


def ridge_lipschitz_for(lam: float) -> float:
    """Honest G for ridge output perturbation: 1 + 1/√λ (the λ-regularised minimiser lies in
    ‖θ‖ ≤ 1/√λ; :class:`~.losses.SquaredLoss`)."""
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"lam: regularisation must be a finite number > 0, got {lam!r}")
    return 1.0 + 1.0 / math.sqrt(lam)


def lipschitz(name: str, radius: float | None = None) -> float:
    """G with ‖∇θ l‖ ≤ G for ‖x‖ ≤ 1 (and ‖θ‖ ≤ ``radius`` for the squared loss, which is not
    globally Lipschitz: G = R + 1)."""
    _known(name)
    if name != "ridge":
        return _GLOBAL_LIPSCHITZ[name]
    if radius is None:
        raise ValueError(
            "radius: the squared loss is not globally Lipschitz; pass radius=R (bound on "
            "||theta||) to get G = R + 1, or use ridge_lipschitz_for(lam) = 1 + 1/sqrt(lam) "
            "for the regularised minimiser"
        )
    if not (math.isfinite(radius) and radius >= 0):
        raise ValueError(f"radius: must be a finite number >= 0, got {radius!r}")
    return float(radius) + 1.0


def smoothness(name: str, h: float = 0.5) -> float:
    """L with ‖∇²θ l‖ ≤ L for ‖x‖ ≤ 1 (``h``: the Huber width)."""
    _known(name)
    if name == "huber_svm":
        if not (isinstance(h, numbers.Real) and math.isfinite(h) and h > 0):
            raise ValueError(f"h: Huber width must be a finite number > 0, got {h!r}")
        return 1.0 / (2.0 * float(h))
    return {"logistic": 0.25, "ridge": 1.0, "softmax": 0.5}[name]


def outputs(name: str, n_classes: int | None = None) -> int:
    """K_out, the rows of W: the class count for softmax, else 1."""
    _known(name)
    if name != "softmax":
        return 1
    if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 2:
        raise ValueError(f"n_classes: must be an int >= 2, got {n_classes!r}")
    return n_classes


def param_dim(name: str, d: int, n_classes: int | None = None) -> int:
    """The length of θ for ``d`` features."""
    return outputs(name, n_classes) * int(d)
