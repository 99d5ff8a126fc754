"""Privacy statements in plain language, for the people who must sign off a job (a privacy
officer, an ethics board), not the people who run it.

Two statements, each made from the machine-readable records alone so that anyone can make it
again:

- :func:`job_statement` reads a job's :class:`~mpc_erm.privacy.report.PrivacyReport`: what is
  protected (the unit of privacy), the guarantee with what it means in numbers, what was released
  and what each member learns, the trust model the guarantee rests on, the noise, and how to check
  the figures (``mpc-erm report verify``).
- :func:`dataset_statement` reads a data set's ledger rows (:class:`JobCharge`): its lifetime
  budget, each job's own (ε, δ) beside what the job costs on the data set's scale, and the
  composed total. It answers the question every first reader asks: why does the ledger say
  ε = 0.80 for a job whose report says 1.0? A guarantee is a pair; the ledger states every job at
  the data set's lifetime δ (so that jobs with different δ add up on one scale), and the same
  noise gives a smaller ε at a larger δ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .events import DpEvent, compose
from .report import SIMULATION_TRUST_MODEL, PrivacyReport

__all__ = ["JobCharge", "dataset_statement", "job_statement", "posterior_bound", "detection_power_bound"]

_WHO = {
    "record": "one record (one row of one party's data set)",
    "owner": "one data owner, with all of its rows together",
}


def posterior_bound(epsilon: float, prior: float = 0.5) -> float:
    """The most an observer's belief that the record is in the data can rise from ``prior`` after
    seeing an ε-DP release (δ aside): p·e^ε / (p·e^ε + 1 − p)."""
    if math.isinf(epsilon):
        return 1.0
    odds = prior / (1.0 - prior) * math.exp(epsilon)
    return odds / (1.0 + odds)


def detection_power_bound(epsilon: float, delta: float, false_positive_rate: float = 0.05) -> float:
    """The highest power any test telling neighbouring data sets apart can have at the given
    false-positive rate: e^ε·α + δ (Wasserman–Zhou 2010; Kairouz et al. 2015), at most 1."""
    return 1.0 if math.isinf(epsilon) else min(1.0, math.exp(epsilon) * false_positive_rate + delta)


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "?"
    if math.isinf(x):
        return "∞"
    if x == 0:
        return "0"
    return f"{x:.{digits}g}"


def _unit(report: PrivacyReport) -> str:
    return str((report.plan or {}).get("unit") or "record")


def _neighbours(report: PrivacyReport) -> str:
    """Which two data sets the guarantee says cannot be told apart, in words."""
    who = "one owner's data" if _unit(report) == "owner" else "one record"
    plan = report.plan or {}
    if plan.get("population"):
        return (f"two runs whose data differ in {who}: that owner's data replaced by anyone else's, or the owner "
                "absent")
    if report.adjacency == "replace":
        return f"two runs whose data differ in {who}, replaced by any other (the numbers of records are public)"
    return f"two runs whose data differ in {who}, present in one run and absent from the other"


def _sampling(report: PrivacyReport) -> str:
    """How each round's records or owners were chosen, as a clause ('' for full batches)."""
    if report.sampling_rate >= 1:
        return ""
    plan = report.plan or {}
    if plan.get("population") and plan.get("sample_size"):
        return (f", each drawing exactly {plan['sample_size']:,} of the {plan['population']:,} owner slots uniformly "
                f"without replacement (probability {_num(report.sampling_rate)} for each owner)")
    who = "owner" if _unit(report) == "owner" else "record"
    return f", each {who} sampled with probability {_num(report.sampling_rate)} per round (Poisson)"


