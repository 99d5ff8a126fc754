"""LIBSVM/svmlight text (``label idx:value ...``, optionally gzip) into a dense Dataset:
:func:`load_libsvm`. Errors name the line; an index that would make the dense matrix pass
``max_cells`` is refused at its line, before anything is allocated."""

from __future__ import annotations

import gzip
import math
import os
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from .dataset import DataError, Dataset
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
from .labels import check_task, labels_for_task

__all__ = ["load_libsvm"]


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
    p = check_file(path)
    source = str(p)
    task = check_task(task, source)
    if n_features is not None and (not isinstance(n_features, (int, np.integer))
                                   or n_features < 1):
        raise DataError(f"{source}: n_features must be a positive integer, got {n_features!r}")
    if n_features is not None and n_features > max_cells:
        raise DataError(f"{source}: n_features={n_features:,} exceeds max_cells={max_cells:,}")
    check_size(p, max_bytes)
    raw_labels: list[str] = []
    lines_of_row = array("q")
    rows, cols, vals = array("q"), array("q"), array("d")
    base = 0 if zero_based else 1
    width = n_features or 0
    try:
        with open_limited(p, max_bytes) as f:
            lineno = 0
            while True:
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    break
                lineno += 1
                if len(raw) > MAX_LINE_BYTES:
                    raise line_too_long(source, lineno)
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
                            raise DataError(f"{source}: line {lineno}: feature index {quote_cell(idx_s)} makes the "
                                            f"dense matrix {r + 1:,} x {width:,}, over max_cells={max_cells:,}; "
                                            "refusing rather than exhausting memory")
                    try:
                        v = float(val_s)
                    except ValueError:
                        raise DataError(f"{source}: line {lineno}: value {val_s!r} of feature "
                                        f"{idx_s} is not a number") from None
                    if not math.isfinite(v):
                        raise DataError(f"{source}: line {lineno}: value of feature {idx_s} is "
                                        f"not finite ({quote_cell(val_s)})")
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
