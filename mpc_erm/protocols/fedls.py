"""DP-Fed and DP-Fed-LS (paper 002, Algorithm 1): federated rounds over many data owners with
client-level differential privacy and Laplacian smoothing of the noisy aggregate (issue 17).

Round t, for a public model w_t:

1. **Owners sampled** with rate τ: Poisson (each owner independently; add/remove adjacency of
   owners) — the sampling this module accounts. (Uniform sampling of exactly τN owners needs the
   replace-one accountant for sampling without replacement; not yet planned here.)
2. **Local update** at each sampled owner (on its own rows, its own device): E epochs of
   mini-batch SGD of size b from w_t with learning rate η_l·γ^t and weight decay, the model
   projected back into the 𝓛-ball around w_t after *every* step, w ← w_t + clip(w − w_t, 𝓛) over
   all parameters; Δ = w_K − w_t, so ‖Δ‖ ≤ 𝓛 whatever the data.
3. **Aggregate**: Σ Δ over the sampled owners plus N(0, (z·𝓛)²) per coordinate, added once
   (inside the MPC in the product: mpc_erm.mpc.owner_shares / MpcAggregator.aggregate_shares).
   Adding or removing one owner moves the sum by at most 𝓛, so the rounds are T Poisson-sampled
   Gaussian mechanisms with noise multiplier z at rate τ (client level), accounted by
   :mod:`mpc_erm.privacy` (RDP, PoissonSampledDpEvent).
4. **Public step** (post-processing): w_{t+1} = w_t + η_g · S(Σ̃ / (τN)), S Laplacian smoothing
   per parameter tensor (σ_LS; 0 is DP-Fed). The normaliser is the *expected* count τN, public,
   not the realised one (which is a function of who was sampled: the paper divides by it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from mpc_erm.privacy.events import Composition, GaussianRounds, compose
from mpc_erm.smoothing import smooth_parameters

from .aggregation import NoiseSpec

__all__ = ["DpFedLs", "FedLsConfig", "owner_updates", "poisson_owners"]


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

    def __post_init__(self) -> None:
        checks = {"rounds": self.rounds >= 1, "owners": self.owners >= 1, "sampling_rate": 0 < self.sampling_rate <= 1,
                  "noise_multiplier": self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier),
                  "clip": self.clip > 0 and math.isfinite(self.clip), "local_epochs": self.local_epochs >= 1,
                  "local_batch": self.local_batch >= 1, "local_lr": self.local_lr > 0,
                  "local_lr_decay": 0 < self.local_lr_decay <= 1, "global_lr": self.global_lr > 0,
                  "weight_decay": self.weight_decay >= 0, "ls_sigma": self.ls_sigma >= 0}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"{bad[0]}: out of range ({getattr(self, bad[0])!r})")

    def event(self) -> GaussianRounds:
        """The job's privacy event at client level (one owner added or removed)."""
        return GaussianRounds(noise_multiplier=self.noise_multiplier, rounds=self.rounds,
                              sampling_rate=self.sampling_rate, adjacency="add_remove", sampler_tv=0.0)


def poisson_owners(owners: int, rate: float, generator: torch.Generator) -> list[int]:
    """This round's owners: each independently with probability ``rate``."""
    return torch.nonzero(torch.rand(owners, generator=generator) < rate).reshape(-1).tolist()


@dataclass
class DpFedLs:
    """The round loop of DP-Fed-LS for a torch module (built identically by every member)."""

    config: FedLsConfig
    build: Callable[[], nn.Module]
    loss: Callable[[Tensor, Tensor], Tensor] = nn.functional.cross_entropy
    model: nn.Module = field(init=False)

    def __post_init__(self) -> None:
        self.model = self.build()
        self.shapes = [p.shape for p in self.model.parameters()]
        self.w = parameters_to_vector(self.model.parameters()).detach().to(torch.float64)
        self.p = self.w.numel()
        self.noise = NoiseSpec("gaussian", self.config.noise_multiplier * self.config.clip,
                               sensitivity=self.config.clip) if self.config.noise_multiplier > 0 else \
            NoiseSpec("none", 0.0)

    def guarantee(self, delta: float, rounds: int | None = None) -> Composition:
        """(ε, δ) at client level after ``rounds`` (default: all T) rounds, RDP accountant."""
        ev = self.config.event()
        if rounds is not None:
            ev = GaussianRounds(noise_multiplier=ev.noise_multiplier, rounds=rounds, sampling_rate=ev.sampling_rate,
                                adjacency="add_remove", sampler_tv=0.0)
        return compose([ev], delta, "add_remove")

    # ------------------------------------------------------------------ an owner's side

    def local_update(self, X: Tensor, y: Tensor, t: int, generator: torch.Generator) -> Tensor:
        """Δ = w_K − w_t of E epochs of projected mini-batch SGD from the public w_t on one owner's
        rows (step 2 of the module docstring); float64, ‖Δ‖ ≤ 𝓛."""
        c = self.config
        model = self.model
        w0 = self.w.to(next(model.parameters()).dtype)
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
            return (parameters_to_vector(params) - w0).to(torch.float64)

    # ------------------------------------------------------------------ the public step

    def public_step(self, noisy_sum: Tensor) -> None:
        c = self.config
        g = noisy_sum.detach().to("cpu", torch.float64).reshape(-1) / (c.sampling_rate * c.owners)
        if c.ls_sigma:
            parts = torch.split(g, [math.prod(s) for s in self.shapes])
            g = torch.cat([t.reshape(-1) for t in smooth_parameters(
                [t.reshape(s) for t, s in zip(parts, self.shapes)], c.ls_sigma)])
        self.w = self.w + c.global_lr * g

    def predict(self, X: Tensor) -> Tensor:
        vector_to_parameters(self.w.to(next(self.model.parameters()).dtype), self.model.parameters())
        with torch.no_grad():
            return self.model(X).argmax(dim=-1)

    # ------------------------------------------------------------------ the loop

    def train(self, aggregator: Any, updates: Callable[[int, list[int]], Tensor], sample: Callable[[int], list[int]],
              after_round: Callable[[int, list[int]], None] | None = None) -> Tensor:
        """T rounds: ``sample(t)`` the owners, ``updates(t, owners)`` their Δ rows (k, p), the
        aggregator's noisy sum, the public step. Returns the final public model (float64)."""
        for t in range(self.config.rounds):
            owners = sample(t)
            if owners:
                rows = updates(t, owners)
                weights = torch.ones(rows.shape[0], dtype=torch.float64)
            else:  # nobody sampled: the sum is 0 (+ noise), as in any round
                rows = torch.zeros(1, self.p, dtype=torch.float64)
                weights = torch.zeros(1, dtype=torch.float64)
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
