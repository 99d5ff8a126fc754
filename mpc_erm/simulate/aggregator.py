"""Plaintext, in-process implementation of the protocols' SecureAggregator.

It computes exactly what the MPC reveals (Σ w_i c_i + noise) with a seeded torch generator, so
experiments are reproducible and the daemons' MPC runs are checked against it (the same protocol
round loop over this aggregator and over ``mpc_erm.mpc``'s). It is *not* private
against anyone who can read this process: its trust model says so in every report.
"""

from __future__ import annotations

import torch

from mpc_erm.privacy import sample_noise
from mpc_erm.privacy.report import SIMULATION_TRUST_MODEL
from mpc_erm.protocols.aggregation import NoiseSpec


class InProcessAggregator:
    trust_model = SIMULATION_TRUST_MODEL

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self.rounds = 0

    def aggregate(self, contributions: torch.Tensor, weights: torch.Tensor, noise: NoiseSpec) -> torch.Tensor:
        if contributions.ndim != 2 or weights.shape != contributions.shape[:1]:
            raise ValueError(
                f"contributions (k, p) and weights (k,) expected, got {tuple(contributions.shape)} "
                f"and {tuple(weights.shape)}"
            )
        self.rounds += 1
        total = weights.to(contributions.dtype) @ contributions
        if noise.mechanism == "none":
            return total
        z = sample_noise(noise.mechanism, noise.scale, total.shape, self.generator, dtype=total.dtype)
        return total + z.to(total.device)
