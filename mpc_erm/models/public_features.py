"""The public feature rows of a knowledge-transfer job (``[transfer]``, DPSL-KT), and the one
number about them its privacy needs: their matrix's operator norm. The rows are drawn from the
job's seed (:class:`PublicFeatures`) or are a public file every member holds (:class:`PublicFile`).

A knowledge-transfer job releases the teacher's scores on m public rows, X̃·θ̂ + noise. Two
neighbouring data sets move θ̂ by at most Δθ (strong convexity, the output release's bound), so
they move the scores by at most ‖X̃‖₂·Δθ: the release's ℓ2 sensitivity, exact for any X̃, with no
high-probability event (the thesis's proof needs one, and a converged ℓ0-constrained teacher).

Every member draws X̃ from the job's public seed with NumPy's PCG64 generator, whose streams are
the same on every platform, or reads the public file (the members compare its digest), and holds
it as the parties hold their rows: rows with ‖x̃‖ > 1 scaled onto the unit sphere. The norm is
an upper bound certified against floating-point error and rounded up to :data:`NORM_DIGITS`
significant digits, so every member states the same number.
NumPy only: the daemon's control process plans a job without importing torch.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

__all__ = ["MAX_PUBLIC_ENTRIES", "NORM_DIGITS", "Distribution", "PublicFeatures", "PublicFile", "certified_norm",
           "round_up"]

Distribution = Literal["uniform", "gaussian"]
#: m·d cap: the matrix is held in float64 by every member (1.6 GB at the cap).
MAX_PUBLIC_ENTRIES = 200_000_000
#: Significant digits of the stated norm (rounded up): far above any platform's floating-point
#: disagreement, so every member plans the same sensitivity.
NORM_DIGITS = 9
_UNIT_ROUNDOFF = 2.0**-53


@dataclass(frozen=True)
class PublicFeatures:
    """m public rows in d features, drawn from ``distribution`` with ``scale`` (the entries' half
    width for "uniform", their standard deviation for "gaussian"; None: 1/√d, the largest box
    inside the unit ball) from ``seed``."""

    rows: int
    features: int
    distribution: Distribution = "uniform"
    scale: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rows < 1 or self.features < 1:
            raise ValueError(f"transfer.rows: {self.rows} public rows in {self.features} features; both must be ≥ 1")
        if self.rows * self.features > MAX_PUBLIC_ENTRIES:
            raise ValueError(f"transfer.rows: {self.rows} public rows × {self.features} features exceeds "
                             f"{MAX_PUBLIC_ENTRIES:,} entries")
        if self.distribution not in ("uniform", "gaussian"):
            raise ValueError(f"transfer.distribution: 'uniform' or 'gaussian', not {self.distribution!r}")
        if self.scale is not None and not (0.0 < self.scale < math.inf):
            raise ValueError(f"transfer.scale: must be positive and finite, got {self.scale}")

    @property
    def entry_scale(self) -> float:
        return float(self.scale) if self.scale is not None else 1.0 / math.sqrt(self.features)

    def matrix(self) -> np.ndarray:
        """X̃ (m, d) in float64, every row in the unit ball (as the parties' rows are held)."""
        return _matrix(self)

    def operator_norm(self) -> float:
        """An upper bound on ‖X̃‖₂, the largest singular value (module docstring)."""
        return _operator_norm(self)

    def describe(self) -> str:
        scale = f"{self.entry_scale:.6g}" + (" (1/√d)" if self.scale is None else "")
        law = f"U(−{scale}, {scale})" if self.distribution == "uniform" else f"N(0, {scale}²)"
        return (f"{self.rows} public rows, entries i.i.d. {law} from NumPy PCG64 seed {self.seed}, rows scaled into "
                "the unit ball")


@functools.lru_cache(maxsize=4)
def _matrix(pf: PublicFeatures) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(pf.seed))
    shape, b = (pf.rows, pf.features), pf.entry_scale
    X = rng.uniform(-b, b, shape) if pf.distribution == "uniform" else b * rng.standard_normal(shape)
    X = _in_unit_ball(X, copy=False)
    X.setflags(write=False)  # shared by every caller of the cache
    return X


@dataclass(frozen=True)
class PublicFile:
    """Public rows every member holds: the features of its data set's public test file, as the
    parties hold rows (in the unit ball), pinned by ``sha256`` (:meth:`of`)."""

    rows: int
    features: int
    sha256: str
    values: np.ndarray = field(compare=False, hash=False, repr=False)

    @classmethod
    def of(cls, X: np.ndarray) -> PublicFile:
        """The file's rows, scaled into the unit ball, and their digest (shape, then float64 bytes)."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1:
            raise ValueError(f"transfer.public: the public rows must be a non-empty table, got shape {X.shape}")
        if X.size > MAX_PUBLIC_ENTRIES or not np.isfinite(X).all():
            raise ValueError("transfer.public: the public rows must be finite and at most "
                             f"{MAX_PUBLIC_ENTRIES:,} entries")
        X = _in_unit_ball(X)
        X.setflags(write=False)
        h = hashlib.sha256(f"{X.shape[0]}x{X.shape[1]}:".encode())
        h.update(X.astype("<f8").tobytes())
        return cls(int(X.shape[0]), int(X.shape[1]), h.hexdigest(), X)

    def matrix(self) -> np.ndarray:
        return self.values

    def operator_norm(self) -> float:
        return _operator_norm(self)

    def describe(self) -> str:
        return (f"{self.rows} public rows, the features of the data set's public test file (sha256 "
                f"{self.sha256[:16]}…), rows scaled into the unit ball")


def _in_unit_ball(X: np.ndarray, copy: bool = True) -> np.ndarray:
    """Rows as the parties hold theirs (:func:`mpc_erm.data.preprocess.clip_to_unit_ball`), imported
    here: planning any other job must not load pandas with it."""
    from mpc_erm.data.preprocess import clip_to_unit_ball

    return clip_to_unit_ball(X, copy=copy)


@functools.lru_cache(maxsize=16)
def _operator_norm(pf: PublicFeatures | PublicFile) -> float:
    """A plan is made several times a job: one eigensolve per public matrix (a file is keyed by its
    digest, which pins its values)."""
    return certified_norm(pf.matrix())


def certified_norm(X: np.ndarray) -> float:
    """An upper bound on ‖X‖₂: √λ_max of the smaller Gram matrix, plus the worst-case error of
    forming it (n·u·‖X‖_F², n the inner dimension) and of the symmetric eigensolver (k²·u·λ, k its
    order), rounded up to :data:`NORM_DIGITS` significant digits."""
    rows, features = X.shape
    gram = X @ X.T if rows <= features else X.T @ X
    k, inner = gram.shape[0], max(rows, features)
    top = float(np.linalg.eigvalsh(gram)[-1])
    frob2 = float(np.einsum("ij,ij->", X, X))
    bound = top * (1.0 + k * k * _UNIT_ROUNDOFF) + inner * _UNIT_ROUNDOFF * frob2
    return round_up(math.sqrt(max(bound, 0.0)) * (1.0 + 4 * _UNIT_ROUNDOFF))


def round_up(x: float, digits: int = NORM_DIGITS) -> float:
    """``x`` rounded up to ``digits`` significant digits (a bound stays a bound)."""
    if x <= 0.0:
        return 0.0
    e = math.floor(math.log10(x)) - digits + 1
    c = math.ceil(x / 10.0**e)
    return c * 10.0**e if c * 10.0**e >= x else (c + 1) * 10.0**e
