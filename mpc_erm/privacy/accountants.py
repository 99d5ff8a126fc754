"""(ε, δ) of T (possibly Poisson-subsampled) Gaussian rounds, under four accountants.

- ``"rdp"``: Google ``dp_accounting`` RDP accountant (Mironov 2017; Mironov–Talwar–Zhang 2019
  for the Poisson-subsampled Gaussian). Upper bound; looser than PLD.
- ``"pld"``: Google ``dp_accounting`` privacy-loss-distribution accountant (Koskela et al.;
  Doroshenko et al. 2022), pessimistic discretisation, so an upper bound that is tight to the
  discretisation interval.
- ``"gdp"``: the closed form of :mod:`.gaussian` — exact for full batch (q = 1) only; refused for
  q < 1 (the CLT approximation of subsampled GDP is not an upper bound).
- ``"zcdp"``: the thesis route (:mod:`.zcdp`), full batch only.

docs/explanation/privacy.md §4: the subsampled Gaussian is never hand-written here; it is ``dp_accounting``'s.

Noise-multiplier convention (read this before passing numbers in): ``z = σ/Δ`` where σ is the
noise std added to the aggregate and Δ is the ℓ2-sensitivity of the *unsampled* aggregate under
the declared adjacency (:func:`.sensitivity.gradient_sensitivity`). So for ``"add_remove"`` Δ is
the per-record contribution bound C, for ``"replace"`` Δ = 2C.
  * q = 1: each round is a Gaussian mechanism with shift ≤ Δ, for either adjacency; it is
    accounted as ``GaussianDpEvent(z)`` under ``ADD_OR_REMOVE_ONE`` (whose shift is exactly
    1 noise unit). We do not pass ``REPLACE_ONE`` here, because ``dp_accounting`` 0.6 is
    inconsistent about it: its PLD accountant doubles the shift for a ``GaussianDpEvent`` under
    ``REPLACE_ONE`` (the event's multiplier is per record), its RDP accountant does not.
  * q < 1, ``"add_remove"``: ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` under
    ``ADD_OR_REMOVE_ONE`` — the standard DP-SGD analysis (record included w.p. q, contribution
    ≤ C, public normaliser).
  * q < 1, ``"replace"``: PLD only, with ``REPLACE_ONE`` and per-record multiplier σ/C = 2z
    (``dp_accounting`` then compares q·N(−C) + (1−q)·N(0) with q·N(+C) + (1−q)·N(0), the
    worst case of replacing a sampled record). The RDP accountant of ``dp_accounting`` does not
    support this pair, and it is refused rather than approximated.
  * ``population`` N given (q < 1, q·N whole): each round sums exactly s = q·N of N public slots
    drawn uniformly without replacement, an absent or undrawn slot adding zero (DP-Fed-LS's
    uniform owner sampling). Here z is relative to the *replace-one* shift of the sum (Δ = 2C,
    2𝓛 for owner updates) whatever ``adjacency`` says: N is public and an absent owner is a zero
    slot, so add/remove of one owner is a replacement and the same bound holds under both.
    Accounted as ``SampledWithoutReplacementDpEvent(N, s, GaussianDpEvent(z))`` under
    ``REPLACE_ONE`` (Wang–Balle–Kasiviswanathan 2019, Thm 27; fractional orders by their
    Cor. 10), RDP only; the continuous and the in-MPC discrete Gaussian alike
    (:func:`~.subsampled.wor_gaussian_curve`, re-exported here).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Literal

import dp_accounting
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_delta, compute_epsilon

from . import _checks
from .events import SubsampledRdp, wor_sample_size
from .gaussian import gdp_delta, gdp_epsilon, gdp_meets, gdp_mu
from .member_view import pooled_rows_curve
from .subsampled import (
    RDP_ORDERS,
    discrete_gaussian_curve,
    general_discrete_gaussian_curve,
    poisson_gaussian_curve,
    wor_gaussian_curve,
)
from .zcdp import zcdp_epsilon, zcdp_rho_for

AccountantName = Literal["rdp", "pld", "gdp", "zcdp"]
ACCOUNTANTS = ("rdp", "pld", "gdp", "zcdp")
DEFAULT_PLD_DISCRETIZATION = 1e-4

__all__ = [
    "ACCOUNTANTS",
    "AccountantName",
    "delta_for",
    "epsilon_for",
    "gaussian_rounds_event",
    "noise_multiplier_for",
    "wor_gaussian_curve",
]

_NR = dp_accounting.NeighboringRelation


def gaussian_rounds_event(
    noise_multiplier: float, rounds: int, sampling_rate: float = 1.0, adjacency: str = "replace"
) -> tuple[dp_accounting.DpEvent, dp_accounting.NeighboringRelation]:
    """The ``dp_accounting`` event (and neighbouring relation) describing T rounds, with the
    convention of the module docstring. Useful for ledgers that keep DpEvents."""
    z = _checks.positive("noise_multiplier", noise_multiplier)
    t = _checks.positive_int("rounds", rounds)
    q = _checks.sampling_rate("sampling_rate", sampling_rate)
    adj = _checks.adjacency("adjacency", adjacency)
    if q == 1.0:
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(z), t
        ), _NR.ADD_OR_REMOVE_ONE
    if adj == "add_remove":
        ev = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
        return dp_accounting.SelfComposedDpEvent(ev, t), _NR.ADD_OR_REMOVE_ONE
    ev = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(2.0 * z))
    return dp_accounting.SelfComposedDpEvent(ev, t), _NR.REPLACE_ONE


def _wor_epsilon(z: float, t: int, delta: float, q: float, population: int, member_rows: tuple[int, ...] = ()) -> float:
    curve = pooled_rows_curve(z, population, wor_sample_size(population, q), member_rows)
    return float(compute_epsilon(RDP_ORDERS, t * curve, delta)[0])


def _check_wor(accountant: str, sampling_rate: float, adjacency: str, population: int) -> tuple[str, float, str]:
    """As :func:`_check_common` for rounds on a sample without replacement: any adjacency, RDP only."""
    acc = _checks.choice("accountant", accountant, ACCOUNTANTS)
    q = _checks.sampling_rate("sampling_rate", sampling_rate)
    adj = _checks.adjacency("adjacency", adjacency)
    if acc != "rdp":
        raise ValueError(f"accountant {acc!r}: rounds on a sample without replacement (population) are accounted "
                         "by 'rdp' only (dp_accounting's SampledWithoutReplacementDpEvent)")
    if not q < 1.0:
        raise ValueError("population: needs sampling_rate < 1 (each round draws q·N of the N slots)")
    wor_sample_size(population, q)
    return acc, q, adj


def _check_common(accountant: str, sampling_rate: float, adjacency: str) -> tuple[str, float, str]:
    acc = _checks.choice("accountant", accountant, ACCOUNTANTS)
    q = _checks.sampling_rate("sampling_rate", sampling_rate)
    adj = _checks.adjacency("adjacency", adjacency)
    if acc in ("gdp", "zcdp") and q < 1.0:
        raise ValueError(
            f"sampling_rate must be 1.0 for accountant {acc!r} (exact for full batch only), got "
            f"{sampling_rate!r}; use accountant 'rdp' or 'pld' for subsampled rounds"
        )
    if acc == "rdp" and q < 1.0 and adj == "replace":
        raise ValueError(
            "adjacency 'replace' with sampling_rate < 1 is not supported by the RDP accountant of "
            "dp_accounting; use accountant 'pld' (REPLACE_ONE) or adjacency 'add_remove'"
        )
    return acc, q, adj


def epsilon_for(
    accountant: AccountantName,
    noise_multiplier: float,
    rounds: int,
    delta: float,
    sampling_rate: float = 1.0,
    adjacency: str = "replace",
    *,
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
    discrete: bool = False,
    population: int | None = None,
    subsampled_rdp: SubsampledRdp = "exact",
    member_rows: tuple[int, ...] = (),
) -> float:
    """ε at ``delta`` after ``rounds`` Gaussian rounds with noise multiplier z = σ/Δ.
    ``discrete``: the in-MPC discrete Gaussian, whose Poisson-subsampled rounds are accounted by
    :mod:`.subsampled`'s exact curve (RDP only; ``subsampled_rdp = "general"``: by the general
    bound that events written before it state). ``population`` N: each round draws q·N of N slots
    without replacement, z relative to the replace-one shift, under either ``adjacency`` and for
    either noise (module docstring; RDP only); ``member_rows``: with it, the largest of the outside
    observer's and each such member's view (:mod:`.member_view`)."""
    acc, q, adj = (_check_common(accountant, sampling_rate, adjacency) if population is None
                   else _check_wor(accountant, sampling_rate, adjacency, population))
    z = _checks.positive("noise_multiplier", noise_multiplier)
    t = _checks.positive_int("rounds", rounds)
    dl = _checks.probability_open("delta", delta)
    if member_rows and population is None:
        raise ValueError("member_rows: only with population (a sample without replacement)")
    if population is not None:
        return _wor_epsilon(z, t, dl, q, population, tuple(member_rows))
    if discrete and q < 1.0:
        if acc != "rdp":
            raise ValueError(f"accountant {acc!r}: subsampled rounds of the discrete Gaussian are accounted by 'rdp'")
        curve = (discrete_gaussian_curve if subsampled_rdp == "exact" else general_discrete_gaussian_curve)(q, z)
        return float(compute_epsilon(RDP_ORDERS, t * curve, dl)[0])
    if acc == "gdp":
        return gdp_epsilon(math.sqrt(t) / z, dl)
    if acc == "zcdp":
        return zcdp_epsilon(t / (2.0 * z * z), dl)
    if acc == "rdp":
        return float(compute_epsilon(RDP_ORDERS, t * poisson_gaussian_curve(q, z), dl)[0])
    return float(_pld(z, t, q, adj, pld_discretization).get_epsilon(dl))


def delta_for(
    accountant: AccountantName,
    noise_multiplier: float,
    rounds: int,
    epsilon: float,
    sampling_rate: float = 1.0,
    adjacency: str = "replace",
    *,
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
) -> float:
    """δ at ``epsilon`` after ``rounds`` Gaussian rounds (zCDP: the δ solving its conversion)."""
    acc, q, adj = _check_common(accountant, sampling_rate, adjacency)
    z = _checks.positive("noise_multiplier", noise_multiplier)
    t = _checks.positive_int("rounds", rounds)
    eps = _checks.nonnegative("epsilon", epsilon)
    if acc == "gdp":
        return gdp_delta(math.sqrt(t) / z, eps)
    if acc == "zcdp":
        rho = t / (2.0 * z * z)
        if eps <= rho:
            return 1.0
        return min(1.0, math.exp(-((eps - rho) ** 2) / (4.0 * rho)))
    if acc == "rdp":
        return float(compute_delta(RDP_ORDERS, t * poisson_gaussian_curve(q, z), eps)[0])
    return float(_pld(z, t, q, adj, pld_discretization).get_delta(eps))


def _pld(z: float, t: int, q: float, adj: str, pld_discretization: float) -> PLDAccountant:
    """dp_accounting's PLD accountant having composed ``t`` Gaussian rounds (the RDP route is the
    curve of :func:`~.subsampled.poisson_gaussian_curve`, on the product's orders)."""
    _checks.positive("pld_discretization", pld_discretization)
    event, rel = gaussian_rounds_event(z, t, q, adj)
    a = PLDAccountant(rel, value_discretization_interval=pld_discretization)
    a.compose(event)
    return a


