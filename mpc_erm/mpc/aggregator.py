"""Secure noisy weighted sum (the protocols' ``SecureAggregator``) on CrypTen over gRPC + mTLS.

What one ``aggregate`` call does at party i (all parties call it in the same order):

1. Local, in float64: ``v_i = Σ_rows w·c`` over the rows this party holds (weights are public and
   the rows are its own, so weighting before sharing is exactly as private as multiplying a share
   by a public scalar, and it avoids CrypTen's truncation protocol, which for 3+ parties needs
   wrap-count triples and is only probabilistically exact). Encode ``round(v_i·2^g)`` in int64,
   where g = 16 without noise and the noise source's grid with noise (noise and data must live
   on the same grid: :mod:`mpc_erm.mpc.noise`).
2. Range check, in the same message as the reveal (5): the number of parties whose ``v_i`` is
   non-finite or ``|v_i| ≥ 2^(63−g−margin)`` is revealed (masked, one int64 more per party). A
   party out of range sends a *uniformly random* share in place of its masked value, so the
   revealed sum is uniform and independent of every input and of the noise: if the count is not
   zero every party raises :class:`FixedPointRangeError` and what was revealed carries nothing.
   (A party refusing alone would leave the others waiting for a reveal until their deadline.
   The check as a message step of its own before the reveal cost 2.1× the raw all-reduce at
   d = 122.)
3. Input sharing without a round: party i's share is ``enc(v_i) + Σ_{j≠i} ±PRG(k_ij, t)`` with one
   AES-256-CTR key per pair of parties (exchanged once, at construction) and the call counter t
   as nonce; the masks cancel in the sum. Why not ``crypten.cryptensor(src=i)``: its PRZS masks
   come from the generators i shares with its two ring neighbours only, so for m ≥ 4 parties the
   two neighbours of i together can strip i's share of the aggregate at the reveal and learn
   ``v_i`` (plus i's noise share), more than the sum. Pairwise keys need all m−1 others.
4. Noise: this party's int64 shares of ``z`` on the grid 2^-g from the pluggable
   :class:`NoiseSource` (sampled inside the MPC, pooled offline: :class:`mpc_erm.mpc.noise.InMpcNoise`)
   are added to the share. ``NoiseSpec("none")`` (a job that asked for no privacy) adds nothing.
5. Reveal (one all_reduce, the range check's count riding along), the parties' agreement on the
   revealed words (:func:`~.agreement.agree_on`: digests all-gathered; one wrong share sent to one
   party stops every party whose view differs, before anyone uses the value), and decode exactly:
   ring value / 2^g in float64. CrypTen's ``FixedPointEncoder.decode`` is off by one for negative
   values and is never used here.

Exactness (stated and tested): with P computing parties, each holding k rows,
``|revealed − Σ w·c − z| ≤ P·2^-(g+1) + γ_k·Σ|w·c| + 2^-53·|revealed|`` where γ_k = k·2^-53/(1−k·2^-53)
is the float64 error of a k-term dot product (γ_1 = 2^-53: one rounding of ``w·c``);
see :func:`error_bound`.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.protocols.aggregation import NoiseSpec

from .agreement import agree_on
from .crypten_compat import import_crypten
from .keystream import KEY_BYTES, KeyedMasks, new_key
from .noise import COARSE_GRID_SLACK, Realisation, coarsenings, realise

crypten = import_crypten()
from crypten.communicator.communicator import Communicator  # noqa: E402  (after the compat shim)
from crypten.config import cfg  # noqa: E402  (after the compat shim)

log = logging.getLogger(__name__)

PRECISION_BITS = 16
RING_BITS = 64
DEFAULT_MARGIN_BITS = 8  # headroom for the sum of up to 2^7 parties plus noise, inside int64
_CHECK_DOMAIN = 1 << 63  # nonce bit separating the range-check stream from the data stream
_CONTRIBUTOR_DOMAIN = 1 << 62  # nonce bit of the per-contributor sharing (checked aggregates)

TFP_TRUST_MODEL = "MPC: CrypTen TFP provider (party 0 sees every triple: tests only)"
RSS_TRUST_MODEL = "MPC: CrypTen 3-party replicated sharing (honest majority, no dealer; products re-randomised)"
RSS_UNHARDENED = (
    "MPC: CrypTen 0.4.1 3-party replicated sharing NOT hardened (a product leaks the other input to "
    "party 1: tests only; call mpc_erm.mpc.dealer.harden_crypten_rss)"
)


def dealer_trust_model(name: str) -> str:
    return f"MPC: CrypTen additive sharing, dealer {name!r} (non-colluding third party)"


class FixedPointRangeError(ValueError):
    """A contribution does not fit the fixed-point ring (or is NaN/inf): refused, nothing revealed."""


class NotForProductionError(RuntimeError):
    """A test-only component (zero noise, TFP triples) was requested without ``allow_test_only``."""


@runtime_checkable
class NoiseSource(Protocol):
    """Supplies secret shares of noise for one aggregate.

    ``precision_bits(noise, p)`` is the grid 2^-g of the noise, on which the aggregate is then
    encoded; ``take(p, noise)`` returns this party's int64 additive shares (shape (p,), units
    2^-g) of noise that no party knows. The production source is
    :class:`mpc_erm.mpc.noise.InMpcNoise`.
    """

    description: str
    test_only: bool

    def precision_bits(self, noise: NoiseSpec, p: int) -> int: ...

    def take(self, p: int, noise: NoiseSpec) -> torch.Tensor: ...


class ZeroNoise:
    """Shares of zero whatever the spec asks for: NO privacy. For tests and benchmarks only.

    Never replace this by one party sampling in plaintext: that party would know the noise and
    could subtract it from the release.
    """

    description = "zero noise (tests only: no privacy)"
    test_only = True

    def precision_bits(self, noise: NoiseSpec, p: int) -> int:
        return PRECISION_BITS

    def take(self, p: int, noise: NoiseSpec) -> torch.Tensor:
        return torch.zeros(p, dtype=torch.long)


def error_bound(
    abs_terms_per_party: list[float], rows_per_party: int, revealed_abs_max: float, precision_bits: int = PRECISION_BITS
) -> float:
    """Largest |revealed − exact Σ w·c − z| the fixed-point path allows (see module docstring).

    ``abs_terms_per_party[i]`` = max over coordinates of Σ_rows |w·c| at party i.
    """
    u = 2.0**-53
    k = max(1, rows_per_party)
    gamma_k = k * u / (1 - k * u)
    parties = len(abs_terms_per_party)
    return parties * 2.0 ** -(precision_bits + 1) + gamma_k * sum(abs_terms_per_party) + u * revealed_abs_max


@dataclass
class AggregateStats:
    """What one aggregate cost this party: communicator rounds, payload bytes (sent + received)."""

    rounds: int
    bytes: int
    seconds: float


@dataclass
class AggregateTotals:
    """A party's cost over all its aggregates (the job's metrics): what :meth:`add` summed."""

    aggregates: int = 0
    rounds: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def add(self, st: AggregateStats) -> None:
        self.aggregates += 1
        self.rounds += st.rounds
        self.bytes += st.bytes
        self.seconds += st.seconds


def current_trust_model(dealer_name: str | None = None) -> str:
    """The trust model the CrypTen configuration of this process gives its multiplications."""
    provider = cfg.mpc.provider
    if provider == "TFP":
        triples = TFP_TRUST_MODEL
    elif provider == "DEALER":
        triples = dealer_trust_model(dealer_name or "dealer")
    elif provider == "RSS3" and cfg.mpc.protocol == "replicated":
        return RSS_TRUST_MODEL + "; binary triples and B2A bits made by the 3 parties under RSS (ABY3), no dealer"
    else:
        triples = f"MPC: CrypTen provider {provider}"
    if cfg.mpc.protocol == "replicated":
        from crypten.mpc.primitives import replicated

        rss = RSS_TRUST_MODEL if getattr(replicated, "_mpc_erm_hardened", False) else RSS_UNHARDENED
        # Arithmetic products use RSS; binary AND and B2A (comparisons) still ask the provider.
        return f"{rss}; comparisons' triples: {triples.removeprefix('MPC: ')}"
    return triples


class MpcAggregator:
    """``SecureAggregator`` for one party of a CrypTen job on the gRPC communicator.

    Build it after ``init_crypten`` (and the dealer client, if any) in every party, in the same
    order: the constructor exchanges the pairwise mask keys (one message per pair).
    """

    def __init__(
        self,
        noise_source: NoiseSource,
        *,
        comm: Communicator | None = None,
        allow_test_only: bool = False,
        margin_bits: int = DEFAULT_MARGIN_BITS,
        bounds: Sequence[float] | None = None,
        on_refused: Callable[[int, list[int]], None] | None = None,
    ) -> None:
        """``bounds``: the public ℓ2 bound of each party's weighted contribution (by rank, e.g.
        :meth:`~mpc_erm.privacy.plan.PrivacyPlan.member_bound`): every :meth:`aggregate` then checks
        each party's contribution on its shares before the sum (:mod:`.validation`) and leaves a
        failing one out (:attr:`refused`); None: unchecked. ``on_refused(k, ranks)``: the ranks
        whose contribution to the k-th checked aggregate (from 0) failed (to name them)."""
        self.comm = comm if comm is not None else crypten.communicator.get()
        if self.comm is None:
            raise RuntimeError("MpcAggregator: CrypTen is not initialised (call init_crypten first)")
        if getattr(noise_source, "test_only", False) and not allow_test_only:
            raise NotForProductionError(f"noise source {noise_source.description!r} is for tests only")
        self.rank: int = self.comm.get_rank()
        self.world_size: int = self.comm.get_world_size()
        if not 0 <= self.rank < self.world_size:
            raise ValueError("MpcAggregator runs in the computing parties, not in the dealer")
        if self.world_size > 2 ** (margin_bits - 1):
            raise ValueError(f"margin_bits={margin_bits} leaves no headroom for {self.world_size} parties")
        dealer = None
        table = getattr(self.comm, "table", None)
        if table is not None and table.dealer is not None:
            dealer = table.dealer.name
        self.trust_model = current_trust_model(dealer)
        if "tests only" in self.trust_model and not allow_test_only:
            raise NotForProductionError(f"{self.trust_model}: refused without allow_test_only")
        if getattr(noise_source, "test_only", False):
            self.trust_model += f"; noise: {noise_source.description}"
        self.noise_source = noise_source
        self.margin_bits = margin_bits
        if bounds is not None and len(bounds) != self.world_size:
            raise ValueError(f"bounds: one per party ({self.world_size}), got {len(bounds)}")
        self.bounds = None if bounds is None else tuple(float(b) for b in bounds)
        self.trust_model += ("; every party's contribution checked on its shares against its public ℓ2 bound (one bit "
                             "revealed each; a failing one left out)" if self.bounds is not None else "")
        self.refused: list[list[int]] = []  # per checked aggregate, the ranks whose contribution failed
        self.on_refused = on_refused
        self.limit = self._limit(PRECISION_BITS)
        self.precision_bits = PRECISION_BITS  # of the last aggregate
        self._counter = 0
        self.totals = AggregateTotals()
        self.last: AggregateStats | None = None
        self._keys = self._exchange_keys()
        self._keystream = KeyedMasks()

    def realise(self, plan: PrivacyPlan) -> Realisation:
        """:func:`realise_checked` for this aggregator's parties and bounds."""
        return realise_checked(plan, self.world_size, self.bounds)

    # ------------------------------------------------------------------ setup

    def _exchange_keys(self) -> dict[int, bytes]:
        """One fresh AES key per pair, chosen by the lower rank and sent over mTLS."""
        keys: dict[int, bytes] = {}
        for j in range(self.world_size):
            if j > self.rank:
                keys[j] = new_key()
                self.comm.send(torch.frombuffer(bytearray(keys[j]), dtype=torch.uint8), j)
        for j in range(self.rank):
            got = self.comm.recv(torch.zeros(KEY_BYTES, dtype=torch.uint8), j)
            keys[j] = bytes(got.numpy().tobytes())
        return keys

    def _add_mask(self, x: torch.Tensor, nonce: int) -> None:
        """Add this party's share of a pseudo-random sharing of zero to ``x`` (int64, in place):
        +PRG(k_ij) towards each higher rank j, −PRG(k_ij) towards each lower; they cancel in the sum."""
        for j, key in self._keys.items():
            r = self._keystream.words(key, nonce, x.numel())
            if self.rank < j:
                x.add_(r)
            else:
                x.sub_(r)

    def _limit(self, g: int) -> float:
        return 2.0 ** (RING_BITS - 1 - g - self.margin_bits)

    # ------------------------------------------------------------------ the interface

    def aggregate(self, contributions: torch.Tensor, weights: torch.Tensor, noise: NoiseSpec) -> torch.Tensor:
        """Reveal ``Σ_parties Σ_rows w·c + z`` (float64, shape (p,)); see the module docstring."""
        if contributions.ndim != 2 or weights.ndim != 1 or weights.shape[0] != contributions.shape[0]:
            raise ValueError(
                f"contributions (k, p) and weights (k,) expected, got {tuple(contributions.shape)} "
                f"and {tuple(weights.shape)}"
            )
        p = int(contributions.shape[1])
        if p < 1:
            raise ValueError("contributions must have at least one column")
        t, g, tic, stats0 = self._begin(noise, p)
        limit = self._limit(g)
        local = weights.detach().to("cpu", torch.float64) @ contributions.detach().to("cpu", torch.float64)
        lo, hi = torch.aminmax(local)  # one pass; a NaN makes both comparisons false
        bad = not (bool(hi < limit) and bool(lo > -limit))

        share = torch.empty(p + 1, dtype=torch.long)
        body = share[:p]
        if bad:  # a uniform share: the revealed sum is uniform, independent of every input (step 2)
            body.copy_(torch.frombuffer(bytearray(secrets.token_bytes(8 * p)), dtype=torch.long))
        else:
            body.copy_(local.mul_(float(2**g)).round_())  # local is this call's own temporary
            if self.bounds is None:
                self._add_mask(body, t)
        if self.bounds is not None:
            body.copy_(self._checked_sum(body, t, g))
        return self._noise_and_reveal(share, bad, g, limit, t, noise, tic, stats0).to(contributions.device)

    def _checked_sum(self, mine: torch.Tensor, t: int, g: int) -> torch.Tensor:
        """This party's share of the sum of the contributions that pass the bound check.

        Each party's encoded contribution is shared on its own (no message: party i holds
        ``enc(v_i) − Σ_j PRG(k_ij, (t, i))``, party j ≠ i holds ``PRG(k_ij, (t, i))``), so the
        parties hold shares of every contribution apart and check each against its bound
        (:func:`~.validation.check_contributions`, one opened bit each); the failing ones are left
        out by all parties alike and recorded in :attr:`refused`."""
        from .validation import CheckPlan, bound_units, check_contributions

        assert self.bounds is not None
        p = int(mine.numel())
        rows = torch.empty(self.world_size, p, dtype=torch.long)
        for c in range(self.world_size):
            nonce = _CONTRIBUTOR_DOMAIN | (c << 40) | t
            if c == self.rank:
                rows[c] = mine
                for key in self._keys.values():
                    rows[c].sub_(self._keystream.words(key, nonce, p))
            else:
                rows[c] = self._keystream.words(self._keys[c], nonce, p)
        plan = CheckPlan(p, tuple(bound_units(b, g, p) for b in self.bounds))
        ok = check_contributions(rows, plan, self.comm)
        self.refused.append([c for c in range(self.world_size) if not ok[c]])
        if self.refused[-1] and self.on_refused is not None:
            self.on_refused(len(self.refused) - 1, self.refused[-1])
        return rows[torch.tensor(ok, dtype=torch.bool)].sum(0)

    def aggregate_shares(self, owner_share_sum: torch.Tensor, grid_bits: int, noise: NoiseSpec) -> torch.Tensor:
        """Reveal ``Σ_owners v + z`` (float64, shape (p,)) from this compute party's sum of its
        data owners' shares (int64 on the grid 2^-grid_bits: :mod:`parties.owner.shares`).

        The owners' shares are already an additive sharing of the sum, so steps 1–3 reduce to
        adding this party's pairwise masks (a re-randomisation that keeps one reveal path); the
        noise and the reveal are those of :meth:`aggregate`. ``grid_bits`` is what the owners
        encoded with and must be the noise's grid. The sum is of contributions the compute parties
        already checked against their bound (:mod:`parties.owner.rounds`, :mod:`.validation`)."""
        if owner_share_sum.dtype != torch.long or owner_share_sum.ndim != 1 or owner_share_sum.numel() < 1:
            raise ValueError(f"owner_share_sum: a non-empty int64 vector expected, got {owner_share_sum.dtype} of "
                             f"shape {tuple(owner_share_sum.shape)}")
        p = int(owner_share_sum.numel())
        t, g, tic, stats0 = self._begin(noise, p)
        if g != grid_bits:
            raise ValueError(f"grid_bits: the owners encoded on 2^-{grid_bits}, the noise lives on 2^-{g}")
        share = torch.empty(p + 1, dtype=torch.long)
        share[:p].copy_(owner_share_sum.to("cpu"))
        self._add_mask(share[:p], t)
        return self._noise_and_reveal(share, False, g, self._limit(g), t, noise, tic, stats0)

    def _begin(self, noise: NoiseSpec, p: int) -> tuple[int, int, float, dict[str, Any]]:
        """A call's number t (the masks' nonce), its grid bits g, and its start (time, traffic)."""
        stats0 = self.comm.get_communication_stats()
        tic = time.perf_counter()
        t = self._counter
        self._counter += 1
        g = PRECISION_BITS if noise.mechanism == "none" else int(self.noise_source.precision_bits(noise, p))
        return t, g, tic, stats0

    def _noise_and_reveal(self, share: torch.Tensor, bad: bool, g: int, limit: float, t: int, noise: NoiseSpec,
                          tic: float, stats0: dict[str, Any]) -> torch.Tensor:
        """Steps 4–5: add this party's noise share (unless ``bad``), the masked range-check count,
        one all_reduce, the exact decode, and the call's statistics."""
        p = int(share.numel()) - 1
        body = share[:p]
        scale = float(2**g)
        if noise.mechanism != "none":  # taken in every case: all parties draw the pool in step
            z = self.noise_source.take(p, noise)
            if z.dtype != torch.long or tuple(z.shape) != (p,):
                raise ValueError(
                    f"noise source {self.noise_source.description!r} returned {z.dtype} shape {tuple(z.shape)}, "
                    f"expected int64 shares of shape ({p},)"
                )
            if not bad:
                body += z.to("cpu")
        share[p] = int(bad)  # the range check's count, masked
        self._add_mask(share[p:], _CHECK_DOMAIN | t)
        ring = self.comm.all_reduce(share)
        agree_on(self.comm, f"aggregate #{t}", ring)  # the same value at every party, or nobody uses it
        n_bad = int(ring[p])
        if n_bad != 0:
            mine = " (including this party's)" if bad else ""
            raise FixedPointRangeError(
                f"aggregate #{t}: {n_bad} of {self.world_size} parties' weighted contributions{mine} are NaN/inf "
                f"or reach |x| >= 2^{RING_BITS - 1 - g - self.margin_bits} "
                f"(int64 ring, {g} fractional bits, {self.margin_bits} bits of headroom); nothing revealed"
            )
        # int64 -> float64 is exact below 2^53; the division by 2^g is exact.
        result = ring[:p].to(torch.float64).div_(scale)
        self.precision_bits = g
        self.limit = limit

        stats1 = self.comm.get_communication_stats()
        st = AggregateStats(
            rounds=stats1["rounds"] - stats0["rounds"],
            bytes=stats1["bytes"] - stats0["bytes"],
            seconds=time.perf_counter() - tic,
        )
        self.last = st
        self.totals.add(st)
        return result

    def describe(self) -> dict[str, Any]:
        """Trust model and cumulative cost, for the job report."""
        return {
            "trust_model": self.trust_model,
            "parties": self.world_size,
            "aggregates": self.totals.aggregates,
            "rounds": self.totals.rounds,
            "bytes": self.totals.bytes,
            "seconds": self.totals.seconds,
            "limit_abs": self.limit,
            "resolution": 2.0**-self.precision_bits,
        }


