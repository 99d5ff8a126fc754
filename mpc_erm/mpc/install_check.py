"""Post-install check run by `make install`: fail loudly on a broken or oversized install.

Why: the install must not pull CUDA wheels on a CPU machine, and CrypTen must import on the
pinned torch. Catching either here is cheaper than a confusing failure in a job.
"""

from __future__ import annotations

import importlib.metadata as md
import shutil
import sys


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
    if problems:
        for p in problems:
            print(f"install check: {p}", file=sys.stderr)
        return 1
    print(f"install check: torch {torch.__version__}, crypten {version} ({crypten.__name__}) OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
