"""Loaders for data a user (a party) brings: CSV, LIBSVM/svmlight, NumPy.

Every failure is a ``DataError`` naming the file and the column or row/line at fault, because a
party operator must be able to fix their export without reading our code.  Nothing is coerced
silently: missing cells, non-numeric cells, labels outside the task's domain and mis-shaped
files all raise.

Memory is bounded by the input, never by what a file claims: a file larger than ``max_bytes``
is refused before a byte is read (``stat``), a gzip file that inflates past ``max_bytes`` is
refused while streaming, a line longer than ``MAX_LINE_BYTES`` is refused, the dense matrix is
refused once it would pass ``max_cells`` (checked as rows arrive, and a LIBSVM index is checked
before any allocation), and an .npy/.npz header's shape is checked before numpy allocates it.

Rows are *not* scaled here (use ``preprocess`` or pass a public ``preprocessor``), so
``Dataset.is_unit_ball()`` may be False on what these return.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import math
import os
import threading
import zipfile
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .dataset import MAX_CLASSES, TASKS, DataError, Dataset, Task
from .preprocess import (
    NumericColumn,
    Preprocessor,
    binary_labels,
    encode_classes,
    scale_regression_labels,
)

#: Refuse to build a dense matrix with more cells than this (2.4 GB of float64) instead of
#: exhausting memory half-way; pass ``max_cells`` to raise it deliberately.
DEFAULT_MAX_CELLS = 300_000_000

#: Refuse a file larger than this (on disk, and after gzip decompression) before reading it; a
#: party config's ``datasets.<id>.max_bytes`` (the same default) raises it deliberately.
DEFAULT_MAX_BYTES = 512 << 20

#: Longest line (a CSV row or header, a LIBSVM row) read; a longer one is refused, not buffered.
MAX_LINE_BYTES = 4 << 20

_NPY_MAGIC, _ZIP_MAGIC = b"\x93NUMPY", b"PK\x03\x04"

#: Cell spellings read as "missing" (and therefore rejected in feature/label columns).
NA_VALUES = ("", "?", "NA", "N/A", "NaN", "nan", "NULL", "null", "None", "#N/A")

_GZIP_MAGIC = b"\x1f\x8b"


def _check_file(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: file not found")
    if not p.is_file():
        raise DataError(f"{p}: not a regular file")
    return p


def is_gzip(path: Path) -> bool:
    """Detect gzip by magic bytes, so a compressed file need not end in .gz."""
    with open(path, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


def open_maybe_gzip(path: Path, mode: str = "rb") -> Any:
    """Open ``path`` for reading, decompressing transparently if it is gzip."""
    if is_gzip(path):
        return gzip.open(path, mode)
    return open(path, mode)


def _check_size(p: Path, max_bytes: int | None) -> None:
    """Refuse a file over ``max_bytes`` from its size on disk, before reading any of it; a gzip
    file also by its inflated size, counted in a first pass through a 1 MiB buffer (so a
    1 MB file that inflates to 1 TB is refused in constant memory, before any parsing)."""
    if max_bytes is None:
        return
    size = p.stat().st_size
    if size > max_bytes:
        raise DataError(f"{p}: file is {size:,} bytes, larger than max_bytes={max_bytes:,}; refused "
                        f"before reading (raise max_bytes deliberately for a bigger file)")
    if is_gzip(p):
        try:
            with _open_limited(p, max_bytes) as f:
                while f.read(1 << 20):
                    pass
        except (EOFError, gzip.BadGzipFile, OSError) as e:
            raise DataError(f"{p}: not a readable gzip file ({e})") from None


class _Limited(io.RawIOBase):
    """A binary reader that raises DataError once more than ``limit`` bytes came out of ``f``:
    a gzip file that inflates to gigabytes is stopped while streaming, not after."""

    def __init__(self, f: Any, limit: int | None, source: str) -> None:
        self._f, self._limit, self._source, self._n = f, limit, source, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self._f.readinto(b)
        self._n += n or 0
        if self._limit is not None and self._n > self._limit:
            raise DataError(f"{self._source}: decompresses to more than max_bytes={self._limit:,} bytes; "
                            f"refused while reading (raise max_bytes deliberately for a bigger file)")
        return int(n or 0)

    def close(self) -> None:
        self._f.close()
        super().close()


def _open_limited(p: Path, max_bytes: int | None) -> io.BufferedReader:
    """``p`` as a binary stream (gunzipped if gzip) that never yields more than ``max_bytes``."""
    raw = gzip.open(p, "rb") if is_gzip(p) else open(p, "rb")
    return io.BufferedReader(_Limited(raw, max_bytes, str(p)))


def _line_too_long(source: str, lineno: int) -> DataError:
    return DataError(f"{source}: line {lineno} is longer than {MAX_LINE_BYTES:,} bytes; refused "
                     f"(no table this loader accepts has such rows)")


def _task_arg(task: str, source: str) -> Task:
    if task not in TASKS:
        raise DataError(f"{source}: task must be one of {TASKS}, got {task!r}")
    return task  # type: ignore[return-value]


def _fmt_values(values: Sequence[Any], limit: int = 10) -> str:
    vals = list(values)
    shown = ", ".join(_cell(v) for v in vals[:limit])
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
                            f"{_cell(s.iloc[r])}")
        big = num >= MAX_CLASSES
        if big.any():
            r = int(np.flatnonzero(big)[0])
            raise DataError(f"{source}: multiclass label at {unit} {r + row_offset} is {_cell(s.iloc[r])}; "
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


def _cell(v: Any) -> str:
    """A cell quoted in a message, cut to 60 characters (a 5000-digit cell is not echoed whole)."""
    r = repr(v)
    return r if len(r) <= 60 else f"{r[:60]}…({len(r)} characters)"


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
                raise DataError(f"{source}: non-numeric value {_cell(col.iloc[r])} in numeric column "
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
        with _open_limited(path, max_bytes) as f:
            for _ in range(1000):  # blank lines before the header (pandas skips them too)
                raw = f.readline(MAX_LINE_BYTES + 1)
                if len(raw) > MAX_LINE_BYTES:
                    raise _line_too_long(str(path), 1)
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
            raise DataError(f"{path}: duplicate column name(s) {', '.join(_cell(d) for d in dup[:10])} in the header")
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
    p = _check_file(path)
    source = str(p)
    task = _task_arg(task, source)
    if p.stat().st_size == 0:
        raise DataError(f"{source}: file is empty")
    _check_size(p, max_bytes)
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
    stream = _open_limited(p, max_bytes)
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


def load_libsvm(
    path: str | os.PathLike[str],
    n_features: int | None = None,
    *,
    task: str,
    positive_label: Any = None,
    classes: Sequence[Any] | None = None,
    label_bounds: tuple[float, float] | None = None,
    zero_based: bool = False,
    name: str | None = None,
    max_cells: int = DEFAULT_MAX_CELLS,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    feature_range: tuple[float, float] | None = None,
) -> Dataset:
    """Load a LIBSVM/svmlight file ``label idx:value ...`` (1-based indices) as a dense Dataset.

    ``n_features`` fixes d (needed so that every party's file has the same width even when its
    rows never touch the last features); without it d is the largest index seen.  Comments after
    '#' and blank lines are skipped; query ids, repeated or decreasing indices are errors, each
    naming the line.  The dense n x d matrix is checked against ``max_cells`` as rows arrive
    (an index of 10^9 is refused at its line, not allocated); the non-zeros are kept in typed
    arrays (24 bytes each), so memory stays a small multiple of the file.
    """
    p = _check_file(path)
    source = str(p)
    task = _task_arg(task, source)
    if n_features is not None and (not isinstance(n_features, (int, np.integer))
                                   or n_features < 1):
        raise DataError(f"{source}: n_features must be a positive integer, got {n_features!r}")
    if n_features is not None and n_features > max_cells:
        raise DataError(f"{source}: n_features={n_features:,} exceeds max_cells={max_cells:,}")
    _check_size(p, max_bytes)
    raw_labels: list[str] = []
    lines_of_row = array("q")
    rows, cols, vals = array("q"), array("q"), array("d")
    base = 0 if zero_based else 1
    width = n_features or 0
    try:
        with _open_limited(p, max_bytes) as f:
            lineno = 0
            while True:
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    break
                lineno += 1
                if len(raw) > MAX_LINE_BYTES:
                    raise _line_too_long(source, lineno)
                body = raw.decode("utf-8").split("#", 1)[0].strip()
                if not body:
                    continue
                tokens = body.split()
                r = len(raw_labels)
                raw_labels.append(tokens[0][:64])  # a label is short; a hostile one is not kept whole
                lines_of_row.append(lineno)
                last = -1
                for t in tokens[1:]:
                    idx_s, sep, val_s = t.partition(":")
                    if not sep:
                        raise DataError(f"{source}: line {lineno}: token {t!r} is not "
                                        f"'index:value'")
                    if idx_s == "qid":
                        raise DataError(f"{source}: line {lineno}: query ids (qid) are not "
                                        f"supported")
                    try:
                        j = int(idx_s) - base
                    except ValueError:
                        raise DataError(f"{source}: line {lineno}: feature index {idx_s!r} is "
                                        f"not an integer") from None
                    if j < 0:
                        raise DataError(f"{source}: line {lineno}: feature index {idx_s} below "
                                        f"{base} ({'0' if base else 'negative'}-based indices; "
                                        f"pass zero_based=True for 0-based files)")
                    if j <= last:
                        raise DataError(f"{source}: line {lineno}: feature index {idx_s} is "
                                        f"repeated or not increasing")
                    if n_features is not None and j >= n_features:
                        raise DataError(f"{source}: line {lineno}: feature index {idx_s} "
                                        f"exceeds n_features={n_features}")
                    if j >= width:
                        width = j + 1
                        if (r + 1) * width > max_cells:
                            raise DataError(f"{source}: line {lineno}: feature index {_cell(idx_s)} makes the "
                                            f"dense matrix {r + 1:,} x {width:,}, over max_cells={max_cells:,}; "
                                            "refusing rather than exhausting memory")
                    try:
                        v = float(val_s)
                    except ValueError:
                        raise DataError(f"{source}: line {lineno}: value {val_s!r} of feature "
                                        f"{idx_s} is not a number") from None
                    if not math.isfinite(v):
                        raise DataError(f"{source}: line {lineno}: value of feature {idx_s} is "
                                        f"not finite ({_cell(val_s)})")
                    if feature_range is not None and not feature_range[0] <= v <= feature_range[1]:
                        raise DataError(f"{source}: line {lineno}: value {v!r} of feature {idx_s} is outside "
                                        f"the declared feature range [{feature_range[0]:g}, {feature_range[1]:g}]")
                    last = j
                    rows.append(r)
                    cols.append(j)
                    vals.append(v)
                if (r + 1) * max(width, 1) > max_cells:
                    raise DataError(f"{source}: line {lineno}: dense matrix {r + 1:,} x {width:,} exceeds "
                                    f"max_cells={max_cells:,}; refusing rather than exhausting memory")
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, OSError) as e:
        raise DataError(f"{source}: not a readable LIBSVM text file ({e})") from None
    n = len(raw_labels)
    if n == 0:
        raise DataError(f"{source}: file is empty (no data lines)")
    d = n_features if n_features is not None else width
    if d == 0:
        raise DataError(f"{source}: no features in any line; pass n_features")
    if n * d > max_cells:
        raise DataError(f"{source}: dense matrix {n:,} x {d:,} exceeds max_cells={max_cells:,}; "
                        f"refusing rather than exhausting memory")
    try:
        y, k = labels_for_task(np.array(raw_labels, dtype=object), task, source,
                               positive_label=positive_label, classes=classes,
                               label_bounds=label_bounds)
    except DataError as e:
        raise _relabel_rows_as_lines(e, lines_of_row) from None
    X = np.zeros((n, d), dtype=np.float64)
    X[np.frombuffer(rows, dtype=np.int64), np.frombuffer(cols, dtype=np.int64)] = np.frombuffer(vals)
    if feature_range is not None and not feature_range[0] <= 0.0 <= feature_range[1]:
        raise DataError(f"{source}: absent features are 0, outside the declared feature range "
                        f"[{feature_range[0]:g}, {feature_range[1]:g}]")
    return Dataset(X=X, y=y, task=task, name=name or p.name,
                   feature_names=tuple(f"f{j + base}" for j in range(d)),
                   n_classes=k if task == "multiclass" else None)


def _relabel_rows_as_lines(e: DataError, lines_of_row: Sequence[int]) -> DataError:
    """Turn 'row R' (0-based data row) in a label error into 'line L' of the LIBSVM file."""
    import re

    def sub(m: re.Match[str]) -> str:
        r = int(m.group(1))
        return f"line {lines_of_row[r]}" if 0 <= r < len(lines_of_row) else m.group(0)

    return DataError(re.sub(r"\brow (\d+)", sub, str(e)))


#: Held while numpy reads .npy headers. Why: numpy parses each header with ``ast.literal_eval``,
#: and CPython 3.11 (seen on 3.11.7) keeps the AST constructor's recursion depth in state shared by
#: all threads (python/cpython#106905): two threads parsing at once can fail with "SystemError: AST
#: constructor recursion depth mismatch". Seen with owners loading their .npz files as threads of
#: one process; loads are short, so serialising them costs nothing that matters.
_NPY_HEADER_LOCK = threading.Lock()


def _npy_nbytes(f: Any, where: str) -> int:
    """Bytes of the array an .npy stream declares, read from its header alone (nothing allocated)."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f".npy format version {version} is not supported (1.0 and 2.0 are)")
    except (ValueError, OSError, EOFError, SyntaxError) as e:
        raise DataError(f"{where}: not a valid .npy header ({e})") from None
    if dtype.hasobject:
        raise DataError(f"{where}: object arrays are refused (they would need unpickling)")
    if not shape:
        return int(dtype.itemsize)
    return int(math.prod(int(s) for s in shape)) * int(dtype.itemsize)