def _trust(report: PrivacyReport) -> list[str]:
    """The trust model in words: who must not collude for nobody to see more than the release."""
    tm = report.trust_model
    parties = report.parties
    if tm == SIMULATION_TRUST_MODEL:
        return ["This was an in-process simulation: one trusted process saw every record. It predicts a job's "
                "accuracy and privacy figures; it protects nothing from whoever ran it."]
    if "NOT hardened" in tm or "tests only" in tm:
        return [f"This job ran with a test-only MPC configuration ({tm}). It must not be used on real data."]
    lines = []
    if "replicated" in tm:
        lines.append("The computation is split among 3 compute parties with replicated secret sharing. Each sees "
                     "only shares, which look uniformly random on their own. The guarantee holds as long as no two "
                     "of the three work together (an honest majority). Two who pool their shares could rebuild "
                     "every input of the sum.")
    elif "dealer" in tm:
        count = f"{parties} parties" if parties else "the parties"
        lines.append(f"The computation is split among {count} with additive secret sharing; a dealer, a separate "
                     "daemon, makes the correlated randomness for multiplications and sees no data or shares. The "
                     "guarantee holds as long as the dealer works with no party, and not every party works "
                     "against the others.")
    elif tm.startswith("data owner"):
        lines.append("You are a data owner: your contribution left your machine only as secret shares, one to each "
                     "compute party. The guarantee rests on the compute parties' trust model, stated in their "
                     "report and in the job's public plan (with 3 replicated compute parties: no two of them work "
                     "together).")
    else:
        lines.append(f"Trust model: {tm}.")
    lines.append(_noise_words(report))
    lines.append(_security(report))
    lines.append(f"Stated by the engine: {tm}.")
    return lines


def _noise_words(report: PrivacyReport) -> str:
    """Who made the noise and who could subtract what."""
    plan = report.plan or {}
    if plan.get("noise") != "distributed":
        return ("The noise is drawn inside the MPC: no member, alone or in a coalition the trust model allows, "
                "knows it, so nobody can subtract it from the release.")
    k, h = plan.get("noise_parties"), plan.get("noise_honest")
    return (f"The noise is distributed: each of the {k} compute parties added its own discrete Gaussian share, "
            f"sized so that the shares of the {h} the trust model counts honest carry the whole guarantee. A party "
            "knows only its own share, so it can subtract only that; a deviating party cannot shrink the others'. "
            f"The release carries √({k}/{h}) ≈ {(k / h) ** 0.5:.3g} times the noise of one sample drawn inside the "
            "MPC, the price of needing no sampler circuit.")


_owners_malicious = (" Each data owner proved its own contribution within the job's public bound on its replicated "
                     "shares, checked the same way; an owner whose proof failed was left out of the sum. A compute "
                     "party can still leave an owner out of a round (claim its share never came), as the network "
                     "can, but not change what a counted owner contributed.")


def _has_owners(report: PrivacyReport) -> bool:
    params = report.parameters if isinstance(report.parameters, dict) else {}
    return bool(params.get("owners"))


def _security(report: PrivacyReport) -> str:
    """What the compute parties were assumed to do, and what that leaves a deviating one able to do."""
    if report.security == "malicious":
        return ("Security model: malicious, with abort (three compute parties, any one of which may deviate). Each "
                "party proved its own input — its data's contribution plus its own noise share — within a public "
                "bound, and every value opened was checked against both parties holding each share, before anything "
                "that depends on it was revealed; each release ended unanimously, on signed verdicts relayed between "
                "the parties, so the honest parties both released it or both stopped; an abort reveals only that it "
                "happened. What a deviating party can still do: choose its own data within its "
                "bound, as in any MPC, and replace its noise share by any vector within the share's bound, which "
                "moves the release by at most that much but cannot weaken the guarantee, carried by the honest "
                "parties' shares." + (_owners_malicious if _has_owners(report) else ""))
    head = ("Security model: semi-honest. " if report.security == "semi-honest" else
            "This report does not state a security model (it was written before reports did); read it as "
            "semi-honest. ")
    return head + ("The compute parties are trusted to follow the protocol. They compare a digest of every value "
                   "they reveal before using it, and data owners, where a job has them, use only releases every "
                   "compute party signed: a party that gives different members different values stops the job. A "
                   "party that deviates the same way toward everyone could still shift the sum or shrink the noise "
                   "unseen; catching that needs a malicious-secure protocol, which this job did not run.")


