"""The data schema: a public file every member of a consortium holds, saying how raw rows become
the features and labels a private model is trained on.

Why the product owns this: every sensitivity the privacy plan states assumes ‖x‖₂ ≤ 1 (and
|y| ≤ 1 for a regression), so the scaling, one-hot encoding, label mapping and row-norm rule are
part of the privacy guarantee. They must be *public constants* the members agreed on (a
documented range, not the minimum of one party's private column), identical at every party, and
applied by the daemon itself before any gradient is taken. A schema is that agreement; its
``digest`` is compared by every member before a share moves, and a job may pin it
(``job.schema_sha256``). A model bundle carries the schema, so ``predict`` applies the same
mapping to new rows.

A schema file (TOML; the full reference is docs/how-to/write-a-schema.md)::

    intercept = true                 # a constant feature 1 (the model's bias)
    missing = "error"                # or "drop" (leave the row out) or "fill" (each column's `fill`)
    row_norm = "worst_case"          # or a number: rows are divided by it, then clipped to norm 1
    scaling = "minmax"               # numeric [low, high] -> [0, 1]; "maxabs" -> [-1, 1]
    unknown_category = "ignore"      # an unlisted category encodes as all zeros; "error" refuses

    [label]
    column = "diagnosis"
    task = "binary"                  # or "multiclass" (with `classes`) or "regression" (`low`, `high`)
    positive = "malignant"
    negative = "benign"

    [[columns]]
    name = "radius_mean"
    type = "numeric"
    low = 5.0                        # public bounds: values outside are clipped to them
    high = 30.0

    [[columns]]
    name = "region"
    type = "categorical"
    categories = ["north", "south"]

Columns of a file that the schema does not list are ignored (an id column, a free-text note), and
the file's column order does not matter: columns are found by name.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .dataset import DataError, Dataset, Task
from .files import DEFAULT_MAX_BYTES, check_file, check_size, open_limited
from .preprocess import (
    CategoricalColumn,
    NumericColumn,
    Preprocessor,
    binary_labels,
    clip_to_unit_ball,
    encode_classes,
    scale_regression_labels,
)

__all__ = ["SCHEMA_FORMAT", "DataSchema", "LabelSpec", "SchemaColumn", "load_schema", "read_csv_with_schema"]

SCHEMA_FORMAT = "mpc-erm-schema/1"
INTERCEPT = "intercept"
#: Cells read as missing (pandas' defaults less "NA"/"None", which can be real categories; "?" as
#: in the UCI files).
MISSING_CELLS = ("", "?", "nan", "NaN", "NULL", "null", "#N/A", "N/A", "n/a")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SchemaColumn(_Strict):
    """One input column: numeric with public bounds, or categorical with its public categories."""

    name: str = Field(min_length=1, max_length=256)
    type: Literal["numeric", "categorical"]
    low: float | None = Field(None, allow_inf_nan=False)
    high: float | None = Field(None, allow_inf_nan=False)
    categories: tuple[str, ...] | None = None
    fill: float | str | None = None  # with missing = "fill": the public value a missing cell takes

    @field_validator("low", "high", mode="before")
    @classmethod
    def _float(cls, v: Any) -> Any:
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("categories", mode="before")
    @classmethod
    def _tuple(cls, v: Any) -> Any:
        return tuple(str(c).strip() for c in v) if isinstance(v, list) else v

    @model_validator(mode="after")
    def _by_type(self) -> SchemaColumn:
        if self.type == "numeric":
            if self.low is None or self.high is None:
                raise ValueError("a numeric column needs public bounds `low` and `high` (a documented range, "
                                 "not the minimum and maximum of one party's data)")
            if not self.low < self.high:
                raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
            if self.categories is not None:
                raise ValueError("`categories` is for categorical columns")
            if self.fill is not None and not isinstance(self.fill, int | float):
                raise ValueError(f"fill: a numeric column's fill must be a number, got {self.fill!r}")
        else:
            if not self.categories:
                raise ValueError("a categorical column needs its public list `categories`")
            if len(set(self.categories)) != len(self.categories):
                raise ValueError(f"categories: duplicates in {list(self.categories)}")
            if self.low is not None or self.high is not None:
                raise ValueError("`low`/`high` are for numeric columns")
            if self.fill is not None and str(self.fill) not in self.categories:
                raise ValueError(f"fill: {self.fill!r} is not one of the categories")
        return self

    def describe(self) -> str:
        """One line, e.g. ``age: numeric [0, 120]`` — public, for messages that compare schemas."""
        if self.type == "numeric":
            return f"{self.name}: numeric [{self.low:g}, {self.high:g}]"
        return f"{self.name}: categorical {list(self.categories or ())}"


class LabelSpec(_Strict):
    """The label column and its public mapping onto the task's domain."""

    column: str = Field(min_length=1, max_length=256)
    task: Literal["binary", "multiclass", "regression"]
    positive: str | None = None  # binary: the class mapped to +1
    negative: str | None = None  # binary: the other class (then any third value is refused)
    classes: tuple[str, ...] | None = None  # multiclass: the public order (class k = classes[k])
    low: float | None = Field(None, allow_inf_nan=False)  # regression: public bounds mapped onto [-1, 1]
    high: float | None = Field(None, allow_inf_nan=False)

    @field_validator("positive", "negative", mode="before")
    @classmethod
    def _str(cls, v: Any) -> Any:
        return str(v).strip() if isinstance(v, int | float | bool) or isinstance(v, str) else v

    @field_validator("classes", mode="before")
    @classmethod
    def _tuple(cls, v: Any) -> Any:
        return tuple(str(c).strip() for c in v) if isinstance(v, list) else v

    @field_validator("low", "high", mode="before")
    @classmethod
    def _float(cls, v: Any) -> Any:
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @model_validator(mode="after")
    def _by_task(self) -> LabelSpec:
        given = {k for k in ("positive", "negative", "classes", "low", "high") if getattr(self, k) is not None}
        allowed = {"binary": {"positive", "negative"}, "multiclass": {"classes"}, "regression": {"low", "high"}}
        extra = sorted(given - allowed[self.task])
        if extra:
            raise ValueError(f"{', '.join(extra)}: not used by task {self.task!r} "
                             f"(it takes {', '.join(sorted(allowed[self.task]))})")
        if self.task == "binary":
            if self.positive is None:
                raise ValueError("positive: required for a binary label (the class the model predicts as +1)")
            if self.negative is not None and self.negative == self.positive:
                raise ValueError("negative: must differ from positive")
        elif self.task == "multiclass":
            if not self.classes or len(self.classes) < 2:
                raise ValueError("classes: a multiclass label needs at least 2 classes, in their public order")
            if len(set(self.classes)) != len(self.classes):
                raise ValueError(f"classes: duplicates in {list(self.classes)}")
        else:
            if self.low is None or self.high is None:
                raise ValueError("low, high: a regression label needs public bounds, mapped onto [-1, 1]")
            if not self.low < self.high:
                raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        return self

    @property
    def class_names(self) -> list[str] | None:
        """What a prediction prints: binary [negative, positive], multiclass ``classes``."""
        if self.task == "binary":
            return [self.negative or f"not {self.positive}", str(self.positive)]
        if self.task == "multiclass":
            return list(self.classes or ())
        return None


