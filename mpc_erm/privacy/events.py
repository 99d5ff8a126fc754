"""Typed, immutable privacy events — what a job released — and the one composition of them.

In the style of dp-accounting's ``DpEvent``: an event says *what ran*; accountants interpret it.
A job's :class:`~mpc_erm.privacy.plan.PrivacyPlan` makes its event once; the ledger stores it
(JSON), composes a data set's events and admits jobs by the composed bound; the privacy report
carries it; ``mpc-erm report verify`` recomputes ε from it. Nothing else re-derives a guarantee.

Events:

* :class:`GaussianRounds` — ``rounds`` releases, each Gaussian with noise multiplier
  z = σ/Δ₂ (Δ₂ under the event's adjacency, in grid units with every party's rounding for the
  in-MPC discrete Gaussian). Accounted through its Rényi divergence only: the discrete Gaussian's
  Rényi divergence at integer shifts is at most the continuous one's (Canonne–Kamath–Steinke
  2020, Prop. 5), but its privacy-loss distribution is not the continuous one's, so the GDP/PLD
  closed forms of the continuous Gaussian are not used for it. With ``sampling_rate`` q < 1 each
  release sums a Poisson sample of the records (each in w.p. q, independently): the subsampled
  Gaussian of DP-SGD, under add/remove only: the continuous Gaussian by dp_accounting's RDP of
  ``PoissonSampledDpEvent`` (Mironov–Talwar–Zhang 2019), the in-MPC discrete Gaussian
  (``discrete``) by the same sum at integer orders, which its exact moments give in both
  directions (:mod:`.subsampled`; ``subsampled_rdp = "general"`` marks events written when it was
  accounted by the looser general bound of Zhu–Wang 2019, and recomputes them by it).
  With ``population`` N set, each release instead sums exactly s = q·N of N public slots drawn
  uniformly without replacement (DP-Fed-LS's uniform owner sampling; an absent or undrawn slot
  adds zero), and z is relative to the replace-one shift of the sum (2𝓛 for updates of norm
  ≤ 𝓛): dp_accounting's RDP of ``SampledWithoutReplacementDpEvent`` under ``REPLACE_ONE``
  (Wang–Balle–Kasiviswanathan 2019, Thm 27; fractional orders by their Cor. 10), for the
  continuous and the in-MPC discrete Gaussian alike (:func:`~.subsampled.wor_gaussian_curve`).
  Such an event holds unchanged under either adjacency (:meth:`GaussianRounds.under`).
  ``member_rows`` lists how many of the N slots each member holds whose own draws it sees (an
  owner its own slot; a party its rows): the curve is then the largest of the outside observer's
  and each such member's view, the mixture over how many of its own slots were drawn
  (:mod:`.member_view`). Empty: the observer's curve alone (events written before it).
* :class:`PureDp` — ``rounds`` releases, each ε-DP (per-coordinate discrete Laplace with the ℓ1
  sensitivity). Composed either by summing ε or through the Rényi curve of binary randomized
  response with ε, the worst case of every ε-DP mechanism (Kairouz–Oh–Viswanath 2015).
* :class:`NonPrivate` — a release with no noise (test-only jobs): ε = ∞ for whatever it touches.

Every event carries ``sampler_tv``: a bound on the total-variation distance, per release, between
what the sampler produced and the ideal mechanism. Over all events τ = Σ rounds·sampler_tv, and
a mechanism within TV τ of an (ε, δ)-DP one is (ε, δ + (1 + e^ε)·τ)-DP — with the ε of the whole
composition, not each job's own (:func:`compose`).

Adjacency: an event is stated under ``replace`` (one record replaced) or ``add_remove`` (one added
or removed). A replace is a removal followed by an addition, so an add/remove event with shift Δ
has shift ≤ 2Δ under replace: its noise multiplier halves (Gaussian) or its ε doubles (pure).
Nothing converts the other way: a replace-one job may publish exact counts, which add/remove
protects. The exception is a Gaussian event with ``population``: its N slots are public and an
absent owner is a zero slot, so one owner added or removed is one slot replaced and the event
holds unchanged under both. The ledger composes a data set's events under the relation its
budget is stated in.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar, Literal

__all__ = [
    "ADJACENCIES",
    "SUBSAMPLED_RDP",
    "Adjacency",
    "AdjacencyError",
    "ApproxDp",
    "Composition",
    "DpEvent",
    "GaussianRounds",
    "NonPrivate",
    "PureDp",
    "SubsampledRdp",
    "compose",
    "event_from_dict",
    "event_from_json",
    "wor_sample_size",
]

Adjacency = Literal["replace", "add_remove"]
ADJACENCIES = ("replace", "add_remove")
SubsampledRdp = Literal["exact", "general"]
SUBSAMPLED_RDP = ("exact", "general")


class AdjacencyError(ValueError):
    """An event cannot be stated under the requested relation (replace-one → add/remove)."""


def _adjacency(v: Any) -> Adjacency:
    if v not in ADJACENCIES:
        raise ValueError(f"adjacency must be one of {ADJACENCIES}, got {v!r}")
    return v  # type: ignore[no-any-return]


def _finite_positive(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)


def _rounds(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"rounds must be an integer >= 0, got {v!r}")
    return v


def wor_sample_size(population: Any, sampling_rate: float, *, field: str = "population") -> int:
    """s = q·N, the slots a round draws without replacement from ``population`` N public ones:
    N an integer ≥ 2, q·N whole (to 1e-9·N) and 1 ≤ s < N. Errors name ``field``."""
    if isinstance(population, bool) or not isinstance(population, int) or population < 2:
        raise ValueError(f"{field} must be an integer >= 2 (the public number of slots sampled from), "
                         f"got {population!r}")
    exact = sampling_rate * population
    size = round(exact)
    if abs(exact - size) > 1e-9 * population or not 1 <= size < population:
        raise ValueError(f"{field}: sampling_rate·population = {exact:.12g} must be a whole number of slots in "
                         f"[1, {population}) (exactly s = q·N are drawn each round)")
    return size


def _tv(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
        raise ValueError(f"sampler_tv must be a number in [0, 1), got {v!r}")
    return float(v)


@dataclass(frozen=True, kw_only=True)
class _Event:
    kind: ClassVar[str] = ""
    rounds: int
    adjacency: Adjacency
    sampler_tv: float = 0.0  # per release

    def __post_init__(self) -> None:
        _rounds(self.rounds)
        _adjacency(self.adjacency)
        _tv(self.sampler_tv)

    def with_rounds(self, rounds: int) -> DpEvent:
        """The same mechanism released ``rounds`` times (what a job stopped early really spent)."""
        return replace(self, rounds=_rounds(rounds))  # type: ignore[return-value]

    def under(self, adjacency: Adjacency) -> DpEvent:
        """This event stated under ``adjacency`` (module docstring); AdjacencyError if impossible."""
        raise NotImplementedError

    @property
    def total_tv(self) -> float:
        return self.rounds * self.sampler_tv

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))


def _refuse_replace_to_add_remove(ev: _Event, adjacency: Adjacency) -> None:
    if ev.adjacency == "replace" and _adjacency(adjacency) == "add_remove":
        raise AdjacencyError(
            "a replace-one release has no add/remove guarantee (it may publish exact record counts); "
            "compose it under 'replace'"
        )


@dataclass(frozen=True, kw_only=True)
class GaussianRounds(_Event):
    kind: ClassVar[str] = "gaussian"
    noise_multiplier: float
    sampling_rate: float = 1.0  # Poisson sampling of the records per release (1: every record)
    # the in-MPC discrete Gaussian: its RDP is the continuous Gaussian's at integer orders, subsampled
    # or not, interpolated between them (.subsampled); not dp_accounting's fractional orders
    discrete: bool = False
    # which analysis accounts subsampled discrete rounds: "exact" (.subsampled's moments, both
    # directions) or "general" (Zhu–Wang 2019: ledger rows and reports written before the exact one)
    subsampled_rdp: SubsampledRdp = "exact"
    # N public slots of which each release draws exactly q·N uniformly without replacement (None:
    # Poisson sampling, or every record); z is then relative to the replace-one shift of the sum
    population: int | None = None
    # with population: each member's count of slots whose draws it sees (its own); () for none
    member_rows: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite_positive("noise_multiplier", self.noise_multiplier)
        if isinstance(self.member_rows, list):
            object.__setattr__(self, "member_rows", tuple(self.member_rows))
        if self.member_rows:
            if self.population is None:
                raise ValueError("dp_event.member_rows: only with dp_event.population (a sample without replacement)")
            if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < self.population
                       for n in self.member_rows):
                raise ValueError(f"dp_event.member_rows: counts in [0, {self.population}), got {self.member_rows!r}")
        q = self.sampling_rate
        if isinstance(q, bool) or not isinstance(q, int | float) or not 0.0 < q <= 1.0:
            raise ValueError(f"dp_event.sampling_rate must be in (0, 1], got {q!r}")
        if self.population is not None:
            if q >= 1.0:
                raise ValueError("dp_event.population: needs dp_event.sampling_rate < 1 (a sample of the slots)")
            wor_sample_size(self.population, q, field="dp_event.population")
        elif q < 1.0 and self.adjacency != "add_remove":
            raise AdjacencyError("dp_event.sampling_rate < 1: Poisson-subsampled rounds are accounted under "
                                 "add/remove adjacency only")
        if not isinstance(self.discrete, bool):
            raise ValueError(f"dp_event.discrete must be true or false, got {self.discrete!r}")
        if self.subsampled_rdp not in SUBSAMPLED_RDP:
            raise ValueError(f"dp_event.subsampled_rdp must be one of {SUBSAMPLED_RDP}, got {self.subsampled_rdp!r}")
        if self.subsampled_rdp == "general" and not self.poisson_discrete:
            raise ValueError("dp_event.subsampled_rdp 'general' applies to Poisson-subsampled discrete rounds only")

    @property
    def poisson_discrete(self) -> bool:
        """In-MPC discrete Gaussian rounds on a Poisson sample: the rounds ``subsampled_rdp`` names
        the analysis of."""
        return self.discrete and self.sampling_rate < 1.0 and self.population is None

    @property
    def sample_size(self) -> int | None:
        """s: the slots each release draws without replacement (None without ``population``)."""
        return None if self.population is None else wor_sample_size(self.population, self.sampling_rate)

    def under(self, adjacency: Adjacency) -> GaussianRounds:
        if self.population is not None:
            # N is public and an absent owner is a zero slot, so adding or removing one owner is
            # one slot's update replaced (zero ↔ update): the replace-one bound, with z relative to
            # its shift 2𝓛, holds as it is under both relations, in either direction
            return self if self.adjacency == adjacency else replace(self, adjacency=_adjacency(adjacency))
        _refuse_replace_to_add_remove(self, adjacency)
        if self.adjacency == adjacency:
            return self
        if self.sampling_rate < 1.0:
            raise AdjacencyError("a Poisson-subsampled release has no replace-one bound here (halving its noise "
                                 "multiplier is valid for full batches only); compose it under 'add_remove'")
        return replace(self, adjacency=adjacency, noise_multiplier=self.noise_multiplier / 2.0)

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        if self.sampling_rate == 1.0:  # full batch: the form every ledger and report had before
            del out["sampling_rate"]
        if not self.discrete:  # likewise
            del out["discrete"]
        if self.population is None:  # likewise
            del out["population"]
        if not self.member_rows:  # likewise
            del out["member_rows"]
        else:
            out["member_rows"] = list(self.member_rows)
        if not self.poisson_discrete or self.subsampled_rdp == "general":
            # written where it applies; absent there, it is "general": earlier versions' bytes, unchanged
            del out["subsampled_rdp"]
        return out


@dataclass(frozen=True, kw_only=True)
class PureDp(_Event):
    kind: ClassVar[str] = "pure"
    epsilon: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite_positive("epsilon", self.epsilon)

    def under(self, adjacency: Adjacency) -> PureDp:
        _refuse_replace_to_add_remove(self, adjacency)
        if self.adjacency == adjacency:
            return self
        return replace(self, adjacency=adjacency, epsilon=2.0 * self.epsilon)


@dataclass(frozen=True, kw_only=True)
class ApproxDp(_Event):
    """``rounds`` releases each with a stated (ε, δ) and nothing else known (ledger rows written
    before typed events existed): composed by basic composition only."""

    kind: ClassVar[str] = "approx"
    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite_positive("epsilon", self.epsilon)
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not 0.0 <= self.delta < 1.0:
            raise ValueError(f"delta must be a number in [0, 1), got {self.delta!r}")

    def under(self, adjacency: Adjacency) -> ApproxDp:
        _refuse_replace_to_add_remove(self, adjacency)
        if self.adjacency == adjacency:
            return self
        # group privacy for a group of 2 (a replace is a removal and an addition)
        return replace(self, adjacency=adjacency, epsilon=2.0 * self.epsilon,
                       delta=min(0.999999, (1.0 + math.exp(self.epsilon)) * self.delta))


@dataclass(frozen=True, kw_only=True)
class NonPrivate(_Event):
    kind: ClassVar[str] = "none"

    def under(self, adjacency: Adjacency) -> NonPrivate:
        return replace(self, adjacency=_adjacency(adjacency))


DpEvent = GaussianRounds | PureDp | ApproxDp | NonPrivate
_KINDS: dict[str, type[_Event]] = {"gaussian": GaussianRounds, "pure": PureDp, "approx": ApproxDp, "none": NonPrivate}
_FIELDS = {
    "gaussian": {"kind", "rounds", "adjacency", "sampler_tv", "noise_multiplier"},
    "pure": {"kind", "rounds", "adjacency", "sampler_tv", "epsilon"},
    "approx": {"kind", "rounds", "adjacency", "sampler_tv", "epsilon", "delta"},
    "none": {"kind", "rounds", "adjacency", "sampler_tv"},
}


def event_from_dict(d: Mapping[str, Any]) -> DpEvent:
    """Parse an event's dict form (as stored in the ledger, the audit log and reports); every
    field is required, unknown fields are refused, errors name the field."""
    if not isinstance(d, Mapping):
        raise ValueError(f"dp_event must be a JSON object, got {type(d).__name__}")
    kind = d.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"dp_event.kind must be one of {sorted(_KINDS)}, got {kind!r}")
    optional = ({"sampling_rate", "discrete", "population", "subsampled_rdp", "member_rows"} if kind == "gaussian"
                else set())  # omitted at defaults
    if not _FIELDS[kind] <= set(d) <= _FIELDS[kind] | optional:
        raise ValueError(f"dp_event of kind {kind!r} needs exactly the fields {sorted(_FIELDS[kind])}, got {sorted(d)}")
    fields = {k: v for k, v in d.items() if k != "kind"}
    if (kind == "gaussian" and "subsampled_rdp" not in d and d.get("discrete") is True
            and d.get("sampling_rate", 1.0) != 1.0 and d.get("population") is None):
        fields["subsampled_rdp"] = "general"  # written before the exact analysis: recomputed as it was stated
    return _KINDS[kind](**fields)  # type: ignore[return-value]


def event_from_json(text: str) -> DpEvent:
    return event_from_dict(json.loads(text))


# ------------------------------------------------------------------------------------ composition


@dataclass(frozen=True)
class Composition:
    """(ε, δ) of a set of events under one relation: ``delta`` is the total, of which
    ``delta_sampler`` = (1 + e^ε)·τ covers the samplers' distance to the ideal mechanisms."""

    epsilon: float
    delta: float
    delta_sampler: float
    adjacency: Adjacency
    route: str  # "none" (no events), "pure", "rdp", "pure+rdp", "non-private", "impossible"