def _released(report: PrivacyReport) -> list[str]:
    plan = report.plan or {}
    method = plan.get("method")
    rounds = report.rounds
    protocol = str(report.parameters.get("protocol", ""))
    if _unit(report) == "owner" or protocol == "dp_fed_ls":
        out = [f"The noisy sum of the sampled owners' model updates, once per round for {rounds} rounds, and so "
               "the model after every round. The model is public to every member of the job."]
    elif method == "output" and plan.get("transfer"):
        tr = plan["transfer"]
        out = [f"The noisy scores of the parties' averaged locally trained models (the teacher) on {tr.get('rows')} "
               "public rows, once. The teacher itself is never released. The model is a student fitted to those "
               "scores afterwards (it costs nothing more). Both are public to every member of the job."]
    elif method == "output":
        out = ["One noisy average of the parties' locally trained models: the released model. It is public to "
               "every member of the job."]
    else:
        out = [f"One noisy aggregate gradient per round for {rounds} rounds, and so the model after every round "
               "(the training curve is computed from these releases and costs nothing more). Everything released "
               "is public to every member of the job."]
    public = plan.get("what_is_public")
    if public:
        out.append(f"Public besides: {public}.")
    out.append("Nothing else leaves a party: its records, local models, gradients and its part of the noise "
               "are only ever sent as secret shares. A job that fails or is cancelled before its first release "
               "reveals nothing and spends nothing.")
    return out


def job_statement(report: PrivacyReport, *, job_name: str | None = None) -> str:
    """The job's privacy statement as Markdown, from its report alone."""
    plan = report.plan or {}
    eps, delta = report.epsilon, report.delta_total
    title = f"Privacy statement — job {job_name!r}" if job_name else "Privacy statement"
    lines = [f"# {title}", ""]
    if report.mechanism == "none" or math.isinf(eps):
        lines += ["**This job gave no privacy guarantee** (no noise: a test-only run, or a non-private job). "
                  "Its output must be treated like the data it was trained on.", ""]
        return "\n".join(lines)
    unit = _unit(report)
    lines += ["## What is protected", "",
              f"The unit of privacy is {_WHO.get(unit, unit)}. Whatever this job released looks almost the same "
              f"for {_neighbours(report)}. So it says almost nothing about whether any one "
              f"{'owner' if unit == 'owner' else 'person'}'s data was used, or what it contained. This holds "
              "whatever else an observer knows."
              + ("" if unit == "owner" else " A person with k rows is protected as k records: their guarantee is "
                 "weaker, about k·ε."), "",
              "## The guarantee", "",
              f"(ε, δ) = ({_num(eps, 4)}, {_num(delta)})-differential privacy, under "
              f"{'replace-one' if report.adjacency == 'replace' else 'add/remove'} adjacency.", "",
              f"- Every outcome's probability changes by at most a factor e^ε = {_num(math.exp(eps), 3)} between "
              f"the two runs. δ = {_num(delta)} is a small slack beyond that factor: roughly, the chance that "
              "the bound fails.",
              f"- An observer who thought it an even chance that a given {'owner' if unit == 'owner' else 'record'}"
              f" was in the data can be at most {100 * posterior_bound(eps):.0f} % sure after seeing everything "
              "released (δ aside).",
              f"- Any test that tries to tell the two runs apart and is wrong 5 % of the time when the "
              f"{'owner' if unit == 'owner' else 'record'} is absent detects it at most "
              f"{100 * detection_power_bound(eps, delta):.0f} % of the time.",
              ""]
    if report.delta_sampler:
        lines += [f"δ includes {_num(report.delta_sampler)} for the in-MPC noise sampler's distance from the exact "
                  "noise distribution (a bound the engine proves for its sampler, not an estimate).", ""]
    lines += ["## What was released", "", *(f"- {x}" for x in _released(report)), "",
              "## Who sees what", "", *(f"- {x}" for x in _trust(report)), "",
              "## The noise", "",
              f"- {report.mechanism.replace('_', ' ')} noise with scale {_num(report.noise_scale, 4)} per "
              f"coordinate against a sensitivity of {_num(report.sensitivity_l2 or report.sensitivity_l1, 4)} "
              f"({report.norm}): noise multiplier {_num(plan.get('noise_multiplier'), 4)}.",
              f"- Accounted by: {report.accountant}.",
              f"- {report.rounds} release(s)" + _sampling(report) + ".",
              "", "## Check it", "",
              "`mpc-erm report verify privacy_report.json` recomputes ε and δ from the report alone with "
              "Google's dp-accounting, and checks the sensitivity against what the report says is public.",
              "The ledger of each data set this job used charges it on that data set's own scale: "
              "`mpc-erm budget explain` shows the running total and explains the figures.", ""]
    if plan.get("target_epsilon") is not None and eps < float(plan["target_epsilon"]) * 0.999:
        lines.insert(lines.index("## What was released"),
                     f"(The job asked for ε ≤ {_num(plan['target_epsilon'], 4)}; it revealed fewer rounds than "
                     "planned, so it spent less.)\n")
    return "\n".join(lines)


