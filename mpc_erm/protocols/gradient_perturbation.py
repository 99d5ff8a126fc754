"""MPC gradient perturbation ("MPC Grad P", thesis §6.3.2), transport-independent.

Round t: every party sums its per-example ℓ2-clipped gradients at the public θ_t; the aggregator
returns g̃_t = Σ_j w_j·s_j + N(0, σ²I); every party takes the same public step

    θ_{t+1} = θ_t − η·S(g̃_t + λθ_t),

where S is the optional Laplacian smoothing A_σ⁻¹ (post-processing of the revealed value: noise
first, then smoothing; σ_LS = 0 is the identity bit for bit). With ``training.sparsity`` s the
step is DP-IGHT's (thesis ch. 2, Alg. 1): θ_{t+1} = H_s(θ_t − η·S(g̃_t + λθ_t)), H_s keeping the
s largest-magnitude entries — post-processing of public values, so the guarantee is unchanged
and every party thresholds the same θ the same way (ties broken by index). Clipping at C makes the per-round
sensitivity 2C/n (pooled, replace-one) whatever the data, so the guarantee does not rest on the
unit-ball assumption. σ is calibrated for the T-fold composition by the spec's accountant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mpc_erm.models import clip_rows
from mpc_erm.models.job_model import loss_for
from mpc_erm.privacy import PrivacyReport
from mpc_erm.privacy.plan import PrivacyPlan, plan_job, public_sizes
from mpc_erm.protocols.aggregation import NO_NOISE, NoiseSpec, SecureAggregator
from mpc_erm.protocols.common import PartySizes, run_report
from mpc_erm.smoothing import laplacian_smooth
from mpc_erm.spec import JobSpec

RoundCallback = Callable[[int, torch.Tensor], None]
LocalSum = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def hard_threshold(theta: torch.Tensor, s: int) -> torch.Tensor:
    """H_s: θ with all but its ``s`` largest-magnitude entries set to zero. Deterministic on equal
    magnitudes (the lower index is kept), so parties holding the same θ keep the same entries."""
    if s >= theta.numel():
        return theta
    order = torch.argsort(theta.abs(), descending=True, stable=True)  # stable: ties keep index order
    out = torch.zeros_like(theta)
    keep = order[:s]
    out[keep] = theta[keep]
    return out


@dataclass
class GradientPerturbation:
    """One job's gradient rounds. Its privacy comes from ``plan`` (made from the spec and the public
    sizes when not given: the simulator's ideal-noise plan); ``noise`` is the plan's noise as the
    aggregator realises it (the MPC engine passes its grid realisation; default: the ideal one)."""

    spec: JobSpec
    parties: PartySizes | None
    n_features: int
    plan: PrivacyPlan | None = None
    noise: NoiseSpec | None = None

    def __post_init__(self) -> None:
        if self.spec.method != "gradient":
            raise ValueError("method: GradientPerturbation needs method = 'gradient'")
        self.loss = loss_for(self.spec)
        self.p = self.loss.param_dim(self.n_features)
        if self.plan is None:
            counts = None if self.parties is None else self.parties.sizes
            self.plan = plan_job(self.spec, sizes=public_sizes(self.spec, counts), n_features=self.n_features)
        pl = self.plan
        if pl.dim != self.p:
            raise ValueError(f"plan.dim {pl.dim} is not the model's {self.p} parameters")
        self.clip = pl.clip
        self.sensitivity = pl.sensitivity_l2()
        self.weights = (torch.tensor([pl.weight(j, n) for j, n in enumerate(self.parties.sizes)], dtype=torch.float64)
                        if self.parties is not None else None)
        if self.noise is None:  # the plan's noise, whatever sampler it was planned for
            self.noise = NO_NOISE if pl.mechanism == "none" else NoiseSpec("gaussian", pl.noise_scale(),
                                                                           sensitivity=self.sensitivity)

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
        stepped = theta - self.spec.training.learning_rate * direction
        s = self.spec.training.sparsity
        return stepped if s is None else hard_threshold(stepped, s)

    def round(
        self,
        aggregator: SecureAggregator,
        theta: torch.Tensor,
        contributions: torch.Tensor,
        weights: torch.Tensor,
        noise: NoiseSpec | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One round: aggregate the caller's contributions (rows, with their public ``weights``:
        :meth:`PrivacyPlan.weight`) with the plan's noise (``noise``: a baseline's instead), step.
        Returns (θ_next, g̃)."""
        noise = self.noise if noise is None else noise
        assert noise is not None
        noisy = aggregator.aggregate(contributions, weights.to(contributions.dtype), noise)
        return self.public_step(theta, noisy), noisy

    def train(
        self,
        aggregator: SecureAggregator,
        local_sum: LocalSum,
        *,
        noise: NoiseSpec | None = None,
        before_reveal: Callable[[int], None] | None = None,
        after_round: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """The protocol's T rounds from θ₀ = 0: the one loop a party daemon's worker and the
        simulator both run, so a simulated run predicts a daemon's.

        ``local_sum(θ)`` → (contributions, weights) the caller holds (a party: its own clipped
        sum and weight; the simulator: every row's weighted sum with weight 1). ``before_reveal(t)``
        runs before round t's aggregate is revealed (a daemon records the spend there, and may
        raise to stop before revealing); ``after_round(t, θ_t, g̃_t)`` after it."""
        theta = self.initial_model()
        for t in range(1, self.spec.training.iterations + 1):
            contributions, weights = local_sum(theta)
            if before_reveal is not None:
                before_reveal(t)
            theta, noisy = self.round(aggregator, theta, contributions, weights, noise)
            if after_round is not None:
                after_round(t, theta, noisy)
        return theta

    def report(self, trust_model: str) -> PrivacyReport:
        tr = self.spec.training
        return run_report(
            self.plan, self.noise, trust_model, self.parties,
            {
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