def _rr_p(eps: float) -> float:
    """dp_accounting's RandomizedResponseDpEvent noise parameter for binary RR with ε:
    the true bucket is kept w.p. e^ε/(1+e^ε) = 1 − p/2, so p = 2/(1+e^ε) (stably)."""
    return 2.0 * math.exp(-eps) / (1.0 + math.exp(-eps))


# (kind, parameter, sampling rate, population or 0, member views (gaussian_wor), count)
_Part = tuple[str, float, float, int, tuple[int, ...], int]


@functools.lru_cache(maxsize=2048)
def _rdp_epsilon(parts: tuple[_Part, ...], delta: float) -> float:
    """RDP ε at ``delta`` of ((kind, parameter, sampling rate, population, member views, count), …): the
    conversion of :func:`_rdp_curve` (cheap; the sampler's fixed point asks at many δ)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    from .subsampled import RDP_ORDERS

    return float(compute_epsilon(RDP_ORDERS, _rdp_curve(parts), delta)[0])


@functools.lru_cache(maxsize=512)
def _rdp_curve(parts: tuple[_Part, ...]) -> Any:
    """The RDP curve on :data:`~.subsampled.RDP_ORDERS` of ((kind, parameter, sampling rate,
    population, member views, count), …) — identical events are composed as one SelfComposedDpEvent (RR's RDP
    costs dp_accounting ~0.1 s an event). Read-only: callers convert it, never change it."""
    import dp_accounting
    import numpy as np
    from dp_accounting.rdp import RdpAccountant

    from .member_view import pooled_rows_curve
    from .subsampled import (
        RDP_ORDERS,
        discrete_gaussian_curve,
        general_discrete_gaussian_curve,
        poisson_gaussian_curve,
    )

    full: list[Any] = []
    rdp = np.zeros(len(RDP_ORDERS))
    for kind, param, q, population, views, count in parts:
        if kind == "discrete_gaussian":  # the in-MPC noise, Poisson-subsampled: .subsampled's exact curve
            rdp = rdp + count * discrete_gaussian_curve(q, param)
        elif kind == "discrete_gaussian_general":  # ... as events written before it state it
            rdp = rdp + count * general_discrete_gaussian_curve(q, param)
        elif kind == "gaussian_wor":  # s = q·N of N slots without replacement, either noise (accountants)
            rdp = rdp + count * pooled_rows_curve(param, population, wor_sample_size(population, q), views)
        elif kind == "gaussian" and q < 1.0:  # add/remove by construction (the event's docstring)
            rdp = rdp + count * poisson_gaussian_curve(q, param)
        else:
            one = (dp_accounting.GaussianDpEvent(param) if kind == "gaussian"
                   else dp_accounting.RandomizedResponseDpEvent(_rr_p(param), 2))
            full.append(dp_accounting.SelfComposedDpEvent(one, count))
    # REPLACE_ONE is what dp_accounting needs for RR; its RDP of GaussianDpEvent is the same under
    # either relation. The relation itself was applied by converting every event (`under`). Rényi
    # divergences of one pair of data sets add over adaptively composed mechanisms, whichever
    # bound gave each curve (RR's curve bounds every ε-DP release); tests/privacy pin the sum
    # against a single accountant where one can hold both parts.
    if full:
        acc = RdpAccountant(orders=RDP_ORDERS, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        acc.compose(dp_accounting.ComposedDpEvent(full))
        rdp = rdp + np.asarray(acc._rdp, dtype=np.float64)  # dp_accounting keeps the curve in _rdp
    rdp.flags.writeable = False
    return rdp


def _grouped(events: Iterable[DpEvent], kinds: tuple[str, ...]) -> tuple[_Part, ...]:
    counts: dict[tuple[str, float, float, int, tuple[int, ...]], int] = {}
    for ev in events:
        if ev.kind in kinds and ev.rounds > 0:
            if isinstance(ev, GaussianRounds):
                if ev.population is not None:  # one bound for either noise (the event's docstring)
                    key = ("gaussian_wor", ev.noise_multiplier, float(ev.sampling_rate), ev.population,
                           tuple(sorted(set(ev.member_rows))))
                else:
                    kind = (ev.kind if not ev.poisson_discrete else "discrete_gaussian"
                            if ev.subsampled_rdp == "exact" else "discrete_gaussian_general")
                    key = (kind, ev.noise_multiplier, float(ev.sampling_rate), 0, ())
            else:
                key = (ev.kind, ev.epsilon, 1.0, 0, ())  # type: ignore[union-attr]
            counts[key] = counts.get(key, 0) + ev.rounds
    return tuple(sorted((k, p, q, pop, views, n) for (k, p, q, pop, views), n in counts.items()))


def _with_sampler(eps_at: Any, tau: float, delta: float) -> tuple[float, float]:
    """Smallest ε (found from below) with δ_mech(ε) + (1 + e^ε)·τ ≤ δ, where ``eps_at(d)`` is the
    mechanism's ε at δ_mech = d. Returns (ε, (1 + e^ε)·τ); (inf, 1) if none exists.

    Iterating ε ← eps_at(δ − (1 + e^ε)·τ) from ε₀ = eps_at(δ) (a lower bound) increases ε; once
    an iterate ε' ≤ ε, the mechanism is ε-DP at δ − (1 + e^ε)·τ and the sum is exactly δ."""
    if tau == 0.0:
        return eps_at(delta), 0.0

    def step(eps: float) -> float:
        d_s = (1.0 + math.exp(min(eps, 700.0))) * tau
        return math.inf if d_s >= delta else eps_at(delta - d_s)

    eps = eps_at(delta)
    for _ in range(80):
        if not math.isfinite(eps):
            return math.inf, 1.0
        new = step(eps)
        if new <= eps:
            return eps, (1.0 + math.exp(eps)) * tau
        eps = new
    eps *= 1.0 + 1e-9  # not settled to the last ulp: a point slightly above is feasible, checked
    if step(eps) <= eps:
        return eps, (1.0 + math.exp(eps)) * tau
    return math.inf, 1.0  # pragma: no cover


