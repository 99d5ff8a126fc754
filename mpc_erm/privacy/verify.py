"""Recompute a privacy report's guarantee from the report alone: what an auditor runs.

``mpc-erm report verify REPORT.json`` calls :func:`verify_report`. It reads only the JSON: the
plan section (mechanism, adjacency, what is public, clip or G, λ, solver tolerance, weighting,
rounds, the noise multiplier, the sampler budget, the event) and the engine's realisation (grid,
σ or t in grid units, the grid sensitivity, the sampler's parameters). It recomputes every number
the report states from those public inputs, each with the formula written out here (or in
:mod:`.sampler_tv`) rather than taken from the code that made the report, and checks that the
report states exactly that:

1. the headline fields are the plan's: mechanism, norm, adjacency, rounds, sampling rate, n, the
   accountant named;
2. the sensitivity follows from the stated public facts (docs/explanation/privacy.md, "What is
   public"), in the headline, the plan and the realisation's grid units (Δ·2^g plus every
   party's rounding);
3. the noise meets the event's multiplier on that grid (σ_grid ≥ z·s_grid, or s_grid/t ≤ ε),
   the stated multiplier and σ in real units are σ_grid's; an in-process simulation's σ is the
   plan's rule (z·Δ₂, Δ₁/ε, Δ₂/ε);
4. the sampler's total variation per release, recomputed from its stated parameters, is the
   realisation's and within the event's budget; a simulation's sampler is ideal (0);
5. the event agrees with the plan's numbers, and the stated security model is one this version
   runs (semi-honest for a job, none for an in-process simulation);
6. ε and δ recomputed from the event (RDP or pure ε with dp_accounting; zCDP, GDP, PLD with that
   accountant at the mechanism's share of δ) are the reported ones, the sampler's term
   δ_sampler = (1 + e^ε)·τ included, within the job's target; a pure-ε job states (ε, δ_sampler).

It never raises on a report that parses: a field missing, of the wrong type or inconsistent is a
failed check with its reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mpc_erm.models.public_features import PublicFeatures, PublicFile

from .events import DpEvent, GaussianRounds, PureDp, compose, event_from_dict, wor_sample_size
from .report import SCHEMA, SIMULATION_TRUST_MODEL, PrivacyReport
from .sampler_tv import sampler_sigma, tv_per_release

__all__ = ["Check", "ReportVerification", "verify_report"]

REL_TOL = 1e-6
#: Two computations of the same float quantity agree to this (a report's numbers are exact recomputations).
SAME = 1e-9


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
    """The release's Δ₂: the model's, times the public rows' ‖X̃‖₂ for knowledge transfer."""
    transfer = plan.get("transfer")
    return _model_sensitivity(plan) * (1.0 if transfer is None else float(transfer["operator_norm"]))


def _model_sensitivity(plan: dict[str, Any]) -> float:
    method, adj, weighting = plan["method"], plan["adjacency"], plan["weighting"]
    c = plan["clip"] if method == "gradient" else plan["lipschitz_G"]
    lam, tol = plan["lam"], plan["solver_tol"]
    if adj == "add_remove":
        n_hat = float(plan["public_n"])
        q = float(plan.get("sampling_rate", 1.0))  # gradient: divided by the public expected batch q·n̂
        # owners drawn uniformly without replacement (N public slots): one owner replaced, or absent
        # (a zero update), shifts the sum by 2C — the replace-one shift the accountant takes
        shift = 2 * c if method == "gradient" and plan["population"] is not None else c
        return shift / (q * n_hat) if method == "gradient" else 3 * c / (n_hat * lam) + 2 * tol
    counts = plan["public_counts"]
    m, n, n_min, n_max = len(counts), sum(counts), min(counts), max(counts)
    if method == "gradient" and plan["population"] is not None:  # b = q·N pooled rows: one replaced moves 2C
        return 2 * c / (float(plan["sampling_rate"]) * n)
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
    if MALICIOUS_MARK in report.trust_model.lower():
        return Check("security", False, f"the trust model is the malicious-secure engine's, the report claims "
                     f"{sec or 'no security model'}")
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
    stated = (math.isclose(real.get("kls_tau", -1.0), tau, rel_tol=1e-9, abs_tol=1e-300)
              and math.isclose(real.get("release_noise_scale_grid", -1.0), sp * math.sqrt(k), rel_tol=1e-9))
    ok = (same and stated and math.isclose(total, real["noise_scale_grid"], rel_tol=1e-9)
          and plan["rounds"] * tau * dim <= 1e-300)
    return Check("distributed", ok, f"{h} honest shares of {k} (σ per party {sp:.6g} grid units): √h·σ_p = "
                 f"{total:.6g} is the σ the guarantee rests on; KLS τ = {tau:.3g}")


