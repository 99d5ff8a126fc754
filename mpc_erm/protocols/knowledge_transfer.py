"""Knowledge transfer for sparse learning (DPSL-KT, thesis ch. 3, Alg. 2), in the variant whose
guarantee is proved: an output-perturbation teacher labels public rows, a student learns from them.

1. **Teacher.** Each member solves its λ-strongly-convex ERM exactly (to the plan's certified
   tolerance), as in output perturbation (:mod:`.output_perturbation`); the teacher θ̂ is the
   weighted sum of the local minimisers. It is never revealed.
2. **One release.** Each member hands in its local scores on the m public rows X̃, w_j·X̃θ̂_j
   (m·K values); the aggregator adds them and the noise once, and reveals y = X̃θ̂ + ξ. Two
   neighbouring data sets move θ̂ by ≤ Δθ, the output release's bound, so y by ≤ ‖X̃‖₂·Δθ: the
   plan's sensitivity (:class:`~mpc_erm.privacy.plan.TransferPlan`), for any X̃ and any data.
3. **Student**, post-processing of y in the clear: least squares (2m)⁻¹‖y − X̃w‖² per output by
   iterative hard thresholding to s non-zeros (step 1/L, L = ‖X̃‖₂²/m its exact smoothness), or
   its minimum-norm solution when no sparsity is asked.

Why not the thesis's own algorithm: its teacher is the ℓ0-constrained minimiser (IGHT), and its
σ² = 8mβ̃sγ²log(2.5/δ)/(n²ε²λ²) rests on (i) the teacher having converged to that minimiser,
(ii) first-order optimality inequalities that do not hold over the non-convex ℓ0 set, and (iii)
a restricted-isometry event on X̃ absorbed into δ. None of the three is proved, so the product
does not ship it; ``benchmarks/dpsl_kt.py`` runs it for comparison and labels it unproven.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mpc_erm.privacy import PrivacyReport
from mpc_erm.privacy.plan import PrivacyPlan, TransferPlan
from mpc_erm.protocols.aggregation import NoiseSpec
from mpc_erm.protocols.common import run_report
from mpc_erm.protocols.gradient_perturbation import hard_threshold
from mpc_erm.protocols.output_perturbation import OutputPerturbation
from mpc_erm.spec import JobSpec

__all__ = ["KnowledgeTransfer", "sparse_least_squares"]


def sparse_least_squares(X: torch.Tensor, y: torch.Tensor, sparsity: int | None, iterations: int,
                         norm: float) -> torch.Tensor:
    """argmin (2m)⁻¹‖y − Xw‖² over w with ≤ ``sparsity`` non-zeros, by IGHT from 0 with step m/‖X‖₂²
    (``norm`` ≥ ‖X‖₂), one column of ``y`` (m, K) at a time; ``sparsity`` None: the minimum-norm
    least-squares solution. Returns W (K, d)."""
    if sparsity is None:
        return torch.linalg.lstsq(X, y, driver="gelsd").solution.T.contiguous()
    m = X.shape[0]
    step = m / (norm * norm)
    out = []
    for k in range(y.shape[1]):
        w = torch.zeros(X.shape[1], dtype=X.dtype)
        for _ in range(iterations):
            w = hard_threshold(w - step * (X.T @ (X @ w - y[:, k])) / m, sparsity)
        out.append(w)
    return torch.stack(out)


@dataclass
class KnowledgeTransfer:
    """One knowledge-transfer job: the teacher's release (an :class:`OutputPerturbation` whose plan
    releases scores, not weights) and the student fitted to it."""

    spec: JobSpec
    n_features: int
    plan: PrivacyPlan
    noise: NoiseSpec | None = None

    def __post_init__(self) -> None:
        tr = self.plan.transfer
        if self.spec.transfer is None or tr is None or tr.public is None:
            raise ValueError("transfer: a knowledge-transfer job needs [transfer] and a plan bound to its features")
        if tr.public.features != self.n_features:
            raise ValueError(f"transfer: the plan's public rows have {tr.public.features} features, the data "
                             f"{self.n_features}")
        self.transfer: TransferPlan = tr
        self.teacher = OutputPerturbation(self.spec, None, self.n_features, plan=self.plan, noise=self.noise)
        self.noise = self.teacher.noise
        self.public = torch.from_numpy(tr.public.matrix().copy())

    @property
    def release_dim(self) -> int:
        return self.transfer.dim

    def scores(self, theta: torch.Tensor) -> torch.Tensor:
        """θ's scores on the public rows, flattened row-major (m·K): what a member hands in."""
        return self.teacher.loss.scores(theta.to(torch.float64), self.public).reshape(-1)

    def student(self, released: torch.Tensor) -> torch.Tensor:
        """The student θ (p) fitted to the released scores (module doc, step 3)."""
        tr, ts = self.transfer, self.spec.transfer
        assert ts is not None and tr.norm is not None and tr.outputs is not None
        y = released.to(torch.float64).reshape(tr.rows, tr.outputs)
        W = sparse_least_squares(self.public, y, ts.student_sparsity, ts.student_iterations, tr.norm)
        return W.reshape(-1)

    def report(self, trust_model: str) -> PrivacyReport:
        ts = self.spec.transfer
        assert ts is not None
        return run_report(self.plan, self.noise, trust_model, None, {
            "protocol": "knowledge_transfer", "loss": self.teacher.loss.name, "lam": self.spec.model.lam,
            "lipschitz_G": self.teacher.lipschitz, "public_rows": self.transfer.rows,
            "public_norm": self.transfer.norm, "student_sparsity": ts.student_sparsity,
            "student_iterations": ts.student_iterations, "dim": self.release_dim})
