"""mpc_erm.privacy: sensitivities, noise calibration, accountants, samplers and reports.

Everything numeric a privacy claim rests on lives here (docs/privacy.md); each module cites the
paper/notes section its formula comes from, and ``tests/privacy`` checks each one against an
independent computation or a published number.

- :mod:`.sensitivity`  ℓ2/ℓ1 sensitivities of the aggregated model and gradient
- :mod:`.gaussian`     classic and analytic Gaussian / GDP (exact T-round composition)
- :mod:`.zcdp`         the thesis's zCDP route (and its eq. 6.3.1 / Table 6.1 formulas)
- :mod:`.laplace`      per-coordinate and ℓ2 ("Gamma-norm") Laplace mechanisms
- :mod:`.accountants`  RDP / PLD (Google dp_accounting), GDP and zCDP behind one interface
- :mod:`.contraction`  amplification by iteration (paper 004: Thm 4, Prop. 1, Thm 5, Thm 3)
- :mod:`.calibration`  the entry points protocols call → :class:`Calibration`
- :mod:`.thesis`       Table 6.1 analytic scales, for reproduction
- :mod:`.noise`        seedable plaintext samplers for the in-process simulator
- :mod:`.report`       :class:`PrivacyReport` (JSON)
"""

from .accountants import (
    ACCOUNTANTS,
    delta_for,
    epsilon_for,
    gaussian_rounds_event,
    noise_multiplier_for,
)
from .calibration import (
    Calibration,
    calibrate_gradient_perturbation,
    calibrate_output_perturbation,
    no_noise_calibration,
)
from .contraction import (
    ContractionBound,
    contraction_factor,
    feldman_balle_delta,
    feldman_balle_epsilon,
    feldman_balle_kappa,
    log_theta_gamma,
    pnsgd_best_delta,
    pnsgd_epsilon,
    pnsgd_gaussian_delta,
    pnsgd_gaussian_log_delta,
    pnsgd_laplace_delta,
    pnsgd_random_stop_delta,
    theta_gamma,
)
from .gaussian import (
    analytic_gaussian_sigma,
    classic_gaussian_sigma,
    gaussian_delta_for_rounds,
    gaussian_epsilon_for_rounds,
    gaussian_sigma_for_rounds,
    gdp_delta,
    gdp_epsilon,
    gdp_log_delta,
    gdp_mu,
)
from .laplace import (
    l2_laplace_coordinate_std,
    l2_laplace_epsilon,
    l2_laplace_norm_mean,
    l2_laplace_norm_second_moment,
    l2_laplace_scale,
    laplace_coordinate_std,
    laplace_hockey_stick,
    laplace_scale,
    per_coordinate_laplace_epsilon,
)
from .noise import MECHANISMS, sample_gamma, sample_noise
from .report import SIMULATION_TRUST_MODEL, PrivacyReport
from .sensitivity import gradient_sensitivity, l1_from_l2, output_perturbation_sensitivity
from .thesis import TABLE_6_1_METHODS, table_6_1_scales, thesis_output_scale
from .zcdp import (
    thesis_grad_sigma,
    thesis_table_6_1_grad_scale,
    zcdp_compose,
    zcdp_epsilon,
    zcdp_epsilon_for_rounds,
    zcdp_rho_for,
    zcdp_rho_gaussian,
    zcdp_sigma,
)

__all__ = [
    "ACCOUNTANTS",
    "MECHANISMS",
    "SIMULATION_TRUST_MODEL",
    "TABLE_6_1_METHODS",
    "Calibration",
    "ContractionBound",
    "PrivacyReport",
    "analytic_gaussian_sigma",
    "calibrate_gradient_perturbation",
    "calibrate_output_perturbation",
    "classic_gaussian_sigma",
    "contraction_factor",
    "delta_for",
    "epsilon_for",
    "feldman_balle_delta",
    "feldman_balle_epsilon",
    "feldman_balle_kappa",
    "gaussian_delta_for_rounds",
    "gaussian_epsilon_for_rounds",
    "gaussian_rounds_event",
    "gaussian_sigma_for_rounds",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_log_delta",
    "gdp_mu",
    "gradient_sensitivity",
    "l1_from_l2",
    "l2_laplace_coordinate_std",
    "l2_laplace_epsilon",
    "l2_laplace_norm_mean",
    "l2_laplace_norm_second_moment",
    "l2_laplace_scale",
    "laplace_coordinate_std",
    "laplace_hockey_stick",
    "laplace_scale",
    "log_theta_gamma",
    "no_noise_calibration",
    "noise_multiplier_for",
    "output_perturbation_sensitivity",
    "per_coordinate_laplace_epsilon",
    "pnsgd_best_delta",
    "pnsgd_epsilon",
    "pnsgd_gaussian_delta",
    "pnsgd_gaussian_log_delta",
    "pnsgd_laplace_delta",
    "pnsgd_random_stop_delta",
    "sample_gamma",
    "sample_noise",
    "table_6_1_scales",
    "thesis_grad_sigma",
    "thesis_output_scale",
    "thesis_table_6_1_grad_scale",
    "theta_gamma",
    "zcdp_compose",
    "zcdp_epsilon",
    "zcdp_epsilon_for_rounds",
    "zcdp_rho_for",
    "zcdp_rho_gaussian",
    "zcdp_sigma",
]
