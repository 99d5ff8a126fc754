"""A party's own network architectures ("model plugins"), pinned by the digest of their source.

A job may name ``model.name = "plugin"`` with ``model.plugin = "<id>"`` and ``model.plugin_digest =
"sha256:<hex>"``. Each party maps the id to a Python entry point *installed at that party and
listed in its own config* (``[models.<id>] entry_point = "package.module:function"``); the daemon
never runs code the coordinator sends. ``function(spec: NetworkSpec) -> torch.nn.Module`` builds
the network (its weights are then re-drawn from the job's seed, as for the built-ins).

The digest is the sha256 of the entry point's module source file, checked *before* the module is
imported (locating it imports only its parent packages, the party's own installed code): every
party provably builds from the same source, and the job's digest says which. The initial
weights' digest is then compared with party 0's as for every network, which catches other
imported code that changes the parameters; code the module imports that changes only the forward
computation is covered by neither digest, so a plugin should keep its architecture in its module.

    mpc-erm model digest package.module:function   # prints the digest to put in the job file
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from pathlib import Path

from ..plugin_ids import DIGEST_RE, ENTRY_POINT_RE
from .networks import NetworkBuilder

__all__ = ["PluginError", "load_builder", "source_digest"]


class PluginError(ValueError):
    """A plugin that cannot be used: not listed, not found, or not the source the job pins."""


def _split(entry_point: str) -> tuple[str, str]:
    if not isinstance(entry_point, str) or not ENTRY_POINT_RE.fullmatch(entry_point):
        raise PluginError(f"entry point {entry_point!r} is not 'package.module:function'")
    module, _, function = entry_point.partition(":")
    return module, function


def _source_file(module: str) -> Path:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        raise PluginError(f"module {module!r} cannot be found: {exc}") from None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        origin = getattr(spec, "origin", None)
        raise PluginError(f"module {module!r} is not an installed Python source file (found {origin})")
    return Path(spec.origin)


def source_digest(entry_point: str) -> str:
    """``sha256:<hex>`` of the source file of the entry point's module. The module itself is read,
    not imported; locating a dotted module imports its parent packages (the party's own code)."""
    module, _ = _split(entry_point)
    return "sha256:" + hashlib.sha256(_source_file(module).read_bytes()).hexdigest()


def load_builder(entry_point: str, expected_digest: str) -> NetworkBuilder:
    """The builder function, after checking its module's source against ``expected_digest``."""
    if not isinstance(expected_digest, str) or not DIGEST_RE.fullmatch(expected_digest):
        raise PluginError(f"plugin digest {expected_digest!r} is not 'sha256:' and 64 hex digits")
    module, function = _split(entry_point)
    got = source_digest(entry_point)
    if got != expected_digest:
        raise PluginError(f"the source of {module!r} here has digest {got}, the job pins {expected_digest}: "
                          "the parties would not build the same network")
    fn = getattr(importlib.import_module(module), function, None)
    if not callable(fn):
        raise PluginError(f"{entry_point}: {function!r} is not a function of {module!r}")
    return fn
