"""Distributed noise (privacy.noise = "distributed"): each compute party adds its own discrete
Gaussian share; the honest shares alone carry the guarantee. The Kairouz–Liu–Steinke bound is
checked against the Rényi divergence of an exactly convolved sum of discrete Gaussians; the plan,
its realisation and the verifier against independent arithmetic."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from mpc_erm.mpc.noise import realise
from mpc_erm.privacy.distributed import NoiseSplit, kls_tau, noise_split
from mpc_erm.privacy.plan import PlanError, PublicSizes, plan_job
from mpc_erm.privacy.report import PrivacyReport
from mpc_erm.privacy.verify import verify_report
from mpc_erm.spec import JobSpec

RSS = "MPC: CrypTen 3-party replicated sharing (honest majority, no dealer; products re-randomised)"


def _spec(noise: str = "distributed", method: str = "gradient", mechanism: str = "gaussian") -> JobSpec:
    privacy: dict = {"epsilon": 1.0, "delta": 1e-5, "noise": noise}
    if method == "gradient":
        privacy["clip"] = 1.0
    else:
        privacy["mechanism"] = mechanism
    return JobSpec.model_validate({"method": method, "model": {"name": "logistic", "lam": 1e-3}, "privacy": privacy,
                                   "training": {"iterations": 20 if method == "gradient" else 1}})


SIZES = PublicSizes(counts=(10054, 10054, 10054))


def _dg_log_pmf(sigma: float, m: int) -> np.ndarray:
    xs = np.arange(-m, m + 1, dtype=np.float64)
    w = -(xs**2) / (2 * sigma**2)
    return w - np.logaddexp.reduce(w)


def _log_convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log of the convolution of two PMFs given as logs (exact in the tails, where exp underflows)."""
    out = np.full(a.size + b.size - 1, -np.inf)
    for i, la in enumerate(a):
        out[i : i + b.size] = np.logaddexp(out[i : i + b.size], la + b)
    return out


