"""Recompute a privacy report's guarantee from the report alone: what an auditor runs.

``mpc-erm report verify REPORT.json`` calls :func:`verify_report`. It reads only the JSON: the
plan section (mechanism, adjacency, what is public, clip or G, λ, solver tolerance, weighting,
rounds, the noise multiplier, the sampler budget, the event) and the engine's realisation (grid,
σ or t in grid units, the grid sensitivity), and checks, each with the formula written out here
rather than taken from the code that made the report:

1. the sensitivity follows from the stated public facts (docs/explanation/privacy.md, "What is public");
2. the realised noise meets the event's multiplier on the stated grid (σ_grid ≥ z·s_grid with
   s_grid = Δ·2^g + m·√d; or s_grid/t ≤ ε with s_grid = Δ₁·2^g + m·d) and the sampler's TV
   bound per release is within the event's budget;
3. the event agrees with the plan's numbers, and the stated security model is one this version
   runs (semi-honest for a job, none for an in-process simulation);
4. ε recomputed from the event with dp_accounting (RDP; pure ε summed; the sampler term
   (1 + e^ε)·τ at that ε) is at most the reported ε, and ε, δ are within the job's target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .events import GaussianRounds, PureDp, compose, event_from_dict
from .report import SIMULATION_TRUST_MODEL, PrivacyReport

__all__ = ["Check", "ReportVerification", "verify_report"]

REL_TOL = 1e-6


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class ReportVerification:
    epsilon: float  # recomputed
    delta: float  # recomputed total δ (sampler term included)
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def _le(a: float, b: float) -> bool:
    return a <= b * (1 + REL_TOL) + 1e-300


def _sensitivity(plan: dict[str, Any]) -> float:
    method, adj, weighting = plan["method"], plan["adjacency"], plan["weighting"]
    c = plan["clip"] if method == "gradient" else plan["lipschitz_G"]
    lam, tol = plan["lam"], plan["solver_tol"]
    if adj == "add_remove":
        n_hat = float(plan["public_n"])
        q = float(plan.get("sampling_rate", 1.0))  # gradient: divided by the public expected batch q·n̂
        # owners drawn uniformly without replacement (N public slots): one owner replaced, or absent
        # (a zero update), shifts the sum by 2C — the replace-one shift the accountant takes
        shift = 2 * c if method == "gradient" and plan.get("population") is not None else c
        return shift / (q * n_hat) if method == "gradient" else 3 * c / (n_hat * lam) + 2 * tol
    counts = plan["public_counts"]
    m, n, n_min, n_max = len(counts), sum(counts), min(counts), max(counts)
    if method == "gradient":
        return 2 * c / n if weighting == "pooled" else 2 * c / (m * n_min)
    if weighting == "pooled":
        return 2 * c / (n * lam) + 2 * (n_max / n) * tol
    return 2 * c / (m * n_min * lam) + 2 * tol / m


#: What the malicious-secure engine's trust model says (mpc_erm.mpc.verified_aggregator), lower case.
MALICIOUS_MARK = "malicious security with abort"


def _security_check(report: PrivacyReport) -> Check:
    """The stated security model is one this version runs for the stated trust model: an in-process
    simulation states none; a job states "semi-honest" (or nothing, if written before reports did),
    or "malicious" only for three replicated parties with distributed noise, whose trust model says
    the verified protocol ran (a dealer, trusted by construction, never can)."""
    simulated = report.trust_model == SIMULATION_TRUST_MODEL
    sec = report.security
    if simulated:
        return Check("security", sec is None, "an in-process simulation: no compute parties, no security model"
                     + ("" if sec is None else f"; the report claims {sec!r}"))
    if sec == "malicious":
        trust = report.trust_model.lower()
        real = report.realisation or {}
        why = ("a dealer is trusted by construction, so a dealer job cannot be malicious-secure"
               if "replicated" not in trust else
               "the trust model does not say the verified protocol ran" if MALICIOUS_MARK not in trust else
               "malicious security needs distributed noise (the in-MPC sampler is not verified)"
               if real.get("noise") != "distributed" else "")
        if why:
            return Check("security", False, f"the report claims 'malicious' security: {why}")
        return Check("security", True, "malicious, with abort: three replicated parties, every input proved within "
                     "its bound and every opening checked by both holders; distributed noise")
    return Check("security", True, "semi-honest: the compute parties are trusted to follow the protocol"
                 + ("" if sec else " (not stated: a report written before reports stated it)"))


def _distributed_check(plan: dict[str, Any], real: dict[str, Any], parties: int, dim: int, trust_model: str) -> Check:
    """Distributed noise (docs/explanation/privacy.md, "Distributed noise"): h of the k parties'
    shares σ_p carry the guarantee, so the honest sum's σ is √h·σ_p; h follows from the trust model
    (k − 1 of 3 replicated parties, 1 with a dealer); the Kairouz–Liu–Steinke term
    τ = 10·Σ_{j<h} exp(−2π²σ_p²·j/(j+1)) must vanish over the job (rounds·τ·d ≤ 1e-300)."""
    k, h, sp = real.get("noise_parties"), real.get("noise_honest"), real.get("party_noise_scale_grid")
    if not (isinstance(k, int) and isinstance(h, int) and isinstance(sp, (int, float))):
        return Check("distributed", False, "distributed noise without its parties, honest parties and σ per party")
    # replicated sharing (3 parties): one may be corrupt; with a dealer (or unstated) only one need be honest
    honest = k - 1 if "replicated" in trust_model.lower() else 1
    same = (k == parties and h <= honest and (plan.get("noise_parties"), plan.get("noise_honest")) == (k, h))
    total = math.sqrt(h) * sp
    tau = 10.0 * sum(math.exp(-2.0 * math.pi**2 * sp**2 * j / (j + 1)) for j in range(1, h))
    ok = same and math.isclose(total, real["noise_scale_grid"], rel_tol=1e-9) and plan["rounds"] * tau * dim <= 1e-300
    return Check("distributed", ok, f"{h} honest shares of {k} (σ per party {sp:.6g} grid units): √h·σ_p = "
                 f"{total:.6g} is the σ the guarantee rests on; KLS τ = {tau:.3g}")


def verify_report(report: PrivacyReport) -> ReportVerification:
    """The checks of the module docstring; a report without a plan cannot be verified."""
    checks: list[Check] = []
    plan = report.plan
    if plan is None:
        return ReportVerification(math.inf, 1.0, [Check("plan", False, "the report has no plan section: it was not "
                                                        "made by a job's privacy plan and cannot be recomputed")])
    ev = event_from_dict(plan["event"])
    checks.append(_security_check(report))
    if plan["mechanism"] == "none":
        checks.append(Check("non-private", report.epsilon == math.inf,
                            "a zero-noise run: ε = ∞ and the data set's whole budget is spent"))
        return ReportVerification(math.inf, 1.0, checks)
    # 1. sensitivity from the public facts
    d2 = _sensitivity(plan)
    checks.append(Check("sensitivity", math.isclose(d2, report.sensitivity_l2 or -1.0, rel_tol=1e-9),
                        f"Δ₂ = {d2:.6g} from {plan['what_is_public']}; report says {report.sensitivity_l2}"))
    dim = plan["dim"]
    real = report.realisation
    m = report.parties
    # 2. the realisation meets the event
    if real is not None and m is not None:
        g = real["grid_bits"]
        if isinstance(ev, GaussianRounds):
            s_grid = d2 * 2.0**g + m * math.sqrt(dim)
            ok = real["noise_scale_grid"] >= ev.noise_multiplier * s_grid * (1 - 1e-12)
            checks.append(Check("noise", ok, f"σ_grid = {real['noise_scale_grid']:.6g} ≥ z·s_grid = "
                                             f"{ev.noise_multiplier:.6g}·{s_grid:.6g}"))
            if plan.get("noise") == "distributed" or real.get("noise") == "distributed":
                checks.append(_distributed_check(plan, real, m, dim, report.trust_model))
        elif isinstance(ev, PureDp):
            s_grid = math.sqrt(dim) * d2 * 2.0**g + m * dim
            ok = s_grid / real["noise_scale_grid"] <= ev.epsilon * (1 + 1e-12)
            checks.append(Check("noise", ok, f"s_grid/t = {s_grid / real['noise_scale_grid']:.6g} ≤ ε per release "
                                             f"{ev.epsilon:.6g}"))
        checks.append(Check("sampler", real["sampler_tv_per_release"] <= ev.sampler_tv,
                            f"TV per release {real['sampler_tv_per_release']:.3g} ≤ budget {ev.sampler_tv:.3g}"))
    else:
        checks.append(Check("noise", False, "no realisation section: the noise actually sampled is not stated"))
    # 3. the event is the plan's
    same = ev.rounds == plan["rounds"] and ev.adjacency == plan["adjacency"] and (
        (isinstance(ev, GaussianRounds) and ev.noise_multiplier == plan["noise_multiplier"])
        or (isinstance(ev, PureDp) and ev.epsilon == plan["epsilon_per_release"]))
    checks.append(Check("event", same, f"event {plan['event']} against the plan's rounds, adjacency and multiplier"))
    # 4. ε from the event
    target_eps, target_delta = plan["target_epsilon"], plan["target_delta"]
    if plan["accountant"] == "zcdp":
        from .accountants import epsilon_for

        share = plan.get("sampler_delta_share", 0.0)
        eps = epsilon_for("zcdp", ev.noise_multiplier, ev.rounds, target_delta * (1 - share),  # type: ignore[union-attr]
                          adjacency="add_remove")
        d_s = (1 + math.exp(eps)) * ev.total_tv
        delta = target_delta * (1 - share) + d_s
    else:
        c = compose([ev], target_delta, plan["adjacency"])
        eps, delta = c.epsilon, c.delta
    checks.append(Check("epsilon", _le(eps, report.epsilon) and _le(eps, target_eps),
                        f"recomputed ε = {eps:.6g} (report {report.epsilon:.6g}, target {target_eps:g})"))
    checks.append(Check("delta", _le(report.delta_total, target_delta) and _le(delta, target_delta),
                        f"δ = {report.delta_total:.3g} incl. sampler {report.delta_sampler:.3g} ≤ target "
                        f"{target_delta:g}"))
    return ReportVerification(eps, delta, checks)
