"""Elementwise correlated randomness carved out of large flat batches.

Why: a binary Beaver triple (a, b, c = a ∧ b) is elementwise, so the triples of a whole circuit
can be cut from one long flat triple in any shapes, in the order the circuit asks for them. The
noise samplers ask for ≈ 100 triples per batch, one per AND round; made one at a time, each is a
blocking round trip to the dealer (or, without a dealer, one replication round of its own) in
the critical path of the circuit. Cut from pools of :data:`POOL_WORDS` words, a batch costs a few
refills, and the dealer's refills are requested one pool ahead (:class:`Prefetch`), so the
dealer computes the next pool while the parties compute with the current one.

The tuples are the same as one request per triple would give: every word of a pool is used at
most once, the law of each word is unchanged (a, b uniform, c = a ∧ b), and who knows what is
unchanged (the dealer knows a, b, c as before; a party only its shares). What the provider learns
about the circuit is less: only how many words it used, rounded up to whole pools.

SPMD like all of CrypTen: every party takes the same sizes in the same order, so the pools of
all parties are refilled at the same points and the dealer regenerates each party's shares in the
order they were drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["B2A_POOL_BITS", "POOL_WORDS", "DevicePools", "FlatPool", "Prefetch"]

POOL_WORDS = 1 << 19  # 4 MiB per tensor (two pools of three: 24 MiB); a 2^17-sample Gaussian batch uses ≈ 13 M words
B2A_POOL_BITS = 1 << 18  # B2A bits per pool: an int64 arithmetic and an int64 binary share each (4 MiB)


class Prefetch:
    """A refill in two halves: ``start(n)`` draws this party's local shares of the next n words and
    (party 0) posts the request; ``finish(handle)`` waits for the answer and returns the tensors."""

    def __init__(self, start: Callable[[int], Any], finish: Callable[[Any], Sequence[torch.Tensor]]) -> None:
        self.start = start
        self.finish = finish


class FlatPool:
    """Tuples of flat int64 tensors of equal length, handed out front to back.

    ``refill`` is either a function n → tensors (made now, e.g. one replication round) or a
    :class:`Prefetch`, whose next pool is requested as soon as the current one is started."""

    def __init__(self, refill: Callable[[int], Sequence[torch.Tensor]] | Prefetch, words: int = POOL_WORDS) -> None:
        if words < 1:
            raise ValueError("words must be positive")
        self.words = words
        self._refill = refill
        self._pending: Any = None  # a started, unfinished prefetch
        self._parts: list[torch.Tensor] = []
        self._pos = 0
        self.refills = 0

    @property
    def left(self) -> int:
        return self._parts[0].numel() - self._pos if self._parts else 0

    def _next(self) -> None:
        if isinstance(self._refill, Prefetch):
            handle = self._pending if self._pending is not None else self._refill.start(self.words)
            self._parts = list(self._refill.finish(handle))
            self._pending = self._refill.start(self.words)
        else:
            self._parts = list(self._refill(self.words))
        self._pos = 0
        self.refills += 1

    def take(self, n: int) -> list[torch.Tensor]:
        """The next n words of every tensor of the tuple (views where the pool holds them whole)."""
        if n < 0:
            raise ValueError("n must be non-negative")
        if not self._parts:
            self._next()
        if n <= self.left:
            out = [t[self._pos : self._pos + n] for t in self._parts]
            self._pos += n
            return out
        pieces = [[t[self._pos :]] for t in self._parts]
        need = n - self.left
        while need > 0:
            self._next()
            m = min(need, self.left)
            for p, t in zip(pieces, self._parts):
                p.append(t[:m])
            self._pos = m
            need -= m
        return [torch.cat(p) for p in pieces]

    def drain(self) -> None:
        """Finish a started prefetch (the answer must be received before the session ends)."""
        if self._pending is not None and isinstance(self._refill, Prefetch):
            self._refill.finish(self._pending)
        self._pending = None


class DevicePools:
    """One :class:`FlatPool` of a kind of tuple per device, made on first use by ``make(device)``;
    what a provider holds for each kind (binary triples, B2A bits)."""

    def __init__(self, make: Callable[[torch.device], FlatPool]) -> None:
        self._make = make
        self._pools: dict[str, FlatPool] = {}

    def take(self, device: Any, size: torch.Size) -> list[torch.Tensor]:
        """The next tuple of ``size`` (views of the pool where it holds them whole)."""
        dev = torch.device(device if device is not None else "cpu")
        pool = self._pools.get(str(dev))
        if pool is None:
            pool = self._pools[str(dev)] = self._make(dev)
        return [t.view(size) for t in pool.take(size.numel())]

    def drain(self) -> None:
        for pool in self._pools.values():
            pool.drain()

    def clear(self) -> None:
        self._pools = {}
