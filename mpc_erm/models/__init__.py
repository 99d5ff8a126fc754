"""Models layer: losses with their Lipschitz/smoothness constants, the regularised objective,
per-example gradients (closed form and torch.func), clipping, and certified exact solvers.

Conventions (docs/explanation/contracts.md): torch.float64, rows ||x|| <= 1, labels {-1,+1} / 0..K-1 /
[-1, 1], theta flat with softmax laid out as nn.Linear(d, K, bias=False).weight.flatten().
"""

from .clipping import clip_rows
from .losses import (
    LOSSES,
    HuberSVMLoss,
    LogisticLoss,
    Loss,
    SoftmaxLoss,
    SquaredLoss,
    get_loss,
    ridge_lipschitz_for,
)
from .networks import NETWORKS, NetworkSpec, build_network, model_digest, parameter_count
from .objective import objective_grad, objective_value
from .per_example import flatten_grads, per_example_grads
from .solvers import ConvergenceError, SolveResult, solve_erm, solve_erm_batched

__all__ = [
    "LOSSES",
    "NETWORKS",
    "ConvergenceError",
    "HuberSVMLoss",
    "LogisticLoss",
    "Loss",
    "NetworkSpec",
    "SoftmaxLoss",
    "SolveResult",
    "SquaredLoss",
    "build_network",
    "clip_rows",
    "flatten_grads",
    "get_loss",
    "model_digest",
    "objective_grad",
    "objective_value",
    "parameter_count",
    "per_example_grads",
    "ridge_lipschitz_for",
    "solve_erm",
    "solve_erm_batched",
]
