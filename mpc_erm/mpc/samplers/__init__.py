"""Noise samplers inside the MPC whose privacy is analysed for the distribution actually sampled.

- :mod:`.params`            public parameters; bit thresholds c_j = ⌊p_j·2^k⌋ define the sampler
- :mod:`.pmf`               exact PMF of the implemented discrete Laplace (log space)
- :mod:`.accounting`        exact ε(δ) from that PMF (numpy hockey-stick and dp_accounting PLD);
                            ℓ1 guarantee over d coordinates
- :mod:`.reference`         plaintext sampler of the same algorithm (fast statistical tests)
- :mod:`.bits`              XOR-shared 64-lane words in the MPC: Beaver ANDs, openings, B2A
- :mod:`.coins`             biased coins [U < c]: bit-sliced comparisons with public constants
- :mod:`.discrete_laplace`  the CrypTen sampler (coins, sign × magnitude, B2A, one mul)
- :mod:`.pool`              offline pool of secret-shared noise
- :mod:`.gaussian`          discrete Gaussian by rejection from the discrete Laplace (CKS 2020,
                            Alg. 3) with exact acceptance coins: parameters, exact PMF, reference
- :mod:`.discrete_gaussian` the CrypTen discrete Gaussian (R candidates, oblivious selection)

Modules that need CrypTen (bits, coins, discrete_laplace, discrete_gaussian, pool) are not
imported here, so the analysis can be used without starting an MPC.
"""

from .accounting import (
    L1Guarantee,
    exact_delta,
    exact_epsilon,
    grid_sensitivity,
    l1_guarantee,
    pld_for_shift,
    sampler_delta,
)
from .gaussian import DiscreteGaussianParams, gaussian_reference_samples, ideal_discrete_gaussian_log_pmf
from .params import FRAC_BITS, DiscreteLaplaceParams, default_bits, full_support_bits
from .pmf import ideal_discrete_laplace_log_pmf, log_pmf, support
from .reference import reference_samples

__all__ = [
    "FRAC_BITS",
    "DiscreteGaussianParams",
    "DiscreteLaplaceParams",
    "L1Guarantee",
    "default_bits",
    "exact_delta",
    "exact_epsilon",
    "full_support_bits",
    "gaussian_reference_samples",
    "grid_sensitivity",
    "ideal_discrete_gaussian_log_pmf",
    "ideal_discrete_laplace_log_pmf",
    "l1_guarantee",
    "log_pmf",
    "pld_for_shift",
    "reference_samples",
    "sampler_delta",
    "support",
]