def _np_load(path: Path, max_bytes: int | None = DEFAULT_MAX_BYTES) -> Any:
    """np.load that also accepts gzip-compressed .npy/.npz, never unpickling objects, with every
    array's declared size checked against ``max_bytes`` before numpy allocates it."""
    _check_size(path, max_bytes)
    try:
        if is_gzip(path):
            with _open_limited(path, max_bytes) as f:
                data: Any = io.BytesIO(f.read())
        else:
            data = path
        with open(data, "rb") if isinstance(data, Path) else contextlib.nullcontext(data) as f:
            magic = f.read(6)
            f.seek(0)
            if magic == _NPY_MAGIC:
                declared = _npy_nbytes(f, str(path))
                f.seek(0)
            elif magic[:4] == _ZIP_MAGIC:
                with zipfile.ZipFile(f) as z:
                    declared = 0
                    for info in z.infolist():
                        if info.filename.endswith(".npy"):
                            with z.open(info) as member:
                                declared += _npy_nbytes(member, f"{path}[{info.filename}]")
                f.seek(0)
            else:
                raise DataError(f"{path}: not a NumPy .npy/.npz file (starts with {magic!r})")
            if max_bytes is not None and declared > max_bytes:
                raise DataError(f"{path}: its arrays declare {declared:,} bytes, more than max_bytes={max_bytes:,}; "
                                "refused before loading")
        return np.load(data, allow_pickle=False)  # an .npz's arrays are read on access (checked above)
    except DataError:
        raise
    except (ValueError, zipfile.BadZipFile, MemoryError) as e:
        raise DataError(f"{path}: cannot load ({e}; object arrays are refused)") from None
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: not a NumPy .npy/.npz file ({e})") from None


