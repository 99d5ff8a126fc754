"""Image data for networks (issue 16): IDX files (MNIST's format) and NumPy image arrays, with
the same file-naming errors and size limits as the tabular loaders."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from mpc_erm.data import DataError
from mpc_erm.data.loaders import load_file, load_numpy, read_idx_file, write_idx_file


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    """An unsigned-byte IDX file, written by the product's writer (checked against the format's
    bytes in test_the_idx_writer_writes_the_format)."""
    return write_idx_file(path, np.asarray(array, dtype=np.uint8), gz)


def test_the_idx_writer_writes_the_format(tmp_path: Path) -> None:
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    raw = write_idx_file(tmp_path / "a.idx", a).read_bytes()
    assert raw[:4] == bytes([0, 0, 8, 3]) and raw[4:16] == b"".join(d.to_bytes(4, "big") for d in (2, 3, 4))
    assert raw[16:] == a.tobytes() and np.array_equal(read_idx_file(tmp_path / "a.idx"), a)
    assert gzip.decompress(write_idx_file(tmp_path / "a.gz", a, gz=True).read_bytes()) == raw
    with pytest.raises(DataError, match="unsigned bytes"):
        write_idx_file(tmp_path / "b.idx", a.astype(np.int32))


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


def _png_folder(tmp_path: Path, images: list[np.ndarray], labels: list[object], names: list[str] | None = None) -> Path:
    from PIL import Image

    names = names or [f"img{i}.png" for i in range(len(images))]
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name, a in zip(names, images):
        if not name.startswith(".."):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(a).save(tmp_path / name)
    csv = tmp_path / "labels.csv"
    csv.write_text("file,label\n" + "".join(f"{n},{lab}\n" for n, lab in zip(names, labels)))
    return csv


def test_a_png_folder_loads_as_scaled_channel_first_rows(tmp_path: Path) -> None:
    """Issue 16: a folder of PNGs with a CSV of labels; greyscale → 1 channel, RGB → 3, (C, H, W)
    flattened row-major, pixels / 255, the labels as the CSV gives them."""
    rng = np.random.default_rng(1)
    grey = [rng.integers(0, 256, size=(5, 4), dtype=np.uint8) for _ in range(3)]
    ds = load_file("png", _png_folder(tmp_path / "g", grey, [1, 0, 1], ["a.png", "sub/b.png", "c.png"]),
                   task="multiclass")
    assert ds.X.shape == (3, 20) and np.allclose(ds.X[1], grey[1].reshape(-1) / 255.0) and ds.n_classes == 2
    rgb = [rng.integers(0, 256, size=(3, 2, 3), dtype=np.uint8) for _ in range(2)]
    ds = load_file("png", _png_folder(tmp_path / "c", rgb, [0, 1]), task="multiclass")
    assert ds.X.shape == (2, 18) and np.allclose(ds.X[0], rgb[0].transpose(2, 0, 1).reshape(-1) / 255.0)


def test_a_png_folder_refuses_what_it_cannot_use_naming_row_and_file(tmp_path: Path) -> None:
    from PIL import Image

    a = np.zeros((4, 4), dtype=np.uint8)
    with pytest.raises(DataError, match=r"row 3: .*is \(4, 5\) pixels"):
        load_file("png", _png_folder(tmp_path / "s", [a, np.zeros((4, 5), np.uint8)], [0, 1]), task="multiclass")
    with pytest.raises(DataError, match="row 2: file '../x.png' must be a relative path inside"):
        load_file("png", _png_folder(tmp_path / "e", [a], [0], ["../x.png"]), task="multiclass")
    with pytest.raises(DataError, match="row 3: .*file not found"):
        csv = _png_folder(tmp_path / "m", [a], [0])
        csv.write_text(csv.read_text() + "gone.png,1\n")
        load_file("png", csv, task="multiclass")
    d = tmp_path / "r"
    d.mkdir()
    Image.fromarray(np.zeros((2, 2, 4), np.uint8), "RGBA").save(d / "x.png")
    Image.fromarray(a).save(d / "y.jpg", format="JPEG")
    (d / "labels.csv").write_text("file,label\nx.png,0\n")
    with pytest.raises(DataError, match="mode RGBA; greyscale"):
        load_file("png", d / "labels.csv", task="multiclass")
    (d / "labels.csv").write_text("file,label\ny.jpg,0\n")
    with pytest.raises(DataError, match="is JPEG, not PNG"):
        load_file("png", d / "labels.csv", task="multiclass")
    (d / "labels.csv").write_text("name,label\ny.jpg,0\n")
    with pytest.raises(DataError, match="no column 'file'"):
        load_file("png", d / "labels.csv", task="multiclass")
    big = _png_folder(tmp_path / "b", [np.zeros((64, 64), np.uint8)] * 4, [0, 1, 0, 1])
    with pytest.raises(DataError, match="exceed max_bytes"):
        load_file("png", big, task="multiclass", max_bytes=4 * 64 * 64)
