"""Make CrypTen 0.4.1 (last release, 2022, unmaintained) import on the torch this project pins.

CrypTen's ONNX converter does ``from torch.onnx._internal.registration import registry``. Torch
moved that module to ``torch.onnx._internal.torchscript_exporter.registration``. We alias the new
location under the old name *before* crypten is imported. If a future torch moves it again,
``import_crypten`` raises ``CryptenCompatError`` naming both paths instead of failing somewhere
deep inside crypten (tests/mpc/test_crypten_compat.py keeps that promise).

Import crypten only through :func:`import_crypten`.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

OLD_PATH = "torch.onnx._internal.registration"
NEW_PATH = "torch.onnx._internal.torchscript_exporter.registration"


class CryptenCompatError(ImportError):
    """The installed torch no longer offers what the CrypTen shim aliases."""


def install_aliases() -> None:
    """Register the old module path for the relocated ONNX symbolic registry (idempotent)."""
    if OLD_PATH in sys.modules:
        return
    try:
        importlib.import_module(OLD_PATH)
        return  # an older torch still has it where crypten looks
    except ModuleNotFoundError:
        pass
    try:
        moved = importlib.import_module(NEW_PATH)
    except ModuleNotFoundError as exc:
        import torch

        raise CryptenCompatError(
            f"torch {torch.__version__} has neither {OLD_PATH} nor {NEW_PATH}; "
            "update mpc_erm/mpc/crypten_compat.py for this torch release"
        ) from exc
    if not hasattr(moved, "registry"):
        raise CryptenCompatError(f"{NEW_PATH} has no attribute 'registry'")
    sys.modules[OLD_PATH] = moved


def import_crypten() -> ModuleType:
    """Return the crypten module, importing it after the compat aliases are in place."""
    install_aliases()
    import crypten

    _complete_cuda_wrapper()
    return crypten


def _complete_cuda_wrapper() -> None:
    """Give CrypTen's ``CUDALongTensor`` the two tensor methods its own CUDA paths call but it
    lacks (idempotent): ``contiguous`` (``replicated.replicate_shares``, i.e. every replicated
    multiplication on CUDA) and ``detach``. Both return the wrapper, as its other methods do."""
    from crypten.cuda import CUDALongTensor

    for name in ("contiguous", "detach"):
        if name not in vars(CUDALongTensor):
            def method(self: Any, *args: Any, _name: str = name, **kwargs: Any) -> Any:
                return CUDALongTensor(getattr(self._tensor, _name)(*args, **kwargs))

            method.__name__ = name
            setattr(CUDALongTensor, name, method)


def plain(t: Any) -> Any:
    """The torch tensor inside CrypTen's ``CUDALongTensor``; any other value unchanged.

    CrypTen wraps every CUDA share in that class (``from_shares``, its random ring elements) so
    that its matmul and convolutions can split int64 into float64 blocks. The wrapper forwards
    only what CrypTen's own protocols call: an ``out=`` argument recurses without end and
    ``contiguous`` is missing. Our samplers and transport therefore work on the plain tensor and
    hand CrypTen plain tensors, which its ``from_shares`` wraps again."""
    from crypten.cuda import CUDALongTensor

    return t.tensor() if isinstance(t, CUDALongTensor) else t


def unwrap_all(values: Any) -> tuple[Any, bool]:
    """``values`` (a tuple of arguments) with every CUDALongTensor, also inside lists and tuples,
    replaced by its plain tensor; True if there was one."""
    from crypten.cuda import CUDALongTensor

    found = False

    def one(v: Any) -> Any:
        nonlocal found
        if isinstance(v, CUDALongTensor):
            found = True
            return v.tensor()
        if isinstance(v, (list, tuple)):
            return type(v)(one(x) for x in v)
        return v

    return tuple(one(v) for v in values), found


def rewrap_all(value: Any) -> Any:
    """Wrap every CUDA tensor in ``value`` (a tensor, or lists and tuples of them) back in
    CUDALongTensor: what CrypTen's own communicator returns for CUDALongTensor inputs."""
    import torch
    from crypten.cuda import CUDALongTensor

    if torch.is_tensor(value) and value.is_cuda and value.dtype == torch.long:
        return CUDALongTensor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(rewrap_all(x) for x in value)
    return value
