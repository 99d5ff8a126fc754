"""A batch of exactly b of the parties' pooled rows each round, as each party sees it.

With ``training.batch_size`` a round's batch is b rows drawn uniformly without replacement from
all N = Σ n_j rows the parties hold (the thesis's DP-SRM sampling). No party may learn which of
another's rows were drawn; each must know its own, to compute on them. A party's part of the
draw is therefore a (rounds, n_j) bit matrix: the daemons make it by the parties' secret shuffle
(``parties/row_sample.py``), the simulator by one joint draw (:func:`pooled_draws`) of the same
distribution. The protocol (:class:`~.dpsgd.DpSgd`) reads one round's row indices at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

__all__ = ["RowDraws", "pooled_draws"]


@dataclass
class RowDraws:
    """One party's draws: round t's bit of each of its rows, packed (numpy's big-endian bit order,
    ``rows`` bits a round); :meth:`next` gives the next round's drawn row indices."""

    packed: np.ndarray  # (rounds, ceil(rows / 8)) uint8
    rows: int
    round: int = field(default=0)

    def __post_init__(self) -> None:
        if self.packed.ndim != 2 or self.packed.shape[1] != (self.rows + 7) // 8:
            raise ValueError(f"row draws: (rounds, {(self.rows + 7) // 8}) packed bytes expected for {self.rows} rows, "
                             f"got {self.packed.shape}")

    @property
    def rounds(self) -> int:
        return int(self.packed.shape[0])

    def bits(self, t: int) -> np.ndarray:
        """Round t's (0-based) bit of each row."""
        return np.unpackbits(self.packed[t], count=self.rows)

    def next(self) -> Tensor:
        """The drawn rows' indices of the next round."""
        if self.round >= self.rounds:
            raise ValueError(f"row draws: only {self.rounds} rounds were drawn")
        idx = torch.from_numpy(np.flatnonzero(self.bits(self.round)).astype(np.int64))
        self.round += 1
        return idx


def pooled_draws(counts: Sequence[int], batch: int, rounds: int, generator: torch.Generator) -> list[RowDraws]:
    """The simulator's draw: each round b of the N = Σ counts pooled rows uniformly without
    replacement (``torch.randperm`` on ``generator``), split by party (party j's rows are the
    pooled rows Σ_{i<j} n_i … Σ_{i≤j} n_i − 1)."""
    n_all = int(sum(counts))
    if not 1 <= batch < n_all:
        raise ValueError(f"training.batch_size: 1 to {n_all - 1} of the {n_all} pooled rows, got {batch}")
    bits = np.zeros((rounds, n_all), dtype=np.uint8)
    for t in range(rounds):
        bits[t, torch.randperm(n_all, generator=generator)[:batch].numpy()] = 1
    out, lo = [], 0
    for n in counts:
        out.append(RowDraws(np.packbits(bits[:, lo:lo + n], axis=1), int(n)))
        lo += n
    return out