def noise_multiplier_for(
    accountant: AccountantName,
    target_eps: float,
    delta: float,
    rounds: int,
    sampling_rate: float = 1.0,
    adjacency: str = "replace",
    *,
    rel_tol: float = 1e-4,
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
    discrete: bool = False,
    population: int | None = None,
    subsampled_rdp: SubsampledRdp = "exact",
    member_rows: tuple[int, ...] = (),
) -> float:
    """Smallest z (within ``rel_tol``, rounded up) such that T rounds are (target_eps, δ)-DP
    (``discrete``: of the in-MPC discrete Gaussian; ``population``: on q·N of N slots drawn
    without replacement, z relative to the replace-one shift — both as in :func:`epsilon_for`).

    GDP and zCDP use their closed forms. RDP and PLD search in log z by a bracketed Illinois
    (regula falsi) iteration that keeps the invariant ε(upper end) ≤ target, and return that
    upper end: the result is always feasible (``calibrate_dp_mechanism`` only promises to be
    within ``tol`` of the optimum, on either side).
    """
    acc, q, adj = (_check_common(accountant, sampling_rate, adjacency) if population is None
                   else _check_wor(accountant, sampling_rate, adjacency, population))
    eps = _checks.positive("target_eps", target_eps)
    dl = _checks.probability_open("delta", delta)
    t = _checks.positive_int("rounds", rounds)
    tol = _checks.positive("rel_tol", rel_tol)
    if acc == "gdp":
        z = math.sqrt(t) / gdp_mu(eps, dl)
        while not gdp_meets(math.sqrt(t) / z, eps, dl):  # pragma: no cover - rounding guard
            z = math.nextafter(z, math.inf)
        return z
    if acc == "zcdp":
        z = math.sqrt(t / (2.0 * zcdp_rho_for(eps, dl)))
        while zcdp_epsilon(t / (2.0 * z * z), dl) > eps:  # pragma: no cover - rounding guard
            z = math.nextafter(z, math.inf)
        return z

    return _searched_z(acc, eps, dl, t, q, adj, tol, pld_discretization, discrete, population, subsampled_rdp,
                       tuple(int(n) for n in member_rows))


