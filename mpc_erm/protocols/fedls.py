"""DP-Fed and DP-Fed-LS (paper 002, Algorithm 1): federated rounds over many data owners with
client-level differential privacy and Laplacian smoothing of the noisy aggregate.

Round t, for a public model w_t:

1. **Owners sampled** with rate τ: Poisson (each owner independently; add/remove adjacency of
   owners), or uniform (exactly s = τN of the N owners, without replacement; replace-one
   adjacency of owners, N public, an absent owner a zero update — so one owner's data replaced,
   or its absence, moves the sum by at most 2𝓛).
2. **Local update** at each sampled owner (on its own rows, its own device): E epochs of
   mini-batch SGD of size b from w_t with learning rate η_l·γ^t and weight decay, the model
   projected back into the 𝓛-ball around w_t after *every* step, w ← w_t + clip(w − w_t, 𝓛) over
   all parameters; Δ = w_K − w_t, so ‖Δ‖ ≤ 𝓛 whatever the data.
3. **Aggregate**: Σ Δ over the sampled owners plus N(0, (z·𝓛)²) per coordinate, added once
   (inside the MPC in the product: parties.owner.shares / MpcAggregator.aggregate_shares).
   Poisson: adding or removing one owner moves the sum by at most 𝓛, so the rounds are T
   Poisson-sampled Gaussian mechanisms with noise multiplier z at rate τ (client level),
   accounted by :mod:`mpc_erm.privacy` (RDP, PoissonSampledDpEvent). Uniform: the shift is 2𝓛
   and the noise N(0, (z·2𝓛)²); T rounds of the Gaussian on a sample without replacement
   (RDP, SampledWithoutReplacementDpEvent, Wang–Balle–Kasiviswanathan 2019).
4. **Public step** (post-processing): w_{t+1} = w_t + η_g · S(Σ̃ / (τN)), S Laplacian smoothing
   per parameter tensor (σ_LS; 0 is DP-Fed). The normaliser is the *expected* count τN, public,
   not the realised one (which is a function of who was sampled: the paper divides by it). Each
   update enters the aggregate with the public weight 1/(τN) (the plan's weight), so the revealed
   value is already the noisy mean and the noise is z·𝓛/(τN) on it.

Through the daemons (:meth:`DpFedLs.for_job`) a job's ``[federated]`` table sets E, b, η_l, γ and
its privacy plan sets z, τ, 𝓛 and N. Poisson: every owner samples *itself* with a private coin.
Uniform: the three compute parties draw each round's s owners by a secret shuffle
(:mod:`parties.owner.sample`) and each owner reads only its own bits. Either way an owner not
drawn sends shares of a zero update, so no compute party learns the sample.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from mpc_erm.models import NetworkSpec, build_network
from mpc_erm.models.job_model import federated_network
from mpc_erm.privacy.events import Composition, GaussianRounds, compose, wor_sample_size
from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.privacy.report import Security
from mpc_erm.smoothing import smooth_parameters
from mpc_erm.spec import JobSpec

from .aggregation import NoiseSpec, SecureAggregator

__all__ = ["SAMPLINGS", "DpFedLs", "FedLsConfig", "owner_updates", "poisson_owners", "timing_statement",
           "uniform_owners"]

#: How a round's owners are drawn: "poisson" (each w.p. τ) or "uniform" (exactly τN, without replacement).
SAMPLINGS = ("poisson", "uniform")


@dataclass(frozen=True)
class FedLsConfig:
    """A DP-Fed-LS job's public settings (paper 002, Table H.7 names)."""

    rounds: int  # T
    owners: int  # N, public (the size of the owner population sampled from)
    sampling_rate: float  # τ
    noise_multiplier: float  # z: the noise std on the sum is z·𝓛
    clip: float  # 𝓛, the radius of the local projection
    local_epochs: int = 5  # E
    local_batch: int = 10  # b
    local_lr: float = 0.1  # η_l
    local_lr_decay: float = 0.99  # γ, per round
    global_lr: float = 1.0  # η_g
    weight_decay: float = 4e-5
    ls_sigma: float = 0.0  # σ_LS (0: DP-Fed)
    sampling: str = "poisson"  # SAMPLINGS

    def __post_init__(self) -> None:
        checks = {"rounds": self.rounds >= 1, "owners": self.owners >= 1, "sampling_rate": 0 < self.sampling_rate <= 1,
                  "noise_multiplier": self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier),
                  "clip": self.clip > 0 and math.isfinite(self.clip), "local_epochs": self.local_epochs >= 1,
                  "local_batch": self.local_batch >= 1, "local_lr": self.local_lr > 0,
                  "local_lr_decay": 0 < self.local_lr_decay <= 1, "global_lr": self.global_lr > 0,
                  "weight_decay": self.weight_decay >= 0, "ls_sigma": self.ls_sigma >= 0,
                  "sampling": self.sampling in SAMPLINGS and (self.sampling == "poisson" or _whole_sample(self))}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"{bad[0]}: out of range ({getattr(self, bad[0])!r})")

    @property
    def uniform(self) -> bool:
        return self.sampling == "uniform"

    @property
    def sample_size(self) -> int:
        """s: the owners drawn a round under uniform sampling (τN, a whole number)."""
        return wor_sample_size(self.owners, self.sampling_rate, field="owners")

    @property
    def shift(self) -> float:
        """The most one owner moves a round's (unweighted) sum under the sampling's adjacency:
        𝓛 (Poisson, added or removed), 2𝓛 (uniform, replaced; absent is a zero update)."""
        return (2.0 if self.uniform else 1.0) * self.clip

    def draw_owners(self, generator: torch.Generator) -> list[int]:
        """One round's owners as the simulator draws them: τN uniformly without replacement, or
        each by its own coin of rate τ (the daemons draw the same distributions among the compute
        parties and at the owners)."""
        if self.uniform:
            return uniform_owners(self.owners, self.sample_size, generator)
        return poisson_owners(self.owners, self.sampling_rate, generator)

    def event(self, rounds: int | None = None) -> GaussianRounds:
        """The job's privacy event at client level (default: all T rounds)."""
        return GaussianRounds(noise_multiplier=self.noise_multiplier, rounds=self.rounds if rounds is None else rounds,
                              sampling_rate=self.sampling_rate, adjacency="add_remove", sampler_tv=0.0,
                              population=self.owners if self.uniform else None,
                              member_rows=(1,) if self.uniform else ())


