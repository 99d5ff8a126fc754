"""Many simulated parties held as one pooled tensor plus a party id per row (vectorised: the
thesis runs m = 50,000 one-row parties, far too many for a Python object per party)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mpc_erm.data import Dataset
from mpc_erm.protocols.common import PartySizes


@dataclass(frozen=True)
class SimulatedParties:
    X: torch.Tensor  # (n, d), rows of all parties, grouped by party
    y: torch.Tensor  # (n,)
    party_ids: torch.Tensor  # (n,) int64 in 0..m-1, non-decreasing
    sizes: PartySizes

    @classmethod
    def from_partition(cls, data: Dataset, parts: Sequence[np.ndarray]) -> SimulatedParties:
        order = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
        ids = np.concatenate([np.full(len(p), j, dtype=np.int64) for j, p in enumerate(parts)])
        y = torch.from_numpy(np.asarray(data.y)[order])
        if data.task == "multiclass":
            y = y.to(torch.int64)
        else:
            y = y.to(torch.float64)
        return cls(
            X=torch.from_numpy(np.ascontiguousarray(data.X[order], dtype=np.float64)),
            y=y,
            party_ids=torch.from_numpy(ids),
            sizes=PartySizes.of([len(p) for p in parts]),
        )

    @property
    def m(self) -> int:
        return self.sizes.m

    def padded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(m, k_max, d) features, (m, k_max) labels and mask, for the batched local solvers."""
        m, k = self.m, max(self.sizes.sizes)
        d = self.X.shape[1]
        starts = torch.tensor(np.concatenate([[0], np.cumsum(self.sizes.sizes)[:-1]]), dtype=torch.int64)
        pos = torch.arange(self.X.shape[0]) - starts[self.party_ids]
        Xp = torch.zeros(m, k, d, dtype=self.X.dtype)
        # padding rows carry a label valid for every task (+1 / class 0); the mask excludes them
        fill = 1.0 if self.y.dtype.is_floating_point else 0
        yp = torch.full((m, k), fill, dtype=self.y.dtype)
        mask = torch.zeros(m, k, dtype=torch.bool)
        Xp[self.party_ids, pos] = self.X
        yp[self.party_ids, pos] = self.y
        mask[self.party_ids, pos] = True
        return Xp, yp, mask
