"""The JSON privacy report attached to every result (docs/explanation/privacy.md §8: mechanism, σ, accountant,
ε, δ incl. the sampler term, parties, n, trust model, security model).

``delta_sampler`` is the extra δ charged for deviations of the actual sampler from the ideal
distribution (truncation, grid holes; docs/explanation/privacy.md §5). The plaintext simulator samples the ideal
float64 distribution and reports 0.0 with a note saying so; the MPC engine must fill in its
measured/bounded term. ``delta_total`` = ``delta`` + ``delta_sampler`` is the guarantee.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA = "mpc_erm.privacy_report/1"
#: What the compute parties are assumed to do: follow the protocol ("semi-honest") or deviate
#: arbitrarily, one of three ("malicious": every product and opening verified before a release).
Security = Literal["semi-honest", "malicious"]
SIMULATION_TRUST_MODEL = "simulation (in-process, trusted)"
SIMULATION_SAMPLER_NOTE = (
    "delta_sampler = 0: plaintext float64 sampler of the ideal distribution in a trusted "
    "in-process simulation; floating-point effects of the sampler are not bounded"
)

__all__ = ["SCHEMA", "SIMULATION_SAMPLER_NOTE", "SIMULATION_TRUST_MODEL", "PrivacyReport", "Security"]


class PrivacyReport(BaseModel):
    """What was done to whose data, with which guarantee. Immutable; JSON round-trips exactly."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, ser_json_inf_nan="constants", populate_by_name=True
    )

    schema_: str = Field(SCHEMA, alias="schema")
    mechanism: Literal["gaussian", "laplace", "l2_laplace", "none"]
    noise_scale: float = Field(
        ..., ge=0.0, description="σ (gaussian), b (laplace), Δ₂/ε (l2_laplace)"
    )
    norm: Literal["l2", "l1"] = Field(
        ..., description="the sensitivity norm the noise is calibrated to"
    )
    sensitivity_l2: float | None = Field(None, ge=0.0)
    sensitivity_l1: float | None = Field(None, ge=0.0)
    adjacency: Literal["replace", "add_remove"]
    accountant: str
    epsilon: float = Field(..., ge=0.0)
    delta: float = Field(..., ge=0.0, le=1.0)
    delta_sampler: float = Field(0.0, ge=0.0, le=1.0)
    rounds: int = Field(1, ge=1)
    sampling_rate: float = Field(1.0, gt=0.0, le=1.0)
    trust_model: str = SIMULATION_TRUST_MODEL
    # what the compute parties were assumed to do: follow the protocol ("semi-honest") or deviate
    # ("malicious", every product and opening verified); None: an in-process simulation (one
    # trusted process) or a report written before the field existed
    security: Security | None = None
    parties: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1)
    parameters: dict[str, Any] = Field(default_factory=dict)
    # the job's privacy plan (mpc_erm.privacy.plan.PrivacyPlan.describe(): event, multiplier, what is
    # public, sensitivity inputs) and how the engine realised its noise: enough to recompute ε alone
    plan: dict[str, Any] | None = None
    realisation: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()

    @field_validator("noise_scale", "sensitivity_l2", "sensitivity_l1", "delta", "delta_sampler")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be finite")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> PrivacyReport:
        if self.norm == "l2" and self.sensitivity_l2 is None and self.mechanism != "none":
            raise ValueError("sensitivity_l2: required when norm is 'l2'")
        if self.norm == "l1" and self.sensitivity_l1 is None:
            raise ValueError("sensitivity_l1: required when norm is 'l1'")
        return self

    @property
    def delta_total(self) -> float:
        """δ of the guarantee actually claimed: accountant δ plus the sampler's δ."""
        return min(1.0, self.delta + self.delta_sampler)

    def to_json(self, **kwargs: Any) -> str:
        """JSON text (``Infinity`` for the ε of a non-private run)."""
        return self.model_dump_json(by_alias=True, **kwargs)

    @classmethod
    def from_json(cls, text: str | bytes) -> PrivacyReport:
        return cls.model_validate_json(text)