def _whole_sample(c: FedLsConfig) -> bool:
    """Whether τN is a whole number of owners in [1, N) (what uniform sampling draws a round)."""
    try:
        wor_sample_size(c.owners, c.sampling_rate)
    except ValueError:
        return False
    return True


def poisson_owners(owners: int, rate: float, generator: torch.Generator) -> list[int]:
    """This round's owners: each independently with probability ``rate``."""
    return torch.nonzero(torch.rand(owners, generator=generator) < rate).reshape(-1).tolist()


def uniform_owners(owners: int, size: int, generator: torch.Generator) -> list[int]:
    """This round's owners: ``size`` of them, uniformly without replacement (the simulator's
    draw; the daemons draw the same distribution by the compute parties' secret shuffle)."""
    return sorted(torch.randperm(owners, generator=generator)[:size].tolist())


@dataclass
class DpFedLs:
    """The round loop of DP-Fed-LS for a torch module (built identically by every member)."""

    config: FedLsConfig
    build: Callable[[], nn.Module]
    loss: Callable[[Tensor, Tensor], Tensor] = nn.functional.cross_entropy
    noise: NoiseSpec | None = None  # the engine's realisation of the plan's noise (default: the ideal one)
    device: torch.device | str = "cpu"  # where the local steps run (the public model stays on the CPU)
    net_spec: NetworkSpec | None = None  # the architecture ``build`` makes, which save records (for_job sets it)
    model: nn.Module = field(init=False)

    def __post_init__(self) -> None:
        self.model = self.build().to(self.device)
        self.shapes = [p.shape for p in self.model.parameters()]
        self.w = parameters_to_vector(self.model.parameters()).detach().to("cpu", torch.float64)
        self.p = self.w.numel()
        c = self.config
        self.weight = 1.0 / (c.sampling_rate * c.owners)  # public: the expected count τN
        if self.noise is None and c.noise_multiplier > 0:
            sens = c.shift * self.weight  # what one owner moves the weighted sum by
            self.noise = NoiseSpec("gaussian", c.noise_multiplier * sens, sensitivity=sens)
        elif self.noise is None:
            self.noise = NoiseSpec("none", 0.0)

    @classmethod
    def for_job(cls, spec: JobSpec, plan: PrivacyPlan, features: int, *, noise: NoiseSpec | None = None,
                device: torch.device | str = "cpu") -> DpFedLs:
        """A daemon job's rounds: E, b, η_l, γ from its ``[federated]`` table; T, τ, 𝓛, N, η_g,
        σ_LS and z from its privacy plan (the one the ledger reserves); ``noise``: the plan's noise
        as the MPC realises it."""
        f, tr = spec.federated, spec.training
        if f is None:
            raise ValueError("federated: the job has no [federated] table")
        cfg = FedLsConfig(rounds=plan.rounds, owners=int(plan.public_n), sampling_rate=plan.sampling_rate,
                          noise_multiplier=plan.noise_multiplier or 0.0, clip=plan.clip, local_epochs=f.local_epochs,
                          local_batch=f.local_batch, local_lr=f.local_lr, local_lr_decay=f.local_lr_decay,
                          global_lr=tr.learning_rate, weight_decay=spec.model.lam, ls_sigma=plan.ls_sigma,
                          sampling=f.sampling)
        net = federated_network(spec, features)
        if noise is None and plan.noise_split is not None and plan.mechanism == "gaussian":
            # distributed noise in a simulation: the whole release's noise, every party's share
            noise = NoiseSpec("gaussian", plan.noise_scale(), sensitivity=plan.sensitivity_l2())
        return cls(cfg, lambda: build_network(net), noise=noise, device=device, net_spec=net)

    def save(self, directory: str | os.PathLike[str], plan: PrivacyPlan, *, trust_model: str,
             job: dict[str, Any] | None = None, security: Security | None = None) -> Path:
        """Write the public model as a bundle ``mpc_erm.load_model`` reads, with the plan's privacy
        statement (a job made by :meth:`for_job`)."""
        from mpc_erm.models.bundle import save_network_bundle

        if self.net_spec is None:
            raise ValueError("save: only a job's model (DpFedLs.for_job) has an architecture to record")
        return save_network_bundle(directory, self.net_spec, self.w, job=job,
                                   privacy=plan.model_statement(plan.rounds, trust_model, security))

    def guarantee(self, delta: float, rounds: int | None = None) -> Composition:
        """(ε, δ) at client level after ``rounds`` (default: all T) rounds, RDP accountant."""
        return compose([self.config.event(rounds)], delta, "add_remove")

    # ------------------------------------------------------------------ an owner's side

    def local_update(self, X: Tensor, y: Tensor, t: int, generator: torch.Generator) -> Tensor:
        """Δ = w_K − w_t of E epochs of projected mini-batch SGD from the public w_t on one owner's
        rows (step 2 of the module docstring); float64, ‖Δ‖ ≤ 𝓛."""
        c = self.config
        model = self.model
        ref = next(model.parameters())
        w0 = self.w.to(device=ref.device, dtype=ref.dtype)
        vector_to_parameters(w0.clone(), model.parameters())
        lr = c.local_lr * c.local_lr_decay**t
        n = X.shape[0]
        params = list(model.parameters())
        for _ in range(c.local_epochs):
            order = torch.randperm(n, generator=generator)
            for lo in range(0, n, c.local_batch):
                idx = order[lo : lo + c.local_batch]
                model.zero_grad(set_to_none=True)
                self.loss(model(X[idx]), y[idx]).backward()
                with torch.no_grad():
                    for prm in params:
                        prm.add_(prm.grad + c.weight_decay * prm, alpha=-lr)  # type: ignore[operator]
                    d = parameters_to_vector(params) - w0
                    scale = min(1.0, c.clip / max(float(d.norm()), 1e-12))  # project into the 𝓛-ball
                    if scale < 1.0:
                        vector_to_parameters(w0 + d * scale, params)
        with torch.no_grad():
            delta = (parameters_to_vector(params) - w0).to("cpu", torch.float64)
        # the projections above are in the model's dtype: float32 rounding (and its cancellation
        # around a large w_t) can leave ‖Δ‖ a little over 𝓛; project once more in float64, so
        # the bound the accounting and the compute parties' check rely on holds
        norm = float(torch.linalg.vector_norm(delta))
        return delta if norm <= c.clip else delta * (c.clip / norm)

    # ------------------------------------------------------------------ the public step

    def public_step(self, noisy_mean: Tensor) -> None:
        """w ← w + η_g·S(noisy mean): the revealed Σ Δ/(τN) + noise, smoothed per tensor."""
        c = self.config
        g = noisy_mean.detach().to("cpu", torch.float64).reshape(-1)
        if c.ls_sigma:
            parts = torch.split(g, [math.prod(s) for s in self.shapes])
            g = torch.cat([t.reshape(-1) for t in smooth_parameters(
                [t.reshape(s) for t, s in zip(parts, self.shapes)], c.ls_sigma)])
        self.w = self.w + c.global_lr * g

    def predict(self, X: Tensor) -> Tensor:
        ref = next(self.model.parameters())
        vector_to_parameters(self.w.to(device=ref.device, dtype=ref.dtype), self.model.parameters())
        with torch.no_grad():
            return torch.cat([self.model(X[i : i + 4096].to(ref.device)).argmax(dim=-1).cpu()
                              for i in range(0, X.shape[0], 4096)])

    # ------------------------------------------------------------------ the loop

    def train(self, aggregator: SecureAggregator, updates: Callable[[int, list[int]], Tensor],
              sample: Callable[[int], list[int]],
              after_round: Callable[[int, list[int]], None] | None = None,
              before_reveal: Callable[[int], None] | None = None) -> Tensor:
        """T rounds: ``sample(t)`` the owners this caller holds that joined, ``updates(t, owners)``
        their Δ rows (k, p), each weighted 1/(τN); the aggregator's noisy mean; the public step.
        A caller with no owner in the round (a compute party, an owner not sampled) hands in no
        row. ``before_reveal(t)`` (t from 1) runs before round t's aggregate, ``after_round(t,
        owners)`` after its step. Returns the final public model (float64)."""
        for t in range(self.config.rounds):
            owners = sample(t)
            rows = updates(t, owners) if owners else torch.zeros(0, self.p, dtype=torch.float64)
            weights = torch.full((rows.shape[0],), self.weight, dtype=torch.float64)
            if before_reveal is not None:
                before_reveal(t + 1)
            assert self.noise is not None
            self.public_step(aggregator.aggregate(rows, weights, self.noise))
            if after_round is not None:
                after_round(t + 1, owners)
        return self.w.clone()


def owner_updates(job: DpFedLs, data: Sequence[tuple[Tensor, Tensor]],
                  generators: Sequence[torch.Generator]) -> Callable[[int, list[int]], Tensor]:
    """The simulator's ``updates``: every sampled owner's Δ computed in this process, in turn."""
    def run(t: int, owners: list[int]) -> Tensor:
        return torch.stack([job.local_update(*data[o], t, generators[o]) for o in owners])

    return run


def timing_statement(send_after_s: float | None) -> str:
    """What the arrival time of an owner's shares tells the compute parties in a federated job
    (``federated.send_after_s``): every report of such a job states it."""
    if send_after_s is None:
        return ("the timing of an owner's share can tell the one compute party it sends to (its explicit party) "
                "that it ran local epochs this round (its share arrives later than a zero update's; set "
                "federated.send_after_s to close this); the owner's sampling is otherwise hidden")
    return (f"every owner sends each round's share {send_after_s:g} s after it read the previous release, sampled or "
            "not, so its arrival does not tell the compute party it sends to (its explicit party) who ran local "
            "epochs, except in a round whose local epochs took longer (the owner's own summary lists those: "
            "rounds_sent_late)")
