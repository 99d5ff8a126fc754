"""Dataset validation and the unit-ball preprocessing."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mpc_erm.data import (
    DataError,
    Dataset,
    Preprocessor,
    binary_labels,
    clip_to_unit_ball,
    encode_classes,
    fit_preprocessor,
    scale_regression_labels,
)


def test_dataset_validates_and_is_frozen() -> None:
    X = np.array([[3.0, 4.0], [0.1, 0.2]])
    ds = Dataset(X, np.array([1, -1]), "binary", "toy")
    assert ds.y.dtype == np.float64 and (ds.n, ds.d) == (2, 2)
    assert ds.feature_names == ("x0", "x1") and not ds.is_unit_ball()
    assert ds.max_row_norm() == pytest.approx(5.0)
    with pytest.raises(ValueError):
        ds.X[0, 0] = 1.0  # read-only view
    X[0, 0] = 0.0  # the caller's own array stays writable
    sub = ds.subset([1])
    assert sub.n == 1 and sub.is_unit_ball() and sub.name == "toy"
    assert ds.subset(np.array([True, False])).y.tolist() == [1.0]
    m = Dataset(np.zeros((3, 1)), np.array([0, 2, 2]), "multiclass", n_classes=4)
    assert m.subset([0]).n_classes == 4 and m.y.dtype == np.int64


@pytest.mark.parametrize("X,y,task,kw,match", [
    (np.zeros(3), np.zeros(3), "binary", {}, "2-D"),
    (np.zeros((3, 2)), np.ones(2), "binary", {}, r"shape \(3,\)"),
    (np.array([[np.nan]]), np.ones(1), "binary", {}, "non-finite value nan at row 0"),
    (np.zeros((2, 1)), np.array([1.0, 0.0]), "binary", {}, "row 1 has 0.0"),
    (np.zeros((2, 1)), np.array([0, 3]), "multiclass", {"n_classes": 3}, "row 1 has 3"),
    (np.zeros((2, 1)), np.array([0.5, 1.0]), "multiclass", {}, "integers"),
    (np.zeros((2, 1)), np.array([0.5, 1.5]), "regression", {}, r"\[-1, 1\].*row 1"),
    (np.zeros((2, 1)), np.zeros(2), "ranking", {}, "task must be"),
    (np.zeros((2, 2)), np.zeros(2), "regression", {"feature_names": ("a",)}, "feature_names"),
])
def test_dataset_errors_name_the_fault(X: np.ndarray, y: np.ndarray, task: str, kw: dict,
                                       match: str) -> None:
    with pytest.raises(DataError, match=match) as e:
        Dataset(X, y, task, name="bad", **kw)  # type: ignore[arg-type]
    assert "'bad'" in str(e.value)


@settings(max_examples=50, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 20), st.integers(1, 6)),
              elements=st.floats(-1e6, 1e6)))
def test_clip_to_unit_ball_properties(X: np.ndarray) -> None:
    Y = clip_to_unit_ball(X)
    norms = np.linalg.norm(Y, axis=1)
    assert (norms <= 1 + 1e-12).all()
    inside = np.linalg.norm(X, axis=1) <= 1
    np.testing.assert_array_equal(Y[inside], X[inside])  # rows already inside are untouched
    # projection keeps direction: Y is a non-negative multiple of X
    assert np.allclose(Y * np.linalg.norm(X, axis=1, keepdims=True),
                       X * norms[:, None], atol=1e-6 * (1 + np.abs(X).max()))


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"age": [20, 40, 60, 30], "colour": ["red", "blue", "red", "green"],
                         "income": [1.0, -3.0, 5.0, 0.0]})


def test_fit_preprocessor_chaudhuri() -> None:
    pre = fit_preprocessor(_frame(), ["age", "income"], ["colour"],
                           column_order=["age", "colour", "income"])
    assert pre.feature_names == ("age", "colour=blue", "colour=green", "colour=red", "income")
    X = pre.transform(_frame())
    assert np.isclose(np.linalg.norm(X, axis=1).max(), 1.0)
    enc = pre.encode(_frame())
    assert enc[:, 0].tolist() == [0.0, 0.5, 1.0, 0.25]  # min-max to [0, 1]
    # another party's rows: out-of-range numbers are clipped, unknown colour encodes as zeros
    other = pd.DataFrame({"age": [1000], "colour": ["purple"], "income": [-99.0]})
    Z = pre.transform(other)
    assert np.linalg.norm(Z) <= 1 + 1e-12 and Z[0, 1:4].tolist() == [0, 0, 0]
    strict = Preprocessor(pre.columns, norm_bound=pre.norm_bound, handle_unknown="error")
    with pytest.raises(DataError, match="'colour' row 0 has unknown category 'purple'"):
        strict.transform(other)
    # public schema round-trips through JSON
    again = Preprocessor.from_dict(json.loads(json.dumps(pre.to_dict())))
    np.testing.assert_array_equal(again.transform(_frame()), X)


def test_fit_preprocessor_public_options() -> None:
    f = _frame()
    pre = fit_preprocessor(f, ["age"], ["colour"], row_norm="worst_case",
                           numeric_bounds={"age": (0, 100)},
                           categories={"colour": ["red", "green", "blue", "other"]})
    assert pre.norm_bound == pytest.approx(np.sqrt(2))
    assert pre.feature_names[1:] == ("colour=red", "colour=green", "colour=blue", "colour=other")
    assert pre.transform(f)[0, 0] == pytest.approx(0.2 / np.sqrt(2))
    maxabs = fit_preprocessor(f, ["income"], numeric_scaling="maxabs", row_norm=1.0)
    assert maxabs.transform(f)[:, 0].tolist() == [0.2, -0.6, 1.0, 0.0]
    with pytest.raises(DataError, match=r"missing column\(s\) \['nope'\]; available"):
        fit_preprocessor(f, ["nope"])
    with pytest.raises(DataError, match="'colour'.*row 1"):
        fit_preprocessor(pd.DataFrame({"colour": ["a", None]}), (), ["colour"])
    with pytest.raises(DataError, match="'age'.*'x'.*row 2"):
        fit_preprocessor(pd.DataFrame({"age": ["1", "2", "x"]}), ["age"])


def test_label_helpers() -> None:
    assert binary_labels([">50K", "<=50K", " >50K"], ">50K").tolist() == [1, -1, 1]
    assert binary_labels(["smurf", "normal", "back"], {"smurf", "back"}).tolist() == [1, -1, 1]
    assert scale_regression_labels([0, 5, 10, 20], 0, 10).tolist() == [-1, 0, 1, 1]
    with pytest.raises(DataError, match="low < high"):
        scale_regression_labels([1.0], 3, 3)
    assert encode_classes(["b", "a", "c"], ["a", "b", "c"]).tolist() == [1, 0, 2]
    with pytest.raises(DataError, match="row 1 has label 'z'"):
        encode_classes(["a", "z"], ["a", "b"])
