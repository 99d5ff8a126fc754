"""DP-SGD and DP-Adam for neural networks (with per-tensor Laplacian smoothing: DP-LSSGD,
DP-LSAdam), transport-independent: the round loop a party's worker and the simulator both run.

Round t, at every party, on the same public model θ_t:

1. **Poisson batch**: each of the party's own records joins w.p. q = ``training.sampling_rate``,
   drawn with the party's private generator (no party learns another's batch; the union is a
   Poisson sample of the pooled data).
2. **Clipped sum**: per-example gradients of the party's copy of the network (torch.func, on its
   device), each clipped to ℓ2 norm C in float64, summed.
3. **Secure noisy sum**: the aggregator returns Σ_parties w·sum + N(0, σ²I), w = 1/(q·n̂) the
   public expected batch (add/remove adjacency; n̂ = ``privacy.public_n``), σ = z·C/(q·n̂) with z
   the plan's noise multiplier for T Poisson-subsampled rounds.
4. **Public step**, identical everywhere (post-processing): g̃ + λθ (weight decay), Laplacian
   smoothing of each parameter tensor separately (PyTorch's row-major flattening, the papers'
   convention), then SGD (momentum) or Adam with the learning-rate schedule — on a float64 CPU
   master copy of the parameters, so that parties on different devices keep bit-identical public
   models; each party then loads the master into its working network.

**DP-SRM** (``training.optimizer = "srm"``, the thesis's ch. 4): step 2 sums each example's
recursive-momentum increment instead, γ·clip_C₁(∇f_i(θ_t)) + (1−γ)·clip_C₂(∇f_i(θ_t) − ∇f_i(θ_{t−1}))
(two gradient evaluations per example, at the last two public models), whose norm is at most
C = γ·C₁ + (1−γ)·C₂ = ``privacy.clip`` — so the plan, σ and the accountant are DP-SGD's with that
C, unchanged. Step 4 keeps v_t = ṽ_t + (1−γ)·v_{t−1} (v_0 = 0: the first increment has no
difference term), and steps θ ← θ − η·v_t with η = min(lr, ``max_step``/‖v_t‖) (the thesis's
adaptive step, which bounds ‖θ_{t+1} − θ_t‖ and so the gradient differences C₂ clips). The
batch is the Poisson sample of step 1, hidden from every party as for DP-SGD (each party knows
only its own draws), accounted by the Poisson-subsampled Gaussian; the thesis's fixed-size batch
without replacement is not what runs here.

The privacy of the whole job is the plan's (``PrivacyPlan`` with ``sampling_rate``); nothing here
re-derives it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from mpc_erm.models import build_network, clip_rows, flatten_grads, per_example_grads
from mpc_erm.models.bundle import save_network_bundle
from mpc_erm.models.job_model import network_spec
from mpc_erm.models.networks import NetworkBuilder
from mpc_erm.privacy.plan import PrivacyPlan, PublicSizes, plan_job
from mpc_erm.privacy.report import Security
from mpc_erm.protocols.aggregation import NoiseSpec, SecureAggregator
from mpc_erm.protocols.row_draws import RowDraws
from mpc_erm.smoothing import smooth_parameters
from mpc_erm.spec import JobSpec

__all__ = ["DpSgd", "network_spec", "poisson_batch"]

LocalSum = Callable[[nn.Module], tuple[Tensor, Tensor]]


def poisson_batch(n: int, q: float, generator: torch.Generator) -> Tensor:
    """Indices of the records that join this round: each of ``n`` independently w.p. ``q``
    (exactly: uniforms on the CPU generator compared with q)."""
    if q >= 1.0:
        return torch.arange(n)
    return torch.nonzero(torch.rand(n, generator=generator, dtype=torch.float64) < q).flatten()


@dataclass
class DpSgd:
    """One job's DP-SGD / DP-Adam rounds (module docstring). ``plan``: the job's plan (default:
    the simulator's ideal-noise plan from the spec); ``noise``: the plan's noise as the aggregator
    realises it (default: the ideal one); ``device``: where this party's network computes."""

    spec: JobSpec
    plan: PrivacyPlan | None = None
    noise: NoiseSpec | None = None
    device: torch.device | str = "cpu"
    loss: Callable[[Tensor, Tensor], Tensor] = nn.functional.cross_entropy
    chunk_size: int | None = 256  # per-example gradients computed this many rows at a time
    builder: NetworkBuilder | None = None  # model.name = "plugin": this party's builder (.plugins)
    model: nn.Module = field(init=False)

    def __post_init__(self) -> None:
        spec = self.spec
        if spec.method != "gradient" or not spec.model.is_network:
            raise ValueError("model.name: DpSgd trains the networks of mpc_erm.models.networks")
        if spec.privacy.adjacency != "add_remove" and spec.training.batch_size is None:
            raise ValueError("privacy.adjacency: networks are trained under add/remove adjacency with a public "
                             "normaliser privacy.public_n (the expected batch q·n̂ divides each round's sum), or "
                             "replace-one with a batch of exactly training.batch_size pooled rows")
        self.net_spec = network_spec(spec)
        self.model = build_network(self.net_spec, self.device, builder=self.builder)
        self.shapes = [p.shape for p in self.model.parameters()]
        self.master = nn.Parameter(parameters_to_vector(self.model.parameters()).detach().to("cpu", torch.float64))
        self.p = self.master.numel()
        if self.plan is None:
            rows = spec.privacy.party_rows
            self.plan = plan_job(spec, sizes=PublicSizes(public_n=spec.privacy.public_n) if rows is None
                                 else PublicSizes(counts=tuple(rows.values())))
        self.plan = self.plan.with_sizes(None, self.p)
        pl = self.plan
        self.clip = pl.clip
        self.q = pl.sampling_rate
        self.weight = pl.weight(0, 0)  # 1 / (q·n̂): the same for every party
        if self.noise is None:
            self.noise = (NoiseSpec("gaussian", pl.noise_scale(), sensitivity=pl.sensitivity_l2())
                          if pl.mechanism != "none" else NoiseSpec("none", 0.0))
        self.optimizer = self._optimizer()
        self.scheduler = self._scheduler()
        self.round_index = 0
        tr = spec.training
        self.srm = tr.optimizer == "srm"
        if self.srm:
            assert tr.srm_momentum is not None and tr.clip_difference is not None  # JobSpec._srm
            self.gamma, self.clip_difference = float(tr.srm_momentum), float(tr.clip_difference)
            self.clip_gradient = (self.clip - (1.0 - self.gamma) * self.clip_difference) / self.gamma  # C₁
            self.velocity = torch.zeros(self.p, dtype=torch.float64)  # v_{t−1}, public
            self.previous: Tensor | None = None  # θ_{t−1}, public
            self.previous_model = build_network(self.net_spec, self.device, builder=self.builder)

    # ------------------------------------------------------------------ public state

    def _optimizer(self) -> torch.optim.Optimizer:
        tr = self.spec.training
        if tr.optimizer == "adam":
            return torch.optim.Adam([self.master], lr=tr.learning_rate, betas=tr.adam_betas, foreach=False)
        return torch.optim.SGD([self.master], lr=tr.learning_rate, momentum=tr.momentum, foreach=False)

    def _scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        tr = self.spec.training
        if tr.schedule == "step":
            return torch.optim.lr_scheduler.StepLR(self.optimizer, tr.schedule_step, tr.schedule_gamma)
        if tr.schedule == "cosine":
            return torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, tr.iterations)
        return torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _t: 1.0)

    def _load_master(self) -> None:
        vector_to_parameters(self.master.detach().to(self.device, next(self.model.parameters()).dtype),
                             self.model.parameters())

    def public_parameters(self) -> Tensor:
        """The public model θ_t as one float64 CPU vector (``named_parameters`` order)."""
        return self.master.detach().clone()

    # ------------------------------------------------------------------ the round

    def local_contribution(self, X: Tensor, y: Tensor, draws: torch.Generator | RowDraws) -> tuple[Tensor, int]:
        """(Σ_i clip_C(∇ℓ(θ; x_i, y_i)) over this round's batch of the caller's rows as a (1, p)
        float64 CPU row, the batch size — which stays with the caller). The batch: a Poisson sample
        drawn from ``draws`` (a generator), or this party's part of a pooled draw (:class:`RowDraws`)."""
        idx = draws.next() if isinstance(draws, RowDraws) else poisson_batch(X.shape[0], self.q, draws)
        dev = next(self.model.parameters()).device
        total = torch.zeros(1, self.p, dtype=torch.float64, device=dev)
        if idx.numel() == 0:
            return total.cpu(), 0
        Xb, yb = X[idx.to(X.device)], y[idx.to(y.device)]
        step = self.chunk_size or idx.numel()
        for lo in range(0, idx.numel(), step):
            rows = self._per_example(self.model, Xb[lo : lo + step], yb[lo : lo + step], dev)
            if self.srm:
                rows = self._increments(rows, Xb[lo : lo + step], yb[lo : lo + step], dev)
            # clipped and summed in float64 where they were computed: one (1, p) row leaves the
            # device per round, not a (batch, p) block (53 MB a round for the MNIST CNN)
            total += clip_rows(rows, self.clip).sum(dim=0, keepdim=True)
        return total.cpu(), int(idx.numel())

    def _per_example(self, model: nn.Module, X: Tensor, y: Tensor, dev: torch.device) -> Tensor:
        return flatten_grads(per_example_grads(model, self.loss, X, y), model).to(dev, torch.float64)

    def _increments(self, grads: Tensor, X: Tensor, y: Tensor, dev: torch.device) -> Tensor:
        """DP-SRM's per-example increments from the gradients at θ_t: γ·clip_C₁(g_t) +
        (1−γ)·clip_C₂(g_t − g_{t−1}), the second term absent in the first round (module docstring);
        each within C by the triangle inequality (and clipped to C after, for the rounding)."""
        out = self.gamma * clip_rows(grads, self.clip_gradient)
        if self.previous is not None and self.gamma < 1.0:
            before = self._per_example(self.previous_model, X, y, dev)
            out += (1.0 - self.gamma) * clip_rows(grads - before, self.clip_difference)
        return out

    def public_step(self, noisy: Tensor) -> None:
        """The step every party takes on the revealed g̃ (pure post-processing; module docstring)."""
        tr = self.spec.training
        g = noisy.detach().to("cpu", torch.float64).reshape(-1)
        if self.srm:  # v_t = ṽ_t + (1−γ)·v_{t−1}
            self.velocity = g + (1.0 - self.gamma) * self.velocity
            g = self.velocity.clone()
        if self.spec.model.lam:
            g = g + self.spec.model.lam * self.master.detach()
        if tr.ls_sigma:
            parts = torch.split(g, [math.prod(s) for s in self.shapes])
            g = torch.cat([t.reshape(-1) for t in smooth_parameters(
                [t.reshape(s) for t, s in zip(parts, self.shapes)], tr.ls_sigma)])
        if self.srm:
            g = self._srm_direction(g)
        self.master.grad = g
        self.optimizer.step()
        self.master.grad = None
        self.scheduler.step()
        self._load_master()
        self.round_index += 1

    @torch.no_grad()
    def _srm_direction(self, g: Tensor) -> Tensor:
        """g scaled so that the optimiser's plain SGD step lr·g is η·g, η = min(lr, max_step/‖g‖);
        θ_t kept (and loaded into the second network) for the next round's gradient differences."""
        lr = float(self.optimizer.param_groups[0]["lr"])  # the schedule's
        cap = self.spec.training.max_step
        norm = float(torch.linalg.vector_norm(g))
        self.previous = self.master.detach().clone()
        vector_to_parameters(self.previous.to(self.device, next(self.previous_model.parameters()).dtype),
                             self.previous_model.parameters())
        return g if cap is None or norm * lr <= cap else g * (cap / (norm * lr))

    def round(self, aggregator: SecureAggregator, contributions: Tensor, noise: NoiseSpec | None = None) -> Tensor:
        """Aggregate the caller's clipped sums (rows, each weighted 1/(q·n̂)) with the plan's
        noise, take the public step; returns g̃."""
        noise = self.noise if noise is None else noise
        assert noise is not None and self.plan is not None
        weights = torch.full((contributions.shape[0],), self.weight, dtype=torch.float64)
        rows, radius = contributions.to(torch.float64), self.plan.contribution_radius()
        if math.isfinite(radius):  # into the public ball the check bounds (PrivacyPlan.batch_cap): 1-Lipschitz
            rows = clip_rows(rows, radius)
        noisy = aggregator.aggregate(rows, weights, noise)
        self.public_step(noisy)
        return noisy

    def train(
        self,
        aggregator: SecureAggregator,
        local_sum: LocalSum,
        *,
        noise: NoiseSpec | None = None,
        before_reveal: Callable[[int], None] | None = None,
        after_round: Callable[[int, Tensor], None] | None = None,
    ) -> Tensor:
        """The job's T rounds: the one loop a party daemon's worker and the simulator both run.

        ``local_sum(model)`` → (contributions, batch sizes) the caller holds (a party: its own row;
        the simulator: one row per party). ``before_reveal(t)`` runs before round t's aggregate
        is revealed (a daemon records the spend there); ``after_round(t, g̃_t)`` after the step.
        Returns the final public parameters (float64, CPU)."""
        for t in range(1, self.spec.training.iterations + 1):
            contributions, _sizes = local_sum(self.model)
            if before_reveal is not None:
                before_reveal(t)
            noisy = self.round(aggregator, contributions, noise)
            if after_round is not None:
                after_round(t, noisy)
        return self.public_parameters()

    def save(self, directory: str | os.PathLike[str], *, classes: list[Any] | None = None,
             feature_names: list[str] | None = None,
             trust_model: str = "simulation (plaintext aggregator)", schema: dict[str, Any] | None = None,
             security: Security | None = None) -> Path:
        """Write the public model as a bundle that ``mpc_erm.load_model`` reads (mpc_erm.models.bundle),
        with the plan's privacy statement for the rounds run so far."""
        pl = self.plan
        assert pl is not None
        return save_network_bundle(directory, self.net_spec, self.master, classes=classes, feature_names=feature_names,
                                   privacy=pl.model_statement(self.round_index, trust_model, security),
                                   job={"spec_digest": self.spec.digest()}, builder=self.builder,
                                   plugin_digest=self.spec.model.plugin_digest, schema=schema)

    @torch.no_grad()
    def predict(self, X: Tensor, batch: int = 4096) -> Tensor:
        """Class predictions of the current public model (the caller's rows, its device)."""
        self.model.eval()
        out = [self.model(X[i : i + batch]).argmax(dim=-1) for i in range(0, X.shape[0], batch)]
        self.model.train()
        return torch.cat(out) if out else torch.empty(0, dtype=torch.long)
