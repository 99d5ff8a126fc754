"""A compute party that lies about its own input (tests only): on this directory's path (its
daemon's PYTHONPATH, so in the daemon and every job worker it starts), every party aggregate it
takes part in gets its weighted contributions × 10⁶ — a full peer inflating its local sum, while
following the protocol otherwise. The patch is applied when ``mpc_erm.mpc.aggregator`` is loaded."""

from __future__ import annotations

from types import ModuleType

from tests.parties.patch_on_import import patch_on_import


def _inflate(module: ModuleType) -> None:
    agg = module.MpcAggregator.aggregate

    def inflated(self, contributions, weights, noise):  # type: ignore[no-untyped-def]
        return agg(self, contributions * 1e6, weights, noise)

    module.MpcAggregator.aggregate = inflated


patch_on_import({"mpc_erm.mpc.aggregator": _inflate})
