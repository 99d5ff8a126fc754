"""Partitioners: disjoint, covering, sizes as promised (property tests), and fast at m = n."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpc_erm.data import (
    DataError,
    partition_dirichlet,
    partition_equal,
    partition_sizes,
    party_index,
)


def _assert_disjoint_cover(parts: list[np.ndarray], n: int, used: int) -> None:
    owner = party_index(parts, n)  # raises on overlap / out of range
    assert (owner >= 0).sum() == used
    assert all(p.dtype == np.int64 for p in parts)
    assert sum(len(p) for p in parts) == used


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 500), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_equal_property(n: int, data: st.DataObject, seed: int) -> None:
    m = data.draw(st.integers(1, n))
    parts = partition_equal(n, m, np.random.default_rng(seed))
    assert len(parts) == m
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    _assert_disjoint_cover(parts, n, n)


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=20),
       extra=st.integers(0, 50), seed=st.integers(0, 1000))
def test_sizes_property(sizes: list[int], extra: int, seed: int) -> None:
    n = sum(sizes) + extra
    parts = partition_sizes(n, sizes, seed)
    assert [len(p) for p in parts] == sizes
    _assert_disjoint_cover(parts, n, sum(sizes))


@settings(max_examples=100, deadline=None)
@given(labels=st.lists(st.integers(0, 4), min_size=1, max_size=300), data=st.data(),
       alpha=st.floats(1e-3, 100.0), seed=st.integers(0, 1000))
def test_dirichlet_property(labels: list[int], data: st.DataObject, alpha: float,
                            seed: int) -> None:
    n = len(labels)
    min_size = data.draw(st.integers(0, min(3, n)))
    m = data.draw(st.integers(1, n // max(min_size, 1)))
    parts = partition_dirichlet(np.array(labels), m, alpha, seed, min_size=min_size)
    assert len(parts) == m and min(len(p) for p in parts) >= min_size
    _assert_disjoint_cover(parts, n, n)


def test_dirichlet_skews_labels() -> None:
    y = np.repeat(np.arange(10), 500)
    skewed = partition_dirichlet(y, 20, 0.05, 0)
    iid = partition_dirichlet(y, 20, 1000.0, 0)

    def classes_per_party(parts: list[np.ndarray]) -> float:
        return float(np.mean([np.unique(y[p]).size for p in parts]))

    assert classes_per_party(skewed) < 5 < classes_per_party(iid)


def test_deterministic_given_seed() -> None:
    a = partition_equal(100, 7, 3)
    b = partition_equal(100, 7, np.random.default_rng(3))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_one_row_parties_are_fast() -> None:
    n = 50_000
    y = np.random.default_rng(0).integers(0, 2, n)
    t = time.perf_counter()
    parts = partition_equal(n, n, 0)
    d = partition_dirichlet(y, n, 0.5, 0)
    owner = party_index(d, n)
    elapsed = time.perf_counter() - t
    assert all(len(p) == 1 for p in parts) and all(len(p) == 1 for p in d)
    assert np.array_equal(np.sort(owner), np.arange(n))
    assert elapsed < 5.0, f"{elapsed:.2f}s for m = n = 50,000"


@pytest.mark.parametrize("call,match", [
    (lambda: partition_equal(3, 4), r"m \(number of parties, 4\) must be <= n"),
    (lambda: partition_equal(0, 1), "n must be >= 1"),
    (lambda: partition_equal(5, 2.5), "m must be an integer"),
    (lambda: partition_sizes(5, [3, 3]), r"sum\(sizes\) = 6 exceeds n = 5"),
    (lambda: partition_sizes(5, [2, 0]), r"sizes\[1\] must be >= 1"),
    (lambda: partition_sizes(5, []), "sizes must be a non-empty"),
    (lambda: partition_dirichlet([0, 1], 2, 0.0), "alpha must be a positive"),
    (lambda: partition_dirichlet([0, 1], 3, 1.0), "m \\* min_size = 3 \\* 1 exceeds"),
    (lambda: party_index([np.array([0, 1]), np.array([1])], 3), "row 1 belongs to more"),
    (lambda: party_index([np.array([5])], 3), "row index 5 is outside"),
])
def test_argument_errors(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DataError, match=match):
        call()


def test_party_index_marks_unused() -> None:
    owner = party_index(partition_sizes(10, [2, 3], 0), 10)
    assert (owner == -1).sum() == 5 and (owner == 1).sum() == 3