__all__ = [
    "AggregateStats",
    "AggregateTotals",
    "FixedPointRangeError",
    "MpcAggregator",
    "NoiseSource",
    "RSS_TRUST_MODEL",
    "RSS_UNHARDENED",
    "TFP_TRUST_MODEL",
    "NotForProductionError",
    "ZeroNoise",
    "current_trust_model",
    "dealer_trust_model",
    "error_bound",
    "realise_checked",
]


def realise_checked(plan: PrivacyPlan, parties: int, bounds: Sequence[float] | None) -> Realisation:
    """The plan's noise on the default grid, or — when the in-MPC bound check's exact squared norms
    do not fit its int64 ring there (large d, fine grid) — on the finest coarser grid where they
    do, while rounding adds at most :data:`~.noise.COARSE_GRID_SLACK` to the sensitivity (the
    noise meets the plan on it, rounding counted). Raises a ValueError naming the job's fields
    when none fits: before anything is charged, where the check itself used to fail at the first
    round, after the round was marked. ``bounds`` None: unchecked, the default grid."""
    from .validation import CheckPlan, ValidationError, bound_units

    if bounds is None:
        return realise(plan, parties)
    dim = int(plan.dim or 0)
    for real in coarsenings(plan, parties):
        try:
            CheckPlan(dim, tuple(bound_units(b, real.plan.grid_bits, dim) for b in bounds))
            return real
        except ValidationError as exc:
            refusal = exc
    raise ValueError(f"privacy.clip / job.features: the parties' contribution bounds over {dim} coordinates fit the "
                     f"in-MPC bound check on no grid whose rounding adds at most {COARSE_GRID_SLACK:.0%} to the "
                     f"sensitivity ({refusal}); fewer features or a larger ε fit")
