"""MPC gradient perturbation ("MPC Grad P", thesis §6.3.2), transport-independent.

Round t: every party sums its per-example ℓ2-clipped gradients at the public θ_t; the aggregator
returns g̃_t = Σ_j w_j·s_j + N(0, σ²I); every party takes the same public step

    θ_{t+1} = θ_t − η·S(g̃_t + λθ_t),

where S is the optional Laplacian smoothing A_σ⁻¹ (post-processing of the revealed value: noise
first, then smoothing; σ_LS = 0 is the identity bit for bit). Clipping at C makes the per-round
sensitivity 2C/n (pooled, replace-one) whatever the data, so the guarantee does not rest on the
unit-ball assumption. σ is calibrated for the T-fold composition by the spec's accountant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mpc_erm.models import clip_rows
from mpc_erm.privacy import Calibration, PrivacyReport, calibrate_gradient_perturbation, gradient_sensitivity
from mpc_erm.protocols.aggregation import NoiseSpec, SecureAggregator
from mpc_erm.protocols.common import PartySizes, gradient_weights, lipschitz_for, loss_for
from mpc_erm.protocols.spec import JobSpec
from mpc_erm.smoothing import laplacian_smooth

RoundCallback = Callable[[int, torch.Tensor], None]


@dataclass
class GradientPerturbation:
    spec: JobSpec
    parties: PartySizes
    n_features: int
    calibration: Calibration = field(init=False)
    noise: NoiseSpec = field(init=False)

    def __post_init__(self) -> None:
        if self.spec.method != "gradient":
            raise ValueError("method: GradientPerturbation needs method = 'gradient'")
        self.loss = loss_for(self.spec)
        self.p = self.loss.param_dim(self.n_features)
        pv, tr = self.spec.privacy, self.spec.training
        self.clip = pv.clip if pv.clip is not None else lipschitz_for(self.loss, self.spec.model.lam)
        self.weights = gradient_weights(self.parties, tr.weighting)
        self.sensitivity = gradient_sensitivity(self.clip, self.parties.sizes, tr.weighting, pv.adjacency)
        self.calibration = calibrate_gradient_perturbation(
            self.sensitivity, tr.iterations, pv.epsilon, pv.delta, accountant=pv.accountant, adjacency=pv.adjacency
        )
        self.noise = NoiseSpec("gaussian", self.calibration.scale)

    def initial_model(self, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(self.p, dtype=dtype, device=device)

    def local_contribution(
        self,
        theta: torch.Tensor,
        X: torch.Tensor,
        y: torch.Tensor,
        segment_ids: torch.Tensor | None = None,
        num_segments: int = 1,
    ) -> torch.Tensor:
        """Σ_i clip_C(∇ℓ(θ; x_i, y_i)) per segment → (num_segments, p).

        A daemon calls it on its own rows (one segment); the simulator passes every row with its
        party id to get all parties' sums in one vectorised pass.
        """
        g = clip_rows(self.loss.per_example_grad(theta, X, y), self.clip)
        if segment_ids is None:
            return g.sum(dim=0, keepdim=True)
        out = torch.zeros(num_segments, g.shape[1], dtype=g.dtype, device=g.device)
        return out.index_add_(0, segment_ids, g)

    def weighted_clipped_sum(
        self,
        theta: torch.Tensor,
        X: torch.Tensor,
        y: torch.Tensor,
        row_weights: torch.Tensor,
        x_norms: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Σ_i w_i·clip_C(∇ℓ(θ; x_i, y_i)) → (p,).

        Linear in the rows, so Σ_j w_j·(party j's local_contribution) equals this with each row
        weighted by its party's weight: the simulator's vectorised form of one aggregation.
        """
        return self.loss.clipped_weighted_grad(theta, X, y, row_weights.to(X.dtype), self.clip, x_norms)

    def public_step(self, theta: torch.Tensor, noisy_grad: torch.Tensor) -> torch.Tensor:
        """The step every party takes on the revealed g̃ (pure post-processing)."""
        direction = noisy_grad + self.spec.model.lam * theta
        direction = laplacian_smooth(direction, self.spec.training.ls_sigma)
        return theta - self.spec.training.learning_rate * direction

    def round(
        self,
        aggregator: SecureAggregator,
        theta: torch.Tensor,
        contributions: torch.Tensor,
        party_ids: torch.Tensor | list[int],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One round: aggregate the caller's contributions with noise, step. Returns (θ_next, g̃)."""
        w = self.weights[torch.as_tensor(party_ids, dtype=torch.long)].to(contributions.dtype)
        noisy = aggregator.aggregate(contributions, w, self.noise)
        return self.public_step(theta, noisy), noisy

    def report(self, trust_model: str) -> PrivacyReport:
        tr = self.spec.training
        return self.calibration.report(
            trust_model=trust_model,
            parties=self.parties.m,
            n=self.parties.n,
            parameters={
                "protocol": "gradient_perturbation",
                "loss": self.loss.name,
                "lam": self.spec.model.lam,
                "clip_C": self.clip,
                "weighting": tr.weighting,
                "iterations": tr.iterations,
                "learning_rate": tr.learning_rate,
                "ls_sigma": tr.ls_sigma,
                "smoothing": "post-processing of the revealed noisy gradient (no privacy cost)",
                "dim": self.p,
            },
        )
