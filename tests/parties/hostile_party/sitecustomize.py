"""A compute party that lies about its own input (tests only): on this directory's path (its
daemon's PYTHONPATH, so in the daemon and every job worker it starts), every party aggregate it
takes part in gets its weighted contributions × 10⁶ — a full peer inflating its local sum, while
following the protocol otherwise. The patch is applied when ``mpc_erm.mpc.aggregator`` is loaded."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

TARGET = "mpc_erm.mpc.aggregator"


class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            run(module)
            agg = module.MpcAggregator.aggregate

            def inflated(self, contributions, weights, noise):  # type: ignore[no-untyped-def]
                return agg(self, contributions * 1e6, weights, noise)

            module.MpcAggregator.aggregate = inflated

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Patch())
