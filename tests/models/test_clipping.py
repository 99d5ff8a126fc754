"""clip_rows: row * min(1, C/||row||), exact where it should be."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpc_erm.models import clip_rows

F64 = torch.float64


def test_clip_rows_basic() -> None:
    G = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [-6.0, 8.0]], dtype=F64)
    out = clip_rows(G, 1.0)
    torch.testing.assert_close(out, torch.tensor([[0.6, 0.8], [0.3, 0.4], [0, 0], [-0.6, 0.8]],
                                                 dtype=F64))
    assert torch.equal(out[1], G[1])  # inside the ball: bit for bit
    assert torch.equal(out[2], G[2]) and not torch.isnan(out).any()  # zero row, no 0/0


def test_clip_rows_zero_C_and_trailing_dims() -> None:
    G = torch.randn(5, 3, 4, dtype=F64)
    G[0] = 0
    assert torch.equal(clip_rows(G, 0.0), torch.zeros_like(G))
    out = clip_rows(G, 0.5)
    norms = torch.linalg.vector_norm(out.reshape(5, -1), dim=1)
    assert (norms <= 0.5 * (1 + 1e-15)).all()


def test_clip_rows_rejects_bad_C() -> None:
    for C in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="C"):
            clip_rows(torch.ones(2, 2, dtype=F64), C)
    with pytest.raises(ValueError, match="grads"):
        clip_rows(torch.ones(3, dtype=F64), 1.0)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 20), p=st.integers(1, 30), C=st.floats(1e-6, 1e3),
    scale=st.floats(1e-8, 1e8), seed=st.integers(0, 2**31 - 1),
)
def test_clip_rows_properties(n: int, p: int, C: float, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(n, p, generator=g, dtype=F64) * scale
    out = clip_rows(G, C)
    norms, onorms = G.norm(dim=1), out.norm(dim=1)
    assert (onorms <= C * (1 + 4e-16 * p)).all()
    inside = norms <= C
    assert torch.equal(out[inside], G[inside])
    # Clipped rows keep their direction and land on the sphere of radius C.
    outside = ~inside
    torch.testing.assert_close(onorms[outside], torch.full_like(onorms[outside], C))
    cos = (out[outside] * G[outside]).sum(1) / (onorms[outside] * norms[outside])
    torch.testing.assert_close(cos, torch.ones_like(cos))


@pytest.mark.parametrize("name", ["logistic", "huber_svm", "ridge", "softmax"])
def test_clipped_weighted_grad_equals_clipping_the_materialised_rows(name: str) -> None:
    from mpc_erm.models import get_loss

    loss = get_loss(name, **({"n_classes": 4} if name == "softmax" else {}))
    gen = torch.Generator().manual_seed(11)
    n, d = 300, 9
    X = torch.randn(n, d, dtype=torch.float64, generator=gen) * 2.0  # many rows outside the ball
    if loss.task == "multiclass":
        y = torch.randint(0, 4, (n,), generator=gen)
    elif loss.task == "binary":
        y = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
    else:
        y = torch.rand(n, dtype=torch.float64, generator=gen) * 2 - 1
    theta = torch.randn(loss.param_dim(d), dtype=torch.float64, generator=gen)
    w = torch.rand(n, dtype=torch.float64, generator=gen)
    X[0] = 0.0  # a zero gradient row must not produce 0/0
    for C in (0.05, 0.7, 1e6):
        want = w @ clip_rows(loss.per_example_grad(theta, X, y), C)
        got = loss.clipped_weighted_grad(theta, X, y, w, C)
        assert torch.equal(got, loss.clipped_weighted_grad(theta, X, y, w, C, X.norm(dim=-1)))
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-13), C