def _infer_task(y: np.ndarray, source: str) -> Task:
    vals = np.unique(y)
    if np.issubdtype(y.dtype, np.floating) and set(vals.tolist()) <= {-1.0, 1.0}:
        return "binary"
    if np.issubdtype(y.dtype, np.integer):
        if set(vals.tolist()) <= {-1, 1}:
            return "binary"
        if vals.size and vals.min() >= 0:
            return "multiclass"
    if np.issubdtype(y.dtype, np.floating):
        return "regression"
    raise DataError(f"{source}: cannot infer the task from y of dtype {y.dtype}; pass task=")


def load_numpy(
    path: str | os.PathLike[str],
    *,
    y_path: str | os.PathLike[str] | None = None,
    task: str | None = None,
    name: str | None = None,
    feature_names: Sequence[str] = (),
    n_classes: int | None = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    feature_range: tuple[float, float] | None = None,
) -> Dataset:
    """Load X and y from an .npz (keys X, y; optional task, feature_names, n_classes), from a
    directory holding X.npy and y.npy, or from X.npy plus ``y_path``; gzip is transparent.

    Labels must already be in the task's domain (NumPy files are typically our own exports).
    Without ``task`` (and no 'task' key) it is inferred: float/int in {-1, 1} -> binary,
    non-negative ints -> multiclass, other floats -> regression.
    """
    p = _check_file(path) if not Path(path).is_dir() else Path(path)
    source = str(p)
    meta: dict[str, Any] = {}
    with _NPY_HEADER_LOCK:  # numpy parses each array's header with ast.literal_eval (see the lock)
        if p.is_dir():
            xp, yp = p / "X.npy", p / "y.npy"
            for q in (xp, yp):
                if not q.exists():
                    raise DataError(f"{q}: file not found (a directory must hold X.npy and y.npy)")
            X, y = _np_load(xp, max_bytes), _np_load(yp, max_bytes)
        else:
            obj = _np_load(p, max_bytes)
            if isinstance(obj, np.lib.npyio.NpzFile):
                with obj:
                    keys = list(obj.files)
                    for k in ("X", "y"):
                        if k not in keys:
                            raise DataError(f"{source}: array {k!r} not in the .npz; found "
                                            f"{[_cell(k) for k in keys[:20]]}")
                    try:
                        X, y = obj["X"], obj["y"]
                        for k in ("task", "feature_names", "n_classes", "name"):
                            if k in keys:
                                meta[k] = obj[k]
                    except (ValueError, OSError, EOFError, zipfile.BadZipFile, MemoryError) as e:
                        raise DataError(f"{source}: cannot load an array of the .npz ({e})") from None
            else:
                if y_path is None:
                    sib = p.with_name(p.name.replace("X", "y", 1)) if "X" in p.name else None
                    if sib is None or not sib.exists():
                        raise DataError(f"{source}: a bare .npy holds only X; pass y_path= (or use "
                                        f"an .npz with X and y)")
                    y_path = sib
                X, y = obj, _np_load(_check_file(y_path), max_bytes)
    if not isinstance(X, np.ndarray) or not isinstance(y, np.ndarray):
        raise DataError(f"{source}: expected arrays X and y")
    if X.ndim in (3, 4):  # images (n, H, W) or (n, C, H, W): one flat row each, row-major
        X = X.reshape(X.shape[0], -1)
    if X.ndim != 2:
        raise DataError(f"{source}: X must be 2-D (n, d), got shape {X.shape} (images: (n, H, W) or (n, C, H, W))")
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise DataError(f"{source}: y must have shape ({X.shape[0]},) to match X, got {y.shape}")
    if X.shape[0] == 0:
        raise DataError(f"{source}: no rows")
    if X.shape[1] == 0:
        raise DataError(f"{source}: X has no feature columns (shape {X.shape})")
    if not (np.issubdtype(X.dtype, np.integer) or np.issubdtype(X.dtype, np.floating) or X.dtype == np.bool_):
        raise DataError(f"{source}: X must be real numbers (bool, int or float), got dtype {X.dtype}")
    Xf = X.astype(np.float64, copy=False)
    bad = ~np.isfinite(Xf)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise DataError(f"{source}: X has a non-finite value at row {r}, column {c}")
    if feature_range is not None:
        out = (Xf < feature_range[0]) | (Xf > feature_range[1])
        if out.any():
            r, c = np.argwhere(out)[0]
            raise DataError(f"{source}: X has {Xf[r, c].item()!r} at row {r}, column {c}, outside the declared "
                            f"feature range [{feature_range[0]:g}, {feature_range[1]:g}]")
    if task is None and "task" in meta:
        task = str(meta["task"])[:64]
    if task is None:
        task = _infer_task(y, source)
    task_ = _task_arg(task, source)
    if not feature_names and "feature_names" in meta:
        names = meta["feature_names"]
        if names.ndim != 1 or names.shape[0] != X.shape[1]:
            raise DataError(f"{source}: feature_names must be {X.shape[1]} names, got shape {names.shape}")
        feature_names = tuple(str(s)[:256] for s in names.tolist())
    if n_classes is None and "n_classes" in meta:
        nc = meta["n_classes"]
        if nc.shape != () or not np.issubdtype(nc.dtype, np.integer):
            raise DataError(f"{source}: n_classes must be one integer, got dtype {nc.dtype} shape {nc.shape}")
        n_classes = int(nc)
    try:
        return Dataset(X=X, y=y, task=task_, name=name or str(meta.get("name", p.name)),
                       feature_names=tuple(feature_names), n_classes=n_classes)
    except DataError as e:
        raise DataError(f"{source}: {e}") from None


