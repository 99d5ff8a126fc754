"""Models layer: losses with their Lipschitz/smoothness constants, the regularised objective,
per-example gradients (closed form and torch.func), clipping, and certified exact solvers.

Conventions (docs/explanation/contracts.md): torch.float64, rows ||x|| <= 1, labels {-1,+1} / 0..K-1 /
[-1, 1], theta flat with softmax laid out as nn.Linear(d, K, bias=False).weight.flatten().
"""

from mpc_erm.lazy_exports import lazy_exports

# Names load their module on first use (PEP 562): importing this package, or its torch-free
# modules (``facts``, ``job_model``'s planning facts), does not import torch, which a job's
# planning (``job submit``'s check, the daemon's admission) must not wait for.
_WHERE = {
    "clip_rows": "clipping",
    **dict.fromkeys(("LOSSES", "HuberSVMLoss", "LogisticLoss", "Loss", "SoftmaxLoss", "SquaredLoss", "get_loss",
                     "ridge_lipschitz_for"), "losses"),
    **dict.fromkeys(("NETWORKS", "NetworkSpec", "build_network", "model_digest", "parameter_count"), "networks"),
    **dict.fromkeys(("objective_grad", "objective_value"), "objective"),
    **dict.fromkeys(("flatten_grads", "per_example_grads"), "per_example"),
    **dict.fromkeys(("ConvergenceError", "SolveResult", "solve_erm", "solve_erm_batched"), "solvers"),
}

__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
