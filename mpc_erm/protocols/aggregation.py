"""The one thing a protocol needs from the outside world: a secure noisy weighted sum.

A protocol never talks to a network. It hands its contributions to a :class:`SecureAggregator`
which returns ``Σ_i w_i·c_i + noise`` and nothing else. The in-process simulator
(:mod:`mpc_erm.simulate.aggregator`) implements it in plaintext; the MPC engine implements it
with CrypTen over gRPC, where the caller holds only its own rows. So the same protocol code runs
in both, and a protocol step is testable without a network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch

NoiseMechanism = Literal["none", "gaussian", "laplace", "l2_laplace"]


@dataclass(frozen=True)
class NoiseSpec:
    """Noise added once to the aggregate: σ (gaussian), b (per-coordinate laplace) or Δ₂/ε
    (l2_laplace: density ∝ exp(−‖z‖/scale)).

    ``sensitivity`` (optional): the release's ℓ2 (gaussian, l2_laplace) or ℓ1 (laplace)
    sensitivity in real units. An engine that encodes contributions on a fixed-point grid uses it
    to pick a grid fine enough that rounding adds little to it (``mpc_erm.mpc.noise``); the
    plaintext simulator ignores it.
    """

    mechanism: NoiseMechanism
    scale: float
    sensitivity: float | None = None
    grid_bits: int | None = None  # fixed by the engine's realisation of a plan (mpc_erm.mpc.noise.realise)
    coin_bits: int | None = None  # in-MPC Gaussian: bits per acceptance/Laplace coin (None: the engine's default)

    def __post_init__(self) -> None:
        if self.mechanism != "none" and not (self.scale > 0 and self.scale < float("inf")):
            raise ValueError(f"NoiseSpec.scale must be positive and finite for {self.mechanism}, got {self.scale}")
        if self.sensitivity is not None and not (0 < self.sensitivity < float("inf")):
            raise ValueError(f"NoiseSpec.sensitivity must be positive and finite, got {self.sensitivity}")


NO_NOISE = NoiseSpec("none", 0.0)


@runtime_checkable
class SecureAggregator(Protocol):
    """Securely computes and reveals ``Σ_i weights[i]·contributions[i] + noise``.

    ``contributions`` (k, p) and ``weights`` (k,) are the rows *this caller* holds: all m parties'
    rows in the simulator, the caller's own row in a party daemon. Weights are public.
    """

    trust_model: str

    def aggregate(self, contributions: torch.Tensor, weights: torch.Tensor, noise: NoiseSpec) -> torch.Tensor:
        ...
