"""The (ε, δ) a job gets from the in-MPC samplers over d coordinates and T releases.

:mod:`.accounting` is exact for one coordinate of the implemented PMF; a job releases d
coordinates T times, on a grid, from parties that each round their own input. This module turns
that into one guarantee, by a route every step of which is a theorem or an exact computation:

1. **Ideal discrete mechanisms on the grid.** With every party's input rounded to the grid
   2^-g, neighbouring aggregates differ by an *integer* vector s (grid units) with
   ``‖s‖ ≤ Δ·2^g + e``: ``e`` = (number of parties whose encoding may change)·√d (ℓ2) or ·d (ℓ1),
   because rounding moves each coordinate of each changed party's input by < 1 unit in either
   dataset (:func:`grid_sensitivity_units`).
   * Discrete Gaussian N_Z(0, σ²) per coordinate: for integer shifts the Rényi divergence of
     one coordinate is ≤ α·s_j²/(2σ²) (Canonne–Kamath–Steinke 2020, Prop. 5 / Thm. 4), and
     Rényi divergences of independent coordinates add, so one release is ρ-zCDP with
     ρ = ‖s‖²/(2σ²) — the Rényi curve of a continuous Gaussian with noise multiplier
     z = σ/‖s‖. T releases are composed by ``dp_accounting``'s RDP accountant (or the zCDP
     conversion). The GDP/PLD closed forms of the *continuous* Gaussian are not used here.
   * Discrete Laplace per coordinate with scale t: P(x)/P(x + s) ≤ e^{|s|/t}, so ℓ1 shifts give
     pure ε = ‖s‖₁/t (CKS 2020, §4).
2. **Implemented vs ideal: total variation.** The sampler differs from the ideal law only through
   events bounded by coupling (same randomness, compare coin by coin): a coin whose implemented
   probability c/2^k differs from the ideal p (|p − c/2^k| < 2^-k: c = ⌊p·2^k⌋ computed exactly),
   the geometric's bits above B (ideal mass Σ_{j≥B} q^{2^j}/(1+q^{2^j}) ≤ 2q^{2^B}), the
   Gaussian's dropped low-bit coins (≤ 2^low/D per candidate) and, with oblivious rounds, its
   fallback after R − 1 rejections ((1 − ρ)^{R−1}, ρ bounded below numerically); with revealed
   rejection the per-candidate terms count 1/ρ times (:func:`gaussian_tv_bound`). Summed: ``tv`` per coordinate
   (:func:`laplace_tv_bound`, :func:`gaussian_tv_bound`).
3. **Transfer.** If M is (ε, δ)-DP and TV(M'(x), M(x)) ≤ τ for every x, then M' is
   (ε, δ + (1 + e^ε)·τ)-DP. Over d coordinates and T releases τ = T·d·tv (union bound). That
   term is the report's ``delta_sampler``.

Tests check the TV bounds against the exact PMFs of :mod:`.pmf`/:mod:`.gaussian` at small
scales, and ε against an independent computation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from .gaussian import DiscreteGaussianParams
from .params import DiscreteLaplaceParams

__all__ = [
    "NoiseGuarantee",
    "coin_error",
    "discrete_gaussian_guarantee",
    "discrete_laplace_guarantee",
    "gaussian_tv_bound",
    "grid_sensitivity_units",
    "laplace_tv_bound",
]

GaussianAccountant = Literal["rdp", "zcdp"]


def coin_error(k: int) -> float:
    """|p − c/2^k| < 2^-k: thresholds are ⌊p·2^k⌋ computed exactly (params.coin_threshold)."""
    return 2.0**-k


def _tail_geometric(t: float, bits: int) -> float:
    """Ideal mass of the geometric's bits ≥ B: Σ_{j≥B} P(bit_j = 1) ≤ 2·q^{2^B}, q = e^{−1/t}."""
    return 2.0 * math.exp(-(2.0**bits) / t)


def laplace_tv_bound(params: DiscreteLaplaceParams) -> float:
    """TV between the implemented discrete Laplace and the ideal one (same t), per sample."""
    return (params.bits + 1) * coin_error(params.k) + _tail_geometric(params.t, params.bits)


def gaussian_tv_bound(params: DiscreteGaussianParams) -> float:
    """TV between the implemented discrete Gaussian and N_Z(0, tμ), per sample (module doc, 2).

    Revealed rejection: couple the implemented and the ideal sampler candidate by candidate; an
    output can differ only if a coupling fails at one of the candidates the ideal sampler draws
    until it accepts, 1/ρ of them on average, so TV ≤ (per candidate + per test)/ρ."""
    r = params.rounds
    lap = params.laplace
    per_candidate = laplace_tv_bound(lap)
    d = 2 * params.t * params.mu
    per_test = len(params.coin_thresholds) * coin_error(params.k) + (2.0**params.low_bit - 1) / d
    rho = params.ideal_acceptance()
    if params.revealed:
        return (per_candidate + per_test) / rho
    fallback = math.exp((r - 1) * math.log1p(-rho)) if r > 1 else 1.0
    return fallback + r * per_candidate + (r - 1) * per_test


def grid_sensitivity_units(sensitivity: float, grid_bits: int, dim: int, parties: int, norm: str) -> float:
    """Bound on ‖s‖ (grid units) between neighbouring encoded aggregates (module doc, 1)."""
    if sensitivity <= 0 or dim < 1 or parties < 1:
        raise ValueError("sensitivity, dim and parties must be positive")
    per_party = math.sqrt(dim) if norm == "l2" else float(dim)
    if norm not in ("l1", "l2"):
        raise ValueError(f"norm must be 'l1' or 'l2', not {norm!r}")
    return sensitivity * 2.0**grid_bits + parties * per_party


