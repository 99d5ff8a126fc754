"""Argument validation shared by the privacy modules.

Every error is a ``ValueError`` whose message starts with the argument's name, so that a caller
(CLI, job spec, protocol) can point at the field at fault (docs/explanation/contracts.md, "Errors").
That holds for wrong *types* too (hence the ``noqa: TRY004``): one exception class to catch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

ADJACENCIES = ("replace", "add_remove")


def positive(name: str, value: Any) -> float:
    """A finite number > 0."""
    x = _number(name, value)
    if not (x > 0.0 and math.isfinite(x)):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return x


def nonnegative(name: str, value: Any) -> float:
    """A finite number >= 0."""
    x = _number(name, value)
    if not (x >= 0.0 and math.isfinite(x)):
        raise ValueError(f"{name} must be non-negative and finite, got {value!r}")
    return x


def nonnegative_or_inf(name: str, value: Any) -> float:
    """A number >= 0, +inf allowed (NaN refused)."""
    x = _number(name, value)
    if not x >= 0.0:
        raise ValueError(f"{name} must be non-negative, got {value!r}")
    return x


def probability_open(name: str, value: Any) -> float:
    """A number in the open interval (0, 1), e.g. a DP δ."""
    x = _number(name, value)
    if not (0.0 < x < 1.0):
        raise ValueError(f"{name} must lie in (0, 1), got {value!r}")
    return x


def probability_half_open(name: str, value: Any) -> float:
    """A number in [0, 1) (a δ where 0 means pure DP)."""
    x = _number(name, value)
    if not (0.0 <= x < 1.0):
        raise ValueError(f"{name} must lie in [0, 1), got {value!r}")
    return x


def sampling_rate(name: str, value: Any) -> float:
    """A Poisson sampling probability in (0, 1]."""
    x = _number(name, value)
    if not (0.0 < x <= 1.0):
        raise ValueError(f"{name} must lie in (0, 1], got {value!r}")
    return x


def positive_int(name: str, value: Any) -> int:
    """An integer >= 1 (bools are refused: ``True`` is not a round count)."""
    if isinstance(value, bool) or not isinstance(value, int | _np_integer()):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if int(value) < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def sizes(name: str, value: Any) -> list[int]:
    """A non-empty sequence of party sizes n_j >= 1."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | _np_ndarray()):
        raise ValueError(f"{name} must be a non-empty sequence of positive integers, got {value!r}")
    out = [positive_int(f"{name}[{j}]", v) for j, v in enumerate(value)]
    if not out:
        raise ValueError(f"{name} must be a non-empty sequence of positive integers, got {value!r}")
    return out


def adjacency(name: str, value: Any) -> str:
    if value not in ADJACENCIES:
        raise ValueError(f"{name} must be one of {ADJACENCIES}, got {value!r}")
    return str(value)


def choice(name: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
    return str(value)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None


def _np_integer() -> type:
    import numpy as np

    return np.integer


def _np_ndarray() -> type:
    import numpy as np

    return np.ndarray
