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

from dataclasses import dataclass

import torch

from mpc_erm.models import solve_erm
from mpc_erm.models.job_model import loss_for
from mpc_erm.privacy import PrivacyReport
from mpc_erm.privacy.plan import PrivacyPlan, plan_job, public_sizes
from mpc_erm.protocols.aggregation import NO_NOISE, NoiseSpec, SecureAggregator
from mpc_erm.protocols.common import PartySizes, project_to_unit_ball, run_report
from mpc_erm.spec import JobSpec


class LocalSolveError(RuntimeError):
    """A local solve did not reach its certified tolerance: releasing it would void the proof."""


@dataclass
class OutputPerturbation:
    """One job's output release. Privacy from ``plan`` (default: the simulator's ideal-noise plan
    for ``parties``); ``noise``: the plan's noise as the aggregator realises it (default: the
    plan's ideal noise, ``plan.noise_scale()``)."""

    spec: JobSpec
    parties: PartySizes | None
    n_features: int
    plan: PrivacyPlan | None = None
    noise: NoiseSpec | None = None

    def __post_init__(self) -> None:
        if self.spec.method != "output":
            raise ValueError("method: OutputPerturbation needs method = 'output'")
        self.loss = loss_for(self.spec)
        self.p = self.loss.param_dim(self.n_features)
        if self.plan is None:
            counts = None if self.parties is None else self.parties.sizes
            self.plan = plan_job(self.spec, sizes=public_sizes(self.spec, counts), n_features=self.n_features)
        pl = self.plan
        released = self.p if pl.transfer is None else pl.transfer.dim  # knowledge transfer: public rows' scores
        if pl.dim != released:
            raise ValueError(f"plan.dim {pl.dim} is not the release's {released} values")
        self.lipschitz = pl.clip
        self.sensitivity = pl.sensitivity_l2()
        self.weights = (torch.tensor([pl.weight(j, n) for j, n in enumerate(self.parties.sizes)], dtype=torch.float64)
                        if self.parties is not None else None)
        if self.noise is None:  # the plan's noise, whatever sampler it was planned for
            self.noise = NO_NOISE if pl.mechanism == "none" else NoiseSpec(
                pl.mechanism, pl.noise_scale(), sensitivity=pl.sensitivity())  # type: ignore[arg-type]

    def local_model(self, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """θ̂_j: the party's exact regularised minimiser, certified to the plan's tolerance for its
        row count (``training.solver_tol``; under add/remove scaled by n̂/n_j, see the plan)."""
        X, _ = project_to_unit_ball(X)
        self.loss.check_labels(y)
        assert self.plan is not None
        tol = self.plan.solver_tol_for(int(X.shape[0]))
        res = solve_erm(self.loss, X, y, self.spec.model.lam, tol=tol)
        if not res.converged or res.certified_error > tol:
            raise LocalSolveError(
                f"local solve stopped at certified error {res.certified_error:.3g} > {tol:.3g} "
                "(training.solver_tol)"
            )
        return res.theta

    def release(self, aggregator: SecureAggregator, local_models: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Securely aggregate the caller's local model(s) (rows of ``local_models``) with their
        weights (:meth:`PrivacyPlan.weight`), add the noise once, return the revealed model."""
        assert self.noise is not None
        return aggregator.aggregate(local_models, weights.to(local_models.dtype), self.noise)

    def report(self, trust_model: str) -> PrivacyReport:
        return run_report(
            self.plan, self.noise, trust_model, self.parties,
            {
                "protocol": "output_perturbation",
                "loss": self.loss.name,
                "lam": self.spec.model.lam,
                "lipschitz_G": self.lipschitz,
                "weighting": self.spec.training.weighting,
                "solver_tol": self.spec.training.solver_tol,
                "dim": self.p,
            },
        )
