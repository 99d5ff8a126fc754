"""The thesis ch. 6 methods, run on simulated parties.

MPC Out P and MPC Grad P go through the transport-independent protocols with the in-process
aggregator. The baselines (Pathak, Local Out P, Local Obj P, Local Grad P, Rajkumar–Agarwal)
exist only here: they are what the product is compared against, never what it runs.

Two conventions:
- ``exact``: the product's calibration. ℓ2-Laplace (pure ε) for one-shot releases, the analytic
  Gaussian / GDP accountant for T Gaussian rounds, pooled weights.
- ``thesis``: the formulas as printed in the thesis, for reproduction: per-coordinate
  Lap(Δ₂/ε) (NOT ε-DP for d > 1: it is calibrated to the ℓ2 sensitivity, see docs/explanation/privacy.md §3),
  σ² = 8G²T log(1/δ)/(m² n₍₁₎² ε²) (eq. 6.3.1), per-party-mean weights 1/(m·n_j).

Rajkumar–Agarwal (AISTATS'12) is modelled from the thesis's description only (the paper is not
available here): each party adds local Gaussian noise, summing to MPC Grad P's σ, through a
trusted aggregator, plus a per-round Laplace term calibrated to ε per round, so its total budget
is T·ε under basic composition. Its report says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

from mpc_erm.models import Loss, solve_erm, solve_erm_batched
from mpc_erm.privacy import (
    calibrate_gradient_perturbation,
    calibrate_output_perturbation,
    sample_noise,
    thesis_grad_sigma,
)
from mpc_erm.protocols import GradientPerturbation, JobSpec, ModelSpec, OutputPerturbation, PrivacySpec, TrainingSpec
from mpc_erm.protocols.aggregation import NoiseSpec, SecureAggregator
from mpc_erm.simulate.aggregator import InProcessAggregator
from mpc_erm.simulate.parties import SimulatedParties

Convention = Literal["exact", "thesis"]
METHODS = ("mpc_grad_p", "mpc_out_p", "pathak", "local_out_p", "local_obj_p", "local_grad_p", "rajkumar_agarwal")
ONE_SHOT = {"mpc_out_p", "pathak", "local_out_p", "local_obj_p"}
# Display names as in the thesis's figures.
LABELS = {
    "mpc_grad_p": "MPC Grad P",
    "mpc_out_p": "MPC Out P",
    "pathak": "Pathak",
    "local_out_p": "Local Out P",
    "local_obj_p": "Local Obj P",
    "local_grad_p": "Local Grad P",
    "rajkumar_agarwal": "Rajkumar and Agarwal",
}


@dataclass(frozen=True)
class Setting:
    """Public parameters shared by all methods of one experiment."""

    model: str = "logistic"
    lam: float = 1e-3
    epsilon: float = 0.5
    delta: float = 1e-3
    G: float = 1.0
    learning_rate: float = 1.0
    iterations: int = 1500
    convention: Convention = "exact"
    n_classes: int | None = None

    def spec(self, method: Literal["output", "gradient"], seed: int) -> JobSpec:
        thesis = self.convention == "thesis"
        return JobSpec(
            method=method,
            model=ModelSpec(name=self.model, lam=self.lam, n_classes=self.n_classes),
            privacy=PrivacySpec(
                epsilon=self.epsilon,
                delta=self.delta if (method == "gradient" or not thesis) else 0.0,
                mechanism="l2_laplace",
                accountant="zcdp" if thesis else "gdp",
                clip=self.G,
            ),
            training=TrainingSpec(
                iterations=self.iterations,
                learning_rate=self.learning_rate,
                weighting="thesis" if thesis else "pooled",
            ),
            seed=seed,
        )


@dataclass
class MethodRun:
    """One method's final model and what it claims about privacy."""

    method: str
    theta: torch.Tensor
    privacy: dict = field(default_factory=dict)


ThetaHook = Callable[[int, torch.Tensor], None]