@pytest.mark.parametrize(("sigma", "honest"), [(0.6, 2), (0.8, 2), (0.7, 3)])
def test_the_kls_bound_holds_for_an_exact_sum_of_discrete_gaussians(sigma: float, honest: int) -> None:
    """D_α(X + 1 ‖ X) for X the sum of ``honest`` discrete Gaussians, from the exact convolution,
    never exceeds α/(2hσ²) + τ (KLS 2021 Prop. 14, d = 1, Δ = 1) — at σ small enough that τ
    matters, and the sum is visibly not a discrete Gaussian itself."""
    m = int(30 * sigma) + 30
    one = _dg_log_pmf(sigma, m)
    total = one
    for _ in range(honest - 1):
        total = _log_convolve(total, one)
    lp, lq = total[:-1], total[1:]  # log P(X + 1 = x) and log P(X = x) on the common support (a shift by one)
    tau = kls_tau(sigma, honest)
    assert tau > 1e-6  # the correction is doing work at these σ
    for alpha in (1.5, 2.0, 4.0, 8.0, 16.0):
        renyi = float(np.logaddexp.reduce(alpha * lp + (1 - alpha) * lq)) / (alpha - 1)
        assert renyi <= alpha / (2 * honest * sigma**2) + tau + 1e-12, (alpha, renyi)
    # and it is no discrete Gaussian of the same variance: the bound's τ is not slack for nothing
    same = _dg_log_pmf(math.sqrt(honest) * sigma, (len(total) - 1) // 2)
    assert float(np.abs(np.exp(total) - np.exp(same)).sum()) > 1e-4


def test_tau_by_hand_and_vanishing_at_the_products_scale() -> None:
    assert kls_tau(0.5, 1) == 0.0  # one discrete Gaussian: no extra term
    assert kls_tau(0.5, 2) == pytest.approx(10 * math.exp(-2 * math.pi**2 * 0.25 / 2))
    assert kls_tau(0.5, 3) == pytest.approx(10 * (math.exp(-math.pi**2 * 0.25) + math.exp(-2 * math.pi**2 * 0.25
                                                                                       * 2 / 3)))
    assert kls_tau(8.0, 2) < 1e-270 and kls_tau(12.0, 2) == 0.0  # gone by 12 grid units; the product's σ: thousands


def test_the_split_follows_the_trust_model() -> None:
    assert noise_split("replicated", 3) == NoiseSplit(3, 2)
    assert noise_split("dealer", 5) == NoiseSplit(5, 1)
    assert NoiseSplit(3, 2).inflation == pytest.approx(math.sqrt(1.5))
    with pytest.raises(ValueError, match="honest"):
        NoiseSplit(3, 4)


def test_the_plan_keeps_the_event_and_states_the_inflation() -> None:
    mpc = plan_job(_spec("mpc"), sampler="mpc", sizes=SIZES, n_features=104)
    dist = plan_job(_spec(), sampler="mpc", sizes=SIZES, n_features=104, noise_split=NoiseSplit(3, 2))
    assert dist.event == mpc.event and dist.guarantee() == mpc.guarantee()  # the honest shares' σ is z·Δ
    assert dist.noise_scale() == pytest.approx(math.sqrt(1.5) * mpc.noise_scale())  # what the release carries
    d = dist.describe()
    assert (d["noise"], d["noise_parties"], d["noise_honest"]) == ("distributed", 3, 2)
    assert mpc.describe()["noise"] == "mpc" and "noise_parties" not in mpc.describe()
    assert "Kairouz–Liu–Steinke" in dist.accountant_statement()
    assumed = plan_job(_spec(), sampler="mpc", sizes=SIZES, n_features=104)  # a simulation of the spec alone
    assert assumed.noise_split == NoiseSplit(3, 2) and "assumed 3 replicated" in assumed.notes[0]
    # jobs that do not ask for it keep their digests; asking for it changes the digest
    assert "noise" not in _spec("mpc").canonical_json() and _spec().digest() != _spec("mpc").digest()


def test_laplace_cannot_be_distributed() -> None:
    with pytest.raises(ValueError, match="privacy.noise: distributed noise is Gaussian"):
        _spec(method="output", mechanism="laplace_thesis")
    plan_job(_spec(method="output"), sampler="mpc", sizes=SIZES, n_features=10)  # Gaussian output: fine
    assert issubclass(PlanError, ValueError)


@pytest.mark.parametrize(("split", "trust"), [(NoiseSplit(3, 2), RSS),
                                              (NoiseSplit(3, 1), "MPC: CrypTen additive sharing, dealer 'dealer'")])
def test_the_realisation_meets_the_plan_and_a_report_verifies(split: NoiseSplit, trust: str) -> None:
    plan = plan_job(_spec(), sampler="mpc", sizes=SIZES, n_features=104, noise_split=split)
    real = realise(plan, 3)
    z, h = float(plan.noise_multiplier), split.honest
    sigma_p = real.plan.params.sigma
    assert h * sigma_p**2 >= (z * real.sensitivity_grid) ** 2  # the honest shares carry z·s_grid
    assert math.sqrt(h) * sigma_p < 1.001 * z * real.sensitivity_grid  # ... and not much more
    assert real.tv_per_release <= plan.sampler_tv_per_release and real.kls_tau == 0.0
    desc = real.describe()
    assert desc["release_noise_scale_grid"] == pytest.approx(math.sqrt(3) * sigma_p)
    rep = plan.report(noise_scale=real.report_scale, realisation=desc, trust_model=trust, parties=3,
                      security="semi-honest")
    v = verify_report(rep)
    assert v.ok, [c for c in v.checks if not c.ok]
    assert any(c.name == "distributed" and c.ok for c in v.checks)
    base = json.loads(rep.to_json())

    def tampered(path: tuple[str, ...], value: object) -> bool:
        d = copy.deepcopy(base)
        node = d
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return verify_report(PrivacyReport.from_json(json.dumps(d))).ok

    assert not tampered(("realisation", "noise_honest"), 3)  # "every party is honest": never allowed
    assert not tampered(("realisation", "party_noise_scale_grid"), sigma_p / 2)  # shares smaller than stated sum
    assert not tampered(("realisation", "noise_parties"), 4)
    if h == 1:  # with a dealer only one party need be honest: two claimed is a forgery
        assert not tampered(("realisation", "noise_honest"), 2)
