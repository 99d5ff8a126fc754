"""Laplacian smoothing A_sigma^{-1}: dense solve, sigma = 0 identity, edge sizes, paper tables."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpc_erm.smoothing import laplacian_smooth, ls_constants, ls_divisors, smooth_parameters

F64 = torch.float64


def dense_A(p: int, sigma: float) -> torch.Tensor:
    """A_sigma = I + sigma L built by accumulating the periodic stencil [-1, 2, -1]."""
    A = torch.eye(p, dtype=F64)
    for i in range(p):
        A[i, i] += 2 * sigma
        A[i, (i - 1) % p] -= sigma
        A[i, (i + 1) % p] -= sigma
    return A


def test_dense_stencil_matches_paper_matrix() -> None:
    A = dense_A(5, 0.7)
    first_row = torch.tensor([1 + 1.4, -0.7, 0, 0, -0.7], dtype=F64)
    torch.testing.assert_close(A[0], first_row)  # Paper B: (1 + 2s, -s, 0, ..., 0, -s)
    # p = 2: both neighbours are the other element; p = 1: L = 0.
    torch.testing.assert_close(dense_A(2, 0.5), torch.tensor([[2.0, -1.0], [-1.0, 2.0]], dtype=F64))
    torch.testing.assert_close(dense_A(1, 3.0), torch.ones(1, 1, dtype=F64))


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8, 17, 1000])
@pytest.mark.parametrize("sigma", [0.3, 1.0, 3.7])
def test_matches_dense_solve(p: int, sigma: float) -> None:
    g = torch.Generator().manual_seed(p)
    v = torch.randn(3, p, generator=g, dtype=F64)
    ref = torch.linalg.solve(dense_A(p, sigma), v.T).T
    out = laplacian_smooth(v, sigma)
    assert out.dtype == F64 and out.shape == v.shape and not out.is_complex()
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-13)


def test_p2_operator_explicitly() -> None:
    s = 0.8
    v = torch.tensor([1.0, 3.0], dtype=F64)
    # Mean (2) is kept, the difference (-1, 1) is divided by 1 + 4 s.
    expect = torch.tensor([2 - 1 / (1 + 4 * s), 2 + 1 / (1 + 4 * s)], dtype=F64)
    torch.testing.assert_close(laplacian_smooth(v, s), expect)
    torch.testing.assert_close(ls_divisors(2, s), torch.tensor([1.0, 1 + 4 * s], dtype=F64))


def test_p1_and_degenerate_shapes_are_identity() -> None:
    v = torch.randn(4, 1, dtype=F64)
    assert laplacian_smooth(v, 2.0) is v
    s = torch.tensor(1.5, dtype=F64)
    assert laplacian_smooth(s, 2.0) is s
    e = torch.zeros(3, 0, dtype=F64)
    assert laplacian_smooth(e, 1.0) is e


def test_sigma_zero_is_bit_identical() -> None:
    v = torch.randn(5, 33, dtype=F64) * 1e3
    bits = v.clone().view(torch.int64)
    out = laplacian_smooth(v, 0.0)
    assert out is v and torch.equal(out.view(torch.int64), bits)
    assert laplacian_smooth(v, 0) is v
    params = {"w": torch.randn(3, 4, dtype=F64), "b": torch.randn(3, dtype=F64)}
    sp = smooth_parameters(params, 0.0)
    assert all(sp[k] is params[k] for k in params)
    lst = list(params.values())
    assert all(a is b for a, b in zip(smooth_parameters(lst, 0.0), lst))


def test_batched_shapes_equal_rowwise() -> None:
    g = torch.Generator().manual_seed(0)
    v = torch.randn(2, 3, 4, 50, generator=g, dtype=F64)
    out = laplacian_smooth(v, 1.3)
    rows = torch.stack([laplacian_smooth(r, 1.3) for r in v.reshape(-1, 50)]).reshape(v.shape)
    torch.testing.assert_close(out, rows, rtol=1e-13, atol=1e-14)
    # Non-contiguous input (a transpose) works and equals the contiguous result.
    w = torch.randn(50, 6, generator=g, dtype=F64).T
    torch.testing.assert_close(laplacian_smooth(w, 2.0), laplacian_smooth(w.contiguous(), 2.0))


def test_float32_in_float32_out() -> None:
    v = torch.randn(3, 64)
    out = laplacian_smooth(v, 1.0)
    assert out.dtype == torch.float32
    ref = torch.linalg.solve(dense_A(64, 1.0), v.double().T).T
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)


def test_rejects_bad_input() -> None:
    for s in (-1.0, float("nan"), float("inf"), "1"):
        with pytest.raises(ValueError, match="sigma"):
            laplacian_smooth(torch.zeros(3, dtype=F64), s)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="v"):
        laplacian_smooth(torch.zeros(3, dtype=torch.int64), 1.0)


def test_smooth_parameters_flattens_row_major() -> None:
    g = torch.Generator().manual_seed(1)
    conv = torch.randn(4, 3, 5, 5, generator=g, dtype=F64)
    bias = torch.randn(4, generator=g, dtype=F64)
    scalar = torch.randn(1, generator=g, dtype=F64)
    out = smooth_parameters({"conv": conv, "bias": bias, "s": scalar}, 2.0)
    assert list(out) == ["conv", "bias", "s"]
    torch.testing.assert_close(out["conv"],
                               laplacian_smooth(conv.flatten(), 2.0).reshape(conv.shape))
    torch.testing.assert_close(out["bias"], laplacian_smooth(bias, 2.0))
    torch.testing.assert_close(out["s"], scalar)
    as_list = smooth_parameters([conv, bias], 2.0)
    assert isinstance(as_list, list)
    torch.testing.assert_close(as_list[0], out["conv"])
    # Works on nn.Module parameters (a generator is materialised into a list).
    lin = torch.nn.Linear(6, 3).double()
    sm = smooth_parameters([p.detach() for p in lin.parameters()], 1.0)
    torch.testing.assert_close(sm[0], laplacian_smooth(lin.weight.detach().flatten(), 1.0)
                               .reshape(3, 6))
    with pytest.raises(TypeError, match="tensors"):
        smooth_parameters(conv, 1.0)


@settings(max_examples=50, deadline=None)
@given(p=st.integers(2, 300), sigma=st.floats(1e-3, 50.0), seed=st.integers(0, 2**31 - 1))
def test_properties(p: int, sigma: float, seed: int) -> None:
    """A_sigma u = v; mean preserved; ||A^{-1} v|| <= ||v||; contraction >= 1/(1 + 4 sigma)."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(p, generator=g, dtype=F64)
    u = laplacian_smooth(v, sigma)
    # For p = 2 both rolls give the other element: the accumulated stencil, as documented.
    Au = u + sigma * (2 * u - torch.roll(u, 1) - torch.roll(u, -1))
    torch.testing.assert_close(Au, v, rtol=1e-10, atol=1e-10)
    assert u.mean().item() == pytest.approx(v.mean().item(), abs=1e-12)
    assert u.norm() <= v.norm() * (1 + 1e-12)
    assert u.norm() >= v.norm() / (1 + 4 * sigma) * (1 - 1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda() -> None:
    v = torch.randn(4, 100, dtype=F64, device="cuda")
    out = laplacian_smooth(v, 1.0)
    assert out.device == v.device and out.dtype == F64
    torch.testing.assert_close(out.cpu(), laplacian_smooth(v.cpu(), 1.0))


# ----------------------------------------------------------------------------- constants
# DP-LSSGD Table 3 (gamma) and Table 4 (beta); identical rows for d = 1e3, 1e4, 1e5.
TABLE3 = {1: 0.447, 2: 0.333, 3: 0.277, 4: 0.243, 5: 0.218}
TABLE4 = {1: 0.268, 2: 0.185, 3: 0.149, 4: 0.128, 5: 0.114}


@pytest.mark.parametrize("d", [1000, 10_000, 100_000])
@pytest.mark.parametrize("sigma", [1, 2, 3, 4, 5])
def test_paper_tables_3_and_4(d: int, sigma: int) -> None:
    gamma, beta = ls_constants(d, sigma)
    assert abs(gamma - TABLE3[sigma]) <= 0.0005  # printed to 3 decimals
    assert abs(beta - TABLE4[sigma]) <= 0.0005


@pytest.mark.parametrize("d", [3, 10, 100, 1000])
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.5, 5.0])
def test_closed_forms_props_5_and_8(d: int, sigma: float) -> None:
    gamma, beta = ls_constants(d, sigma)
    omega = (2 * sigma + 1 - math.sqrt(4 * sigma + 1)) / (2 * sigma)
    od = omega**d
    assert gamma == pytest.approx((1 + od) / ((1 - od) * math.sqrt(4 * sigma + 1)), rel=1e-10)
    xi = -math.sqrt(1 + 4 * sigma) / sigma
    beta_cf = (2 * omega ** (2 * d + 1) - xi * omega ** (2 * d) + 2 * xi * d * omega**d
               - 2 * omega + xi) / (sigma**2 * xi**3 * (1 - od) ** 2)
    assert beta == pytest.approx(beta_cf, rel=1e-8)
    # Direct sums and the operator itself: gamma = tr(A^-1)/d, beta = tr(A^-2)/d.
    if d <= 100:
        Ainv = torch.linalg.inv(dense_A(d, sigma))
        assert gamma == pytest.approx(float(torch.trace(Ainv)) / d, rel=1e-12)
        assert beta == pytest.approx(float(torch.trace(Ainv @ Ainv)) / d, rel=1e-12)


def test_constants_limits_and_edges() -> None:
    assert ls_constants(7, 0.0) == (1.0, 1.0)
    assert ls_constants(1, 3.0) == (1.0, 1.0)
    g2, b2 = ls_constants(2, 0.5)
    assert g2 == pytest.approx((1 + 1 / 3) / 2) and b2 == pytest.approx((1 + 1 / 9) / 2)
    s = 2.0
    g, b = ls_constants(10**6, s)
    assert g == pytest.approx(1 / math.sqrt(1 + 4 * s), rel=1e-9)
    assert b == pytest.approx((1 + 2 * s) / (1 + 4 * s) ** 1.5, rel=1e-9)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="d"):
            ls_constants(bad, 1.0)  # type: ignore[arg-type]
    assert ls_constants(np.int64(10), 1.0) == ls_constants(10, 1.0)
