"""Distributed noise: each compute party adds its own discrete Gaussian share of the noise.

Under a threat model of at most t corrupt compute parties among k, a corrupt party knows its own
share and can subtract it from the release; the guarantee must rest on the h = k − t honest
shares alone. Each party therefore samples N_Z(0, σ_p²) with h·σ_p² ≥ σ², σ = z·Δ the noise the
plan's accountant asks for, and the release carries k·σ_p² = (k/h)·σ² of variance in all: the
standard deviation is √(k/h) times the in-MPC sampler's (1.22× with 3 replicated parties, t = 1;
√k with a dealer, where only one party need be honest, t = k − 1).

The sum of h independent N_Z(0, σ_p²)^d is not a discrete Gaussian. Kairouz–Liu–Steinke (ICML
2021, Prop. 14) bound its Rényi divergence for every integer shift Δ and every order α ≥ 1:

    D_α(X + Δ ‖ X) ≤ α‖Δ‖²/(2hσ_p²) + τ·d,   τ = 10·Σ_{j=1}^{h−1} exp(−2π²σ_p²·j/(j+1)),

the Gaussian's curve plus a constant. The grid (mpc_erm.mpc.noise) puts σ_p at thousands of grid
units, where τ·d is below 10^-300: :func:`kls_tau` computes it, the realisation states it, and a
σ_p too small for it to vanish is refused. The curve is then the in-MPC discrete Gaussian's
α/(2z²), and the plan's accountant applies unchanged.

A deviating compute party cannot shrink the honest shares, which it never sees; what it can
still do is shift the sum (its own share is any value it likes), which only a malicious-secure
protocol with checked inputs catches (docs/explanation/trust-models.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MAX_KLS_OFFSET", "NoiseSplit", "kls_tau", "noise_split"]

#: The largest ε the KLS τ·d term may add over a whole job: far below float64's resolution of ε.
MAX_KLS_OFFSET = 1e-300


@dataclass(frozen=True)
class NoiseSplit:
    """``parties`` compute parties each add a share; ``honest`` of them (k − t) carry the guarantee."""

    parties: int
    honest: int

    def __post_init__(self) -> None:
        if not 1 <= self.honest <= self.parties:
            raise ValueError(f"noise split: 1 ≤ honest ≤ parties, got {self.honest} of {self.parties}")

    @property
    def inflation(self) -> float:
        """√(k/h): the release's noise standard deviation over the in-MPC sampler's."""
        return math.sqrt(self.parties / self.honest)

    def describe(self) -> str:
        t = self.parties - self.honest
        return (f"each of the {self.parties} compute parties adds its own share; the guarantee rests on the "
                f"{self.honest} honest ones' shares alone (up to {t} corrupt), so the noise is {self.inflation:.3g}× "
                "the in-MPC sampler's")


def noise_split(trust: str, parties: int) -> NoiseSplit:
    """The split for a job's trust model: replicated sharing tolerates one corrupt party of three;
    with a dealer only one party need be honest."""
    if trust == "replicated":
        return NoiseSplit(parties, parties - 1)
    return NoiseSplit(parties, 1)


def kls_tau(sigma_units: float, honest: int) -> float:
    """τ of Kairouz–Liu–Steinke 2021 Prop. 14 for ``honest`` summands of N_Z(0, σ²), σ in grid
    units (0 for one summand: a single discrete Gaussian's RDP has no extra term)."""
    return 10.0 * sum(math.exp(-2.0 * math.pi**2 * sigma_units**2 * j / (j + 1)) for j in range(1, honest))
