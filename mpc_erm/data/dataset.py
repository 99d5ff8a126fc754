"""The in-memory data set every other layer consumes, and the one error type of the data layer.

A ``Dataset`` is validated once, when it is built, so that models, privacy calibration and the
protocols can rely on the conventions of docs/explanation/contracts.md (float64 features, labels in the
task's domain) without re-checking them.  Whether rows lie in the unit ball is *reported*
(``is_unit_ball``) rather than enforced, because raw loaders legitimately produce unscaled data
that ``preprocess`` then maps into the ball.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Task = Literal["binary", "multiclass", "regression"]
TASKS: tuple[str, ...] = ("binary", "multiclass", "regression")

#: Slack allowed on ||x|| <= 1 and on |y| <= 1 for floating-point rounding of scaled data.
UNIT_BALL_TOL = 1e-9

#: Most classes a multiclass data set may have (the job spec's n_classes has the same bound): a
#: label of 10^12 must be refused, not turned into a 10^12-column softmax model.
MAX_CLASSES = 10_000


class DataError(ValueError):
    """Bad input data; the message names the file (or data set) and the column/row at fault."""


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view, so a frozen Dataset cannot be mutated through its arrays."""
    v = a.view()
    v.flags.writeable = False
    return v


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


@dataclass(frozen=True, eq=False)
class Dataset:
    """Features, labels and task of one data set (or one party's share of it).

    ``X`` is (n, d) float64; ``y`` is (n,) with the task's domain: binary float64 in {-1, +1},
    multiclass int64 in 0..n_classes-1, regression float64 in [-1, 1].  ``feature_names``
    defaults to ``x0..x{d-1}``; ``n_classes`` is required to be K >= 2 for multiclass (inferred
    as max(y)+1 when omitted), 2 or None for binary, None for regression.
    """

    X: np.ndarray
    y: np.ndarray
    task: Task
    name: str = "dataset"
    feature_names: tuple[str, ...] = field(default=())
    n_classes: int | None = None

    def __post_init__(self) -> None:
        where = f"data set {self.name!r}"
        if self.task not in TASKS:
            raise DataError(f"{where}: task must be one of {TASKS}, got {self.task!r}")
        X = np.asarray(self.X)
        if X.ndim != 2:
            raise DataError(f"{where}: X must be 2-D (n, d), got shape {X.shape}")
        if not (np.issubdtype(X.dtype, np.floating) or np.issubdtype(X.dtype, np.integer)
                or X.dtype == np.bool_):
            raise DataError(f"{where}: X must be numeric, got dtype {X.dtype}")
        X = np.ascontiguousarray(X, dtype=np.float64)
        n, d = X.shape
        finite = np.isfinite(X)
        if not finite.all():
            r, c = np.argwhere(~finite)[0]
            raise DataError(f"{where}: X has a non-finite value {X[r, c]} at row {r}, column {c}")
        y = np.asarray(self.y)
        if y.ndim != 1 or y.shape[0] != n:
            raise DataError(f"{where}: y must have shape ({n},) to match X, got {y.shape}")
        y, n_classes = self._check_labels(y, where)
        names = tuple(str(s) for s in self.feature_names) or tuple(f"x{j}" for j in range(d))
        if len(names) != d:
            raise DataError(f"{where}: {len(names)} feature_names for {d} columns of X")
        object.__setattr__(self, "X", _readonly(X))
        object.__setattr__(self, "y", _readonly(y))
        object.__setattr__(self, "feature_names", names)
        object.__setattr__(self, "n_classes", n_classes)

    def _check_labels(self, y: np.ndarray, where: str) -> tuple[np.ndarray, int | None]:
        if y.dtype == np.bool_ or not (np.issubdtype(y.dtype, np.floating)
                                       or np.issubdtype(y.dtype, np.integer)):
            raise DataError(f"{where}: y must be numeric for task {self.task!r}, got {y.dtype}")
        if self.task == "binary":
            y = np.ascontiguousarray(y, dtype=np.float64)
            bad = (y != 1.0) & (y != -1.0)
            if bad.any():
                i = _first_bad(bad)
                raise DataError(f"{where}: binary labels must be -1/+1, row {i} has {y[i].item()!r}")
            if self.n_classes not in (None, 2):
                raise DataError(f"{where}: n_classes must be None or 2 for binary, "
                                f"got {self.n_classes}")
            return y, self.n_classes
        if self.task == "multiclass":
            if np.issubdtype(y.dtype, np.floating):
                nonint = ~np.isfinite(y) | (y != np.round(y)) | (np.abs(y) > 2.0**62)
                if nonint.any():
                    i = _first_bad(nonint)
                    raise DataError(f"{where}: multiclass labels must be integers, "
                                    f"row {i} has {y[i].item()!r}")
            y = np.ascontiguousarray(y, dtype=np.int64)
            k = self.n_classes
            if k is None:
                k = int(y.max()) + 1 if y.size else 0
            if k < 2:
                raise DataError(f"{where}: multiclass needs n_classes >= 2, got {k}")
            if k > MAX_CLASSES:
                raise DataError(f"{where}: at most {MAX_CLASSES:,} classes are supported, got n_classes={k:,}")
            bad = (y < 0) | (y >= k)
            if bad.any():
                i = _first_bad(bad)
                raise DataError(f"{where}: multiclass labels must be in 0..{k - 1}, "
                                f"row {i} has {y[i]}")
            return y, int(k)
        y = np.ascontiguousarray(y, dtype=np.float64)
        bad = ~np.isfinite(y) | (np.abs(y) > 1.0 + UNIT_BALL_TOL)
        if bad.any():
            i = _first_bad(bad)
            raise DataError(f"{where}: regression labels must lie in [-1, 1] (scale them with "
                            f"preprocess.scale_regression_labels), row {i} has {y[i].item()!r}")
        if self.n_classes is not None:
            raise DataError(f"{where}: n_classes must be None for regression")
        return y, None

    @property
    def n(self) -> int:
        """Number of rows."""
        return int(self.X.shape[0])

    @property
    def d(self) -> int:
        """Number of features (columns of X)."""
        return int(self.X.shape[1])

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        k = f", n_classes={self.n_classes}" if self.n_classes is not None else ""
        return f"Dataset(name={self.name!r}, task={self.task!r}, n={self.n}, d={self.d}{k})"

    def row_norms(self) -> np.ndarray:
        """Euclidean norm of every row (the privacy analysis needs all <= 1)."""
        return np.sqrt(np.einsum("ij,ij->i", self.X, self.X))

    def max_row_norm(self) -> float:
        return float(self.row_norms().max()) if self.n else 0.0

    def is_unit_ball(self, tol: float = UNIT_BALL_TOL) -> bool:
        """True when every row has ||x||_2 <= 1 + tol, as the sensitivity bounds assume."""
        return self.max_row_norm() <= 1.0 + tol

    def subset(self, idx: np.ndarray | list[int] | slice, name: str | None = None) -> Dataset:
        """The rows ``idx`` (integer indices, boolean mask or slice) as a new Dataset.

        n_classes is kept, so a party whose share lacks some class still agrees on K.
        """
        if isinstance(idx, slice):
            sel: np.ndarray | slice = idx
        else:
            sel = np.asarray(idx)
            if sel.dtype == np.bool_:
                if sel.shape != (self.n,):
                    raise DataError(f"data set {self.name!r}: boolean mask of shape {sel.shape}"
                                    f" for {self.n} rows")
            elif sel.size == 0:
                sel = sel.astype(np.int64)
            elif not np.issubdtype(sel.dtype, np.integer):
                raise DataError(f"data set {self.name!r}: subset indices must be integers, "
                                f"got {sel.dtype}")
            elif sel.size and (sel.min() < -self.n or sel.max() >= self.n):
                raise DataError(f"data set {self.name!r}: subset index out of range for "
                                f"{self.n} rows")
        return Dataset(X=self.X[sel], y=self.y[sel], task=self.task,
                       name=self.name if name is None else name,
                       feature_names=self.feature_names, n_classes=self.n_classes)

    def label_counts(self) -> dict[float | int, int]:
        """Rows per label value (for binary/multiclass; a sanity check on balance)."""
        vals, counts = np.unique(self.y, return_counts=True)
        return {v.item(): int(c) for v, c in zip(vals, counts)}
