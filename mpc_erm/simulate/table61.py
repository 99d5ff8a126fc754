"""Thesis Table 6.1 reproduced: the noise each multi-party method adds, as printed (thesis
convention), as sampled (std over 1000 draws, generated the way each method generates it), and
what the product's valid calibration needs for the same budget.

Why the last column differs: the thesis samples per-coordinate Lap(Δ₂/ε), which is only
(√d·ε)-DP in d dimensions; the product's pure-ε mechanism is the ℓ2-Laplace (per-coordinate std
√(d+1)·Δ₂/ε), and its Gaussian methods use the exact GDP accountant instead of zCDP.
"""

from __future__ import annotations

import math

import torch

from mpc_erm.privacy import (
    calibrate_gradient_perturbation,
    l2_laplace_coordinate_std,
    sample_noise,
    table_6_1_scales,
    thesis_grad_sigma,
)

# The thesis's printed rows (Table 6.1), for side-by-side comparison.
PRINTED_SCALE = {"Pathak": 800e-3, "Local Out P": 80.0e-3, "Local Obj P": 8.00e-3, "Local Grad P": 5.66e-3,
                 "MPC Out P": 8.00e-3, "MPC Grad P": 0.57e-3}
PRINTED_EMPIRICAL_STD = {"Pathak": 1150e-3, "Local Out P": 112e-3, "Local Obj P": 11.6e-3,
                         "Local Grad P": 5.63e-3, "MPC Out P": 12.2e-3, "MPC Grad P": 0.572e-3}


def _chaudhuri_eps_prime(eps: float, n: int, lam: float, c: float) -> float:
    """ε' of Chaudhuri et al. (2011) objective perturbation (c: smoothness of the loss)."""
    e = eps - math.log(1 + 2 * c / (n * lam) + (c / (n * lam)) ** 2)
    return e if e > 0 else eps / 2


def table_6_1(m: int = 100, n_min: int = 500, lam: float = 0.01, eps: float = 0.5, G: float = 1.0,
              T: int = 100, delta: float = 1e-3, dim: int = 122, samples: int = 1000, seed: int = 0,
              smoothness: float = 0.25) -> dict:
    """One JSON-ready object: per method the thesis's analytic scale, its empirical std over
    ``samples`` draws, and the product's calibration for the same (ε, δ) at dimension ``dim``."""
    gen = torch.Generator().manual_seed(seed)
    scales = table_6_1_scales(m, n_min, lam, eps, G, T)
    n = m * n_min
    rows = []
    for name, (dist, scale) in scales.items():
        local = name.startswith("Local") and name != "Local Obj P"
        if local:  # each sample is the average of m independent local draws
            party_scale = scale * math.sqrt(m)
            draws = sample_noise(dist, party_scale, (samples, m), gen).mean(dim=1)
        else:
            draws = sample_noise(dist, scale, (samples,), gen)
        analytic_std = scale * (math.sqrt(2) if dist == "laplace" else 1.0)
        correct = _correct(name, m, n_min, n, lam, eps, G, T, delta, dim, smoothness)
        rows.append({
            "method": name,
            "thesis_distribution": dist,
            "thesis_scale": scale,
            "thesis_printed_scale": PRINTED_SCALE[name],
            "thesis_std": analytic_std,
            "empirical_std": float(draws.std()),
            "thesis_printed_empirical_std": PRINTED_EMPIRICAL_STD[name],
            **correct,
        })
    return {
        "parameters": {"m": m, "n_min": n_min, "lam": lam, "epsilon": eps, "G": G, "T": T,
                       "delta_for_gaussian_methods": delta, "dim_for_l2_laplace": dim,
                       "samples": samples, "seed": seed, "loss_smoothness_c": smoothness},
        "conventions": {
            "thesis_scale": "Laplace scale b (std √2·b) or Gaussian std, as printed in Table 6.1",
            "thesis_gaussian": "Table 6.1 omits √log(1/δ) and uses √2 where eq. 6.3.1 has √8",
            "correct": "ℓ2-Laplace (pure ε) for one-shot releases; exact GDP for T Gaussian rounds; "
                       "per-coordinate std reported so rows are comparable",
        },
        "methods": rows,
    }


def _correct(name: str, m: int, n_min: int, n: int, lam: float, eps: float, G: float, T: int,
             delta: float, dim: int, c: float) -> dict:
    def l2lap(delta2: float, averaged_over: int = 1) -> dict:
        s = delta2 / eps
        return {"correct_mechanism": "l2_laplace", "correct_scale": s,
                "correct_coordinate_std": l2_laplace_coordinate_std(dim, s) / math.sqrt(averaged_over),
                "correct_epsilon": eps, "correct_delta": 0.0}

    def gauss(delta2: float, averaged_over: int = 1) -> dict:
        sigma = calibrate_gradient_perturbation(delta2, T, eps, delta, accountant="gdp").scale
        return {"correct_mechanism": "gaussian (GDP accountant)", "correct_scale": sigma,
                "correct_coordinate_std": sigma / math.sqrt(averaged_over),
                "correct_epsilon": eps, "correct_delta": delta,
                "thesis_eq_6_3_1_sigma": thesis_grad_sigma(G, T, eps, delta, 1 if averaged_over > 1 else m,
                                                           n_min) / math.sqrt(averaged_over)}

    if name == "Pathak":
        return l2lap(2 * G / (n_min * lam))
    if name == "Local Out P":
        return l2lap(2 * G / (n_min * lam), averaged_over=m)
    if name == "Local Obj P":
        e = _chaudhuri_eps_prime(eps, n_min, lam, c)
        s = 2 * G / (n_min * e)  # scale of b/n in the perturbed objective
        return {"correct_mechanism": "objective perturbation, ‖b‖ ~ Gamma(d, 2/ε')", "correct_scale": s,
                "correct_coordinate_std": l2_laplace_coordinate_std(dim, s), "correct_epsilon": eps,
                "correct_delta": 0.0, "chaudhuri_eps_prime": e}
    if name == "Local Grad P":
        return gauss(2 * G / n_min, averaged_over=m)
    if name == "MPC Out P":
        return l2lap(2 * G / (n * lam))
    return gauss(2 * G / n)
