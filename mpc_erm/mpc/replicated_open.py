"""Openings that a deviating compute party cannot falsify: 3-party replicated shares, each of the
three additive shares held by two parties, and every opened value rebuilt from both holders'
copies.

Party i holds shares i and i + 1 (mod 3), so share j is held by parties j and j − 1. Whatever a
party computes from a share by public linear maps (sums, the contributors' proof checks in
:mod:`.norm_proof`) its share's second holder computes too; an opening takes each share's result
from both holders and stops at the first difference. With at most one deviating party, every share
has an honest holder, so an opening either returns the value the protocol defines or raises
:class:`OpeningMismatch`, naming the share and its two holders (one of whom deviated; which one the
other parties cannot tell from the opening alone).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from . import field as F

__all__ = ["PARTIES", "OpeningMismatch", "holders", "open_verified", "shares_of"]

PARTIES = 3


class OpeningMismatch(RuntimeError):
    """Two holders of one share reported different results: a compute party deviated."""

    def __init__(self, share: int, parties: tuple[int, int]) -> None:
        super().__init__(f"share {share}: its holders, parties {parties[0]} and {parties[1]}, disagree")
        self.share = share
        self.parties = parties


def shares_of(party: int) -> tuple[int, int]:
    return party % PARTIES, (party + 1) % PARTIES


def holders(share: int) -> tuple[int, int]:
    return share % PARTIES, (share - 1) % PARTIES


def open_verified(reports: Mapping[int, Mapping[int, np.ndarray]]) -> np.ndarray:
    """The opened field vector from every party's results per share it holds
    (``reports[party][share]``); raises :class:`OpeningMismatch` if two holders differ."""
    total: np.ndarray | None = None
    for share in range(PARTIES):
        a, b = holders(share)
        mine, theirs = reports[a][share], reports[b][share]
        if mine.shape != theirs.shape or not np.array_equal(mine, theirs):
            raise OpeningMismatch(share, (a, b))
        total = mine.astype(np.uint64) if total is None else F.add(total, mine)
    assert total is not None
    return total
