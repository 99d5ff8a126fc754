"""The shipped real data sets: row/feature counts, label balance, unit ball, train/test alignment."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mpc_erm.data import (
    DATASETS,
    DataError,
    Dataset,
    load_adult,
    load_breast_cancer_default,
    load_dataset,
    load_diabetes_default,
    load_kddcup99,
)
from mpc_erm.data.sets import data_root


def _check_pair(tr: Dataset, te: Dataset) -> None:
    """What every shipped (train, test) pair must satisfy for the privacy analysis."""
    assert tr.is_unit_ball() and te.is_unit_ball()
    assert tr.feature_names == te.feature_names and tr.d == te.d
    assert tr.task == te.task and tr.n_classes == te.n_classes
    assert np.isclose(tr.max_row_norm(), 1.0)  # the thesis scales so that max ||x|| = 1
    if tr.task == "regression":
        assert np.abs(tr.y).max() <= 1.0 and np.abs(te.y).max() <= 1.0


@pytest.fixture(scope="module")
def kdd_timed(kdd_cache: Path) -> Iterator[tuple[tuple[Dataset, Dataset], float, float]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MPC_ERM_CACHE", str(kdd_cache))
        t0 = time.perf_counter()
        first = load_kddcup99()
        t1 = time.perf_counter()
        second = load_kddcup99()
        t2 = time.perf_counter()
        np.testing.assert_array_equal(first[0].X, second[0].X)
        np.testing.assert_array_equal(first[1].y, second[1].y)
        yield first, t1 - t0, t2 - t1


@pytest.mark.data
def test_adult_counts_and_preprocessing(data_dir: Path) -> None:
    tr, te = load_adult(data_dir)
    assert (tr.n, te.n) == (30_162, 15_060)  # rows without '?'
    assert tr.d == 104  # thesis: 104 (6 numeric + 98 one-hot)
    _check_pair(tr, te)
    assert tr.label_counts() == {-1.0: 22_654, 1.0: 7_508}
    assert 0.2 < (te.y == 1).mean() < 0.3
    assert "workclass=Never-worked" not in tr.feature_names
    onehot = [j for j, f in enumerate(tr.feature_names) if f.startswith("native-country=")]
    assert len(onehot) == 41
    # one-hot blocks are exactly one-hot before the row scaling: one nonzero per block per row
    assert ((tr.X[:, onehot] > 0).sum(axis=1) == 1).all()


@pytest.mark.data
def test_adult_missing_as_category_and_subsample(data_dir: Path) -> None:
    tr, te = load_adult(data_dir, missing="category")
    assert (tr.n, te.n, tr.d) == (32_561, 16_281, 108)
    assert "workclass=?" in tr.feature_names
    _check_pair(tr, te)
    a, b = load_adult(data_dir, n_train=1000, n_test=500, seed=3)
    a2, _ = load_adult(data_dir, n_train=1000, n_test=500, seed=3)
    assert (a.n, b.n, a.d) == (1000, 500, 104)  # schema fitted on the full file
    np.testing.assert_array_equal(a.X, a2.X)
    with pytest.raises(DataError, match="n_train"):
        load_adult(data_dir, n_train=10**6)


@pytest.mark.data
def test_kddcup99_counts_and_cache(data_dir: Path, kdd_cache: Path,
                                   kdd_timed: tuple[tuple[Dataset, Dataset], float, float]
                                   ) -> None:
    (tr, te), first_s, cached_s = kdd_timed
    assert (tr.n, te.n) == (50_000, 20_000)
    assert tr.d == 122  # thesis: 122 (34 numeric + 3 + 66 + 11 + 4 x 2 one-hot)
    _check_pair(tr, te)
    assert 0.7 < (tr.y == 1).mean() < 0.85  # DoS is ~79 % of the 10 % file
    # The cache is what makes the second load cheap: check that it is written, not a wall-clock
    # figure (timings are benchmarks; this machine's load varies). Times are printed for reading.
    assert list(kdd_cache.iterdir()), "the first KDD load wrote no cache file"
    print(f"KDD load: first {first_s:.2f}s, cached {cached_s:.2f}s")


@pytest.mark.data
def test_kddcup99_feature_count_is_sample_independent(data_dir: Path, kdd_cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPC_ERM_CACHE", str(kdd_cache))
    tr, te = load_kddcup99(data_dir, n_train=2000, n_test=1000, seed=7, flags="numeric")
    assert (tr.n, te.n, tr.d) == (2000, 1000, 118)
    _check_pair(tr, te)
    with pytest.raises(DataError, match="exceeds"):
        load_kddcup99(data_dir, n_train=494_021, n_test=1, cache=False)


@pytest.mark.data
def test_mnist_shapes(data_dir: Path) -> None:
    tr, te = load_dataset("mnist", data_dir)
    assert tr.X.shape == (60_000, 784) and te.X.shape == (10_000, 784)
    assert tr.task == "multiclass" and tr.n_classes == 10 and tr.y.dtype == np.int64
    assert tr.label_counts()[1] == 6742 and te.label_counts()[0] == 980
    _check_pair(tr, te)
    assert tr.X.min() >= 0.0


@pytest.mark.data
@pytest.mark.parametrize("name,n_total,d", [("communities_crime", 1993, 102),
                                            ("california_housing", 20_640, 8)])
def test_regression_sets(data_dir: Path, name: str, n_total: int, d: int) -> None:
    tr, te = load_dataset(name, data_dir)
    assert tr.n + te.n == n_total and tr.d == d and tr.task == "regression"
    _check_pair(tr, te)
    assert tr.y.std() > 0.05


def test_sklearn_defaults_are_deterministic() -> None:
    tr, te = load_breast_cancer_default()
    assert (tr.n + te.n, tr.d, tr.task) == (569, 30, "binary")
    _check_pair(tr, te)
    assert tr.label_counts()[1.0] + te.label_counts()[1.0] == 212  # malignant -> +1
    tr2, _ = load_breast_cancer_default(seed=0)
    np.testing.assert_array_equal(tr.X, tr2.X)
    dtr, dte = load_diabetes_default(seed=1, test_fraction=0.2)
    assert (dtr.n + dte.n, dtr.d, dte.n) == (442, 10, 88)
    _check_pair(dtr, dte)


def test_registry_errors() -> None:
    with pytest.raises(DataError, match="valid names: .*adult.*kddcup99"):
        load_dataset("kdd98")
    with pytest.raises(DataError, match="unknown argument"):
        load_dataset("diabetes", bogus=1)
    assert set(DATASETS) == {"adult", "kddcup99", "mnist", "communities_crime",
                             "california_housing", "breast_cancer", "diabetes"}


def test_missing_root_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    with pytest.raises(DataError, match="not a directory"):
        data_root(tmp_path / "nope")
    monkeypatch.setenv("MPC_ERM_DATA", str(tmp_path / "also-nope"))
    monkeypatch.setattr("mpc_erm.data.sets._repo_default_root", lambda: tmp_path / "x")
    with pytest.raises(DataError, match="also-nope.*MPC_ERM_DATA"):
        load_adult()
    with pytest.raises(DataError, match="adult.data.gz"):
        load_adult(tmp_path)  # root exists but holds no Adult files
    monkeypatch.delenv("MPC_ERM_DATA")
    train, test = load_adult(n_train=50, n_test=20)  # no data root at all: the copy in the package
    assert train.d == 104 and train.n == 50 and test.n == 20
