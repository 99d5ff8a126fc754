"""The plain-language privacy statements (mpc_erm/privacy/statement.py): every number they print
is checked against an independent computation, and every kind of job states its unit of privacy
and its trust model in words."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
from scipy.stats import norm

from mpc_erm.mpc.noise import realise
from mpc_erm.privacy.events import GaussianRounds, PureDp
from mpc_erm.privacy.plan import PublicSizes, plan_job
from mpc_erm.privacy.report import SIMULATION_TRUST_MODEL, PrivacyReport
from mpc_erm.privacy.statement import (
    JobCharge,
    dataset_statement,
    detection_power_bound,
    job_statement,
    posterior_bound,
)
from mpc_erm.spec import JobSpec

RSS = ("MPC: CrypTen 3-party replicated sharing (honest majority, no dealer; products re-randomised); binary "
       "triples and B2A bits made by the 3 parties under RSS (ABY3), no dealer")


def _report(trust_model: str = RSS, adjacency: str = "replace", method: str = "gradient") -> PrivacyReport:
    privacy: dict = {"epsilon": 1.0, "delta": 1e-7, "adjacency": adjacency, "clip": 1.0}
    if adjacency == "add_remove":
        privacy["public_n"] = 30000
    if method == "output":
        privacy = {k: v for k, v in privacy.items() if k != "clip"} | {"mechanism": "gaussian"}
    spec = JobSpec.model_validate({"method": method, "model": {"name": "logistic", "lam": 1e-3}, "privacy": privacy,
                                   "training": {"iterations": 50 if method == "gradient" else 1}})
    sizes = PublicSizes(counts=(10217, 10263, 10238)) if adjacency == "replace" else PublicSizes(public_n=30000)
    plan = plan_job(spec, sampler="mpc", sizes=sizes, n_features=28)
    real = realise(plan, 3)
    return plan.report(noise_scale=real.report_scale, realisation=real.describe(), trust_model=trust_model, parties=3,
                       parameters={"protocol": "gradient_perturbation" if method == "gradient" else "output"},
                       security=None if trust_model == SIMULATION_TRUST_MODEL else "semi-honest")


def test_posterior_and_detection_bounds_by_hand() -> None:
    assert posterior_bound(1.0) == pytest.approx(math.e / (1 + math.e))  # 0.731
    assert posterior_bound(2.0, prior=0.1) == pytest.approx(0.1 * math.e**2 / (0.1 * math.e**2 + 0.9))
    assert posterior_bound(0.0, prior=0.3) == pytest.approx(0.3)
    assert detection_power_bound(1.0, 1e-7) == pytest.approx(math.e * 0.05 + 1e-7)
    assert detection_power_bound(5.0, 0.0) == 1.0 and posterior_bound(math.inf) == 1.0


@pytest.mark.parametrize("z, rounds", [(35.2, 50), (5.0, 10), (1.0, 1)])
def test_the_detection_bound_holds_for_the_gaussian_mechanism_itself(z: float, rounds: int) -> None:
    """The statement's 'detects it at most x % of the time' is an upper bound on the best test
    against the real mechanism: T Gaussian releases of multiplier z are μ-GDP with μ = √T/z
    (Dong–Roth–Su 2019), whose best test at false-positive rate α has power Φ(μ − Φ⁻¹(1 − α))."""
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z), rounds)
    eps = acc.get_epsilon(1e-7)
    mu = math.sqrt(rounds) / z
    for alpha in (0.01, 0.05, 0.2):
        best = norm.cdf(mu - norm.ppf(1 - alpha))
        assert best <= detection_power_bound(eps, 1e-7, alpha) + 1e-12


def test_a_job_statement_states_the_unit_the_guarantee_and_the_trust_model_in_words() -> None:
    rep = _report()
    text = job_statement(rep, job_name="income-model")
    assert "job 'income-model'" in text
    assert "The unit of privacy is one record" in text and "replaced by any other" in text
    assert f"(ε, δ) = ({rep.epsilon:.4g}, {rep.delta_total:.3g})" in text
    assert "at most 73 % sure" in text  # e/(1+e), ε = 1
    assert f"at most {100 * (math.exp(rep.epsilon) * 0.05 + rep.delta_total):.0f} % of the time" in text  # 14 %
    assert "no two of the three work together" in text
    assert "[10217, 10263, 10238]" in text  # what is public: the replace-one counts
    assert "50 rounds" in text and "mpc-erm report verify" in text
    assert f"{rep.delta_sampler:.3g} for the in-MPC noise sampler" in text


def test_each_trust_model_and_adjacency_is_said_in_its_own_words() -> None:
    dealer = job_statement(_report("MPC: CrypTen additive sharing, dealer 'dealer' (non-colluding third party)"))
    assert "a dealer" in dealer and "works with no party" in dealer
    for mpc in (dealer, job_statement(_report())):  # what a deviating compute party can and cannot do
        assert "Security model: semi-honest. The compute parties are trusted to follow the protocol" in mpc
        assert "malicious-secure protocol, which this job did not run" in mpc
    sim = job_statement(_report(SIMULATION_TRUST_MODEL))
    assert "in-process simulation" in sim and "protects nothing" in sim and "semi-honest" not in sim
    unhardened = job_statement(_report("MPC: CrypTen 0.4.1 3-party replicated sharing NOT hardened (tests only)"))
    assert "must not be used on real data" in unhardened
    ar = job_statement(_report(adjacency="add_remove"))
    assert "present in one run and absent from the other" in ar and "add/remove adjacency" in ar
    out = job_statement(_report(method="output"))
    assert "One noisy average of the parties' locally trained models" in out


def test_a_malicious_secure_statement_says_what_owners_prove_only_in_an_owner_job() -> None:
    mal = _report().model_copy(update={"security": "malicious"})
    parties = job_statement(mal)
    assert "Security model: malicious, with abort" in parties and "data owner" not in parties
    owners = job_statement(mal.model_copy(update={"parameters": {**mal.parameters, "owners": 9}}))
    assert "Each data owner proved its own contribution within the job's public bound" in owners
    assert "can still leave an owner out of a round" in owners


def test_a_report_that_states_no_security_model_is_read_as_semi_honest() -> None:
    old = _report().model_copy(update={"security": None})  # a report written before reports stated it
    text = job_statement(old)
    assert "does not state a security model" in text and "read it as semi-honest" in text
    assert json.loads(_report().to_json())["security"] == "semi-honest"


def test_a_non_private_job_says_so() -> None:
    rep = PrivacyReport.from_json(json.dumps({"mechanism": "none", "noise_scale": 0.0, "norm": "l2",
                                              "adjacency": "replace", "accountant": "none",
                                              "epsilon": float("inf"), "delta": 1.0}))
    assert "no privacy guarantee" in job_statement(rep)


def test_the_dataset_statement_restates_each_job_at_the_lifetime_delta() -> None:
    """A job of ε = 1 at δ = 1e-7 costs less ε at the data set's δ = 1e-5; the figure equals
    dp_accounting's RDP ε of the same Gaussian at 1e-5, and two jobs compose to less than the sum."""
    z, rounds = 35.2, 50
    ev = GaussianRounds(rounds=rounds, adjacency="replace", sampler_tv=0.0, noise_multiplier=z)
    jobs = [JobCharge("a" * 32, "committed", 1.0, 1e-7, ev, "income-model"),
            JobCharge("b" * 32, "committed", 1.0, 1e-7, ev, "again")]
    text = dataset_statement("income", party="alice", adjacency="replace", epsilon_total=4.0, delta_total=1e-5,
                             jobs=jobs)

    def rdp_eps(count: int) -> float:
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.GaussianDpEvent(z), rounds * count)
        return acc.get_epsilon(1e-5)

    one, two = rdp_eps(1), rdp_eps(2)
    assert one < 1.0 and two < 2 * one
    assert f"| income-model (aaaaaaaa) | committed | (1, 1e-07) | {one:.4g} |" in text
    assert f"**Spent: ε = {two:.4g} at δ = 1e-05**" in text
    assert f"Remaining: ε = {4.0 - two:.4g}" in text
    assert "Both figures describe the same noise" in text and "less than the sum" in text


