"""NumPy .npy/.npz files (optionally gzip) into a Dataset and back: :func:`load_numpy`,
:func:`save_numpy`. Objects are never unpickled, and every array's shape is read from its header
and checked against ``max_bytes`` before numpy allocates it."""

from __future__ import annotations

import contextlib
import io
import math
import os
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .dataset import DataError, Dataset, Task
from .files import DEFAULT_MAX_BYTES, check_file, check_size, is_gzip, open_limited, quote_cell
from .labels import check_task

__all__ = ["load_numpy", "save_numpy"]


_NPY_MAGIC, _ZIP_MAGIC = b"\x93NUMPY", b"PK\x03\x04"

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
    check_size(path, max_bytes)
    try:
        if is_gzip(path):
            with open_limited(path, max_bytes) as f:
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
    p = check_file(path) if not Path(path).is_dir() else Path(path)
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
                                            f"{[quote_cell(k) for k in keys[:20]]}")
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
                X, y = obj, _np_load(check_file(y_path), max_bytes)
    if not isinstance(X, np.ndarray) or not isinstance(y, np.ndarray):
        raise DataError(f"{source}: expected arrays X and y")
    X, Xf = _rows(X, y, source)
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
    task_ = check_task(task, source)
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


def save_numpy(ds: Dataset, path: str | os.PathLike[str]) -> Path:
    """Write a Dataset as an .npz that ``load_numpy`` reads back with its task and names."""
    p = Path(path)
    extra: dict[str, Any] = {}
    if ds.n_classes is not None:
        extra["n_classes"] = np.int64(ds.n_classes)
    np.savez(p, X=ds.X, y=ds.y, task=np.str_(ds.task), name=np.str_(ds.name),
             feature_names=np.array(ds.feature_names, dtype=str), **extra)
    return p if p.suffix == ".npz" else p.with_name(p.name + ".npz")


def _rows(X: np.ndarray, y: np.ndarray | None, source: str) -> tuple[np.ndarray, np.ndarray]:
    """X as rows (images (n, H, W) or (n, C, H, W) flattened row-major) and as float64, checked:
    2-D, some rows and columns, real and finite, and y (where given) one label per row."""
    if X.ndim in (3, 4):  # images (n, H, W) or (n, C, H, W): one flat row each, row-major
        X = X.reshape(X.shape[0], -1)
    if X.ndim != 2:
        raise DataError(f"{source}: X must be 2-D (n, d), got shape {X.shape} (images: (n, H, W) or (n, C, H, W))")
    if y is not None and (y.ndim != 1 or y.shape[0] != X.shape[0]):
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
    return X, Xf


def read_arrays(path: str | os.PathLike[str], *, max_bytes: int | None = DEFAULT_MAX_BYTES
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """Inputs to predict on, from an .npz: X (images (n, H, W) or (n, C, H, W) flattened row-major,
    as :func:`load_numpy` does) and y where the file has it (None for new rows). The same limits:
    the file's size and each array's header are checked before numpy allocates it."""
    p = check_file(path)
    source = str(p)
    with _NPY_HEADER_LOCK:
        obj = _np_load(p, max_bytes)
        if not isinstance(obj, np.lib.npyio.NpzFile):
            X, y = obj, None
        else:
            with obj:
                if "X" not in obj.files:
                    found = [quote_cell(k) for k in obj.files[:20]]
                    raise DataError(f"{source}: array 'X' not in the .npz; found {found}")
                try:
                    X, y = obj["X"], (obj["y"] if "y" in obj.files else None)
                except (ValueError, OSError, EOFError, zipfile.BadZipFile, MemoryError) as e:
                    raise DataError(f"{source}: cannot load an array of the .npz ({e})") from None
    if not isinstance(X, np.ndarray):
        raise DataError(f"{source}: expected an array X")
    return _rows(X, y, source)[1], y
