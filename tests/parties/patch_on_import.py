"""Patch a module of a member's own processes when it is imported (tests only): the
``sitecustomize`` of a deviating member (``hostile_party/``, ``deviating_party/``) registers here
what to change, and its daemon and job workers, started with that directory on their path, load
the module patched."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType


class _Patch(importlib.abc.MetaPathFinder):
    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name not in self.patches:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            self.patches[name](module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def patch_on_import(patches: dict[str, Callable[[ModuleType], None]]) -> None:
    """Apply ``patches[name](module)`` to each named module once it is loaded."""
    sys.meta_path.insert(0, _Patch(patches))
