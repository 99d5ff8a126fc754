"""Loaders for data a user (a party) brings: CSV, LIBSVM/svmlight, NumPy, IDX and PNG images.

:func:`load_file` picks the loader by a party config's ``format``. The loaders themselves live in
one module per format (:mod:`.delimited`, :mod:`.libsvm`, :mod:`.arrays`, :mod:`.images`), on
the bounded file access of :mod:`.files` and the label rules of :mod:`.labels`; their public
names are importable from here too.

Every failure is a ``DataError`` naming the file and the column or row/line at fault, because a
party operator must be able to fix their export without reading our code. Nothing is coerced
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

import os
from typing import Any

from .arrays import load_numpy, read_arrays, save_numpy
from .dataset import DataError, Dataset
from .delimited import load_csv
from .files import DEFAULT_MAX_BYTES, DEFAULT_MAX_CELLS, MAX_LINE_BYTES, is_gzip, open_maybe_gzip
from .images import load_idx, load_png_folder, read_idx_file, read_png_listing, write_idx_file
from .labels import NA_VALUES, labels_for_task
from .libsvm import load_libsvm

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_CELLS", "MAX_LINE_BYTES", "NA_VALUES", "is_gzip", "labels_for_task",
           "load_csv", "load_file", "load_idx", "load_inputs", "load_libsvm", "load_numpy", "load_png_folder",
           "open_maybe_gzip", "read_idx_file", "save_numpy", "write_idx_file"]


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


def load_inputs(fmt: str, path: str | os.PathLike[str], *, label: str = "label",
                max_bytes: int | None = DEFAULT_MAX_BYTES) -> tuple[Any, Any]:
    """Rows to predict on in a network's formats, as a party reads them (``npz``: X and y; ``png``: a
    CSV listing the images, pixels / 255): (X, the labels where the file has them, else None)."""
    if fmt == "npz":
        return read_arrays(path, max_bytes=max_bytes)
    if fmt == "png":
        _, X, raw, _ = read_png_listing(path, label, max_bytes=max_bytes)
        return X, raw
    raise DataError(f"{path}: format {fmt!r} has no reader for new rows here; valid: npz, png")