def _same(a: Any, b: float, rel: float = SAME) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool) and math.isclose(float(a), b, rel_tol=rel,
                                                                                   abs_tol=1e-300)


#: The accountant a plan names → how the report's ``accountant`` line begins.
_ACCOUNTANT_LINES = {"rdp": "RDP", "zcdp": "zCDP", "gdp": "exact GDP", "pld": "PLD", "pure": "pure ε",
                     "none": "none"}


class _Recompute:
    """The report's numbers recomputed, one check at a time (each guarded by :func:`verify_report`)."""

    def __init__(self, report: PrivacyReport, plan: dict[str, Any], public_rows: np.ndarray | None = None) -> None:
        self.r, self.plan, self.public_rows = report, plan, public_rows
        self.ev: DpEvent = event_from_dict(plan["event"])
        self.real = report.realisation
        self.eps = math.inf
        self.delta = 1.0

    @property
    def simulated(self) -> bool:
        return self.r.trust_model == SIMULATION_TRUST_MODEL

    @property
    def honest(self) -> int:
        """Samples per coordinate whose sum carries the guarantee (h honest shares, or 1)."""
        real = self.real or {}
        return int(real["noise_honest"]) if real.get("noise") == "distributed" else 1

    def headline(self) -> list[Check]:
        r, plan, ev = self.r, self.plan, self.ev
        counts = plan["public_counts"]
        n = sum(int(c) for c in counts) if counts is not None else None
        norm = "l1" if plan["mechanism"] == "laplace" else "l2"
        line = _ACCOUNTANT_LINES.get(str(plan["accountant"]), "?")
        return [
            Check("mechanism", r.mechanism == plan["mechanism"], f"{r.mechanism!r}; the plan's {plan['mechanism']!r}"),
            Check("norm", r.norm == norm, f"{r.norm!r}; {plan['mechanism']!r} noise is calibrated to {norm}"),
            Check("adjacency", r.adjacency == plan["adjacency"] == ev.adjacency,
                  f"{r.adjacency!r}; the plan's {plan['adjacency']!r}, the event's {ev.adjacency!r}"),
            Check("rounds", r.rounds == plan["rounds"] == ev.rounds,
                  f"{r.rounds}; the plan's {plan['rounds']}, the event's {ev.rounds}"),
            Check("sampling_rate", _same(r.sampling_rate, float(plan["sampling_rate"])),
                  f"{r.sampling_rate:g}; the plan's {plan['sampling_rate']:g}"),
            Check("n", r.n == n, f"{r.n}; the plan's public counts sum to {n}"),
            Check("accountant", r.accountant.startswith(line),
                  f"{r.accountant.split(' (')[0]!r} names the plan's accountant {plan['accountant']!r}"),
        ]

    def sensitivity(self) -> list[Check]:
        plan, r = self.plan, self.r
        d2 = _sensitivity(plan)
        out = [Check("sensitivity", _same(r.sensitivity_l2, d2) and _same(plan["sensitivity_l2"], d2),
                     f"Δ₂ = {d2:.6g} from {plan['what_is_public']}; the report says {r.sensitivity_l2}, the plan "
                     f"{plan.get('sensitivity_l2')}")]
        if plan["mechanism"] == "laplace":
            d1 = math.sqrt(int(plan["dim"])) * d2
            out.append(Check("sensitivity_l1", _same(r.sensitivity_l1, d1) and _same(plan["sensitivity"], d1),
                             f"Δ₁ = √d·Δ₂ = {d1:.6g}; the report says {r.sensitivity_l1}, the plan "
                             f"{plan.get('sensitivity')}"))
        else:
            out.append(Check("sensitivity_l1", r.sensitivity_l1 is None and _same(plan["sensitivity"], d2),
                             f"an ℓ2 mechanism: the plan's sensitivity {plan['sensitivity']} is Δ₂ and the report "
                             f"states no ℓ1 one ({r.sensitivity_l1})"))
        if plan.get("transfer") is not None:
            out.append(self._transfer(plan["transfer"], int(plan["dim"])))
        return out

    def _transfer(self, tr: dict[str, Any], dim: int) -> Check:
        """A knowledge-transfer release: its public rows drawn again from their seed, their norm
        recomputed, and the release's size m·K."""
        if self.plan["method"] != "output":
            return Check("transfer", False, f"knowledge transfer releases an output job's scores, not a "
                                            f"{self.plan['method']!r} job's")
        pf: PublicFeatures | PublicFile
        if tr["distribution"] == "public_test":
            if self.public_rows is None:
                return Check("transfer", False, f"the public rows are the data set's public test file (sha256 "
                                                f"{str(tr.get('sha256'))[:16]}…): give it to recompute ‖X̃‖₂ "
                                                "(`report verify --public-rows FILE`)")
            pf = PublicFile.of(self.public_rows)
            if pf.sha256 != tr.get("sha256"):
                return Check("transfer", False, f"the public rows given have sha256 {pf.sha256[:16]}…, the report's "
                                                f"{str(tr.get('sha256'))[:16]}…")
        else:
            pf = PublicFeatures(int(tr["rows"]), int(tr["features"]), tr["distribution"],
                                None if tr["scale"] is None else float(tr["scale"]), int(tr["seed"]))
        norm = pf.operator_norm()
        # a seeded draw has no file digest, a file no seed or scale
        own_fields = tr.get("sha256") is None if isinstance(pf, PublicFeatures) else (
            tr.get("seed") is None and tr.get("scale") is None)
        return Check("transfer", _same(tr["operator_norm"], norm) and dim == pf.rows * int(tr["outputs"])
                     and tr["public_rows"] == pf.describe() and int(tr["rows"]) == pf.rows
                     and int(tr["features"]) == pf.features and own_fields,
                     f"‖X̃‖₂ ≤ {norm:.9g} recomputed from {pf.describe()} (the plan says {tr['operator_norm']}); "
                     f"{pf.rows} rows × {tr['outputs']} scores = {pf.rows * int(tr['outputs'])} released values "
                     f"(the plan's dim {dim})")

    def noise(self) -> list[Check]:
        plan, r, ev = self.plan, self.r, self.ev
        d2 = _sensitivity(plan)
        dim = int(plan["dim"])
        laplace = plan["mechanism"] == "laplace"
        if self.real is None:
            if not self.simulated:
                return [Check("noise", False, "no realisation section: the noise actually sampled is not stated")]
            counts = plan["public_counts"]
            split = plan.get("noise_parties") is not None
            setting = [Check("parties", r.parties == (None if counts is None else len(counts)),
                             f"a simulation's parties are its data parties: {r.parties}, counts {counts}"),
                       Check("distributed", plan["noise"] == ("distributed" if split else "mpc"),
                             f"the plan's noise {plan['noise']!r}, {'with' if split else 'without'} a split")]
            inflation = 1.0
            if split:  # distributed in a simulation: √(k/h)
                inflation = math.sqrt(int(plan["noise_parties"]) / int(plan["noise_honest"]))
            if isinstance(ev, GaussianRounds):
                want, rule = ev.noise_multiplier * d2 * inflation, f"z·Δ₂ = {ev.noise_multiplier:.6g}·{d2:.6g}"
            elif isinstance(ev, PureDp):
                d = math.sqrt(dim) * d2 if laplace else d2
                want, rule = d / ev.epsilon, f"Δ/ε = {d:.6g}/{ev.epsilon:.6g}"
            else:
                return [Check("noise", False, f"an event of kind {plan['event'].get('kind')!r} has no noise rule")]
            return [*setting, Check("noise", _same(r.noise_scale, want), f"the simulation's noise "
                                    f"{r.noise_scale:.6g} is the plan's rule {rule} = {want:.6g}")]
        real, m = self.real, r.parties
        if not isinstance(m, int):
            return [Check("noise", False, "the report does not state how many parties rounded their inputs")]
        g = int(real["grid_bits"])
        if isinstance(ev, GaussianRounds):
            s_grid = d2 * 2.0**g + m * math.sqrt(dim)
        else:
            s_grid = math.sqrt(dim) * d2 * 2.0**g + m * dim
        scale_grid = float(real["noise_scale_grid"])
        out = [Check("sensitivity_grid", _same(real["sensitivity_grid"], s_grid),
                     f"s_grid = Δ·2^{g} + {m} parties' rounding = {s_grid:.6g}; the realisation says "
                     f"{real['sensitivity_grid']}")]
        if isinstance(ev, GaussianRounds):
            out.append(Check("noise", scale_grid >= ev.noise_multiplier * s_grid * (1 - 1e-12),
                             f"σ_grid = {scale_grid:.6g} ≥ z·s_grid = {ev.noise_multiplier:.6g}·{s_grid:.6g}"))
            mult = scale_grid / s_grid
        elif isinstance(ev, PureDp):
            out.append(Check("noise", s_grid / scale_grid <= ev.epsilon * (1 + 1e-12),
                             f"s_grid/t = {s_grid / scale_grid:.6g} ≤ ε per release {ev.epsilon:.6g}"))
            mult = s_grid / scale_grid
        else:
            return [*out, Check("noise", False, f"no in-MPC noise for an event of kind {plan['event'].get('kind')!r}")]
        real_scale = scale_grid * 2.0**-g
        out += [Check("realised_multiplier", _same(real["realised_multiplier"], mult),
                      f"{real['realised_multiplier']}; σ_grid and s_grid give {mult:.9g}"),
                Check("noise_scale", _same(r.noise_scale, real_scale) and _same(real["noise_scale"], real_scale),
                      f"the report's {r.noise_scale:.6g} and the realisation's {real['noise_scale']:.6g} are "
                      f"σ_grid·2^-{g} = {real_scale:.6g}")]
        if plan["noise"] != real["noise"]:
            out.append(Check("distributed", False, f"the realisation's noise {real['noise']!r} is not the plan's "
                             f"{plan['noise']!r}"))
        elif plan["noise"] == "distributed":
            out.append(_distributed_check(plan, real, m, dim, r.trust_model))
        elif (real.get("noise"), plan.get("noise")) != ("mpc", "mpc"):
            out.append(Check("distributed", False, f"the realisation's noise {real.get('noise')!r} is not the plan's "
                             f"{plan.get('noise')!r}"))
        return out

    def sampler(self) -> list[Check]:
        plan, ev, r = self.plan, self.ev, self.r
        budget = Check("sampler_budget", _same(plan["sampler_tv_per_release"], ev.sampler_tv, 1e-12)
                       if ev.sampler_tv else plan["sampler_tv_per_release"] == 0.0,
                       f"the plan's TV budget per release {plan['sampler_tv_per_release']:.3g} is the event's "
                       f"{ev.sampler_tv:.3g}")
        if self.real is None:
            ideal = self.simulated and plan.get("sampler") == "ideal"
            return [budget, Check("sampler", ideal and ev.sampler_tv == 0.0 and r.delta_sampler == 0.0,
                                  "an in-process simulation samples the ideal distribution: TV 0, δ_sampler 0"
                                  + ("" if ideal else "; this report is not one"))]
        sampler = self.real.get("sampler")
        if not isinstance(sampler, dict):
            return [budget, Check("sampler", False, "the realisation does not state the sampler's parameters: its "
                                  "total variation cannot be recomputed (a report written before they were stated)")]
        dim = int(plan["dim"])
        tv = tv_per_release(sampler, dim, self.honest)
        per_party = (self.real["party_noise_scale_grid"] if self.real.get("noise") == "distributed"
                     else self.real["noise_scale_grid"])
        sigma = sampler_sigma(sampler)
        kind = "discrete_gaussian" if plan["mechanism"] == "gaussian" else "discrete_laplace"
        return [budget,
                Check("sampler_parameters", sampler["kind"] == kind and _same(per_party, sigma)
                      and self.real["coin_bits"] == sampler["k"]
                      and (kind == "discrete_laplace" or not sampler["revealed"] or sampler["rounds"] == 1),
                      f"{sampler['kind']} of scale {sigma:.9g} grid units, {sampler['k']}-bit coins; the realisation "
                      f"samples {per_party} with {self.real['coin_bits']}-bit coins"),
                Check("sampler", _same(self.real["sampler_tv_per_release"], tv) and tv <= ev.sampler_tv,
                      f"TV per release recomputed {tv:.3g} ({self.honest}·{dim} samples); the realisation says "
                      f"{self.real['sampler_tv_per_release']:.3g}; budget {ev.sampler_tv:.3g}")]

    def rule(self) -> list[Check]:
        """The plan's own numbers from its targets, as the plan makes them: z the smallest noise
        multiplier whose ε at δ·(1 − share) meets the target (share = 1 % of δ for the in-MPC
        sampler's TV, 0 for the ideal one), the TV budget share·δ/((1 + e^ε)·T), or for pure ε the
        target ε per release and share·δ/(1 + e^ε)."""
        from .accountants import noise_multiplier_for
        from .plan import SAMPLER_DELTA_SHARE

        plan, ev, r = self.plan, self.ev, self.r
        mpc = plan["sampler"] == "mpc"
        share = SAMPLER_DELTA_SHARE if mpc else 0.0
        eps, delta, rounds = float(plan["target_epsilon"]), float(plan["target_delta"]), int(plan["rounds"])
        kind_ok = plan["sampler"] == ("ideal" if self.simulated else "mpc")
        share_ok = _same(plan["sampler_delta_share"], share, 1e-12) if share else plan["sampler_delta_share"] == 0.0
        out = [Check("sampler_kind", kind_ok and share_ok,
                     f"the plan's sampler {plan['sampler']!r} with {plan['sampler_delta_share']} of δ for its TV; "
                     f"{'an in-process simulation' if self.simulated else 'a job'} samples "
                     f"{'the ideal distribution' if self.simulated else 'inside the MPC'}")]
        if isinstance(ev, GaussianRounds):
            z = noise_multiplier_for(plan["accountant"], eps, delta * (1.0 - share), rounds,
                                     sampling_rate=float(plan["sampling_rate"]), adjacency="add_remove", discrete=mpc,
                                     population=plan["population"], subsampled_rdp=ev.subsampled_rdp,
                                     member_rows=ev.member_rows)
            tv = share * delta / ((1.0 + math.exp(eps)) * rounds)
            out += [Check("noise_multiplier", _same(plan["noise_multiplier"], z, 1e-9) and ev.discrete == mpc
                          and plan["epsilon_per_release"] is None,
                          f"z = {z:.9g} meets ε = {eps:g} at δ·(1 − {share:g}) with the {plan['accountant']} "
                          f"accountant (the plan says {plan['noise_multiplier']}; the event's discrete flag "
                          f"{ev.discrete}; no pure ε per release: {plan['epsilon_per_release']})")]
        else:
            tv = share * delta / (1.0 + math.exp(eps))
            out.append(Check("epsilon_per_release", _same(plan["epsilon_per_release"], eps, 1e-12)
                             and plan["noise_multiplier"] is None,
                             f"pure ε per release is the target {eps:g} (the plan says {plan['epsilon_per_release']}; "
                             f"no noise multiplier: {plan['noise_multiplier']})"))
        per_round = "/T" if isinstance(ev, GaussianRounds) else ""
        out.append(Check("sampler_tv_budget", _same(plan["sampler_tv_per_release"], tv, 1e-9) if tv
                         else plan["sampler_tv_per_release"] == 0.0,
                         f"the TV budget per release is share·δ/(1 + e^ε){per_round} = {tv:.6g} (the plan says "
                         f"{plan['sampler_tv_per_release']:.6g})"))
        out.append(Check("schema", r.schema_ == SCHEMA, f"{r.schema_!r}; this version reads {SCHEMA!r}"))
        return out

    def public(self) -> list[Check]:
        """What the plan says is public agrees with itself: the unit protected (a client-level
        statement exactly when the unit is the owner), N and s = τ·N for uniform owner sampling,
        n̂ exactly under add/remove, the counts exactly under replace."""
        plan = self.plan
        owner = plan["unit"] == "owner"
        said = str(plan["what_is_public"])
        population = plan["population"]
        counts = plan["public_counts"]
        pooled_rows = not owner and population is not None  # exactly b of the parties' pooled rows a round
        out = [Check("unit", plan["unit"] in ("owner", "record") and owner == said.startswith("client-level")
                     and (population is None or owner or (counts is not None and sum(counts) == population)),
                     f"the unit {plan['unit']!r} against what is public: {said[:60]}…")]
        if population is not None:
            s = wor_sample_size(int(population), float(plan["sampling_rate"]))
            views = getattr(self.ev, "member_rows", ())
            size_ok = (plan["public_n"] == population if not pooled_rows else
                       counts is not None and sum(counts) == population and sorted(views) == sorted(counts))
            out.append(Check("sample_size", plan["sample_size"] == s and str(s) in said
                             and str(population) in said and size_ok,
                             f"s = τ·N = {s} of N = {population} (the plan says {plan.get('sample_size')}, "
                             f"n̂ {plan.get('public_n')}, counts {counts}, the event's member views {list(views)})"))
        else:
            out.append(Check("sample_size", plan["sample_size"] is None, "no uniform owner sample"))
        add_remove = plan["adjacency"] == "add_remove"
        out.append(Check("weighting", plan["weighting"] in ("pooled", "thesis")
                         and (plan["weighting"] == "pooled" or not (add_remove or pooled_rows)),
                         f"{plan['weighting']!r}: the thesis's weights publish every count, so add/remove pools; a "
                         "batch of the pooled rows is divided by the public b"))
        out.append(Check("public_n", (plan["public_n"] is not None) == add_remove
                         and (plan["public_counts"] is None) == add_remove,
                         "n̂ public exactly under add/remove, the exact counts exactly under replace "
                         f"(n̂ {plan.get('public_n')}, counts {plan.get('public_counts')})"))
        return out

    def event(self) -> list[Check]:
        plan, ev = self.plan, self.ev
        same = ev.rounds == plan["rounds"] and ev.adjacency == plan["adjacency"] and (
            (isinstance(ev, GaussianRounds) and ev.noise_multiplier == plan["noise_multiplier"]
             and ev.sampling_rate == plan["sampling_rate"] and ev.population == plan["population"])
            or (isinstance(ev, PureDp) and ev.epsilon == plan["epsilon_per_release"]))
        return [Check("event", same, f"event {plan['event']} against the plan's rounds, adjacency, multiplier, "
                      "sampling rate and population")]

    def guarantee(self) -> list[Check]:
        plan, r, ev = self.plan, self.r, self.ev
        target_eps, target_delta = float(plan["target_epsilon"]), float(plan["target_delta"])
        accountant = plan["accountant"]
        if accountant in ("rdp", "pure", "none"):
            c = compose([ev], target_delta, plan["adjacency"])
            eps, delta, d_s = c.epsilon, c.delta, c.delta_sampler
        else:
            from .accountants import epsilon_for

            if not isinstance(ev, GaussianRounds):
                return [Check("epsilon", False, f"the {accountant} accountant is for Gaussian events only")]
            share = float(plan["sampler_delta_share"])
            d_mech = target_delta * (1 - share)
            eps = epsilon_for(accountant, ev.noise_multiplier, ev.rounds, d_mech, ev.sampling_rate,
                              adjacency="add_remove", discrete=plan.get("sampler") == "mpc", population=ev.population,
                              subsampled_rdp=ev.subsampled_rdp, member_rows=ev.member_rows)
            d_s = (1 + math.exp(eps)) * ev.total_tv
            delta = d_mech + d_s
        self.eps, self.delta = eps, delta
        pure = isinstance(ev, PureDp) and delta == d_s
        return [
            Check("epsilon", _same(r.epsilon, eps, REL_TOL) and _le(eps, target_eps),
                  f"recomputed ε = {eps:.6g} (report {r.epsilon:.6g}, target {target_eps:g})"),
            Check("delta_sampler", _same(r.delta_sampler, d_s, REL_TOL),
                  f"δ_sampler = (1 + e^ε)·τ = {d_s:.3g} over the job (report {r.delta_sampler:.3g})"),
            Check("delta", _same(r.delta, delta - d_s, REL_TOL) and _le(delta, target_delta),
                  f"δ = {delta - d_s:.3g} + δ_sampler {d_s:.3g} ≤ target {target_delta:g} (report {r.delta:.3g})"
                  + ("; pure ε: the mechanism's own δ is 0" if pure else "")),
        ]