class DataSchema(_Strict):
    """A parsed schema file (module docstring). Immutable; ``digest`` identifies it."""

    format: Literal["mpc-erm-schema/1"] = SCHEMA_FORMAT
    name: str | None = Field(None, max_length=128)
    intercept: bool = False
    missing: Literal["error", "drop", "fill"] = "error"
    row_norm: Literal["worst_case"] | float = "worst_case"
    scaling: Literal["minmax", "maxabs"] = "minmax"
    unknown_category: Literal["ignore", "error"] = "ignore"
    label: LabelSpec
    columns: tuple[SchemaColumn, ...] = Field(min_length=1, max_length=100_000)

    @field_validator("row_norm", mode="before")
    @classmethod
    def _norm(cls, v: Any) -> Any:
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("columns", mode="before")
    @classmethod
    def _cols(cls, v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v

    @model_validator(mode="after")
    def _consistent(self) -> DataSchema:
        names = [c.name for c in self.columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"columns: listed twice: {', '.join(dup)}")
        if self.label.column in names:
            raise ValueError(f"label.column: {self.label.column!r} is also a feature column")
        if isinstance(self.row_norm, float) and not (self.row_norm > 0 and math.isfinite(self.row_norm)):
            raise ValueError(f"row_norm: must be 'worst_case' or a positive number, got {self.row_norm}")
        if self.missing == "fill":
            lacking = [c.name for c in self.columns if c.fill is None]
            if lacking:
                raise ValueError(f"missing = 'fill' needs a public `fill` for every column; none for: "
                                 f"{', '.join(lacking[:10])}")
        if self.intercept and INTERCEPT in names:
            raise ValueError(f"intercept: a column is already named {INTERCEPT!r}")
        return self

    # ------------------------------------------------------------------ identity

    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON-able form (what a model bundle stores, what ``digest`` hashes)."""
        return self.model_dump(mode="json", exclude_none=True)

    def digest(self) -> str:
        """sha256 of the canonical form: two files that parse to the same schema (comments, key
        order, 1 vs 1.0) have the same digest; any change of meaning changes it."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    @property
    def task(self) -> Task:
        return self.label.task

    @property
    def n_classes(self) -> int | None:
        return {"binary": 2, "multiclass": len(self.label.classes or ()), "regression": None}[self.label.task]

    @cached_property
    def preprocessor(self) -> Preprocessor:
        """The encoder (one-hot, scaling to public bounds, row norm) of :mod:`.preprocess`."""
        cols = tuple(NumericColumn(c.name, float(c.low), float(c.high)) if c.type == "numeric"  # type: ignore[arg-type]
                     else CategoricalColumn(c.name, tuple(c.categories or ())) for c in self.columns)
        attributes = len(cols) + (1 if self.intercept else 0)
        bound = math.sqrt(attributes) if self.row_norm == "worst_case" else float(self.row_norm)
        return Preprocessor(cols, self.scaling, bound, self.unknown_category)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self.preprocessor.feature_names + ((INTERCEPT,) if self.intercept else ())

    @property
    def n_features(self) -> int:
        return len(self.feature_names)

    def describe_columns(self) -> list[str]:
        """One public line per column, the label and the rules: what members compare on a mismatch."""
        lines = [c.describe() for c in self.columns]
        lab = self.label
        if lab.task == "binary":
            extra = f"positive {lab.positive!r}, negative {lab.negative!r}"
        elif lab.task == "multiclass":
            extra = f"classes {list(lab.classes or ())}"
        else:
            extra = f"[{lab.low:g}, {lab.high:g}]"
        lines.append(f"label {lab.column}: {lab.task} {extra}")
        lines.append(f"rules: intercept={self.intercept}, missing={self.missing}, row_norm={self.row_norm}, "
                     f"scaling={self.scaling}, unknown_category={self.unknown_category}")
        return lines

    # ------------------------------------------------------------------ applying it

    def prepare(self, frame: pd.DataFrame, source: str, *, with_label: bool = True,
                row_offset: int = 1) -> tuple[pd.DataFrame, np.ndarray]:
        """The frame's schema columns after the missing-value rule, and the kept rows' positions.

        Raises naming the column (and row) when a column is absent or, under ``missing = "error"``,
        a cell is empty."""
        need = [c.name for c in self.columns] + ([self.label.column] if with_label else [])
        absent = [c for c in need if c not in frame.columns]
        if absent:
            have = ", ".join(map(str, list(frame.columns)[:30]))
            raise DataError(f"{source}: column(s) {', '.join(map(repr, absent))} required by the schema are "
                            f"missing (columns found: {have})")
        sub = frame[need].copy()
        blank = sub.isna() | sub.astype(str).apply(lambda s: s.str.strip()).isin(MISSING_CELLS)
        if with_label and blank[self.label.column].any():
            r = int(np.flatnonzero(blank[self.label.column].to_numpy())[0])
            raise DataError(f"{source}: label column {self.label.column!r} is empty at row {r + row_offset} "
                            "(a row without a label cannot be used; remove it)")
        feats = [c.name for c in self.columns]
        holes = blank[feats].to_numpy()
        keep = np.arange(len(sub))
        if holes.any():
            if self.missing == "error":
                r, j = (int(v) for v in np.argwhere(holes)[0])
                raise DataError(f"{source}: column {feats[j]!r} is empty at row {r + row_offset} "
                                "(the schema says missing = \"error\"; \"drop\" leaves such rows out, "
                                "\"fill\" uses each column's public `fill`)")
            if self.missing == "drop":
                keep = np.flatnonzero(~holes.any(axis=1))
                sub = sub.iloc[keep]
            else:
                for j, c in enumerate(self.columns):
                    if holes[:, j].any():
                        sub.loc[holes[:, j], c.name] = str(c.fill)
        return sub.reset_index(drop=True), keep

    def features(self, frame: pd.DataFrame, source: str = "rows", *, row_offset: int = 1) -> np.ndarray:
        """The model's inputs: every row scaled, encoded, with the intercept, in the unit ball.

        Values outside a column's public bounds are clipped to them; the row is divided by the
        public row norm and clipped to norm 1 (never by a norm computed from the data)."""
        pre = self.preprocessor
        X = pre.transform(frame, source, row_offset=row_offset)
        if self.intercept:  # (a row norm rule below the worst case: clip again with the intercept in)
            X = clip_to_unit_ball(np.hstack([X, np.full((X.shape[0], 1), 1.0 / pre.norm_bound)]), copy=False)
        return X

    def labels(self, values: Any, source: str = "rows", *, row_offset: int = 1) -> np.ndarray:
        """Label cells onto the task's domain: binary ±1, multiclass 0..K−1, regression [-1, 1]."""
        lab = self.label
        s = pd.Series(np.asarray(values, dtype=object)).astype(str).str.strip()
        if lab.task == "binary":
            if lab.negative is not None:
                bad = ~s.isin([lab.positive, lab.negative])
                if bad.any():
                    r = int(np.flatnonzero(bad.to_numpy())[0])
                    raise DataError(f"{source}: label {lab.column!r} at row {r + row_offset} is {s.iloc[r]!r}, "
                                    f"neither positive {lab.positive!r} nor negative {lab.negative!r}")
            return binary_labels(s.to_numpy(), lab.positive, source)
        if lab.task == "multiclass":
            bad = ~s.isin(list(lab.classes or ()))
            if bad.any():
                r = int(np.flatnonzero(bad.to_numpy())[0])
                raise DataError(f"{source}: label {lab.column!r} at row {r + row_offset} is {s.iloc[r]!r}, not "
                                f"one of the schema's classes {list(lab.classes or ())}")
            return encode_classes(s.to_numpy(), lab.classes or (), source)
        num = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(num)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise DataError(f"{source}: label {lab.column!r} at row {r + row_offset} is not a number: {s.iloc[r]!r}")
        return scale_regression_labels(num, float(lab.low), float(lab.high))  # type: ignore[arg-type]

    def dataset(self, frame: pd.DataFrame, source: str = "rows", name: str | None = None) -> Dataset:
        """A raw frame (a CSV's rows) as the Dataset every protocol trains on."""
        sub, _ = self.prepare(frame, source)
        if len(sub) == 0:
            raise DataError(f"{source}: no rows left (every row had a missing value and missing = \"drop\")")
        X = self.features(sub, source)
        y = self.labels(sub[self.label.column], source)
        return Dataset(X, y, self.task, name or source, self.feature_names, self.n_classes)

    def decode(self, y: np.ndarray) -> np.ndarray:
        """Model outputs back to the user's labels: ±1 or class indices to class names, a
        regression's [-1, 1] back to the label's units."""
        lab = self.label
        y = np.asarray(y)
        if lab.task == "binary":
            neg, pos = self.label.class_names or ["", ""]
            return np.where(y > 0, pos, neg).astype(object)
        if lab.task == "multiclass":
            return np.asarray(lab.classes, dtype=object)[y.astype(np.int64)]
        low, high = float(lab.low), float(lab.high)  # type: ignore[arg-type]
        return low + (np.clip(y.astype(np.float64), -1.0, 1.0) + 1.0) * (high - low) / 2.0


def _problems(exc: ValidationError) -> str:
    out = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-after"))
        msg = str(e["msg"]).removeprefix("Value error, ")
        out.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(out)


def schema_from_mapping(data: Mapping[str, Any], source: str = "schema") -> DataSchema:
    """Validate a parsed schema (a TOML table or a bundle's JSON); errors name the field."""
    try:
        return DataSchema.model_validate(dict(data))
    except ValidationError as exc:
        raise DataError(f"{source}: {_problems(exc)}") from None


def load_schema(path: str | os.PathLike[str]) -> DataSchema:
    """Read a schema file (TOML, or JSON when it ends in .json); errors name the file and field."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{p}: cannot read the schema: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise DataError(f"{p}: not a text file") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise DataError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'TOML'}: {exc}") from None
    return schema_from_mapping(data, str(p))


def read_table(path: str | os.PathLike[str], *, max_bytes: int | None = None,
               columns: Sequence[str] | None = None) -> pd.DataFrame:
    """A CSV file (optionally gzip) as text cells, refused over ``max_bytes`` before it is read.

    Every cell is read as a string: the schema decides what is numeric, so a ZIP code or a
    category "1" keeps its spelling, and numbers are parsed (with the row named) by the schema."""
    p = check_file(path)
    limit = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    if p.stat().st_size == 0:
        raise DataError(f"{p}: file is empty")
    check_size(p, limit)
    with open_limited(p, limit) as stream:
        try:
            frame = pd.read_csv(stream, dtype=str, keep_default_na=False, skipinitialspace=True,
                                usecols=(lambda c: str(c).strip() in set(columns)) if columns is not None else None,
                                encoding="utf-8")
        except pd.errors.EmptyDataError:
            raise DataError(f"{p}: file is empty (no header or data)") from None
        except pd.errors.ParserError as exc:
            raise DataError(f"{p}: malformed row (wrong number of fields?): {exc}") from None
        except UnicodeDecodeError as exc:
            raise DataError(f"{p}: not a UTF-8 text file ({exc})") from None
        except (EOFError, OSError) as exc:
            raise DataError(f"{p}: cannot read: {exc}") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    dup = sorted({c for c in frame.columns if list(frame.columns).count(c) > 1})
    if dup:
        raise DataError(f"{p}: duplicate column name(s) {', '.join(dup)} in the header")
    return frame


def read_csv_with_schema(path: str | os.PathLike[str], schema: DataSchema, *, max_bytes: int | None = None,
                         name: str | None = None) -> Dataset:
    """A party's CSV file through its schema: the Dataset its gradients see."""
    frame = read_table(path, max_bytes=max_bytes)
    return schema.dataset(frame, str(path), name=name or Path(path).name)