def test_open_jobs_and_an_unused_data_set() -> None:
    pure = PureDp(rounds=1, adjacency="replace", epsilon=0.5)
    text = dataset_statement("d", party="p", adjacency="replace", epsilon_total=2.0, delta_total=1e-5,
                             jobs=[JobCharge("c" * 32, "committed", 0.5, 0.0, pure),
                                   JobCharge("e" * 32, "reserved", 0.5, 0.0, pure)])
    assert "**Spent: ε = 0.5 at δ = 1e-05**" in text and "hold ε 0.5 more" in text and "Remaining: ε = 1" in text
    assert "No job has used it yet" in dataset_statement("d", party="p", adjacency="add_remove", epsilon_total=1.0,
                                                         delta_total=1e-6, jobs=[])


def test_a_subsampled_jobs_report_and_statement_state_its_sampling_rate() -> None:
    """A Poisson-subsampled job (DP-SGD) reports its rate q beside the plan that has it, and the
    statement says each record is sampled with that probability (the report once said 1.0)."""
    spec = JobSpec.model_validate({
        "method": "gradient",
        "model": {"name": "mlp", "input_shape": [28], "n_classes": 2, "hidden": [8], "init_seed": 3},
        "privacy": {"epsilon": 2.0, "delta": 1e-6, "adjacency": "add_remove", "public_n": 30000, "clip": 1.0},
        "training": {"iterations": 100, "learning_rate": 0.5, "sampling_rate": 0.01}})
    plan = plan_job(spec, sampler="mpc", sizes=PublicSizes(public_n=30000))
    real = realise(plan, 3)
    rep = plan.report(noise_scale=real.report_scale, realisation=real.describe(), trust_model=RSS, parties=3)
    assert rep.sampling_rate == plan.sampling_rate == 0.01
    assert "sampled with probability 0.01 per round" in job_statement(rep)