def verify_report(report: PrivacyReport, public_rows: np.ndarray | None = None) -> ReportVerification:
    """The checks of the module docstring; a report without a plan cannot be verified. Never
    raises: a field that cannot be read fails the check that needs it, naming why.
    ``public_rows``: a knowledge-transfer job's public test file's features (its ‖X̃‖₂ is
    recomputed from them; a seeded job's rows are drawn again from the report)."""
    plan = report.plan
    if plan is None:
        return ReportVerification(math.inf, 1.0, [Check("plan", False, "the report has no plan section: it was not "
                                                        "made by a job's privacy plan and cannot be recomputed")])
    checks = [_security_check(report)]
    try:
        rec = _Recompute(report, plan, public_rows)
    except Exception as exc:  # the event does not parse: nothing else can be recomputed
        return ReportVerification(math.inf, 1.0, [*checks, Check("event", False, f"the plan's event cannot be read: "
                                                                 f"{_why(exc)}")])
    if plan.get("mechanism") == "none":
        checks.append(Check("non-private", report.epsilon == math.inf,
                            "a zero-noise run: ε = ∞ and the data set's whole budget is spent"))
        return ReportVerification(math.inf, 1.0, checks)
    for name, step in (("headline", rec.headline), ("public", rec.public), ("sensitivity", rec.sensitivity),
                       ("noise", rec.noise), ("sampler", rec.sampler), ("event", rec.event), ("rule", rec.rule),
                       ("epsilon", rec.guarantee)):
        try:
            checks.extend(step())
        except Exception as exc:  # a missing, mistyped or contradictory field: a failed check, never a traceback
            checks.append(Check(name, False, f"cannot be recomputed from the report: {_why(exc)}"))
    return ReportVerification(rec.eps, rec.delta, checks)


def _why(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"the field {exc.args[0]!r} is missing"
    return f"{type(exc).__name__}: {exc}"