def read_idx_file(path: str | os.PathLike[str], max_bytes: int | None = None) -> np.ndarray:
    """An IDX (optionally gzip) file as a uint8 array: (n, rows, cols) images or (n,) labels —
    MNIST's format. Refused past ``max_bytes`` (also when it inflates past it) and when the
    header's shape does not match the bytes."""
    p = _check_file(path)
    _check_size(p, max_bytes)
    try:
        with _open_limited(p, max_bytes) as f:
            buf = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{p}: cannot read IDX file ({e})") from None
    if len(buf) < 8 or buf[0] != 0 or buf[1] != 0 or buf[2] != 0x08:
        raise DataError(f"{p}: not an unsigned-byte IDX file (bad magic {buf[:4]!r})")
    ndim = buf[3]
    header = 4 + 4 * ndim
    if len(buf) < header:
        raise DataError(f"{p}: truncated IDX header")
    dims = tuple(int.from_bytes(buf[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = header + math.prod(dims)
    if len(buf) != expected:
        raise DataError(f"{p}: {len(buf)} bytes, expected {expected} for shape {dims}")
    return np.frombuffer(buf, dtype=np.uint8, offset=header).reshape(dims)


def write_idx_file(path: str | os.PathLike[str], array: np.ndarray, gz: bool = False) -> Path:
    """Write ``array`` (uint8 images or labels) as an unsigned-byte IDX file, the inverse of
    :func:`read_idx_file` — e.g. to give each party its own share of a data set in MNIST's format."""
    a = np.ascontiguousarray(array)
    if a.dtype != np.uint8:
        raise DataError(f"{path}: IDX files here hold unsigned bytes, got dtype {a.dtype}")
    raw = bytes([0, 0, 8, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape) + a.tobytes()
    p = Path(path)
    p.write_bytes(gzip.compress(raw) if gz else raw)
    return p


def load_idx(images: str | os.PathLike[str], labels: str | os.PathLike[str], *, task: str = "multiclass",
             max_bytes: int | None = DEFAULT_MAX_BYTES) -> Dataset:
    """Images and labels in IDX files (MNIST's format): X = pixels / 255 flattened row-major per
    image, y the labels (multiclass 0..K−1, or binary 0/1 → −1/+1)."""
    img, lab = read_idx_file(images, max_bytes), read_idx_file(labels, max_bytes)
    if img.ndim < 2 or lab.ndim != 1:
        raise DataError(f"{images}: images must be (n, ...) and {labels} labels (n,), got {img.shape} and {lab.shape}")
    if img.shape[0] != lab.shape[0]:
        raise DataError(f"{labels}: {lab.shape[0]} labels for {img.shape[0]} images in {images}")
    if img.shape[0] == 0:
        raise DataError(f"{images}: no images")
    X = img.reshape(img.shape[0], -1).astype(np.float64) / 255.0
    task_ = _task_arg(task, str(labels))
    y, n_classes = labels_for_task(lab.astype(np.int64), task_, str(labels))
    try:
        return Dataset(X=X, y=y, task=task_, name=Path(images).name, n_classes=n_classes)
    except DataError as e:
        raise DataError(f"{images}: {e}") from None


def load_png_folder(labels_csv: str | os.PathLike[str], label_column: str = "label", *, task: str = "multiclass",
                    max_bytes: int | None = DEFAULT_MAX_BYTES) -> Dataset:
    """A folder of PNG images with a CSV naming them: columns ``file`` (a path relative to the
    CSV's folder, never outside it) and the label column. Every image must have the same size and
    be greyscale (1 channel) or RGB (3); X = pixels / 255 flattened row-major as (C, H, W). The
    files together are refused past ``max_bytes``, and so are their decoded pixels; errors name the
    CSV's row and the file."""
    from PIL import Image, UnidentifiedImageError

    csv_path = _check_file(labels_csv)
    _check_size(csv_path, max_bytes)
    try:
        table = pd.read_csv(csv_path, dtype={"file": str})
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise DataError(f"{csv_path}: cannot read the labels CSV ({e})") from None
    for col in ("file", label_column):
        if col not in table.columns:
            raise DataError(f"{csv_path}: no column {col!r} (columns: {', '.join(map(str, table.columns))})")
    if len(table) == 0:
        raise DataError(f"{csv_path}: no images listed")
    root = csv_path.parent.resolve()
    total, pixels, shape, rows = 0, 0, None, []
    for i, name in enumerate(table["file"], start=2):  # row 1 is the header
        f = (root / str(name)).resolve()
        if not isinstance(name, str) or Path(name).is_absolute() or not f.is_relative_to(root):
            raise DataError(f"{csv_path}, row {i}: file {name!r} must be a relative path inside {root}")
        if not f.is_file():
            raise DataError(f"{csv_path}, row {i}: {f}: file not found")
        total += f.stat().st_size
        if max_bytes is not None and total > max_bytes:
            raise DataError(f"{csv_path}: the images exceed max_bytes={max_bytes:,} (at row {i}); refused")
        try:
            with Image.open(f) as im:
                if im.format != "PNG":
                    raise DataError(f"{csv_path}, row {i}: {f} is {im.format}, not PNG")
                if im.mode not in ("L", "RGB"):
                    raise DataError(f"{csv_path}, row {i}: {f} has mode {im.mode}; greyscale (L) or RGB only "
                                    "(convert it first)")
                a = np.asarray(im, dtype=np.uint8)
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
            raise DataError(f"{csv_path}, row {i}: {f}: not a readable PNG ({e})") from None
        chw = a[None, :, :] if a.ndim == 2 else a.transpose(2, 0, 1)
        if shape is None:
            shape = chw.shape
        elif chw.shape != shape:
            raise DataError(f"{csv_path}, row {i}: {f} is {chw.shape[1:]} pixels with {chw.shape[0]} channel(s); "
                            f"the first image is {shape[1:]} with {shape[0]}")
        pixels += chw.size
        if max_bytes is not None and 8 * pixels > max_bytes:
            raise DataError(f"{csv_path}: the decoded images exceed max_bytes={max_bytes:,} (at row {i}); refused")
        rows.append(chw.reshape(-1))
    X = np.stack(rows).astype(np.float64) / 255.0
    task_ = _task_arg(task, str(csv_path))
    y, n_classes = labels_for_task(table[label_column].to_numpy(), task_, f"{csv_path}: column {label_column!r}")
    try:
        return Dataset(X=X, y=y, task=task_, name=csv_path.parent.name, n_classes=n_classes)
    except DataError as e:
        raise DataError(f"{csv_path}: {e}") from None


def load_file(fmt: str, path: str | os.PathLike[str], *, task: str, label: Any = None,
              max_bytes: int | None = DEFAULT_MAX_BYTES,
              feature_range: tuple[float, float] | None = None,
              labels: str | os.PathLike[str] | None = None) -> Dataset:
    """A party's own data file by its config's ``format`` (``csv`` needs ``label``, the label
    column; ``idx`` needs ``labels``, the labels' file; ``png``: ``path`` is the CSV listing the
    images, ``label`` its label column, default "label"): what the job worker calls, with the
    config's ``max_bytes`` and ``feature_range``."""
    if fmt == "idx":
        if labels is None:
            raise DataError(f"{path}: format 'idx' needs the labels' IDX file")
        return load_idx(path, labels, task=task, max_bytes=max_bytes)
    if fmt == "png":
        return load_png_folder(path, label or "label", task=task, max_bytes=max_bytes)
    if fmt == "csv":
        if label is None:
            raise DataError(f"{path}: format 'csv' needs the label column's name")
        return load_csv(path, label, task=task, max_bytes=max_bytes, feature_range=feature_range)
    if fmt == "libsvm":
        return load_libsvm(path, task=task, max_bytes=max_bytes, feature_range=feature_range)
    if fmt in ("npz", "npy", "numpy"):
        return load_numpy(path, task=task, max_bytes=max_bytes, feature_range=feature_range)
    raise DataError(f"{path}: unknown format {fmt!r}; valid: csv, libsvm, npz, idx, png")


def save_numpy(ds: Dataset, path: str | os.PathLike[str]) -> Path:
    """Write a Dataset as an .npz that ``load_numpy`` reads back with its task and names."""
    p = Path(path)
    extra: dict[str, Any] = {}
    if ds.n_classes is not None:
        extra["n_classes"] = np.int64(ds.n_classes)
    np.savez(p, X=ds.X, y=ds.y, task=np.str_(ds.task), name=np.str_(ds.name),
             feature_names=np.array(ds.feature_names, dtype=str), **extra)
    return p if p.suffix == ".npz" else p.with_name(p.name + ".npz")