@functools.lru_cache(maxsize=1024)
def _searched_z(acc: str, eps: float, dl: float, t: int, q: float, adj: str, tol: float, pld_discretization: float,
                discrete: bool, population: int | None, subsampled_rdp: SubsampledRdp,
                member_rows: tuple[int, ...]) -> float:
    """:func:`noise_multiplier_for`'s search for the numerical accountants, on checked arguments.
    Cached: a pure function of them, and each search evaluates the accountant 6–20 times (a report
    verified, a ledger's search for the largest ε that fits and a plan ask for the same job's z)."""

    def f(x: float) -> float:  # decreasing in x = log z; f ≤ 0 ⇔ feasible
        e = epsilon_for(acc, math.exp(x), t, dl, q, adj, pld_discretization=pld_discretization,  # type: ignore[arg-type]
                        discrete=discrete, population=population, subsampled_rdp=subsampled_rdp,
                        member_rows=member_rows)
        return math.inf if e == math.inf else (math.log(e) - math.log(eps) if e > 0 else -math.inf)

    # Start from the full-batch GDP value scaled by q (exact at q = 1, close for q < 1).
    guess = math.log(max(q * math.sqrt(t) / gdp_mu(eps, dl), 1e-3))
    a, fa, b, fb = _bracket(f, guess)
    # Illinois (modified regula falsi) in log z: superlinear, and the bracket is kept, so the
    # feasible end b is returned. Each PLD evaluation costs ~0.1–1 s, hence not plain bisection.
    width = math.log1p(tol)
    side = 0
    while b - a > width:
        if math.isfinite(fa) and math.isfinite(fb) and fa != fb:
            c = b - fb * (b - a) / (fb - fa)
            margin = 0.25 * width
            c = min(max(c, a + margin), b - margin)
        else:
            c = 0.5 * (a + b)
        fc = f(c)
        if fc <= 0:
            b, fb = c, fc
            if side == -1:
                fa /= 2.0
            side = -1
        else:
            a, fa = c, fc
            if side == 1:
                fb /= 2.0
            side = 1
    return math.exp(b)


def _bracket(f: Callable[[float], float], x0: float) -> tuple[float, float, float, float]:
    """[a, b] in log z with f(a) > 0 ≥ f(b), searched outward from x0."""
    f0 = f(x0)
    step = math.log(1.25)
    if f0 <= 0:
        b, fb = x0, f0
        a = b - step
        fa = f(a)
        while fa <= 0:
            b, fb = a, fa
            step *= 2.0
            a = b - step
            if a < math.log(1e-6):  # pragma: no cover - absurdly large budgets
                raise ValueError(
                    "target_eps is so large that no positive noise multiplier is needed"
                )
            fa = f(a)
        return a, fa, b, fb
    a, fa = x0, f0
    b = a + step
    fb = f(b)
    while fb > 0:
        a, fa = b, fb
        step *= 2.0
        b = a + step
        fb = f(b)
    return a, fa, b, fb
