"""Metrics of a public model on a set of rows: on a public test set they are public; on a
member's own training or validation rows they are a function of its private data that no ε
covers, and stay with the member (a curve point's ``own``)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from mpc_erm.data.dataset import Dataset
from mpc_erm.models import Loss, objective_value

__all__ = ["linear_metrics", "network_metrics"]


def linear_metrics(loss: Loss, theta: Tensor, ds: Dataset, lam: float) -> dict[str, float]:
    """Objective and accuracy (classification) or MSE (regression) of θ on the rows of ``ds``."""
    X = torch.as_tensor(np.array(ds.X), dtype=torch.float64)
    y = torch.as_tensor(np.array(ds.y))
    th = theta.detach().to("cpu", torch.float64)
    key = "mse" if loss.task == "regression" else "accuracy"
    return {"objective": float(objective_value(loss, th, X, y, lam)), key: loss.score(th, X, y)}


def network_metrics(model: nn.Module, X: Tensor, y: Tensor) -> dict[str, float]:
    """Cross-entropy and accuracy of a classifier network on (X, y), in batches."""
    with torch.no_grad():
        model.eval()
        logits = torch.cat([model(X[i : i + 4096]) for i in range(0, X.shape[0], 4096)])
        model.train()
    return {"loss": float(torch.nn.functional.cross_entropy(logits, y)),
            "accuracy": float((logits.argmax(dim=-1) == y).double().mean())}