@pytest.mark.parametrize("sampling", ["uniform", "poisson"])
def test_a_federated_statement_says_how_owners_are_drawn(sampling: str) -> None:
    """Uniform owner sampling draws exactly s of N slots a round (its accounting is that of
    sampling without replacement); Poisson lets each owner toss its own coin. The statement says
    which, with the figures of the plan it reports."""
    privacy: dict = {"epsilon": 6.0, "delta": 1 / 1000**1.1, "clip": 0.4, "adjacency": "add_remove", "public_n": 1000}
    spec = JobSpec.model_validate({
        "method": "gradient", "model": {"name": "softmax", "n_classes": 2, "lam": 4e-5}, "privacy": privacy,
        "training": {"iterations": 30, "sampling_rate": 0.05, "learning_rate": 1.0, "ls_sigma": 1.0},
        "federated": {"local_epochs": 5, "local_batch": 10, "local_lr": 0.1, "local_lr_decay": 0.99,
                      "sampling": sampling}})
    plan = plan_job(spec, sampler="mpc", sizes=PublicSizes(public_n=1000), n_features=6)
    rep = plan.report(noise_scale=plan.noise_scale(), realisation=None, trust_model=RSS, parties=3)
    text = job_statement(rep)
    assert rep.sampling_rate == 0.05
    if sampling == "uniform":
        assert "30 release(s), each drawing exactly 50 of the 1,000 owner slots uniformly without replacement" in text
    else:
        assert "30 release(s), each owner sampled with probability 0.05 per round (Poisson)" in text
