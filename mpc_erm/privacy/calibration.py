"""Sensitivity + budget → noise (docs/explanation/privacy.md §2-4), for releases outside a job's plan: the
simulator's baselines (local DP-GD, local output perturbation, Table 6.1) and an independent check
of the plan's σ in the tests. A job's own noise is its :class:`~.plan.PrivacyPlan`'s.

Each returns a frozen :class:`Calibration` carrying the noise the sampler takes
(:func:`.noise.sample_noise` ``(mechanism, scale)``) and everything a report must state.
``Calibration.report(**extra)`` builds the JSON :class:`.report.PrivacyReport`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from . import _checks
from .accountants import ACCOUNTANTS, epsilon_for, noise_multiplier_for
from .gaussian import analytic_gaussian_sigma
from .laplace import l2_laplace_scale, laplace_scale
from .report import SIMULATION_SAMPLER_NOTE, SIMULATION_TRUST_MODEL, PrivacyReport
from .sensitivity import l1_from_l2

CalibratedMechanism = Literal["gaussian", "laplace", "l2_laplace", "none"]
OutputMechanism = Literal["l2_laplace", "gaussian", "laplace_thesis"]
OUTPUT_MECHANISMS = ("l2_laplace", "gaussian", "laplace_thesis")

__all__ = [
    "Calibration",
    "calibrate_gradient_perturbation",
    "calibrate_output_perturbation",
    "no_noise_calibration",
]


@dataclass(frozen=True)
class Calibration:
    """Calibrated noise for one mechanism run (output perturbation: 1 release; gradient
    perturbation: ``rounds`` releases, each with this noise).

    ``scale`` is what :func:`.noise.sample_noise` takes: σ (gaussian), b (laplace, per
    coordinate), Δ₂/ε (l2_laplace). ``epsilon``/``delta`` is the guarantee of the whole run under
    ``accountant`` (the target; the calibrated noise meets it, rounded to the safe side).
    """

    mechanism: CalibratedMechanism
    scale: float
    sensitivity_l2: float
    sensitivity_l1: float | None
    epsilon: float
    delta: float
    accountant: str
    adjacency: str
    rounds: int = 1
    sampling_rate: float = 1.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def noise_multiplier(self) -> float:
        """σ/Δ₂ for Gaussian noise (the ``dp_accounting`` convention of :mod:`.accountants`)."""
        if self.mechanism != "gaussian":
            raise ValueError(
                "mechanism: noise_multiplier is defined for 'gaussian' only, "
                f"not {self.mechanism!r}"
            )
        return self.scale / self.sensitivity_l2

    def report(self, **extra: Any) -> PrivacyReport:
        """The :class:`PrivacyReport` of this calibration. ``extra`` sets the run's fields:
        ``trust_model``, ``parties``, ``n``, ``parameters``, ``delta_sampler``, ``notes``
        (appended)."""
        notes = self.notes + tuple(extra.pop("notes", ()))
        trust = extra.pop("trust_model", SIMULATION_TRUST_MODEL)
        if "delta_sampler" not in extra and trust == SIMULATION_TRUST_MODEL:
            notes += (SIMULATION_SAMPLER_NOTE,)
        return PrivacyReport(
            mechanism=self.mechanism,
            noise_scale=self.scale,
            norm="l1" if self.mechanism == "laplace" else "l2",
            sensitivity_l2=self.sensitivity_l2,
            sensitivity_l1=self.sensitivity_l1,
            adjacency=self.adjacency,
            accountant=self.accountant,
            epsilon=self.epsilon,
            delta=self.delta,
            rounds=self.rounds,
            sampling_rate=self.sampling_rate,
            trust_model=trust,
            notes=notes,
            **extra,
        )


def calibrate_output_perturbation(
    sensitivity_l2: float,
    dim: int,
    epsilon: float,
    delta: float = 0.0,
    mechanism: OutputMechanism = "l2_laplace",
    adjacency: str = "replace",
) -> Calibration:
    """Noise added once to the aggregated model (MPC Out P).

    - ``"l2_laplace"`` (default): density ∝ exp(−ε‖b‖/Δ₂), pure ε-DP (:mod:`.laplace`). A
      non-zero ``delta`` is not needed and is reported as 0 (with a note).
    - ``"gaussian"``: analytic Gaussian mechanism (Balle–Wang 2018), (ε, δ)-DP; needs δ > 0.
    - ``"laplace_thesis"``: per-coordinate Laplace with the honest ℓ1 sensitivity
      Δ₁ = √d·Δ₂, b = Δ₁/ε, pure ε-DP. The thesis's literal "Lap(Δ₂/ε)" per coordinate
      (thesis Thm 6.3.1 / Table 6.1) is NOT ε-DP — only √d·ε-DP — and is not offered.

    ``sensitivity_l2`` must already be the one for ``adjacency``
    (:func:`.sensitivity.output_perturbation_sensitivity`); ``adjacency`` is recorded for the report.
    """
    d2 = _checks.positive("sensitivity_l2", sensitivity_l2)
    d = _checks.positive_int("dim", dim)
    eps = _checks.positive("epsilon", epsilon)
    dl = _checks.probability_half_open("delta", delta)
    mech = _checks.choice("mechanism", mechanism, OUTPUT_MECHANISMS)
    adj = _checks.adjacency("adjacency", adjacency)
    if mech == "l2_laplace":
        notes: tuple[str, ...] = (
            "l2-Laplace mechanism (Chaudhuri-Monteleoni 2009): pure epsilon-DP",
        )
        if dl > 0:
            notes += (
                (
                    f"delta={dl!r} was requested but the mechanism is pure epsilon-DP: "
                    "reported delta=0"
                ),
            )
        return Calibration(
            "l2_laplace", l2_laplace_scale(d2, eps), d2, None, eps, 0.0, "pure", adj, notes=notes
        )
    if mech == "gaussian":
        if dl <= 0:
            raise ValueError("delta must be > 0 for the Gaussian mechanism, got 0")
        sigma = analytic_gaussian_sigma(d2, eps, dl)
        return Calibration(
            "gaussian",
            sigma,
            d2,
            None,
            eps,
            dl,
            "gdp",
            adj,
            notes=("analytic Gaussian mechanism (Balle-Wang 2018), exact (epsilon, delta)",),
        )
    d1 = l1_from_l2(d2, d)
    notes = (
        "thesis mode: per-coordinate Laplace with l1 sensitivity sqrt(d)*l2 (pure epsilon-DP)",
        (
            "the thesis's literal Lap(l2 sensitivity/epsilon) per coordinate is only "
            "sqrt(d)*epsilon-DP"
        ),
    )
    if dl > 0:
        notes += (
            f"delta={dl!r} was requested but the mechanism is pure epsilon-DP: reported delta=0",
        )
    return Calibration(
        "laplace", laplace_scale(d1, eps), d2, d1, eps, 0.0, "pure", adj, notes=notes
    )


def calibrate_gradient_perturbation(
    sensitivity_l2: float,
    rounds: int,
    epsilon: float,
    delta: float,
    accountant: str = "gdp",
    sampling_rate: float = 1.0,
    adjacency: str = "replace",
    *,
    rel_tol: float = 1e-4,
    pld_discretization: float = 1e-4,
) -> Calibration:
    """σ of the Gaussian noise added to the normalised aggregated gradient in each of ``rounds``
    rounds, such that the T-fold (adaptive) composition is (ε, δ)-DP under ``accountant``.

    ``sensitivity_l2`` is the per-round Δ under ``adjacency``
    (:func:`.sensitivity.gradient_sensitivity`);
    for ``sampling_rate`` < 1 it must be that of the sampled query with a public normaliser.
    - ``"gdp"`` (default): exact for full batch, σ = √T·Δ/μ(ε, δ) (:mod:`.gaussian`).
    - ``"zcdp"``: thesis route with the exact zCDP inverse (:mod:`.zcdp`); more noise.
    - ``"rdp"`` / ``"pld"``: ``dp_accounting`` numerical accountants; the only ones for q < 1.
    """
    d2 = _checks.positive("sensitivity_l2", sensitivity_l2)
    t = _checks.positive_int("rounds", rounds)
    eps = _checks.positive("epsilon", epsilon)
    dl = _checks.probability_open("delta", delta)
    acc = _checks.choice("accountant", accountant, ACCOUNTANTS)
    q = _checks.sampling_rate("sampling_rate", sampling_rate)
    adj = _checks.adjacency("adjacency", adjacency)
    z = noise_multiplier_for(
        acc, eps, dl, t, q, adj, rel_tol=rel_tol, pld_discretization=pld_discretization
    )
    notes = [f"{t} Gaussian rounds, noise multiplier sigma/Delta = {z:.6g}"]
    if acc in ("rdp", "pld"):
        achieved = epsilon_for(acc, z, t, dl, q, adj, pld_discretization=pld_discretization)
        notes.append(f"dp_accounting {acc.upper()} epsilon at this sigma: {achieved:.6g}")
    if q < 1.0:
        notes.append(f"Poisson subsampling with rate {q!r}, {adj} adjacency")
    return Calibration("gaussian", z * d2, d2, None, eps, dl, acc, adj, t, q, tuple(notes))


def no_noise_calibration(
    sensitivity_l2: float = 0.0, rounds: int = 1, adjacency: str = "replace"
) -> Calibration:
    """The non-private baseline: no noise, ε = ∞ (δ = 0), stated as such in its report."""
    d2 = _checks.nonnegative("sensitivity_l2", sensitivity_l2)
    t = _checks.positive_int("rounds", rounds)
    adj = _checks.adjacency("adjacency", adjacency)
    return Calibration(
        "none",
        0.0,
        d2,
        None,
        math.inf,
        0.0,
        "none",
        adj,
        t,
        1.0,
        ("non-private: no differential privacy",),
    )
