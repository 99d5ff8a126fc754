"""Offline pool of secret-shared noise (discrete Laplace or discrete Gaussian on the grid).

Why: noise never depends on the data, so (like Beaver triples) it can be produced in an offline
phase while parties compute gradients; the online round is then share → sum → add pooled noise
→ reveal (docs/explanation/privacy.md §6). The pool is SPMD: every party holds one and calls
``produce``/``take`` with the same sizes in the same order, as all CrypTen code is.

Each sample is handed out at most once (``take`` removes it): reusing noise would add the same
draw to two releases and break the accounting.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from ..crypten_compat import import_crypten, plain
from .discrete_laplace import sample_discrete_laplace_integers
from .gaussian import DiscreteGaussianParams
from .params import FRAC_BITS, DiscreteLaplaceParams

crypten = import_crypten()
from crypten.mpc.mpc import MPCTensor  # noqa: E402  (after the compat shim)

__all__ = ["NoisePool", "PoolExhausted", "PoolStats", "batch_for"]


def batch_for(params: DiscreteLaplaceParams | DiscreteGaussianParams, base: int = 1 << 15) -> int:
    """Samples per batch. A batch costs a fixed number of message steps whatever its size (≈ 230
    for the Gaussian by revealed rejection under replicated sharing), so larger is faster until
    memory binds: 4·base for the discrete Laplace (2^15: 67k/s, latency-bound at 58 message steps
    a batch); 16·base for the Gaussian by revealed rejection (≈ 1.3 candidates per output, each
    with its acceptance coins; measured with ``python -m benchmarks.sampler --trust replicated
    --batch B`` at σ = 128,925 grid units, 56-bit coins, staircase candidates, 2 cores: 2^17
    135k/s, 2^18 155k/s, 2^19 177k/s, at peak party RSS 555, 633 and 739 MB, of which ≈ 520 MB is
    the process before any batch); by oblivious rounds base/8 (R ≈ 26 candidates per output)."""
    if isinstance(params, DiscreteLaplaceParams):
        return 4 * base
    if params.revealed:
        return 16 * base
    return max(1024, base // 8)


class PoolExhausted(RuntimeError):
    """``take`` asked for more samples than were produced."""


@dataclass(frozen=True)
class PoolStats:
    """Offline cost of what the pool produced so far (this party's view)."""

    produced: int
    taken: int
    seconds: float
    rounds: int
    bytes: int

    @property
    def samples_per_second(self) -> float:
        return self.produced / self.seconds if self.seconds > 0 else float("nan")

    @property
    def bytes_per_sample(self) -> float:
        return self.bytes / self.produced if self.produced else float("nan")


def _comm_counters() -> tuple[int, int]:
    stats: dict[str, Any] = crypten.communicator.get().get_communication_stats()
    return int(stats.get("rounds", 0)), int(stats.get("bytes", 0))


class NoisePool:
    """Secret-shared noise made ahead of time.

    ``produce(n)`` samples n values in batches of ``batch`` (bounded memory: a Laplace batch of
    m samples holds k·(B+1)·m/64 words of bit planes; a Gaussian one more: :func:`batch_for`);
    ``take(d)`` returns the next d as an MPCTensor with CrypTen's encoder (value = D · 2^-grid_bits).
    Communication counters come from the communicator (measured bytes over gRPC; CrypTen's gloo
    communicator counts only when its verbose mode is on).
    """

    def __init__(
        self, params: DiscreteLaplaceParams | DiscreteGaussianParams, device: Any = None, batch: int = 1 << 17
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be positive")
        self.params = params
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.batch = batch
        self._chunks: deque[torch.Tensor] = deque()  # this party's integer shares
        self._available = 0
        self._produced = 0
        self._taken = 0
        self._seconds = 0.0
        self._rounds = 0
        self._bytes = 0

    @property
    def available(self) -> int:
        return self._available

    def produce(self, n: int) -> None:
        """Sample n more values (all parties, same n)."""
        if n < 0:
            raise ValueError("n must be non-negative")
        r0, b0 = _comm_counters()
        tic = time.perf_counter()
        left = n
        while left > 0:
            m = min(left, self.batch)
            self._chunks.append(self._sample(m))
            left -= m
        self._seconds += time.perf_counter() - tic
        r1, b1 = _comm_counters()
        self._rounds += max(0, r1 - r0)
        self._bytes += max(0, b1 - b0)
        self._available += n
        self._produced += n

    def _sample(self, m: int) -> torch.Tensor:
        if isinstance(self.params, DiscreteGaussianParams):
            from .discrete_gaussian import sample_discrete_gaussian_integers

            return plain(sample_discrete_gaussian_integers(self.params, m, self.device).share)
        return plain(sample_discrete_laplace_integers(self.params, m, self.device).share)

    def take_integers(self, d: int) -> torch.Tensor:
        """This party's shares of the next d samples in grid units (removed from the pool)."""
        if d < 0:
            raise ValueError("d must be non-negative")
        if d > self._available:
            raise PoolExhausted(f"asked for {d} noise samples, {self._available} available")
        parts: list[torch.Tensor] = []
        need = d
        while need > 0:
            head = self._chunks[0]
            if head.numel() <= need:
                parts.append(self._chunks.popleft())
                need -= head.numel()
            else:
                parts.append(head[:need])
                self._chunks[0] = head[need:]
                need = 0
        self._available -= d
        self._taken += d
        if len(parts) == 1:
            return parts[0]  # no copy (a view when it is part of a chunk: disjoint from what stays)
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=self.device)

    def take(self, d: int) -> MPCTensor:
        """The next d samples as an MPCTensor (real units on the grid 2^-grid_bits; CrypTen's
        encoder has 16 fractional bits, so finer grids must use :meth:`take_integers`)."""
        if self.params.grid_bits > FRAC_BITS:
            raise ValueError(f"grid 2^-{self.params.grid_bits} is finer than CrypTen's encoder: use take_integers")
        share = self.take_integers(d) * (1 << (FRAC_BITS - self.params.grid_bits))
        return MPCTensor.from_shares(share, precision=FRAC_BITS)

    def stats(self) -> PoolStats:
        return PoolStats(self._produced, self._taken, self._seconds, self._rounds, self._bytes)
