"""Image data sets: IDX files (MNIST's format) and folders of PNG images listed by a CSV.

X is pixels / 255, each image flattened row-major (as (C, H, W) for PNG); y goes through
:func:`.labels.labels_for_task`. Sizes are checked against ``max_bytes`` on disk and decoded,
and errors name the file (and the CSV's row)."""

from __future__ import annotations

import gzip
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from .dataset import DataError, Dataset
from .files import DEFAULT_MAX_BYTES, check_file, check_size, open_limited
from .labels import check_task, labels_for_task

__all__ = ["load_idx", "load_png_folder", "png_shape", "read_idx_file", "read_idx_shape", "read_png_listing",
           "write_idx_file"]


def read_idx_file(path: str | os.PathLike[str], max_bytes: int | None = None) -> np.ndarray:
    """An IDX (optionally gzip) file as a uint8 array: (n, rows, cols) images or (n,) labels —
    MNIST's format. Refused past ``max_bytes`` (also when it inflates past it) and when the
    header's shape does not match the bytes."""
    p = check_file(path)
    check_size(p, max_bytes)
    try:
        with open_limited(p, max_bytes) as f:
            buf = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{p}: cannot read IDX file ({e})") from None
    dims = _idx_dims(buf, p)
    header = 4 + 4 * len(dims)
    expected = header + math.prod(dims)
    if len(buf) != expected:
        raise DataError(f"{p}: {len(buf)} bytes, expected {expected} for shape {dims}")
    return np.frombuffer(buf, dtype=np.uint8, offset=header).reshape(dims)


def _idx_dims(buf: bytes, p: Path) -> tuple[int, ...]:
    """The shape an unsigned-byte IDX file's header (at the start of ``buf``) declares."""
    if len(buf) < 8 or buf[0] != 0 or buf[1] != 0 or buf[2] != 0x08:
        raise DataError(f"{p}: not an unsigned-byte IDX file (bad magic {buf[:4]!r})")
    ndim = buf[3]
    if len(buf) < 4 + 4 * ndim:
        raise DataError(f"{p}: truncated IDX header")
    return tuple(int.from_bytes(buf[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))


def read_idx_shape(path: str | os.PathLike[str], max_bytes: int | None = None) -> tuple[int, ...]:
    """The shape an IDX file's header declares, reading only the header (what ``data check`` shows
    of a file the loader has already read whole)."""
    p = check_file(path)
    try:
        with open_limited(p, max_bytes) as f:
            head = f.read(4)
            head += f.read(4 * head[3]) if len(head) == 4 else b""
    except (OSError, EOFError) as e:
        raise DataError(f"{p}: cannot read IDX file ({e})") from None
    return _idx_dims(head, p)


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
    task_ = check_task(task, str(labels))
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
    csv_path, X, raw, _ = read_png_listing(labels_csv, label_column, max_bytes=max_bytes, require_label=True)
    assert raw is not None
    task_ = check_task(task, str(csv_path))
    y, n_classes = labels_for_task(raw, task_, f"{csv_path}: column {label_column!r}")
    try:
        return Dataset(X=X, y=y, task=task_, name=csv_path.parent.name, n_classes=n_classes)
    except DataError as e:
        raise DataError(f"{csv_path}: {e}") from None


def png_shape(labels_csv: str | os.PathLike[str]) -> tuple[int, int, int]:
    """(C, H, W) of the first image a PNG listing names, from its header alone: what ``data check``
    shows of a listing :func:`load_png_folder` has already read whole (and found of one shape)."""
    from PIL import Image

    csv_path = check_file(labels_csv)
    first = pd.read_csv(csv_path, dtype={"file": str}, nrows=1)["file"].iloc[0]
    with Image.open(csv_path.parent.resolve() / first) as im:  # the header only: nothing decoded
        return (1 if im.mode == "L" else 3, im.height, im.width)


def read_png_listing(labels_csv: str | os.PathLike[str], label_column: str = "label", *,
                     max_bytes: int | None = DEFAULT_MAX_BYTES, require_label: bool = False
                     ) -> tuple[Path, np.ndarray, np.ndarray | None, tuple[int, ...]]:
    """The images a CSV lists (:func:`load_png_folder`'s rules): (the CSV's path, X = pixels / 255
    one flat (C, H, W) row each, the label column's raw values or None where the CSV has no such
    column and ``require_label`` is False (new images to predict), the images' (C, H, W)). The
    header is checked before any image is opened."""
    from PIL import Image, UnidentifiedImageError

    csv_path = check_file(labels_csv)
    check_size(csv_path, max_bytes)
    try:
        table = pd.read_csv(csv_path, dtype={"file": str})
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise DataError(f"{csv_path}: cannot read the labels CSV ({e})") from None
    for col in ("file", label_column) if require_label else ("file",):
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
    assert shape is not None
    raw = table[label_column].to_numpy() if label_column in table.columns else None
    return csv_path, X, raw, tuple(int(v) for v in shape)
