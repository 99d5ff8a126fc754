"""Split row indices among m parties: equal, by given sizes, or with Dirichlet label skew.

All partitioners return disjoint int64 index arrays and are vectorised (a permutation plus
``np.split``), because the simulator runs up to m = 50,000 one-row parties; the only Python
loops are over classes (Dirichlet) and the final list of m views.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .dataset import DataError

RngLike = np.random.Generator | int | None


def _rng(rng: RngLike) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def _check_count(value: object, arg: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise DataError(f"{arg} must be an integer, got {value!r}")
    if value < minimum:
        raise DataError(f"{arg} must be >= {minimum}, got {value}")
    return int(value)


def _split_by_owner(owner: np.ndarray, m: int) -> list[np.ndarray]:
    """Index arrays per party from an (n,) owner array (-1 = unused), each sorted ascending."""
    used = np.flatnonzero(owner >= 0)
    order = used[np.argsort(owner[used], kind="stable")]
    counts = np.bincount(owner[used], minlength=m)
    return np.split(order.astype(np.int64), np.cumsum(counts)[:-1])


def partition_equal(n: int, m: int, rng: RngLike = None) -> list[np.ndarray]:
    """Randomly split rows 0..n-1 among m parties whose sizes differ by at most one."""
    n = _check_count(n, "n", 1)
    m = _check_count(m, "m", 1)
    if m > n:
        raise DataError(f"m (number of parties, {m}) must be <= n (number of rows, {n})")
    perm = _rng(rng).permutation(n).astype(np.int64)
    return np.array_split(perm, m)


def partition_sizes(n: int, sizes: Sequence[int] | np.ndarray, rng: RngLike = None
                    ) -> list[np.ndarray]:
    """Randomly give party i exactly sizes[i] >= 1 distinct rows; sum(sizes) <= n rows are used."""
    n = _check_count(n, "n", 1)
    s = np.asarray(sizes)
    if s.ndim != 1 or s.size == 0:
        raise DataError(f"sizes must be a non-empty 1-D sequence, got shape {s.shape}")
    if not np.issubdtype(s.dtype, np.integer):
        if not (np.issubdtype(s.dtype, np.floating) and np.all(s == np.round(s))):
            raise DataError(f"sizes must be integers, got dtype {s.dtype}")
        s = s.astype(np.int64)
    if (s < 1).any():
        i = int(np.flatnonzero(s < 1)[0])
        raise DataError(f"sizes[{i}] must be >= 1, got {s[i]}")
    total = int(s.sum())
    if total > n:
        raise DataError(f"sum(sizes) = {total} exceeds n = {n}")
    perm = _rng(rng).permutation(n)[:total].astype(np.int64)
    return np.split(perm, np.cumsum(s)[:-1])


def partition_dirichlet(labels: Sequence[float] | np.ndarray, m: int, alpha: float,
                        rng: RngLike = None, min_size: int = 1) -> list[np.ndarray]:
    """Non-iid label skew: party proportions of each class ~ Dirichlet(alpha * 1_m).

    Small alpha -> each party sees few classes; large alpha -> close to iid.  Every row is
    assigned.  Parties below ``min_size`` are then topped up with rows taken at random from
    parties above it (keeps the skew while guaranteeing that no party is empty, which the
    protocols need); this requires n >= m * min_size.
    """
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0:
        raise DataError(f"labels must be a non-empty 1-D array, got shape {y.shape}")
    n = y.size
    m = _check_count(m, "m", 1)
    min_size = _check_count(min_size, "min_size", 0)
    if not (isinstance(alpha, (int, float, np.floating, np.integer)) and alpha > 0
            and np.isfinite(alpha)):
        raise DataError(f"alpha must be a positive finite number, got {alpha!r}")
    if m * min_size > n:
        raise DataError(f"m * min_size = {m} * {min_size} exceeds the {n} rows (labels)")
    g = _rng(rng)
    classes, y_idx = np.unique(y, return_inverse=True)
    owner = np.empty(n, dtype=np.int64)
    for k in range(classes.size):
        rows = np.flatnonzero(y_idx == k)
        g.shuffle(rows)
        # Gamma draws normalised = Dirichlet; robust to underflow when alpha is tiny.
        w = g.standard_gamma(float(alpha), size=m)
        total = w.sum()
        if not total > 0:
            w = np.zeros(m)
            w[g.integers(m)] = 1.0
            total = 1.0
        counts = g.multinomial(rows.size, w / total)
        owner[rows] = np.repeat(np.arange(m, dtype=np.int64), counts)
    if min_size > 0:
        owner = _top_up(owner, m, min_size, g)
    return _split_by_owner(owner, m)


def _top_up(owner: np.ndarray, m: int, min_size: int, g: np.random.Generator) -> np.ndarray:
    """Move random surplus rows to parties with fewer than min_size rows (vectorised)."""
    sizes = np.bincount(owner, minlength=m)
    deficit = np.maximum(min_size - sizes, 0)
    need = int(deficit.sum())
    if need == 0:
        return owner
    order = np.argsort(owner, kind="stable")
    starts = np.cumsum(sizes) - sizes
    rank = np.empty_like(order)
    rank[order] = np.arange(owner.size) - np.repeat(starts, sizes)
    donors = np.flatnonzero(rank >= min_size)  # rows beyond their party's first min_size
    take = g.choice(donors, size=need, replace=False)
    owner = owner.copy()
    owner[take] = np.repeat(np.arange(m, dtype=np.int64), deficit)
    return owner


def party_index(parts: Sequence[np.ndarray], n: int) -> np.ndarray:
    """(n,) int64 array giving each row's party, -1 for rows no party holds.

    Raises if the parts overlap or index outside 0..n-1, so it doubles as a disjointness check.
    """
    n = _check_count(n, "n", 0)
    owner = np.full(n, -1, dtype=np.int64)
    if len(parts) == 0:
        return owner
    lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    flat = np.concatenate([np.asarray(p).ravel() for p in parts]).astype(np.int64, copy=False)
    if flat.size == 0:
        return owner
    if flat.min() < 0 or flat.max() >= n:
        bad = int(flat[(flat < 0) | (flat >= n)][0])
        raise DataError(f"parts: row index {bad} is outside 0..{n - 1} (n = {n})")
    counts = np.bincount(flat, minlength=n)
    if (counts > 1).any():
        raise DataError(f"parts: row {int(np.flatnonzero(counts > 1)[0])} belongs to more "
                        f"than one party")
    owner[flat] = np.repeat(np.arange(len(parts), dtype=np.int64), lengths)
    return owner