@dataclass(frozen=True)
class JobCharge:
    """One job as a data set's ledger holds it: its own (ε, δ) and the event the ledger composes."""

    job_id: str
    state: str  # reserved | revealed | committed
    epsilon: float  # the job's own target ε, at its own δ
    delta: float
    event: DpEvent
    name: str | None = None


def dataset_statement(dataset: str, *, party: str, adjacency: str, epsilon_total: float, delta_total: float,
                      jobs: Sequence[JobCharge]) -> str:
    """A data set's cumulative privacy spend as Markdown: each live job at its own δ and at the data
    set's lifetime δ, the composed total, and what remains; recomputed from the events."""
    adj = "replace-one" if adjacency == "replace" else "add/remove"
    lines = [f"# Privacy budget — data set {dataset!r} at {party}", "",
             f"Lifetime budget: (ε, δ) = ({_num(epsilon_total, 4)}, {_num(delta_total)}), {adj} adjacency. Every "
             "job that reveals anything computed on this data set is charged against it, for ever: the budget "
             "does not refill.", ""]
    if not jobs:
        lines += ["No job has used it yet.", ""]
        return "\n".join(lines)
    spent = [j for j in jobs if j.state != "reserved"]
    open_ = [j for j in jobs if j.state == "reserved"]
    lines += ["| job | state | its own (ε, δ) | ε at the lifetime δ |", "|---|---|---|---|"]
    for j in jobs:
        alone = compose([j.event], delta_total, adjacency)  # type: ignore[arg-type]
        label = f"{j.name} ({j.job_id[:8]})" if j.name else j.job_id[:12]
        lines.append(f"| {label} | {j.state} | ({_num(j.epsilon, 4)}, {_num(j.delta)}) | {_num(alone.epsilon, 4)} |")
    total = compose([j.event for j in spent], delta_total, adjacency)  # type: ignore[arg-type]
    both = compose([j.event for j in jobs], delta_total, adjacency)  # type: ignore[arg-type]
    left = max(0.0, epsilon_total - both.epsilon)
    lines += ["", f"**Spent: ε = {_num(total.epsilon, 4)} at δ = {_num(delta_total)}** "
                  f"({100 * total.epsilon / epsilon_total:.0f} % of the lifetime ε; composed by "
                  f"{total.route.upper()}, the same composition that admits new jobs)."]
    if open_:
        lines.append(f"Open jobs, not yet revealed, hold ε {_num(both.epsilon - total.epsilon, 4)} more until they "
                     "end; a job cancelled before its first release gives it back.")
    lines += [f"Remaining: ε = {_num(left, 4)}. A new job is admitted only if this data set's jobs, with it, "
              f"stay within ε = {_num(epsilon_total, 4)} at δ = {_num(delta_total)}.", "",
              "## Why the figures differ from the jobs' own reports", "",
              "A privacy guarantee is a pair (ε, δ), and the same noise gives a smaller ε at a larger δ. A job's "
              "report states ε at the δ the job asked for. This ledger restates every job at the data set's "
              f"lifetime δ = {_num(delta_total)}, so that jobs with different δ add up on one scale. Both figures "
              "describe the same noise; neither is wrong."]
    if any(j.delta < delta_total for j in jobs):
        lines.append("A job that asked for a δ below the lifetime δ therefore shows a smaller ε here than in its "
                     "report.")
    if len(spent) > 1:
        s = sum(compose([j.event], delta_total, adjacency).epsilon for j in spent)  # type: ignore[arg-type]
        lines.append(f"Several jobs compose to less than the sum of their ε ({_num(s, 4)} summed, "
                     f"{_num(total.epsilon, 4)} composed): Rényi composition adds the noise's Rényi divergences, "
                     "not the ε.")
    lines.append("")
    return "\n".join(lines)
