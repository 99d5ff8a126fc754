"""The error a job's privacy plan raises when its spec cannot be planned as asked, naming the
job-file field to change (its own module: the plan and its parts, :mod:`.transfer`, both raise it)."""

from __future__ import annotations

__all__ = ["PlanError"]


class PlanError(ValueError):
    """The spec cannot be planned as asked; ``field`` names the job-file field to change."""

    def __init__(self, field_name: str, message: str) -> None:
        self.field = field_name
        super().__init__(f"{field_name}: {message}")
