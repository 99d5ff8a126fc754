"""Chaudhuri, Monteleoni & Sarwate (2011) preprocessing: one-hot, scale, map rows into the unit ball.

The sensitivity of every mechanism in mpc_erm.privacy assumes ||x||_2 <= 1 for every row (and
|y| <= 1 for regression).  The thesis follows Chaudhuri et al.: categorical attributes are one-hot
encoded, numeric attributes are scaled to [0, 1] (min-max; ``numeric_scaling="maxabs"`` divides by
max |value| instead, mapping to [-1, 1]), and finally all rows are divided by the largest row norm
so that max ||x|| = 1.

Privacy caveat.  Min/max bounds, the category lists and that largest row norm are *computed from
data*.  That is what the thesis does on public benchmark data, but in a multi-party deployment the
constants must be public or agreed in advance (from a public schema, domain knowledge or a
separate DP release), never computed from the parties' private rows: otherwise the scaling itself
leaks and the DP guarantee does not cover it.  Hence the split into

* ``fit_preprocessor`` -> ``Preprocessor``: a *public schema* (category lists, numeric bounds,
  norm bound) that can be serialised (``to_dict``) and applied by every party to its own rows;
  ``row_norm="worst_case"`` gives a norm bound derived from the schema alone (sqrt of the number
  of encoded attributes), which needs no data at all;
* ``clip_to_unit_ball`` -- a per-row projection, data-independent and therefore privacy-safe, which
  ``Preprocessor.transform`` applies last so that rows outside the fitted bounds (another party's
  data, a test set) still satisfy the assumption.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from .dataset import DataError

NumericScaling = Literal["minmax", "maxabs"]
RowNorm = Literal["max", "worst_case"]


def row_norms(X: np.ndarray) -> np.ndarray:
    """Euclidean norm of each row, without forming X**2 as a separate temporary twice."""
    X = np.asarray(X, dtype=np.float64)
    return np.sqrt(np.einsum("ij,ij->i", X, X))


def clip_to_unit_ball(X: np.ndarray, radius: float = 1.0, *, copy: bool = True) -> np.ndarray:
    """Project each row with norm > radius onto the sphere of that radius; others unchanged.

    Data-independent and row-by-row, so applying it never costs privacy; it is the safe way to
    enforce the ||x|| <= 1 assumption on rows whose scale is not known in advance.  With
    ``copy=False`` a float64 input is modified in place (saves a copy of large matrices).
    """
    if radius <= 0:
        raise DataError(f"clip_to_unit_ball: radius must be > 0, got {radius}")
    X = np.array(X, dtype=np.float64, copy=copy)
    if X.ndim != 2:
        raise DataError(f"clip_to_unit_ball: X must be 2-D, got shape {X.shape}")
    norms = row_norms(X)
    over = norms > radius
    if over.any():
        X[over] *= (radius / norms[over])[:, None]
    return X


def scale_rows(X: np.ndarray, bound: float) -> np.ndarray:
    """Divide every row by ``bound`` then clip, so rows with ||x|| <= bound end in the unit ball."""
    if not (bound > 0 and math.isfinite(bound)):
        raise DataError(f"scale_rows: bound must be a positive finite number, got {bound}")
    return clip_to_unit_ball(np.asarray(X, dtype=np.float64) / bound, copy=False)


def binary_labels(values: Any, positive: Any, source: str = "labels") -> np.ndarray:
    """Map labels to {-1, +1}: +1 where the value equals ``positive`` (or is in it, if a set).

    Values are compared as stripped strings so that 1, "1" and " 1" agree (CSV cells vary).
    """
    arr = np.asarray(values, dtype=object).ravel()
    s = pd.Series(arr).astype(str).str.strip()
    if isinstance(positive, (set, frozenset, list, tuple)):
        pos = {str(p).strip() for p in positive}
    else:
        pos = {str(positive).strip()}
    y = np.where(s.isin(pos).to_numpy(), 1.0, -1.0)
    return y


def scale_regression_labels(y: Any, low: float, high: float) -> np.ndarray:
    """Map [low, high] linearly onto [-1, 1] and clip outside values.

    ``low``/``high`` must be public bounds (a documented range, not the private data's extremes);
    the clipping keeps |y| <= 1, which the squared/Huber loss sensitivities assume.
    """
    if not (math.isfinite(low) and math.isfinite(high) and high > low):
        raise DataError(f"scale_regression_labels: need finite low < high, got ({low}, {high})")
    y = np.asarray(y, dtype=np.float64)
    return np.clip(2.0 * (y - low) / (high - low) - 1.0, -1.0, 1.0)


@dataclass(frozen=True)
class NumericColumn:
    """A numeric attribute and its public bounds [low, high]."""

    name: str
    low: float
    high: float


@dataclass(frozen=True)
class CategoricalColumn:
    """A categorical attribute and its public list of categories (one output column each)."""

    name: str
    categories: tuple[str, ...]


Column = NumericColumn | CategoricalColumn


@dataclass(frozen=True)
class Preprocessor:
    """Public schema mapping raw attribute frames to unit-ball feature matrices.

    Output columns follow ``columns`` in order: one per numeric attribute, one per category of a
    categorical attribute (named ``attr=value``).  Numeric values are clipped to [low, high] before
    scaling, unknown categories encode as all zeros (``handle_unknown="ignore"``, which can only
    shrink a row) or raise, and rows are divided by ``norm_bound`` then clipped to the unit ball.
    """

    columns: tuple[Column, ...]
    numeric_scaling: NumericScaling = "minmax"
    norm_bound: float = 1.0
    handle_unknown: Literal["ignore", "error"] = "ignore"

    def __post_init__(self) -> None:
        if self.numeric_scaling not in ("minmax", "maxabs"):
            raise DataError(f"Preprocessor: numeric_scaling must be 'minmax' or 'maxabs', "
                            f"got {self.numeric_scaling!r}")
        if not (self.norm_bound > 0 and math.isfinite(self.norm_bound)):
            raise DataError(f"Preprocessor: norm_bound must be positive, got {self.norm_bound}")
        if self.handle_unknown not in ("ignore", "error"):
            raise DataError(f"Preprocessor: handle_unknown must be 'ignore' or 'error', "
                            f"got {self.handle_unknown!r}")
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise DataError(f"Preprocessor: duplicate column names in {names}")

    @property
    def input_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def feature_names(self) -> tuple[str, ...]:
        out: list[str] = []
        for c in self.columns:
            if isinstance(c, NumericColumn):
                out.append(c.name)
            else:
                out.extend(f"{c.name}={v}" for v in c.categories)
        return tuple(out)

    @property
    def n_features(self) -> int:
        return sum(1 if isinstance(c, NumericColumn) else len(c.categories)
                   for c in self.columns)

    def worst_case_norm(self) -> float:
        """Largest possible row norm before division: each attribute contributes at most 1."""
        return math.sqrt(max(len(self.columns), 1))

    def encode(self, frame: pd.DataFrame, source: str = "frame", row_offset: int = 0
               ) -> np.ndarray:
        """One-hot + numeric scaling, *without* the row-norm division (see ``transform``).

        Error messages number rows from ``row_offset`` (0 for frames, 1 for file rows).
        """
        missing = [c for c in self.input_columns if c not in frame.columns]
        if missing:
            raise DataError(f"{source}: missing column(s) {missing}; "
                            f"available: {list(map(str, frame.columns))}")
        n = len(frame)
        X = np.zeros((n, self.n_features), dtype=np.float64)
        j = 0
        for c in self.columns:
            col = frame[c.name]
            if isinstance(c, NumericColumn):
                v = _numeric_column(col, c.name, source, row_offset)
                if self.numeric_scaling == "minmax":
                    span = c.high - c.low
                    X[:, j] = (np.clip(v, c.low, c.high) - c.low) / span if span > 0 else 0.0
                else:
                    m = max(abs(c.low), abs(c.high))
                    X[:, j] = np.clip(v, c.low, c.high) / m if m > 0 else 0.0
                j += 1
            else:
                if col.isna().any():
                    r = int(np.flatnonzero(col.isna().to_numpy())[0])
                    raise DataError(f"{source}: column {c.name!r} has a missing value at row "
                                    f"{r + row_offset}")
                values = col.astype(str).str.strip()
                codes = pd.Index(list(c.categories)).get_indexer(values)
                unknown = codes < 0
                if unknown.any() and self.handle_unknown == "error":
                    r = int(np.flatnonzero(unknown)[0])
                    raise DataError(f"{source}: column {c.name!r} row {r + row_offset} has "
                                    f"unknown category "
                                    f"{values.iloc[r]!r}; known: {list(c.categories)}")
                rows = np.flatnonzero(~unknown)
                X[rows, j + codes[rows].astype(np.int64)] = 1.0
                j += len(c.categories)
        return X

    def transform(self, frame: pd.DataFrame, source: str = "frame", row_offset: int = 0
                  ) -> np.ndarray:
        """Encode, divide by the public ``norm_bound`` and clip: every output row has norm <= 1."""
        return scale_rows(self.encode(frame, source, row_offset), self.norm_bound)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, to publish/agree on the schema among parties."""
        cols: list[dict[str, Any]] = []
        for c in self.columns:
            if isinstance(c, NumericColumn):
                cols.append({"name": c.name, "kind": "numeric", "low": c.low, "high": c.high})
            else:
                cols.append({"name": c.name, "kind": "categorical",
                             "categories": list(c.categories)})
        return {"columns": cols, "numeric_scaling": self.numeric_scaling,
                "norm_bound": self.norm_bound, "handle_unknown": self.handle_unknown}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Preprocessor:
        cols: list[Column] = []
        for c in d["columns"]:
            if c["kind"] == "numeric":
                cols.append(NumericColumn(str(c["name"]), float(c["low"]), float(c["high"])))
            elif c["kind"] == "categorical":
                cols.append(CategoricalColumn(str(c["name"]),
                                              tuple(str(v) for v in c["categories"])))
            else:
                raise DataError(f"Preprocessor.from_dict: column {c.get('name')!r} has unknown "
                                f"kind {c['kind']!r}")
        return cls(tuple(cols), d.get("numeric_scaling", "minmax"), float(d["norm_bound"]),
                   d.get("handle_unknown", "ignore"))


def _numeric_column(col: pd.Series, name: str, source: str, row_offset: int = 0) -> np.ndarray:
    """Float64 values of a column, with an error naming the first non-numeric/missing row."""
    v = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(v)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise DataError(f"{source}: numeric column {name!r} has a non-numeric, missing or "
                        f"infinite value {col.iloc[r]!r} at row {r + row_offset}")
    return v


def fit_preprocessor(
    frame: pd.DataFrame,
    numeric_columns: Sequence[str] = (),
    categorical_columns: Sequence[str] = (),
    *,
    numeric_scaling: NumericScaling = "minmax",
    row_norm: RowNorm | float = "max",
    categories: Mapping[str, Iterable[Any]] | None = None,
    numeric_bounds: Mapping[str, tuple[float, float]] | None = None,
    handle_unknown: Literal["ignore", "error"] = "ignore",
    column_order: Sequence[str] | None = None,
    source: str = "frame",
) -> Preprocessor:
    """Fit the public schema on ``frame`` (Chaudhuri et al. on public benchmark data).

    ``categories``/``numeric_bounds`` override what would be computed from the frame -- use them
    to supply public constants.  ``row_norm``: ``"max"`` divides by the largest encoded row norm of
    ``frame`` (the thesis; data-dependent), ``"worst_case"`` by sqrt(#attributes) (schema only),
    or a float given publicly.  Categories are sorted (as strings) for a deterministic layout.
    Output column order is ``column_order`` if given, else numeric columns then categorical.
    """
    categories = dict(categories or {})
    numeric_bounds = dict(numeric_bounds or {})
    overlap = set(numeric_columns) & set(categorical_columns)
    if overlap:
        raise DataError(f"{source}: column(s) {sorted(overlap)} are both numeric and categorical")
    needed = list(numeric_columns) + list(categorical_columns)
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise DataError(f"{source}: missing column(s) {missing}; "
                        f"available: {list(map(str, frame.columns))}")
    specs: dict[str, Column] = {}
    for name in numeric_columns:
        if name in numeric_bounds:
            lo, hi = (float(b) for b in numeric_bounds[name])
        else:
            v = _numeric_column(frame[name], name, source)
            lo, hi = (float(v.min()), float(v.max())) if v.size else (0.0, 1.0)
        if not (math.isfinite(lo) and math.isfinite(hi) and hi >= lo):
            raise DataError(f"{source}: bad bounds ({lo}, {hi}) for numeric column {name!r}")
        specs[name] = NumericColumn(name, lo, hi)
    for name in categorical_columns:
        if name in categories:
            cats = tuple(str(v).strip() for v in categories[name])
        else:
            col = frame[name]
            if col.isna().any():
                r = int(np.flatnonzero(col.isna().to_numpy())[0])
                raise DataError(f"{source}: column {name!r} has a missing value at row {r}; "
                                f"drop it or map it to its own category first")
            cats = tuple(sorted(col.astype(str).str.strip().unique()))
        if len(set(cats)) != len(cats):
            raise DataError(f"{source}: duplicate categories for column {name!r}")
        specs[name] = CategoricalColumn(name, cats)
    order = list(column_order) if column_order is not None else needed
    if sorted(order) != sorted(needed):
        raise DataError(f"{source}: column_order {order} must list exactly the columns {needed}")
    pre = Preprocessor(tuple(specs[c] for c in order), numeric_scaling, 1.0, handle_unknown)
    if isinstance(row_norm, str):
        if row_norm == "max":
            norms = row_norms(pre.encode(frame, source))
            bound = float(norms.max()) if norms.size else 1.0
        elif row_norm == "worst_case":
            bound = pre.worst_case_norm()
        else:
            raise DataError(f"{source}: row_norm must be 'max', 'worst_case' or a number, "
                            f"got {row_norm!r}")
    else:
        bound = float(row_norm)
    if not bound > 0:
        bound = 1.0  # all-zero data: any positive bound keeps it in the ball
    return Preprocessor(pre.columns, numeric_scaling, bound, handle_unknown)


def encode_classes(values: Any, classes: Sequence[Any], source: str = "labels") -> np.ndarray:
    """Map class values to int64 codes 0..K-1 following the *public* order ``classes``.

    An explicit list is required (not the sorted values present) because each party must use
    the same mapping even when its share lacks some classes.
    """
    s = pd.Series(np.asarray(values, dtype=object).ravel()).astype(str).str.strip()
    cats = [str(c).strip() for c in classes]
    codes = pd.Index(cats).get_indexer(s).astype(np.int64)
    bad = codes < 0
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise DataError(f"{source}: row {r} has label {s.iloc[r]!r}, not among classes {cats}")
    return codes
