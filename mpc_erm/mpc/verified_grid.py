"""The grid and the proof statements of ``security = "malicious"`` (:mod:`.verified_aggregator`):
what every compute party and every data owner proves, and the finest grid on which those fit F_p.
Apart from the aggregator, so that a data owner plans the grid its compute parties take.
"""

from __future__ import annotations

from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.protocols.aggregation import NoiseSpec

from . import norm_proof as N
from .local_noise import DistributedNoise
from .noise import COARSE_GRID_SLACK, Realisation, coarsenings
from .validation import bound_units

__all__ = ["MALICIOUS_GRID_SLACK", "owner_statement", "party_bounds", "realise_verified", "statements"]

_PARTIES = 3
#: The coarsest grid the mode may take to fit its statements (:data:`~.noise.COARSE_GRID_SLACK`).
MALICIOUS_GRID_SLACK = COARSE_GRID_SLACK
#: A statement may range-check at most max(d, 2^14) bits: its proof then at most about doubles
#: the words each input deals, where a finer grid would cost up to 6× (d = 26,010 at M = 2^24).
_MIN_BIT_ALLOWANCE = 1 << 14


def statements(noise: DistributedNoise, bounds: tuple[float, ...], p: int, g: int,
               spec: NoiseSpec) -> list[N.NormSpec]:
    """Each party's statement, by rank: its contribution within its bound plus its noise share
    within :meth:`~.local_noise.DistributedNoise.norm_bound`, over ``p`` coordinates on the grid
    2^-g. Raises a ValueError naming ``job.security`` when one does not fit F_p."""
    extra = noise.norm_bound(spec, p)
    try:
        return [N.NormSpec(p, bound_units(b, g, p) + extra) for b in bounds]
    except N.NormProofError as exc:
        raise ValueError(
            f'job.security: "malicious" cannot prove this job\'s inputs: each party proves its contribution '
            f"(bound {max(bounds):.4g}, from privacy.clip and, with sampling, the batch cap) plus its "
            f"noise share (bound {extra / 2.0 ** g:.4g}) over {p} coordinates on the grid 2^-{g} (the "
            f"coarsest whose rounding adds at most {MALICIOUS_GRID_SLACK:.0%} to the sensitivity), and {exc}; "
            'a lower sampling rate or fewer parameters fit; or run security = "semi-honest"'
        ) from None


def party_bounds(plan: PrivacyPlan, parties: int, owners: bool) -> tuple[float, ...]:
    """Each compute party's public contribution bound, by rank: its rows' (``plan.member_bound``),
    or zero in a job with data owners, where a compute party's input is its noise share alone.
    What its aggregator proves against and what every member, owners included, plans the grid by."""
    return (0.0,) * parties if owners else tuple(plan.member_bound(j) for j in range(parties))


def owner_statement(bound: float, p: int, g: int) -> N.NormSpec:
    """Every data owner's statement: its weighted contribution within ``bound`` over ``p``
    coordinates on the grid 2^-g (ValueError naming ``job.security`` if it does not fit F_p)."""
    try:
        return N.NormSpec(p, bound_units(bound, g, p))
    except N.NormProofError as exc:
        raise ValueError(f'job.security: "malicious" cannot prove the owners\' contributions (bound {bound:.4g}) over '
                         f"{p} coordinates on the grid 2^-{g}: {exc}; fewer parameters fit, or run "
                         'security = "semi-honest"') from None


def realise_verified(plan: PrivacyPlan, noise: DistributedNoise, bounds: tuple[float, ...],
                     owner_bound: float | None = None) -> Realisation:
    """The realisation of a malicious-secure job: the finest grid at which every party's statement
    (:func:`statements`) fits F_p within its bit allowance, the default grid first, then coarser
    while rounding adds at most :data:`MALICIOUS_GRID_SLACK` to the sensitivity; if none is
    within the allowance, the one of fewest bits that fits. The noise meets the plan on whichever
    grid is taken (:func:`~.noise.realise` counts the rounding); only the rounding's share of it
    grows. ``owner_bound``: a job with data owners, whose every contribution's statement must fit
    too. Raises a ValueError naming ``job.security`` when no grid fits."""
    dim = int(plan.dim or 0)
    allowance = max(dim, _MIN_BIT_ALLOWANCE)
    cheapest: tuple[int, Realisation] | None = None
    refusal: ValueError | None = None
    for real in coarsenings(plan, _PARTIES):
        try:
            every = statements(noise, bounds, dim, real.plan.grid_bits, real.spec)
            if owner_bound is not None:
                every.append(owner_statement(owner_bound, dim, real.plan.grid_bits))
            bits = max(s.shape.bit_count for s in every)
        except ValueError as exc:  # a coarser grid may fit (a finer one never fits where this does not)
            refusal = exc
            continue
        if bits <= allowance:
            return real
        if cheapest is None or bits < cheapest[0]:
            cheapest = (bits, real)
    if cheapest is not None:
        return cheapest[1]
    assert refusal is not None  # the default grid was tried: it fitted, or it raised
    raise refusal
