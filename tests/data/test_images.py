"""Image data for networks (issue 16): IDX files (MNIST's format) and NumPy image arrays, with
the same file-naming errors and size limits as the tabular loaders."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from mpc_erm.data import DataError
from mpc_erm.data.loaders import load_file, load_numpy, read_idx_file


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    """An unsigned-byte IDX file (magic 0x0000 08 ndim, big-endian dimensions, then the bytes)."""
    a = np.ascontiguousarray(array, dtype=np.uint8)
    raw = bytes([0, 0, 8, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape) + a.tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_idx_images_load_as_scaled_rows(tmp_path: Path, gz: bool) -> None:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(7, 4, 5), dtype=np.uint8)
    lab = np.array([0, 3, 1, 2, 3, 0, 1], dtype=np.uint8)
    ds = load_file("idx", write_idx(tmp_path / "x.idx", img, gz), task="multiclass",
                   labels=write_idx(tmp_path / "y.idx", lab, gz))
    assert ds.X.shape == (7, 20) and np.allclose(ds.X, img.reshape(7, -1) / 255.0)
    assert ds.y.tolist() == lab.tolist() and ds.n_classes == 4 and ds.task == "multiclass"
    bin_ds = load_file("idx", tmp_path / "x.idx", task="binary",
                       labels=write_idx(tmp_path / "b.idx", np.array([0, 1, 1, 0, 1, 0, 1], dtype=np.uint8)))
    assert set(bin_ds.y.tolist()) == {-1.0, 1.0}


def test_idx_errors_name_the_file(tmp_path: Path) -> None:
    img = write_idx(tmp_path / "x.idx", np.zeros((3, 2, 2)))
    with pytest.raises(DataError, match=r"y\.idx: 2 labels for 3 images"):
        load_file("idx", img, task="multiclass", labels=write_idx(tmp_path / "y.idx", np.zeros(2)))
    bad = tmp_path / "bad.idx"
    bad.write_bytes(b"\x00\x00\x09\x01" + (3).to_bytes(4, "big") + b"abc")
    with pytest.raises(DataError, match="bad.idx: not an unsigned-byte IDX file"):
        read_idx_file(bad)
    short = tmp_path / "short.idx"
    short.write_bytes(b"\x00\x00\x08\x01" + (5).to_bytes(4, "big") + b"abc")
    with pytest.raises(DataError, match=r"short.idx: 11 bytes, expected 13 for shape \(5,\)"):
        read_idx_file(short)
    with pytest.raises(DataError, match="larger than max_bytes"):
        read_idx_file(write_idx(tmp_path / "big.idx", np.zeros((10, 10))), max_bytes=50)
    bomb = write_idx(tmp_path / "bomb.idx", np.zeros((100, 100)), gz=True)
    with pytest.raises(DataError, match="decompresses to more than max_bytes"):
        read_idx_file(bomb, max_bytes=5000)
    with pytest.raises(DataError, match="format 'idx' needs the labels"):
        load_file("idx", img, task="multiclass")


def test_numpy_image_arrays_are_flattened_row_major(tmp_path: Path) -> None:
    X = np.arange(2 * 3 * 4 * 4, dtype=np.float64).reshape(2, 3, 4, 4) / 100
    np.savez(tmp_path / "imgs.npz", X=X, y=np.array([0, 1]))
    ds = load_numpy(tmp_path / "imgs.npz", task="multiclass")
    assert ds.X.shape == (2, 48) and np.array_equal(ds.X[1], X[1].reshape(-1))
    np.savez(tmp_path / "bad.npz", X=np.zeros((2, 1, 1, 1, 1)), y=np.array([0, 1]))
    with pytest.raises(DataError, match=r"bad.npz: X must be 2-D \(n, d\), got shape \(2, 1, 1, 1, 1\) \(images"):
        load_numpy(tmp_path / "bad.npz", task="multiclass")
