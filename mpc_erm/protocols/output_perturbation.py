"""MPC output perturbation ("MPC Out P", thesis §6.3.1), transport-independent.

Every party solves its local λ-strongly-convex ERM exactly (to a certified tolerance), the
aggregator returns the weighted average of the local minimisers plus noise added once.

Sensitivity: pooled weights n_j/n give ‖Σ_j w_j(θ_j − θ'_j)‖ ≤ (n_j/n)·2G/(n_j λ) = 2G/(nλ); the
thesis's equal weights 1/m give 2G/(m·n_min·λ). The local solver's certified error τ adds at most
2·max_j w_j·τ (θ̂_j and θ̂'_j each lie within τ of their exact minimisers), which we add to Δ
rather than assume away. Noise: ℓ2-Laplace (pure ε, default), analytic Gaussian (ε, δ), or
per-coordinate Laplace with the honest Δ₁ = √p·Δ₂ ("laplace_thesis"); see mpc_erm.privacy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mpc_erm.models import solve_erm
from mpc_erm.privacy import (
    Calibration,
    PrivacyReport,
    calibrate_output_perturbation,
    output_perturbation_sensitivity,
)
from mpc_erm.protocols.aggregation import NoiseSpec, SecureAggregator
from mpc_erm.protocols.common import PartySizes, lipschitz_for, loss_for, model_weights, project_to_unit_ball
from mpc_erm.protocols.spec import JobSpec


class LocalSolveError(RuntimeError):
    """A local solve did not reach its certified tolerance: releasing it would void the proof."""


@dataclass
class OutputPerturbation:
    spec: JobSpec
    parties: PartySizes
    n_features: int
    calibration: Calibration = field(init=False)
    noise: NoiseSpec = field(init=False)

    def __post_init__(self) -> None:
        if self.spec.method != "output":
            raise ValueError("method: OutputPerturbation needs method = 'output'")
        self.loss = loss_for(self.spec)
        self.p = self.loss.param_dim(self.n_features)
        lam = self.spec.model.lam
        self.lipschitz = lipschitz_for(self.loss, lam)
        self.weights = model_weights(self.parties, self.spec.training.weighting)
        base = output_perturbation_sensitivity(
            self.lipschitz, lam, self.parties.sizes, self.spec.training.weighting, self.spec.privacy.adjacency
        )
        self.solver_slack = 2.0 * float(self.weights.max()) * self.spec.training.solver_tol
        self.sensitivity = base + self.solver_slack
        pv = self.spec.privacy
        self.calibration = calibrate_output_perturbation(
            self.sensitivity, self.p, pv.epsilon, pv.delta, mechanism=pv.mechanism, adjacency=pv.adjacency
        )
        self.noise = NoiseSpec(self.calibration.mechanism, self.calibration.scale)

    def local_model(self, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """θ̂_j: the party's exact regularised minimiser, certified to ``solver_tol``."""
        X, _ = project_to_unit_ball(X)
        self.loss.check_labels(y)
        res = solve_erm(self.loss, X, y, self.spec.model.lam, tol=self.spec.training.solver_tol)
        if not res.converged or res.certified_error > self.spec.training.solver_tol:
            raise LocalSolveError(
                f"local solve stopped at certified error {res.certified_error:.3g} > "
                f"training.solver_tol {self.spec.training.solver_tol:.3g}"
            )
        return res.theta

    def release(
        self, aggregator: SecureAggregator, local_models: torch.Tensor, party_ids: torch.Tensor | list[int]
    ) -> torch.Tensor:
        """Securely aggregate the caller's local model(s) (rows of ``local_models``) with their
        public weights, add the calibrated noise once, and return the revealed private model."""
        w = self.weights[torch.as_tensor(party_ids, dtype=torch.long)]
        return aggregator.aggregate(local_models, w.to(local_models.dtype), self.noise)

    def report(self, trust_model: str) -> PrivacyReport:
        return self.calibration.report(
            trust_model=trust_model,
            parties=self.parties.m,
            n=self.parties.n,
            parameters={
                "protocol": "output_perturbation",
                "loss": self.loss.name,
                "lam": self.spec.model.lam,
                "lipschitz_G": self.lipschitz,
                "weighting": self.spec.training.weighting,
                "solver_tol": self.spec.training.solver_tol,
                "solver_slack_in_sensitivity": self.solver_slack,
                "dim": self.p,
            },
        )
