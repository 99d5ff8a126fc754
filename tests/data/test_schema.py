"""The data schema: parsing with errors naming the field, the mapping from raw cells to features
and labels (checked against a hand computation), missing values, the digest, and the unit ball."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mpc_erm.data import DataError
from mpc_erm.data.schema import load_schema, read_csv_with_schema, schema_from_mapping

SCHEMA = """
# a comment
intercept = true
missing = "error"

[label]
column = "diagnosis"
task = "binary"
positive = "malignant"
negative = "benign"

[[columns]]
name = "age"
type = "numeric"
low = 0
high = 100

[[columns]]
name = "site"
type = "categorical"
categories = ["north", "south"]
"""

CSV = """id,site,age,diagnosis,note
1,north,50,malignant,x
2,south,120,benign,y
3,east,-5,benign,z
"""


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    s, c = tmp_path / "schema.toml", tmp_path / "rows.csv"
    s.write_text(SCHEMA)
    c.write_text(CSV)
    return s, c


def test_rows_are_mapped_by_the_public_bounds_and_categories(files) -> None:
    s, c = files
    schema = load_schema(s)
    ds = read_csv_with_schema(c, schema)
    assert ds.feature_names == ("age", "site=north", "site=south", "intercept")
    r = math.sqrt(3)  # worst case: age, site, intercept each contribute at most 1
    expect = np.array([[0.5, 1, 0, 1], [1.0, 0, 1, 1], [0.0, 0, 0, 1]]) / r  # 120 → 100, -5 → 0; east → zeros
    np.testing.assert_allclose(ds.X, expect)
    np.testing.assert_array_equal(ds.y, [1.0, -1.0, -1.0])
    assert np.linalg.norm(ds.X, axis=1).max() <= 1.0 + 1e-12
    assert schema.decode(np.array([1.0, -1.0])).tolist() == ["malignant", "benign"]


def test_column_order_and_extra_columns_do_not_matter(files, tmp_path) -> None:
    s, c = files
    shuffled = tmp_path / "other.csv"
    pd.read_csv(c)[["diagnosis", "note", "age", "site", "id"]].to_csv(shuffled, index=False)
    a, b = read_csv_with_schema(c, load_schema(s)), read_csv_with_schema(shuffled, load_schema(s))
    np.testing.assert_array_equal(a.X, b.X)


def test_the_digest_is_of_the_meaning_not_the_text(files, tmp_path) -> None:
    s, _ = files
    same = tmp_path / "same.toml"
    same.write_text(SCHEMA.replace("# a comment", "# another comment").replace("high = 100", "high = 100.0"))
    other = tmp_path / "other.toml"
    other.write_text(SCHEMA.replace("high = 100", "high = 90"))
    assert load_schema(s).digest() == load_schema(same).digest()
    assert load_schema(s).digest() != load_schema(other).digest()


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace("high = 100", ""), "columns.0: Value error, a numeric column needs public bounds"),
    (lambda t: t.replace('positive = "malignant"\n', ""), "label: Value error, positive: required"),
    (lambda t: t.replace('task = "binary"', 'task = "regression"'), "negative, positive: not used by task"),
    (lambda t: t.replace('categories = ["north", "south"]', 'categories = ["a", "a"]'), "duplicates"),
    (lambda t: t.replace('missing = "error"', 'missing = "fill"'), "needs a public `fill` for every column"),
    (lambda t: t.replace('missing = "error"', 'missing = "maybe"'), "missing: Input should be"),
    (lambda t: t + "\ncolour = 1\n", "colour: Extra inputs are not permitted"),
    (lambda t: t.replace('name = "age"', 'name = "diagnosis"'), "label.column: 'diagnosis' is also a feature"),
])
def test_a_bad_schema_is_refused_naming_the_field(tmp_path, edit, message) -> None:
    p = tmp_path / "s.toml"
    p.write_text(edit(SCHEMA))
    with pytest.raises(DataError) as info:
        load_schema(p)
    assert str(info.value).startswith(f"{p}: ")
    assert message.replace("Value error, ", "") in str(info.value), str(info.value)


def test_rows_that_break_the_schema_are_refused_naming_column_and_row(files, tmp_path) -> None:
    s, c = files
    schema = load_schema(s)
    cases = {
        "id,age,diagnosis\n1,5,benign\n": "column(s) 'site' required by the schema are missing",
        "site,age,diagnosis\nnorth,,benign\n": "column 'age' is empty at row 1",
        "site,age,diagnosis\nnorth,old,benign\n": "numeric column 'age' has a non-numeric",
        "site,age,diagnosis\nnorth,5,benign\nsouth,6,unknown\n": "label 'diagnosis' at row 2 is 'unknown'",
        "site,age,diagnosis\nnorth,5,\n": "label column 'diagnosis' is empty at row 1",
    }
    for text, message in cases.items():
        f = tmp_path / "bad.csv"
        f.write_text(text)
        with pytest.raises(DataError) as info:
            read_csv_with_schema(f, schema)
        assert message in str(info.value), (text, str(info.value))
        assert str(f) in str(info.value)


def test_missing_values_are_dropped_or_filled_with_public_values(tmp_path) -> None:
    text = "site,age,diagnosis\nnorth,,benign\n,30,malignant\nsouth,40,benign\n"
    f = tmp_path / "rows.csv"
    f.write_text(text)
    base = {"label": {"column": "diagnosis", "task": "binary", "positive": "malignant"},
            "row_norm": 1.0}
    drop = schema_from_mapping({**base, "missing": "drop", "columns": [
        {"name": "age", "type": "numeric", "low": 0, "high": 100},
        {"name": "site", "type": "categorical", "categories": ["north", "south"]}]})
    ds = drop.dataset(pd.read_csv(f, dtype=str, keep_default_na=False))
    assert ds.n == 1 and ds.y.tolist() == [-1.0]
    fill = schema_from_mapping({**base, "missing": "fill", "columns": [
        {"name": "age", "type": "numeric", "low": 0, "high": 100, "fill": 50},
        {"name": "site", "type": "categorical", "categories": ["north", "south"], "fill": "south"}]})
    ds = fill.dataset(pd.read_csv(f, dtype=str, keep_default_na=False))
    assert ds.n == 3
    # row_norm = 1: rows divided by 1, then clipped into the unit ball
    np.testing.assert_allclose(ds.X[0], np.array([0.5, 1.0, 0.0]) / math.hypot(0.5, 1.0))
    np.testing.assert_allclose(ds.X[1], np.array([0.3, 0.0, 1.0]) / math.hypot(0.3, 1.0))


def test_multiclass_and_regression_labels_round_trip() -> None:
    cols = [{"name": "x", "type": "numeric", "low": -1, "high": 1}]
    multi = schema_from_mapping({"label": {"column": "y", "task": "multiclass", "classes": ["a", "b", "c"]},
                                 "columns": cols})
    ds = multi.dataset(pd.DataFrame({"x": ["0", "1", "-1"], "y": ["c", "a", "b"]}))
    assert ds.y.tolist() == [2, 0, 1] and ds.n_classes == 3
    assert multi.decode(np.array([2, 0])).tolist() == ["c", "a"]
    reg = schema_from_mapping({"label": {"column": "y", "task": "regression", "low": 100, "high": 300},
                               "columns": cols})
    ds = reg.dataset(pd.DataFrame({"x": ["0", "1"], "y": ["200", "400"]}))
    np.testing.assert_allclose(ds.y, [0.0, 1.0])  # 400 is clipped to the public bound 300
    np.testing.assert_allclose(reg.decode(np.array([0.0, -1.0, 1.0])), [200.0, 100.0, 300.0])


def test_every_row_lies_in_the_unit_ball_whatever_the_values(tmp_path) -> None:
    rng = np.random.default_rng(0)
    cols = [{"name": f"c{k}", "type": "numeric", "low": 0, "high": 1} for k in range(5)]
    for norm in ("worst_case", 0.5):
        s = schema_from_mapping({"label": {"column": "y", "task": "binary", "positive": "1"}, "intercept": True,
                                 "row_norm": norm, "scaling": "maxabs", "columns": cols})
        frame = pd.DataFrame({f"c{k}": (rng.normal(size=200) * 10).astype(str) for k in range(5)})
        frame["y"] = "1"
        X = s.dataset(frame).X
        assert np.linalg.norm(X, axis=1).max() <= 1.0 + 1e-12


def test_the_public_description_names_every_column_the_label_and_the_rules(files) -> None:
    s, _ = files
    lines = load_schema(s).describe_columns()
    assert lines[:2] == ["age: numeric [0, 100]", "site: categorical ['north', 'south']"]
    assert lines[2] == "label diagnosis: binary positive 'malignant', negative 'benign'"
    assert lines[3].startswith("rules: intercept=True, missing=error")
    for label in ({"task": "multiclass", "classes": ["a", "b"]}, {"task": "regression", "low": 0, "high": 1}):
        sc = schema_from_mapping({"label": {"column": "y", **label}, "columns": [
            {"name": "x", "type": "numeric", "low": 0, "high": 1}]})
        assert sc.describe_columns()[1].startswith(f"label y: {label['task']}")
