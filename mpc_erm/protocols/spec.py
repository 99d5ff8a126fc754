"""The training spec: what every party must agree on before a job starts.

One pydantic model serves the simulator, the job TOML of the coordinator and (later) the spec hash
all parties compare, so a field means the same thing everywhere. Errors name the field.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Method = Literal["output", "gradient"]
ModelName = Literal["logistic", "ridge", "huber_svm", "softmax"]
OutputMechanism = Literal["l2_laplace", "gaussian", "laplace_thesis"]
GradientAccountant = Literal["gdp", "zcdp", "rdp", "pld"]
Weighting = Literal["pooled", "thesis"]
Adjacency = Literal["replace", "add_remove"]


class _Strict(BaseModel):
    # no float field means anything at ±inf or NaN (an infinite clip would mean infinite noise); TOML can write both
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    name: ModelName = "logistic"
    lam: float = Field(1e-3, ge=0.0, description="ridge coefficient λ of λ/2·‖θ‖²")
    n_classes: int | None = Field(None, ge=2, le=10_000, description="softmax only")
    huber_h: float = Field(0.5, gt=0.0, le=1.0, description="huber_svm smoothing width h")

    @field_validator("lam")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


class PrivacySpec(_Strict):
    epsilon: float = Field(..., gt=0.0, le=100.0)
    delta: float = Field(0.0, ge=0.0, lt=1.0)
    # output perturbation: noise distribution; gradient perturbation: always Gaussian
    mechanism: OutputMechanism = "l2_laplace"
    # None: the tightest accountant valid for the noise actually sampled (RDP for the in-MPC discrete
    # Gaussian, exact GDP for the simulator's continuous one); see mpc_erm.privacy.plan
    accountant: GradientAccountant | None = None
    clip: float | None = Field(
        None, gt=0.0, description="per-example gradient ℓ2 clip C; default: the loss's Lipschitz constant G"
    )
    adjacency: Adjacency = "replace"
    public_n: int | None = Field(
        None, ge=1, le=10**12,
        description="add_remove only: the public record count aggregates are divided by (exact counts stay private)",
    )

    @field_validator("epsilon", "delta")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


class TrainingSpec(_Strict):
    iterations: int = Field(100, ge=1, le=1_000_000, description="T, gradient rounds")
    learning_rate: float = Field(1.0, gt=0.0, le=1e3, description="η")
    ls_sigma: float = Field(0.0, ge=0.0, le=1e4, description="Laplacian smoothing σ (0: off)")
    weighting: Weighting = "pooled"
    solver_tol: float = Field(1e-9, gt=0.0, le=1e-3, description="certified ‖θ̂−θ*‖ of local solves")


class JobSpec(_Strict):
    method: Method
    model: ModelSpec = ModelSpec()
    privacy: PrivacySpec
    training: TrainingSpec = TrainingSpec()
    seed: int | None = Field(None, ge=0, description="simulation only: seeds the plaintext noise")

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.method == "output":
            if self.model.lam <= 0:
                raise ValueError("model.lam: output perturbation needs λ > 0 (strong convexity bounds the sensitivity)")
            if self.privacy.mechanism == "gaussian" and self.privacy.delta <= 0:
                raise ValueError("privacy.delta: the Gaussian mechanism needs δ > 0")
        else:
            if self.privacy.delta <= 0:
                raise ValueError("privacy.delta: gradient perturbation (Gaussian) needs δ > 0")
        if self.model.name == "softmax" and self.model.n_classes is None:
            raise ValueError("model.n_classes: required for softmax")
        return self

    def canonical_json(self) -> str:
        """Canonical form (sorted keys, no whitespace) that every party hashes and compares."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()
