"""Delimited text (CSV, optionally gzip) into a Dataset: :func:`load_csv`.

Every failure is a ``DataError`` naming the file and the column or row/line at fault, because a
party operator must be able to fix their export without reading our code. Missing cells,
non-numeric cells in numeric columns, duplicate header names and mis-shaped rows all raise; the
dense matrix is refused once it would pass ``max_cells`` (checked as rows arrive).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .dataset import DataError, Dataset, Task
from .files import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_CELLS,
    MAX_LINE_BYTES,
    check_file,
    check_size,
    line_too_long,
    open_limited,
    quote_cell,
)
from .labels import NA_VALUES, check_task, labels_for_task
from .preprocess import NumericColumn, Preprocessor

__all__ = ["load_csv"]


def _resolve_columns(
    available: list[Any], label_column: Any, feature_columns: Sequence[Any] | None,
    categorical_columns: Sequence[Any], source: str,
) -> list[Any]:
    shown = [str(c) for c in available]
    if label_column not in available:
        raise DataError(f"{source}: label column {label_column!r} not found; available "
                        f"columns: {shown}")
    if feature_columns is None:
        feats = [c for c in available if c != label_column]
    else:
        feats = list(feature_columns)
        missing = [c for c in feats if c not in available]
        if missing:
            raise DataError(f"{source}: feature column(s) {missing} not found; available "
                            f"columns: {shown}")
    if label_column in feats:
        raise DataError(f"{source}: label column {label_column!r} is also a feature column")
    bad_cat = [c for c in categorical_columns if c not in feats]
    if bad_cat:
        raise DataError(f"{source}: categorical column(s) {bad_cat} are not feature columns; "
                        f"feature columns: {[str(c) for c in feats]}")
    if not feats:
        raise DataError(f"{source}: no feature columns besides the label {label_column!r}")
    return feats


def _check_range(v: np.ndarray, c: Any, feature_range: tuple[float, float] | None, source: str,
                 row0: int, line0: int) -> None:
    """Refuse a value outside the declared public range, naming column and row."""
    if feature_range is None:
        return
    low, high = feature_range
    out = (v < low) | (v > high)
    if out.any():
        r = int(np.flatnonzero(out)[0])
        raise DataError(f"{source}: value {v[r].item()!r} in column {c!r} at row {row0 + r} (line {line0 + r}) "
                        f"is outside the declared feature range [{low:g}, {high:g}]")


def _check_numeric_chunk(chunk: pd.DataFrame, cols: list[Any], source: str,
                         row0: int, line0: int,
                         feature_range: tuple[float, float] | None = None) -> np.ndarray:
    """Numeric block of a chunk as float64, naming the column and row of the first bad cell."""
    out = np.empty((len(chunk), len(cols)), dtype=np.float64)
    for j, c in enumerate(cols):
        col = chunk[c]
        if pd.api.types.is_bool_dtype(col.dtype):
            v = col.to_numpy(dtype=np.float64)
        elif pd.api.types.is_numeric_dtype(col.dtype):
            v = col.to_numpy(dtype=np.float64, na_value=np.nan)
        else:
            v = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            nonnum = np.isnan(v) & col.notna().to_numpy()
            if nonnum.any():
                r = int(np.flatnonzero(nonnum)[0])
                raise DataError(f"{source}: non-numeric value {quote_cell(col.iloc[r])} in numeric column "
                                f"{c!r} at row {row0 + r} (line {line0 + r}); declare it in "
                                f"categorical_columns if it is categorical")
        bad = ~np.isfinite(v)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            what = "missing (NaN/empty)" if np.isnan(v[r]) else f"infinite ({v[r]})"
            raise DataError(f"{source}: {what} value in column {c!r} at row {row0 + r} "
                            f"(line {line0 + r})")
        _check_range(v, c, feature_range, source, row0, line0)
        out[:, j] = v
    return out


def _first_line(path: Path, max_bytes: int | None) -> str:
    """The first non-blank line (at most MAX_LINE_BYTES), decoded; '' for a blank file."""
    try:
        with open_limited(path, max_bytes) as f:
            for _ in range(1000):  # blank lines before the header (pandas skips them too)
                raw = f.readline(MAX_LINE_BYTES + 1)
                if len(raw) > MAX_LINE_BYTES:
                    raise line_too_long(str(path), 1)
                if not raw or raw.strip():
                    return raw.decode("utf-8")
    except (UnicodeDecodeError, OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read as text ({e})") from None
    return ""


def _check_header(path: Path, delimiter: str, header: bool, max_bytes: int | None) -> int:
    """The number of columns of the first line; rejects duplicate header names, which pandas
    would silently rename to 'a.1'."""
    import csv

    first = _first_line(path, max_bytes)
    if not first.strip():
        return 0
    if len(delimiter) != 1:
        return len(first.split())
    names = [c.strip() for c in next(csv.reader([first], delimiter=delimiter))]
    if header:
        counts = pd.Series(names).value_counts()
        dup = sorted(counts[counts > 1].index)
        if dup:
            shown = ", ".join(quote_cell(d) for d in dup[:10])
            raise DataError(f"{path}: duplicate column name(s) {shown} in the header")
    return len(names)


def load_csv(
    path: str | os.PathLike[str],
    label_column: Any,
    feature_columns: Sequence[Any] | None = None,
    categorical_columns: Sequence[Any] = (),
    *,
    task: str,
    positive_label: Any = None,
    delimiter: str = ",",
    header: bool = True,
    classes: Sequence[Any] | None = None,
    label_bounds: tuple[float, float] | None = None,
    preprocessor: Preprocessor | None = None,
    name: str | None = None,
    chunksize: int = 200_000,
    max_cells: int = DEFAULT_MAX_CELLS,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    feature_range: tuple[float, float] | None = None,
) -> Dataset:
    """Load a delimited text file (optionally gzip) into a Dataset.

    With ``header=False`` columns are the integers 0..k-1.  Categorical columns are one-hot
    encoded with the categories found in this file (sorted); a party in a federation should
    instead pass the agreed public ``preprocessor`` so that every party gets the same columns
    (the preprocessor then also scales rows into the unit ball).  Rows are numbered from 1
    (the first data row); "line" counts the header too (blank lines are skipped and not
    counted).  The file is read in chunks of
    ``chunksize`` rows and refused once the dense matrix would exceed ``max_cells`` cells; a
    file over ``max_bytes`` (on disk or decompressed) is refused, and values outside a public
    ``feature_range`` = (low, high) are refused naming column and row.
    """
    p = check_file(path)
    source = str(p)
    task = check_task(task, source)
    if p.stat().st_size == 0:
        raise DataError(f"{source}: file is empty")
    check_size(p, max_bytes)
    if len(delimiter) != 1 and delimiter not in ("\\s+",):
        raise DataError(f"{source}: delimiter must be one character, got {delimiter!r}")
    categorical_columns = list(categorical_columns)
    columns = _check_header(p, delimiter, header, max_bytes)
    if columns > max_cells:
        raise DataError(f"{source}: {columns:,} columns would not fit max_cells={max_cells:,}")
    # rows per chunk so that one chunk stays far below max_cells, whatever the width
    chunksize = max(1, min(chunksize, max_cells // max(columns, 1), (64 << 20) // max(columns, 1)))
    if preprocessor is not None and categorical_columns:
        raise DataError(f"{source}: pass either categorical_columns or a preprocessor, not both")
    stream = open_limited(p, max_bytes)
    try:
        reader = pd.read_csv(
            stream, sep=delimiter, header=0 if header else None, chunksize=chunksize,
            na_values=list(NA_VALUES), encoding="utf-8",
            keep_default_na=True, skipinitialspace=True, low_memory=False,
        )
    except pd.errors.EmptyDataError:
        stream.close()
        raise DataError(f"{source}: file is empty (no header or data)") from None
    except (OSError, EOFError, UnicodeDecodeError, pd.errors.ParserError) as e:
        stream.close()
        raise DataError(f"{source}: cannot parse as delimited text: {e}") from None
    except DataError:
        stream.close()
        raise
    with stream:
        return _read_csv_chunks(reader, source, p, label_column, feature_columns, categorical_columns,
                                task=task, positive_label=positive_label, header=header, classes=classes,
                                label_bounds=label_bounds, preprocessor=preprocessor, name=name,
                                max_cells=max_cells, feature_range=feature_range)


def _read_csv_chunks(reader: Any, source: str, p: Path, label_column: Any, feature_columns: Sequence[Any] | None,
                     categorical_columns: list[Any], *, task: Task, positive_label: Any, header: bool,
                     classes: Sequence[Any] | None, label_bounds: tuple[float, float] | None,
                     preprocessor: Preprocessor | None, name: str | None, max_cells: int,
                     feature_range: tuple[float, float] | None) -> Dataset:

    feats: list[Any] | None = None
    width = 0
    numeric_cols: list[Any] = []
    num_blocks: list[np.ndarray] = []
    cat_blocks: list[pd.DataFrame] = []
    raw_frames: list[pd.DataFrame] = []
    labels: list[np.ndarray] = []
    n_rows = 0
    line0 = 2 if header else 1
    try:
        for chunk in reader:
            if feats is None:
                if header:
                    chunk.columns = [str(c).strip() for c in chunk.columns]
                dup = chunk.columns[chunk.columns.duplicated()].tolist()
                if dup:
                    raise DataError(f"{source}: duplicate column name(s) {dup}")
                available = list(chunk.columns)
                if preprocessor is not None:
                    feature_columns = list(preprocessor.input_columns)
                feats = _resolve_columns(available, label_column, feature_columns,
                                         categorical_columns, source)
                numeric_cols = [c for c in feats if c not in categorical_columns]
                width = preprocessor.n_features if preprocessor is not None else len(feats)
            elif header:
                chunk.columns = [str(c).strip() for c in chunk.columns]
            row0 = n_rows + 1
            if (n_rows + len(chunk)) * max(width, 1) > max_cells:
                raise DataError(f"{source}: more than {max_cells:,} cells ({n_rows + len(chunk):,}"
                                f"+ rows x {width} columns) would not fit a dense matrix; split "
                                f"the file or raise max_cells deliberately")
            labels.append(chunk[label_column].to_numpy(dtype=object))
            if preprocessor is not None:
                # Validate numeric columns with row numbers before the preprocessor sees them.
                nums = [c.name for c in preprocessor.columns if isinstance(c, NumericColumn)]
                _check_numeric_chunk(chunk, nums, source, row0, line0 + n_rows, feature_range)
                raw_frames.append(chunk[feats].reset_index(drop=True))
            else:
                num_blocks.append(_check_numeric_chunk(chunk, numeric_cols, source, row0,
                                                       line0 + n_rows, feature_range))
                if categorical_columns:
                    cat = chunk[categorical_columns]
                    na = cat.isna().to_numpy()
                    if na.any():
                        r, j = np.argwhere(na)[0]
                        raise DataError(f"{source}: missing value in categorical column "
                                        f"{categorical_columns[j]!r} at row {row0 + r} "
                                        f"(line {line0 + n_rows + r})")
                    cat_blocks.append(cat.astype(str).apply(lambda s: s.str.strip()))
            n_rows += len(chunk)
    except pd.errors.EmptyDataError:
        raise DataError(f"{source}: file is empty (no header or data)") from None
    except pd.errors.ParserError as e:
        raise DataError(f"{source}: malformed row (wrong number of fields?): {e}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{source}: not a text file ({e})") from None
    except (EOFError, gzip.BadGzipFile, OSError) as e:  # a truncated or corrupt gzip stream
        raise DataError(f"{source}: cannot read: {e}") from None

    if feats is None or n_rows == 0:
        raise DataError(f"{source}: no data rows")
    y, k = labels_for_task(np.concatenate(labels), task, source, positive_label=positive_label,
                           classes=classes, label_bounds=label_bounds, row_offset=1)
    if preprocessor is not None:
        frame = pd.concat(raw_frames, ignore_index=True)
        X = preprocessor.transform(frame, source, row_offset=1)
        names: tuple[str, ...] = preprocessor.feature_names
    else:
        Xn = np.concatenate(num_blocks) if num_blocks else np.empty((n_rows, 0))
        parts = [Xn]
        cat_names: list[str] = []
        if categorical_columns:
            cats = pd.concat(cat_blocks, ignore_index=True)
            for c in categorical_columns:
                values = sorted(cats[c].unique())
                codes = pd.Index(values).get_indexer(cats[c])
                onehot = np.zeros((n_rows, len(values)))
                onehot[np.arange(n_rows), codes] = 1.0
                parts.append(onehot)
                cat_names.extend(f"{c}={v}" for v in values)
        X = np.hstack(parts)
        names = tuple(str(c) for c in numeric_cols) + tuple(cat_names)
    return Dataset(X=X, y=y, task=task, name=name or p.name, feature_names=names,
                   n_classes=k if task == "multiclass" else None)