@dataclass(frozen=True)
class NoiseGuarantee:
    """What a report needs to state about the in-MPC noise of one job."""

    mechanism: str  # "discrete_gaussian" | "discrete_laplace"
    epsilon: float
    delta: float  # total, delta_sampler included
    delta_sampler: float
    accountant: str
    grid_bits: int
    noise_scale_grid: float  # σ (gaussian) or t (laplace) in grid units
    noise_scale: float  # the same in real units
    sensitivity: float  # real units, as given
    sensitivity_grid: float  # grid units, rounding included
    tv_per_coordinate: float
    dim: int
    releases: int
    statement: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gaussian_epsilon(z: float, rounds: int, delta: float, accountant: GaussianAccountant) -> float:
    from mpc_erm.privacy.accountants import epsilon_for

    return epsilon_for(accountant, z, rounds, delta, adjacency="add_remove")


def discrete_gaussian_guarantee(
    params: DiscreteGaussianParams,
    l2_sensitivity: float,
    dim: int,
    releases: int,
    delta: float,
    parties: int,
    accountant: GaussianAccountant = "rdp",
) -> NoiseGuarantee:
    """ε at total δ (``delta_sampler`` included) for ``releases`` d-dimensional releases.

    ``l2_sensitivity``: of one release in real units under the job's adjacency; ``parties``:
    how many parties' encodings can differ between neighbours (all of them, to be safe).
    """
    if accountant not in ("rdp", "zcdp"):
        raise ValueError(
            f"accountant {accountant!r}: the discrete Gaussian is accounted through its Rényi divergence "
            "(CKS 2020 Prop. 5); use 'rdp' or 'zcdp'"
        )
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    g = params.grid_bits
    s_grid = grid_sensitivity_units(l2_sensitivity, g, dim, parties, "l2")
    z = params.sigma / s_grid
    tv = gaussian_tv_bound(params)
    tau = releases * dim * tv
    if tau >= delta / 4:
        raise ValueError(
            f"sampler total variation {tau:.3g} over {releases}×{dim} samples is not small against δ = {delta}: "
            "raise k or the rounds R"
        )
    eps = _gaussian_epsilon(z, releases, delta - 2 * tau, accountant)
    for _ in range(50):  # fixed point of δ_mech + (1 + e^ε)·τ = δ (ε only grows: converges)
        d_sampler = (1.0 + math.exp(eps)) * tau
        if d_sampler >= delta:
            raise ValueError(f"δ = {delta} cannot absorb the sampler term at ε = {eps:.3g}")
        new = _gaussian_epsilon(z, releases, delta - d_sampler, accountant)
        if new <= eps * (1 + 1e-12):
            break
        eps = new
    d_sampler = (1.0 + math.exp(eps)) * tau
    name = {"rdp": "RDP (dp_accounting)", "zcdp": "zCDP (Bun–Steinke conversion)"}[accountant]
    return NoiseGuarantee(
        mechanism="discrete_gaussian",
        epsilon=eps,
        delta=delta,
        delta_sampler=d_sampler,
        accountant=f"{name} of the discrete Gaussian (CKS 2020 Prop. 5, additive over coordinates)",
        grid_bits=g,
        noise_scale_grid=params.sigma,
        noise_scale=params.sigma * 2.0**-g,
        sensitivity=l2_sensitivity,
        sensitivity_grid=s_grid,
        tv_per_coordinate=tv,
        dim=dim,
        releases=releases,
        statement=(
            f"{releases} release(s) of {dim} coordinates with discrete Gaussian noise σ = {params.sigma:.6g} grid "
            f"units (2^-{g}) sampled inside the MPC; ℓ2 sensitivity {s_grid:.6g} grid units including every "
            f"party's rounding; ({eps:.6g}, {delta:.3g})-DP, of which δ_sampler = {d_sampler:.3g} bounds the "
            "sampler's total-variation distance to N_Z"
        ),
    )


def discrete_laplace_guarantee(
    params: DiscreteLaplaceParams, l1_sensitivity: float, dim: int, parties: int, releases: int = 1
) -> NoiseGuarantee:
    """Pure ε = T·‖s‖₁/t of the ideal discrete Laplace plus δ_sampler for the implemented one."""
    g = params.grid_bits
    s_grid = grid_sensitivity_units(l1_sensitivity, g, dim, parties, "l1")
    eps = releases * s_grid / params.t
    tv = laplace_tv_bound(params)
    d_sampler = (1.0 + math.exp(eps)) * releases * dim * tv
    return NoiseGuarantee(
        mechanism="discrete_laplace",
        epsilon=eps,
        delta=d_sampler,
        delta_sampler=d_sampler,
        accountant="pure ε of the discrete Laplace (CKS 2020 §4), basic composition",
        grid_bits=g,
        noise_scale_grid=params.t,
        noise_scale=params.t * 2.0**-g,
        sensitivity=l1_sensitivity,
        sensitivity_grid=s_grid,
        tv_per_coordinate=tv,
        dim=dim,
        releases=releases,
        statement=(
            f"{releases} release(s) of {dim} coordinates with discrete Laplace noise t = {params.t:.6g} grid units "
            f"(2^-{g}) sampled inside the MPC; ℓ1 sensitivity {s_grid:.6g} grid units including every party's "
            f"rounding; ({eps:.6g}, {d_sampler:.3g})-DP, δ entirely from the sampler's total-variation bound"
        ),
    )
