"""User-supplied files: good files load, bad files fail with messages naming file and place."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from mpc_erm.data import (
    DataError,
    Dataset,
    fit_preprocessor,
    load_csv,
    load_libsvm,
    load_numpy,
    save_numpy,
)

GOOD = "a,b,colour,label\n1,2,red,yes\n3,4,blue,no\n5,6,red,yes\n"


def _write(p: Path, text: str, gz: bool = False) -> Path:
    if gz:
        with gzip.open(p, "wt") as f:
            f.write(text)
    else:
        p.write_text(text)
    return p


@pytest.mark.parametrize("gz", [False, True])
def test_csv_loads_with_categoricals(tmp_path: Path, gz: bool) -> None:
    p = _write(tmp_path / ("d.csv.gz" if gz else "d.csv"), GOOD, gz)
    ds = load_csv(p, "label", categorical_columns=["colour"], task="binary", positive_label="yes")
    assert ds.feature_names == ("a", "b", "colour=blue", "colour=red")
    assert ds.X.tolist() == [[1, 2, 0, 1], [3, 4, 1, 0], [5, 6, 0, 1]]
    assert ds.y.tolist() == [1, -1, 1] and ds.name == p.name


def test_csv_gzip_without_gz_suffix_and_chunks(tmp_path: Path) -> None:
    rows = "\n".join(f"{i},{i % 2}" for i in range(1000))
    p = _write(tmp_path / "data.txt", "x,y\n" + rows + "\n", gz=True)
    ds = load_csv(p, "y", task="binary", chunksize=128)  # 0/1 labels map to -1/+1
    assert ds.n == 1000 and ds.X[:, 0].tolist() == list(range(1000))
    assert ds.y[:2].tolist() == [-1, 1]


def test_csv_with_public_preprocessor(tmp_path: Path) -> None:
    import pandas as pd

    pre = fit_preprocessor(pd.DataFrame({"a": [0, 10], "b": [0, 10], "colour": ["red", "blue"]}),
                           ["a", "b"], ["colour"])
    ds = load_csv(_write(tmp_path / "p.csv", GOOD), "label", task="binary",
                  positive_label="yes", preprocessor=pre)
    assert ds.feature_names == pre.feature_names and ds.is_unit_ball()


def test_csv_headerless_multiclass_and_regression(tmp_path: Path) -> None:
    p = _write(tmp_path / "h.tsv", "0.5\t1\t2\n0.1\t0\t0\n0.2\t1\t1\n")
    ds = load_csv(p, 2, task="multiclass", header=False, delimiter="\t")
    assert ds.n_classes == 3 and ds.feature_names == ("0", "1")
    r = load_csv(p, 0, task="regression", header=False, delimiter="\t")
    assert r.y.tolist() == [0.5, 0.1, 0.2]
    s = load_csv(p, 2, task="regression", header=False, delimiter="\t", label_bounds=(0, 2))
    assert s.y.tolist() == [1.0, -1.0, 0.0]
    c = load_csv(_write(tmp_path / "c.csv", GOOD), "label", ["a"], task="multiclass",
                 classes=["no", "yes", "maybe"])
    assert c.y.tolist() == [1, 0, 1] and c.n_classes == 3


@pytest.mark.parametrize("text,kw,match", [
    (GOOD, {"label_column": "target"},
     r"label column 'target' not found; available columns: \['a', 'b', 'colour', 'label'\]"),
    (GOOD, {"feature_columns": ["a", "zz"]}, r"feature column\(s\) \['zz'\] not found"),
    ("a,b,label\n1,2,1\n3,,1\n", {}, r"missing \(NaN/empty\) value in column 'b' at row 2"),
    ("a,b,label\n1,2,1\n3,nan,1\n4,5,1\n", {}, "column 'b' at row 2 .line 3"),
    ("a,b,label\n1,inf,1\n", {}, r"infinite \(inf\) value in column 'b' at row 1"),
    ("a,b,label\n1,2,1\n3,abc,-1\n", {}, "non-numeric value 'abc' in numeric column 'b' at row 2"),
    ("a,b,label\n1,2,1\n3,4,5,6\n", {}, "malformed row"),
    ("a,b,label\n", {}, "no data rows"),
    ("a,b,label\n1,2,1\n3,4,2\n", {}, r"binary labels must be .*values found: \['1', '2'\]"),
    ("a,b,label\n1,2,x\n", {"positive_label": "y"}, "positive_label 'y' never occurs"),
    ("a,b,label\n1,2,1\n3,4,\n", {}, "label is missing at row 2"),
    ("a,b,label\n1,2,0.5\n3,4,-2\n", {"task": "regression"}, r"\[-1, 1\].*row 2 has -2"),
    ("a,b,label\n1,2,0\n3,4,cat\n", {"task": "multiclass"}, "row 2 has 'cat'"),
    ("a,a,label\n1,2,1\n", {}, "duplicate column"),
])
def test_csv_errors(tmp_path: Path, text: str, kw: dict, match: str) -> None:
    p = _write(tmp_path / "bad.csv", text)
    args = {"label_column": "label", "task": "binary", **kw}
    with pytest.raises(DataError, match=match) as e:
        load_csv(p, **args)
    assert str(p) in str(e.value)


def test_csv_empty_and_missing_file(tmp_path: Path) -> None:
    p = _write(tmp_path / "empty.csv", "")
    with pytest.raises(DataError, match=f"{p}: file is empty"):
        load_csv(p, "label", task="binary")
    with pytest.raises(DataError, match="nope.csv: file not found"):
        load_csv(tmp_path / "nope.csv", "label", task="binary")
    with pytest.raises(DataError, match="task must be one of"):
        load_csv(_write(tmp_path / "g.csv", GOOD), "label", task="ranking")


def test_csv_refuses_too_large(tmp_path: Path) -> None:
    p = _write(tmp_path / "big.csv", "a,label\n" + "1,1\n" * 50)
    with pytest.raises(DataError, match="would not fit a dense matrix"):
        load_csv(p, "label", task="binary", max_cells=10, chunksize=20)


LIBSVM = "+1 1:0.5 3:1\n-1 2:0.25  # comment\n\n+1 1:1 2:1 3:1\n"


@pytest.mark.parametrize("gz", [False, True])
def test_libsvm_loads(tmp_path: Path, gz: bool) -> None:
    p = _write(tmp_path / "d.svm", LIBSVM, gz)
    ds = load_libsvm(p, task="binary")
    assert ds.X.tolist() == [[0.5, 0, 1], [0, 0.25, 0], [1, 1, 1]] and ds.y.tolist() == [1, -1, 1]
    assert load_libsvm(p, n_features=5, task="binary").d == 5


@pytest.mark.parametrize("text,kw,match", [
    ("+1 1:0.5\n-1 2-0.3\n", {}, r"line 2: token '2-0.3' is not 'index:value'"),
    ("+1 1:0.5\n-1 a:1\n", {}, "line 2: feature index 'a' is not an integer"),
    ("+1 1:0.5\n\n-1 2:x\n", {}, "line 3: value 'x' of feature 2 is not a number"),
    ("+1 0:0.5\n", {}, "line 1: feature index 0 below 1.*zero_based=True"),
    ("+1 2:1 1:1\n", {}, "line 1: feature index 1 is repeated or not increasing"),
    ("+1 1:1 9:1\n", {"n_features": 3}, "line 1: feature index 9 exceeds n_features=3"),
    ("+1 1:nan\n", {}, "line 1: value of feature 1 is not finite"),
    ("+1 qid:3 1:1\n", {}, "line 1: query ids"),
    ("# only a comment\n\n", {}, "file is empty"),
    ("+1 1:1\n\n3 1:1\n", {}, r"binary labels must be .*\['\+1', '3'\]"),
    ("0 1:1\n\n1.5 1:1\n", {"task": "multiclass"}, "line 3 has '1.5'"),
])
def test_libsvm_errors(tmp_path: Path, text: str, kw: dict, match: str) -> None:
    p = _write(tmp_path / "bad.svm", text)
    with pytest.raises(DataError, match=match) as e:
        load_libsvm(p, **{"task": "binary", **kw})
    assert str(p) in str(e.value)


def test_numpy_roundtrip_and_pairs(tmp_path: Path) -> None:
    ds = Dataset(np.eye(3), np.array([0, 1, 2]), "multiclass", "eye", ("p", "q", "r"))
    p = save_numpy(ds, tmp_path / "eye.npz")
    back = load_numpy(p)
    assert back.task == "multiclass" and back.feature_names == ("p", "q", "r")
    np.testing.assert_array_equal(back.X, ds.X)
    d = tmp_path / "pair"
    d.mkdir()
    np.save(d / "X.npy", np.ones((4, 2)))
    np.save(d / "y.npy", np.array([1.0, -1.0, 1.0, 1.0]))
    assert load_numpy(d).task == "binary"
    assert load_numpy(d / "X.npy").n == 4  # sibling y.npy found
    with gzip.open(tmp_path / "z.npz.gz", "wb") as f:
        f.write(p.read_bytes())
    assert load_numpy(tmp_path / "z.npz.gz").n == 3


@pytest.mark.parametrize("arrays,match", [
    ({"X": np.ones(3), "y": np.ones(3)}, r"X must be 2-D \(n, d\), got shape \(3,\)"),
    ({"X": np.ones((3, 2)), "y": np.ones(2)}, r"y must have shape \(3,\)"),
    ({"X": np.array([[1.0], [np.inf]]), "y": np.ones(2)}, "non-finite value at row 1, column 0"),
    ({"X": np.ones((2, 2))}, r"array 'y' not in the .npz"),
    ({"X": np.ones((2, 1)), "y": np.array([0.5, 3.0])}, r"\[-1, 1\].*row 1 has 3.0"),
])
def test_numpy_errors(tmp_path: Path, arrays: dict, match: str) -> None:
    p = tmp_path / "bad.npz"
    np.savez(p, **arrays)
    with pytest.raises(DataError, match=match) as e:
        load_numpy(p)
    assert str(p) in str(e.value)


def test_numpy_bare_and_garbage(tmp_path: Path) -> None:
    np.save(tmp_path / "feat.npy", np.ones((2, 2)))
    with pytest.raises(DataError, match="pass y_path"):
        load_numpy(tmp_path / "feat.npy")
    (tmp_path / "junk.npz").write_bytes(b"not numpy at all")
    with pytest.raises(DataError, match="junk.npz"):
        load_numpy(tmp_path / "junk.npz")


def test_csv_preprocessor_errors_use_file_rows(tmp_path: Path) -> None:
    import pandas as pd

    pre = fit_preprocessor(pd.DataFrame({"a": [0, 1], "colour": ["red", "blue"]}), ["a"],
                           ["colour"], handle_unknown="error")
    p = _write(tmp_path / "u.csv", "a,colour,label\n0,red,1\n1,pink,-1\n")
    with pytest.raises(DataError, match="u.csv: column 'colour' row 2 has unknown category"):
        load_csv(p, "label", task="binary", preprocessor=pre)