def _noise(mech: str, scale: float, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return sample_noise(mech, scale, shape, gen, dtype=torch.float64)


def _local_models(loss: Loss, parties: SimulatedParties, lam: float, linear: torch.Tensor | None = None,
                  lam_extra: torch.Tensor | None = None) -> torch.Tensor:
    """Every party's exact local minimiser (batched; equals OutputPerturbation.local_model)."""
    Xp, yp, mask = parties.padded()
    if lam_extra is None:
        return solve_erm_batched(loss, Xp, yp, mask, lam, linear_term=linear).theta
    # objective perturbation adds a size-dependent ridge term: solve one batch per distinct value
    out = torch.empty(parties.m, loss.param_dim(Xp.shape[-1]), dtype=torch.float64)
    for value in torch.unique(lam_extra):
        idx = (lam_extra == value).nonzero().squeeze(-1)
        b = None if linear is None else linear[idx]
        out[idx] = solve_erm_batched(loss, Xp[idx], yp[idx], mask[idx], lam + float(value), linear_term=b).theta
    return out


TRUST = {
    "mpc": "simulated: secure aggregation, noise sampled inside the MPC (in-process plaintext here)",
    "pathak": "simulated: secure aggregation of local models, noise added once (Pathak et al.)",
    "local": "local DP: each party perturbs its own release; the aggregator may be anyone",
    "ra": "trusted third-party aggregator; each party adds local noise (not collusion-safe)",
}


def _baseline_privacy(mechanism: str, scale: float, epsilon: float, delta: float, note: str, *,
                      accountant: str, trust: str) -> dict:
    """The privacy record of a method that does not go through a protocol's PrivacyReport: the
    same fields (mechanism, scale, accountant, adjacency, ε, δ, trust model)."""
    return {"mechanism": mechanism, "noise_scale": scale, "accountant": accountant, "adjacency": "replace",
            "epsilon": epsilon, "delta": delta, "trust_model": TRUST[trust], "note": note}


def run_mpc_out_p(setting: Setting, parties: SimulatedParties, gen: torch.Generator) -> MethodRun:
    spec = setting.spec("output", seed=0)
    proto = OutputPerturbation(spec, parties.sizes, parties.X.shape[1])
    local = _local_models(proto.loss, parties, setting.lam)
    if setting.convention == "thesis":
        # Thm 6.3.1 as printed: Lap(2G/(m n1 λ ε)) per coordinate, average with weights 1/m.
        b = 2 * setting.G / (parties.m * parties.sizes.n_min * setting.lam * setting.epsilon)
        theta = proto.weights.to(local.dtype) @ local + _noise("laplace", b, (proto.p,), gen)
        return MethodRun("mpc_out_p", theta, _baseline_privacy(
            "laplace (per coordinate, thesis Thm 6.3.1 as printed)", b, setting.epsilon, 0.0,
            "calibrated to the ℓ2 sensitivity: not ε-DP for d > 1", accountant="pure ε (as printed)", trust="mpc"))
    agg = InProcessAggregator(gen)
    theta = proto.release(agg, local, proto.weights)
    return MethodRun("mpc_out_p", theta, proto.report(agg.trust_model).model_dump(mode="json"))


def _per_party_out_p(setting: Setting, parties: SimulatedParties, gen: torch.Generator, name: str) -> MethodRun:
    """Pathak (noise once, scale of the smallest party) or Local Out P (each party perturbs its
    own model, Chaudhuri et al. output perturbation), then a plain average."""
    proto = OutputPerturbation(setting.spec("output", 0), parties.sizes, parties.X.shape[1])
    loss = proto.loss
    # exact: the loss's own G on the minimisers' region (ridge: 1 + 1/√λ), as the protocol uses
    G = setting.G if setting.convention == "thesis" else proto.lipschitz
    local = _local_models(loss, parties, setting.lam)
    m, p = local.shape
    avg = local.mean(0)
    sizes = torch.tensor(parties.sizes.sizes, dtype=torch.float64)
    delta2 = 2 * G / (sizes * setting.lam)  # each party's own ℓ2 sensitivity
    if name == "pathak":
        d2 = 2 * G / (parties.sizes.n_min * setting.lam)
        if setting.convention == "thesis":
            theta = avg + _noise("laplace", d2 / setting.epsilon, (p,), gen)
            return MethodRun(name, theta, _baseline_privacy("laplace (per coordinate, as printed)",
                                                             d2 / setting.epsilon, setting.epsilon, 0.0, "",
                                                             accountant="pure ε (as printed)", trust="pathak"))
        cal = calibrate_output_perturbation(d2, p, setting.epsilon, 0.0, mechanism="l2_laplace")
        theta = avg + _noise(cal.mechanism, cal.scale, (p,), gen)
        return MethodRun(name, theta, _baseline_privacy(cal.mechanism, cal.scale, setting.epsilon, 0.0,
                                                        "Pathak et al.: average, then noise for the smallest party",
                                                        accountant="pure ε", trust="pathak"))
    # local_out_p: noise per party, then average
    if setting.convention == "thesis":
        z = _noise("laplace", 1.0, (m, p), gen) * (delta2 / setting.epsilon)[:, None]
        mech = "laplace (per coordinate, per party, as printed)"
    else:
        z = _noise("l2_laplace", 1.0, (m, p), gen) * (delta2 / setting.epsilon)[:, None]
        mech = "l2_laplace per party"
    return MethodRun(name, (local + z).mean(0), _baseline_privacy(mech, float(delta2.max() / setting.epsilon),
                                                                 setting.epsilon, 0.0, "each party ε-DP locally",
                                                                 accountant="pure ε", trust="local"))


def run_local_obj_p(setting: Setting, parties: SimulatedParties, gen: torch.Generator) -> MethodRun:
    """Chaudhuri et al. (2011) objective perturbation at every party, then a plain average.

    ε' = ε − log(1 + 2c/(n_j λ) + c²/(n_j λ)²); if ε' ≤ 0 an extra ridge Δ = c/(n_j(e^{ε/4} − 1)) − λ
    is added and ε' = ε/2. The party minimises J_j(θ) + ⟨b, θ⟩/n_j + Δ/2‖θ‖² with ‖b‖ ~ Gamma(p, 2/ε')
    (exact) or per-coordinate Lap(2/ε') (thesis convention). c is the loss's smoothness.
    """
    loss = OutputPerturbation(setting.spec("output", 0), parties.sizes, parties.X.shape[1]).loss
    if setting.convention == "exact" and loss.name not in ("logistic", "huber_svm"):
        # Chaudhuri et al.'s proof covers binary linear classifiers with |ℓ'| ≤ 1, |ℓ''| ≤ c.
        raise ValueError(f"methods: local_obj_p needs a logistic or huber_svm loss, not {loss.name!r}")
    c = loss.smoothness
    sizes = torch.tensor(parties.sizes.sizes, dtype=torch.float64)
    eps, lam = setting.epsilon, setting.lam
    eps_p = eps - torch.log(1 + 2 * c / (sizes * lam) + (c / (sizes * lam)) ** 2)
    extra = torch.where(eps_p > 0, torch.zeros_like(sizes),
                        (c / (sizes * (math.exp(eps / 4) - 1)) - lam).clamp(min=0.0))
    eps_p = torch.where(eps_p > 0, eps_p, torch.full_like(sizes, eps / 2))
    m, p = parties.m, loss.param_dim(parties.X.shape[1])
    mech = "laplace" if setting.convention == "thesis" else "l2_laplace"
    b = _noise(mech, 1.0, (m, p), gen) * (2 * setting.G / eps_p)[:, None]
    local = _local_models(loss, parties, lam, linear=b / sizes[:, None], lam_extra=extra)
    return MethodRun("local_obj_p", local.mean(0), _baseline_privacy(
        f"objective perturbation ({mech})", float((2 * setting.G / eps_p).max()), eps, 0.0,
        f"extra ridge Δ max {float(extra.max()):.3g}", accountant="pure ε (Chaudhuri et al. 2011)", trust="local"))


def run_gradient_method(setting: Setting, parties: SimulatedParties, gen: torch.Generator, name: str,
                        hook: ThetaHook | None = None) -> MethodRun:
    """MPC Grad P through the protocol; Local Grad P and Rajkumar–Agarwal share its round but
    differ in where (and how much) noise enters."""
    spec = setting.spec("gradient", seed=0)
    proto = GradientPerturbation(spec, parties.sizes, parties.X.shape[1])
    m, n_min, T = parties.m, parties.sizes.n_min, setting.iterations
    privacy: dict
    if name == "mpc_grad_p":
        if setting.convention == "thesis":
            sigma = thesis_grad_sigma(setting.G, T, setting.epsilon, setting.delta, m, n_min)
            privacy = _baseline_privacy("gaussian (thesis eq. 6.3.1, zCDP)", sigma, setting.epsilon,
                                        setting.delta, "per-party-mean weighting", accountant="zcdp (thesis)",
                                        trust="mpc")
        else:
            sigma = proto.noise.scale
            privacy = proto.report(InProcessAggregator.trust_model).model_dump(mode="json")
        noise = NoiseSpec("gaussian", sigma)
    elif name == "local_grad_p":
        # each party releases its own mean gradient with σ_j for sensitivity 2G/n_j; average of m
        # independent Gaussians = one Gaussian with std sqrt(Σ σ_j²)/m (exact in distribution).
        sizes = torch.tensor(parties.sizes.sizes, dtype=torch.float64)
        if setting.convention == "thesis":
            sig_j = torch.tensor([thesis_grad_sigma(setting.G, T, setting.epsilon, setting.delta, 1, int(s))
                                  for s in torch.unique(sizes)])
            sig_j = sig_j[torch.searchsorted(torch.unique(sizes), sizes)]
        else:
            uniq = torch.unique(sizes)
            vals = torch.tensor([calibrate_gradient_perturbation(2 * setting.G / float(s), T, setting.epsilon,
                                                                 setting.delta, accountant="gdp").scale
                                 for s in uniq])
            sig_j = vals[torch.searchsorted(uniq, sizes)]
        sigma = float(sig_j.pow(2).sum().sqrt() / m)
        noise = NoiseSpec("gaussian", sigma)
        privacy = _baseline_privacy("gaussian per party (local DP-GD)", float(sig_j.max()), setting.epsilon,
                                    setting.delta, f"aggregate noise std {sigma:.4g}",
                                    accountant="zcdp (thesis)" if setting.convention == "thesis" else "gdp",
                                    trust="local")
    elif name == "rajkumar_agarwal":
        sigma = (thesis_grad_sigma(setting.G, T, setting.epsilon, setting.delta, m, n_min)
                 if setting.convention == "thesis" else proto.noise.scale)
        noise = NoiseSpec("gaussian", sigma)
        lap_b = 2 * setting.G / (m * n_min * setting.epsilon)
        privacy = _baseline_privacy("gaussian + per-round laplace (trusted aggregator)", sigma,
                                    setting.epsilon * T, setting.delta,
                                    f"ε = {setting.epsilon} per round; modelled from the thesis's description",
                                    accountant="basic composition over rounds", trust="ra")
    else:
        raise ValueError(f"method: unknown gradient method {name!r}")

    agg: SecureAggregator = InProcessAggregator(gen)
    if name == "rajkumar_agarwal":  # a per-round Laplace term on top, as the trusted aggregator adds it
        agg = _PlusLaplace(agg, lap_b, gen)
    w = proto.weights[parties.party_ids]  # per-row weight: pooled 1/n or thesis 1/(m n_j)
    x_norms = parties.X.norm(dim=1)  # constant across rounds
    one = torch.ones(1, dtype=torch.float64)

    def local_sum(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Σ_j w_j Σ_{i∈j} clip(∇ℓ_i) = Σ_i w_{j(i)} clip(∇ℓ_i): one weighted row-sum, same value
        # as aggregating the m per-party contributions of GradientPerturbation.local_contribution.
        return proto.weighted_clipped_sum(theta, parties.X, parties.y, w, x_norms)[None, :], one

    theta = proto.train(agg, local_sum, noise=noise,
                        after_round=None if hook is None else (lambda t, th, _g: hook(t, th)))
    return MethodRun(name, theta, privacy)


class _PlusLaplace:
    """Rajkumar–Agarwal's trusted aggregator: the Gaussian aggregate plus a per-round Laplace term."""

    def __init__(self, inner: SecureAggregator, b: float, gen: torch.Generator) -> None:
        self.inner, self.b, self.gen = inner, b, gen
        self.trust_model = inner.trust_model

    def aggregate(self, contributions: torch.Tensor, weights: torch.Tensor, noise: NoiseSpec) -> torch.Tensor:
        out = self.inner.aggregate(contributions, weights, noise)
        return out + _noise("laplace", self.b, out.shape, self.gen)


def run_method(name: str, setting: Setting, parties: SimulatedParties, gen: torch.Generator,
               hook: ThetaHook | None = None) -> MethodRun:
    """Run one method; ``hook(t, θ_t)`` sees every round of the iterative ones."""
    if name == "mpc_out_p":
        return run_mpc_out_p(setting, parties, gen)
    if name in ("pathak", "local_out_p"):
        return _per_party_out_p(setting, parties, gen, name)
    if name == "local_obj_p":
        return run_local_obj_p(setting, parties, gen)
    if name in ("mpc_grad_p", "local_grad_p", "rajkumar_agarwal"):
        return run_gradient_method(setting, parties, gen, name, hook)
    raise ValueError(f"methods: unknown method {name!r}; valid: {', '.join(METHODS)}")


def nonprivate_optimum(loss: Loss, X: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """θ* of the pooled objective (the reference of the optimality gap)."""
    return solve_erm(loss, X, y, lam, tol=1e-10).theta
