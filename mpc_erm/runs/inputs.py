"""What a run is given besides its plan: the member's rows, and the pool its noise comes from."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from mpc_erm.data.dataset import Dataset
from mpc_erm.data.schema import DataSchema
from mpc_erm.protocols.aggregation import NoiseSpec

__all__ = ["NoisePool", "RunRows", "concurrently"]

T = TypeVar("T")


@dataclass(frozen=True)
class RunRows:
    """A member's rows for one job: ``train`` (what its contributions see), a public ``test`` set
    (metrics on it are public), its held-out ``validation`` rows (metrics on them stay with the
    member), and the schema they were read through (the model bundle records it)."""

    train: Dataset
    test: Dataset | None = None
    validation: Dataset | None = None
    schema: DataSchema | None = None


class NoisePool(Protocol):
    """Noise sampled ahead of the reveals that use it (:class:`mpc_erm.mpc.noise.InMpcNoise`):
    ``prepare`` plans ``releases`` releases of ``dim`` values and fills the first; ``top_up``
    samples the next release's while the members compute."""

    def prepare(self, spec: NoiseSpec, dim: int, releases: int = 1) -> None: ...

    def top_up(self, spec: NoiseSpec, dim: int) -> None: ...


def concurrently(work: Callable[[], T], here: Callable[[], object]) -> T:
    """``work()`` in a thread while ``here()`` runs in this one (CrypTen stays in this thread, every
    party at the same point); ``work``'s result, or the first error (``here``'s first: the MPC's
    failures are the ones the job must report)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # re-raised in this thread
            box["error"] = exc

    th = threading.Thread(target=run, name="local-work")
    th.start()
    try:
        here()
    finally:
        th.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def with_next_noise(pool: NoisePool | None, noise: NoiseSpec | None, dim: int, local: Callable[[], T]) -> T:
    """``local()``'s value; meanwhile the next release's noise is sampled in this thread."""
    if pool is None or noise is None:
        return local()
    return concurrently(local, lambda: pool.top_up(noise, dim))
