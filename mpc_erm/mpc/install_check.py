"""Post-install check run by `make install`: fail loudly on a broken or oversized install.

Why: the install must not pull CUDA wheels on a CPU machine, CrypTen must import on the pinned
torch, and the compiled field kernels (numba) must build and compute exactly. Catching any of
these here is cheaper than a confusing failure in a job; compiling the kernels here also fills
their on-disk cache, so a job's first round does not pay for it.
"""

from __future__ import annotations

import importlib.metadata as md
import shutil
import sys


def _field_kernels() -> list[str]:
    """The norm proofs' compiled arithmetic against Python integers, on the worst-case elements."""
    try:
        import numpy as np

        from mpc_erm.mpc import field as F

        p = F.P
        a = np.array([p - 1, p - 1, 1 << 60, 12345], dtype=np.uint64)
        b = np.array([p - 1, 2, (1 << 60) + 7, p - 2], dtype=np.uint64)
        want = [int(x) * int(y) % p for x, y in zip(a, b, strict=True)]
        if [int(v) for v in F.mul(a, b)] != want or int(F.dot(a, b)) != sum(want) % p:
            return ["the compiled field arithmetic (numba) gives wrong products"]
        if int(F.sum_along(a, axis=0)) != sum(int(v) for v in a) % p:
            return ["the compiled field arithmetic (numba) gives wrong sums"]
    except Exception as exc:  # numba missing or failing to compile on this machine
        return [f"the compiled field arithmetic (numba) does not build: {exc}"]
    return []


def main() -> int:
    import torch

    problems: list[str] = []
    has_gpu_driver = shutil.which("nvidia-smi") is not None
    cuda_dists = sorted(
        d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia-")
    )
    if cuda_dists and not has_gpu_driver:
        problems.append(f"CUDA wheels installed on a machine without a GPU: {', '.join(cuda_dists)}")
    try:
        from mpc_erm.mpc.crypten_compat import import_crypten

        crypten = import_crypten()
        version = md.version("crypten")
    except Exception as exc:
        problems.append(f"crypten does not import: {exc}")
        version = "?"
    problems += _field_kernels()
    if problems:
        for p in problems:
            print(f"install check: {p}", file=sys.stderr)
        return 1
    print(f"install check: torch {torch.__version__}, crypten {version} ({crypten.__name__}) OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
