"""A run's training curve and what it leaves for its results.

A curve point has a public part (round, ε spent, metrics on a public test set, counts such as the
owners that contributed) and a private part (``own``: metrics on the member's own training and
validation rows, a function of its data that no ε covers, which never leaves the member)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor

from mpc_erm.privacy.report import Security

__all__ = ["CurvePoint", "ModelFacts", "RunResult"]

Metrics = dict[str, float]


@dataclass(frozen=True)
class CurvePoint:
    """One point of the training curve (module docstring)."""

    round: int
    epsilon_spent: float
    test: Metrics | None = None
    own: dict[str, Metrics] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)  # public: epoch, owners counted

    def as_dict(self) -> dict[str, object]:
        """The point as the results files hold it (``own`` included: the caller drops it where public)."""
        out: dict[str, object] = {"round": self.round, **self.extra, "epsilon_spent": self.epsilon_spent,
                                  "own": self.own}
        if self.test is not None:
            out["test"] = self.test
        return out

    def public(self) -> dict[str, object]:
        return {k: v for k, v in self.as_dict().items() if k != "own"}


@dataclass(frozen=True)
class ModelFacts:
    """Public facts a model bundle records about its job."""

    job_id: str
    spec_digest: str
    name: str | None
    dataset: str | None
    trust_model: str
    security: Security | None = None  # None: an in-process run (one trusted process)

    def job(self) -> dict[str, object]:
        return {"job_id": self.job_id, "spec_digest": self.spec_digest, "name": self.name, "dataset": self.dataset}


ModelWriter = Callable[[Path, ModelFacts], None]


@dataclass
class RunResult:
    """What a run leaves for its host's results: the public model (flat, float64, CPU), the curve
    (its last point is the trained model's), the report's ``parameters`` and note, public counters
    for ``metrics.json``, and the writer of the model bundle."""

    model: Tensor
    curve: list[CurvePoint]
    note: str
    parameters: dict[str, object]
    write_model: ModelWriter
    extra: dict[str, object] = field(default_factory=dict)
