"""A package's names loaded from their modules on first use (PEP 562).

Why: the light commands and the daemon's control process (a ledger check, a report verify,
``job submit``'s check, a job's admission) import packages whose other modules pull in torch or
SciPy, seconds they need not wait for. Each such package maps its public names to the module that
defines them and takes its ``__getattr__`` and ``__dir__`` from :func:`lazy_exports`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, where: Mapping[str, str],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(``__getattr__``, ``__dir__``) for ``package``: a name in ``where`` is imported from its
    module (relative to the package) when first asked for, then kept in ``namespace``."""

    def __getattr__(name: str) -> Any:
        if name in where:
            value = getattr(importlib.import_module(f".{where[name]}", package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted([*namespace, *where])

    return __getattr__, __dir__
