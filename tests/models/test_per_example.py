"""per_example_grads (torch.func) against a per-example autograd loop, and flatten_grads order."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from mpc_erm.models import SoftmaxLoss, flatten_grads, per_example_grads

F64 = torch.float64


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5), nn.ReLU(),
                         nn.Linear(5, 3)).double()


def _loop(model: nn.Module, loss_fn, X, y) -> list[dict[str, torch.Tensor]]:
    out = []
    for i in range(X.shape[0]):
        model.zero_grad()
        loss_fn(model(X[i : i + 1]), y[i : i + 1]).backward()
        out.append({k: p.grad.detach().clone() for k, p in model.named_parameters()
                    if p.requires_grad})
    return out


def test_mlp_per_example_grads_match_loop() -> None:
    model = _mlp()
    g = torch.Generator().manual_seed(1)
    X = torch.randn(17, 6, generator=g, dtype=F64)
    y = torch.randint(0, 3, (17,), generator=g)
    grads = per_example_grads(model, F.cross_entropy, X, y)
    assert list(grads) == [k for k, _ in model.named_parameters()]
    ref = _loop(model, F.cross_entropy, X, y)
    for k, v in grads.items():
        assert v.shape == (17, *dict(model.named_parameters())[k].shape)
        torch.testing.assert_close(v, torch.stack([r[k] for r in ref]), rtol=1e-10, atol=1e-12)
    flat = flatten_grads(grads, model)
    for i in (0, 16):
        model.zero_grad()
        F.cross_entropy(model(X[i : i + 1]), y[i : i + 1]).backward()
        vec = torch.nn.utils.parameters_to_vector([p.grad for p in model.parameters()])
        torch.testing.assert_close(flat[i], vec)
    torch.testing.assert_close(flatten_grads(grads), flat)
    # Chunked vmap gives the same numbers.
    grads2 = per_example_grads(model, F.cross_entropy, X, y, chunk_size=5)
    torch.testing.assert_close(flatten_grads(grads2), flat)


def test_frozen_parameters_are_skipped() -> None:
    model = _mlp()
    model[0].weight.requires_grad_(False)
    X = torch.randn(4, 6, dtype=F64)
    y = torch.randint(0, 3, (4,))
    grads = per_example_grads(model, F.cross_entropy, X, y)
    assert "0.weight" not in grads and "0.bias" in grads
    ref = _loop(model, F.cross_entropy, X, y)
    torch.testing.assert_close(grads["0.bias"], torch.stack([r["0.bias"] for r in ref]))
    assert flatten_grads(grads, model).shape == (4, sum(v[0].numel() for v in grads.values()))


def test_linear_model_agrees_with_closed_form_softmax() -> None:
    d, K = 7, 4
    lin = nn.Linear(d, K, bias=False).double()
    X = torch.randn(20, d, dtype=F64)
    X = X / X.norm(dim=1, keepdim=True)
    y = torch.randint(0, K, (20,))
    flat = flatten_grads(per_example_grads(lin, F.cross_entropy, X, y), lin)
    closed = SoftmaxLoss(K).per_example_grad(lin.weight.detach().flatten(), X, y)
    torch.testing.assert_close(flat, closed, rtol=1e-10, atol=1e-13)


def test_regression_mse_model() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Sigmoid(), nn.Linear(4, 1)).double()
    X = torch.randn(9, 3, dtype=F64)
    y = torch.randn(9, 1, dtype=F64)
    grads = per_example_grads(model, F.mse_loss, X, y)
    ref = _loop(model, F.mse_loss, X, y)
    for k, v in grads.items():
        torch.testing.assert_close(v, torch.stack([r[k] for r in ref]))
