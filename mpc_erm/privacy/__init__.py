"""mpc_erm.privacy: sensitivities, noise calibration, accountants, samplers and reports.

Everything numeric a privacy claim rests on lives here (docs/explanation/privacy.md); each module cites the
paper section its formula comes from (recorded in docs/explanation/papers.md), and ``tests/privacy`` checks
each one against an independent computation or a published number.

- :mod:`.sensitivity`  ℓ2/ℓ1 sensitivities of the aggregated model and gradient
- :mod:`.gaussian`     classic and analytic Gaussian / GDP (exact T-round composition)
- :mod:`.zcdp`         the thesis's zCDP route (and its eq. 6.3.1 / Table 6.1 formulas)
- :mod:`.laplace`      per-coordinate and ℓ2 ("Gamma-norm") Laplace mechanisms
- :mod:`.accountants`  RDP / PLD (Google dp_accounting), GDP and zCDP behind one interface
- :mod:`.contraction`  amplification by iteration (paper 004: Thm 4, Prop. 1, Thm 5, Thm 3)
- :mod:`.plan`         a job's :class:`PrivacyPlan`: what protocols, ledger, report and simulator read
- :mod:`.calibration`  σ or b for a target (ε, δ) outside a job's plan (the baselines) → :class:`Calibration`
- :mod:`.thesis`       Table 6.1 analytic scales, for reproduction
- :mod:`.noise`        seedable plaintext samplers for the in-process simulator
- :mod:`.report`       :class:`PrivacyReport` (JSON)
"""

from __future__ import annotations

from mpc_erm.lazy_exports import lazy_exports

# Names are loaded on first use (PEP 562): the ledger and the CLI import the light modules
# (events, plan) without pulling in torch through the plaintext samplers.
_WHERE = {
    "ACCOUNTANTS": "accountants",
    "Calibration": "calibration",
    "ContractionBound": "contraction",
    "MECHANISMS": "noise",
    "PrivacyReport": "report",
    "SIMULATION_TRUST_MODEL": "report",
    "TABLE_6_1_METHODS": "thesis",
    "analytic_gaussian_sigma": "gaussian",
    "calibrate_gradient_perturbation": "calibration",
    "calibrate_output_perturbation": "calibration",
    "classic_gaussian_sigma": "gaussian",
    "contraction_factor": "contraction",
    "delta_for": "accountants",
    "epsilon_for": "accountants",
    "feldman_balle_delta": "contraction",
    "feldman_balle_epsilon": "contraction",
    "feldman_balle_kappa": "contraction",
    "gaussian_delta_for_rounds": "gaussian",
    "gaussian_epsilon_for_rounds": "gaussian",
    "gaussian_rounds_event": "accountants",
    "gaussian_sigma_for_rounds": "gaussian",
    "gdp_delta": "gaussian",
    "gdp_epsilon": "gaussian",
    "gdp_log_delta": "gaussian",
    "gdp_mu": "gaussian",
    "gradient_sensitivity": "sensitivity",
    "l1_from_l2": "sensitivity",
    "l2_laplace_coordinate_std": "laplace",
    "l2_laplace_epsilon": "laplace",
    "l2_laplace_norm_mean": "laplace",
    "l2_laplace_norm_second_moment": "laplace",
    "l2_laplace_scale": "laplace",
    "laplace_coordinate_std": "laplace",
    "laplace_hockey_stick": "laplace",
    "laplace_scale": "laplace",
    "log_theta_gamma": "contraction",
    "no_noise_calibration": "calibration",
    "noise_multiplier_for": "accountants",
    "output_perturbation_sensitivity": "sensitivity",
    "per_coordinate_laplace_epsilon": "laplace",
    "pnsgd_best_delta": "contraction",
    "pnsgd_epsilon": "contraction",
    "pnsgd_gaussian_delta": "contraction",
    "pnsgd_gaussian_log_delta": "contraction",
    "pnsgd_laplace_delta": "contraction",
    "pnsgd_random_stop_delta": "contraction",
    "sample_gamma": "noise",
    "sample_noise": "noise",
    "table_6_1_scales": "thesis",
    "thesis_grad_sigma": "zcdp",
    "thesis_output_scale": "thesis",
    "thesis_table_6_1_grad_scale": "zcdp",
    "theta_gamma": "contraction",
    "zcdp_compose": "zcdp",
    "zcdp_epsilon": "zcdp",
    "zcdp_epsilon_for_rounds": "zcdp",
    "zcdp_rho_for": "zcdp",
    "zcdp_rho_gaussian": "zcdp",
    "zcdp_sigma": "zcdp",
}

__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