def compose(events: Iterable[DpEvent], delta: float, adjacency: Adjacency) -> Composition:
    """A valid ε at total ``delta`` for all ``events`` together, under ``adjacency``.

    Two routes, the smaller ε wins (each is a valid bound on its own): RDP of every event; or the
    pure events' ε summed, composed by basic composition with the RDP ε of the Gaussian events.
    Raises :class:`AdjacencyError` if an event cannot be stated under ``adjacency``."""
    adj = _adjacency(adjacency)
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    evs = [e.under(adj) for e in events]
    live = [e for e in evs if e.rounds > 0]
    if not live:
        return Composition(0.0, 0.0, 0.0, adj, "none")
    if any(isinstance(e, NonPrivate) for e in live):
        return Composition(math.inf, 1.0, 0.0, adj, "non-private")
    tau = math.fsum(e.total_tv for e in live)
    approx_eps = math.fsum(e.rounds * e.epsilon for e in live if isinstance(e, ApproxDp))
    approx_delta = math.fsum(e.rounds * e.delta for e in live if isinstance(e, ApproxDp))
    if approx_delta > 0 or approx_eps > 0:  # basic composition of the legacy part with the rest
        rest = compose([e for e in live if not isinstance(e, ApproxDp)], max(0.0, delta - approx_delta), adj) \
            if delta - approx_delta >= 0 else None
        if rest is None or not math.isfinite(rest.epsilon):
            return Composition(math.inf, 1.0, 0.0, adj, "impossible")
        return Composition(rest.epsilon + approx_eps, min(delta, rest.delta + approx_delta), rest.delta_sampler, adj,
                           "basic" if rest.route == "none" else f"basic+{rest.route}")
    pure_sum = math.fsum(e.rounds * e.epsilon for e in live if isinstance(e, PureDp))
    gauss = _grouped(live, ("gaussian",))
    every = _grouped(live, ("gaussian", "pure"))
    best = (math.inf, 1.0, "impossible")
    if delta > 0:
        eps, d_s = _with_sampler(lambda d: _rdp_epsilon(every, d), tau, delta)
        best = min(best, (eps, d_s, "rdp"))
        if pure_sum > 0:
            if gauss:
                eps2, d_s2 = _with_sampler(lambda d: pure_sum + _rdp_epsilon(gauss, d), tau, delta)
                best = min(best, (eps2, d_s2, "pure+rdp"))
            else:
                eps2, d_s2 = _with_sampler(lambda d: pure_sum, tau, delta)
                best = min(best, (eps2, d_s2, "pure"))
    elif tau == 0.0 and not gauss:
        best = (pure_sum, 0.0, "pure")
    eps, d_s, route = best
    if not math.isfinite(eps):
        return Composition(math.inf, 1.0, 0.0, adj, "impossible")
    # pure ε: the mechanism's own δ is 0, so the guarantee is (ε, δ_sampler), not (ε, the target δ)
    return Composition(eps, d_s if route == "pure" else delta, d_s, adj, route)
