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

    return crypten
