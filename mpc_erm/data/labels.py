"""Label cells of a party's file into the task's domain, refusing anything ambiguous.

binary: ±1; multiclass: integers 0..K−1; regression: numbers in [−1, 1]. Nothing is coerced
silently: a missing cell, a label outside the domain or an ambiguous spelling raises a
``DataError`` naming the file and the row (or line).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from .dataset import MAX_CLASSES, TASKS, DataError, Task
from .files import quote_cell
from .preprocess import binary_labels, encode_classes, scale_regression_labels

__all__ = ["NA_VALUES", "check_task", "labels_for_task"]


#: Cell spellings read as "missing" (and therefore rejected in feature/label columns).
NA_VALUES = ("", "?", "NA", "N/A", "NaN", "nan", "NULL", "null", "None", "#N/A")


def check_task(task: str, source: str) -> Task:
    """``task`` if it is one of :data:`~.dataset.TASKS`, else a DataError naming ``source``."""
    if task not in TASKS:
        raise DataError(f"{source}: task must be one of {TASKS}, got {task!r}")
    return task  # type: ignore[return-value]


def _fmt_values(values: Sequence[Any], limit: int = 10) -> str:
    vals = list(values)
    shown = ", ".join(quote_cell(v) for v in vals[:limit])
    return f"[{shown}{', ...' if len(vals) > limit else ''}] ({len(vals)} distinct)"


def _numeric_labels(raw: np.ndarray) -> np.ndarray | None:
    """Float view of label cells when all are numeric, else None."""
    v = pd.to_numeric(pd.Series(raw), errors="coerce").to_numpy(dtype=np.float64)
    return None if np.isnan(v).any() else v


def labels_for_task(
    raw: np.ndarray,
    task: Task,
    source: str,
    *,
    positive_label: Any = None,
    classes: Sequence[Any] | None = None,
    label_bounds: tuple[float, float] | None = None,
    row_offset: int = 0,
    unit: str = "row",
) -> tuple[np.ndarray, int | None]:
    """Convert raw label cells to the task's domain, refusing anything ambiguous.

    binary: ``positive_label`` -> +1, the rest -1; without it the values must already be a
    subset of {-1, +1}, {0, 1} or {False, True}.  multiclass: integers 0..K-1, or ``classes``
    giving the public order.  regression: numbers in [-1, 1], or ``label_bounds`` = public
    (low, high) mapped onto [-1, 1].  ``row_offset``/``unit`` make row numbers match the file.
    """
    raw = np.asarray(raw, dtype=object)
    s = pd.Series(raw).astype(str).str.strip()
    missing = pd.Series(raw).isna().to_numpy() | s.isin(NA_VALUES).to_numpy()
    if missing.any():
        r = int(np.flatnonzero(missing)[0])
        raise DataError(f"{source}: label is missing at {unit} {r + row_offset}")
    if task == "binary":
        if positive_label is not None:
            if not (s == str(positive_label).strip()).any():
                raise DataError(f"{source}: positive_label {positive_label!r} never occurs in "
                                f"the labels; values found: {_fmt_values(sorted(s.unique()))}")
            return binary_labels(raw, positive_label), 2
        uniq = sorted(s.unique())
        lowered = {u.lower() for u in uniq}
        num = _numeric_labels(raw)
        if num is not None and set(np.unique(num)) <= {-1.0, 1.0}:
            return num, 2
        if num is not None and set(np.unique(num)) <= {0.0, 1.0}:
            return np.where(num == 1.0, 1.0, -1.0), 2
        if lowered <= {"true", "false"}:
            return np.where(s.str.lower() == "true", 1.0, -1.0), 2
        raise DataError(f"{source}: binary labels must be -1/+1, 0/1 or true/false unless "
                        f"positive_label is given; values found: {_fmt_values(uniq)}")
    if task == "multiclass":
        if classes is not None:
            return encode_classes(raw, classes, source), len(classes)
        num = pd.to_numeric(pd.Series(raw), errors="coerce").to_numpy(dtype=np.float64)
        bad = np.isnan(num) | (num != np.round(num)) | (num < 0)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise DataError(f"{source}: multiclass labels must be integers 0..K-1 unless "
                            f"classes= gives their order; {unit} {r + row_offset} has "
                            f"{quote_cell(s.iloc[r])}")
        big = num >= MAX_CLASSES
        if big.any():
            r = int(np.flatnonzero(big)[0])
            raise DataError(f"{source}: multiclass label at {unit} {r + row_offset} is {quote_cell(s.iloc[r])}; "
                            f"at most {MAX_CLASSES:,} classes (0..{MAX_CLASSES - 1}) are supported")
        y = num.astype(np.int64)
        k = int(y.max()) + 1 if y.size else 0
        if k < 2:
            raise DataError(f"{source}: multiclass needs at least 2 classes, labels go 0..{k - 1}")
        return y, k
    num = _numeric_labels(raw)
    if num is None:
        r = int(np.flatnonzero(pd.to_numeric(pd.Series(raw), errors="coerce").isna())[0])
        raise DataError(f"{source}: regression label at {unit} {r + row_offset} is not a "
                        f"number: {s.iloc[r]!r}")
    bad = ~np.isfinite(num)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise DataError(f"{source}: regression label at {unit} {r + row_offset} is not finite")
    if label_bounds is not None:
        return scale_regression_labels(num, *label_bounds), None
    out = np.abs(num) > 1.0
    if out.any():
        r = int(np.flatnonzero(out)[0])
        raise DataError(f"{source}: regression labels must lie in [-1, 1] (pass public "
                        f"label_bounds=(low, high) to rescale); {unit} {r + row_offset} has "
                        f"{num[r].item()!r}")
    return num, None
