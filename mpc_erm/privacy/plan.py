"""One job's privacy, planned once: :class:`PrivacyPlan`.

A plan is made from the job's spec (and, once the members have agreed on them, the public record
counts and the model's dimension) and nothing downstream re-derives any of it: the protocol reads
the weights and the sensitivity, the MPC engine realises the noise (grid, sampler parameters) to
match the plan's noise multiplier exactly, the ledger reserves and composes the plan's
:class:`~mpc_erm.privacy.events.DpEvent`, the report states the plan, and ``mpc-erm report
verify`` recomputes ε from the report's event alone. Every caller plans a job through one
function, :func:`mpc_erm.privacy.plan.plan_job` (the job file's check, the daemon's admission,
the worker, a data owner, the simulator, ``job plan``): the same public inputs give the same plan,
and the ledger refuses to let a worker reveal under an event other than the one reserved at
admission.

**What is public** (docs/explanation/privacy.md, "What is public"):

* ``replace`` (one record replaced): the number of records is the same in neighbouring data sets,
  so every party's exact count n_j is shared with the other members at the job's agreement,
  published in the report, and the aggregates are normalised by it. Sensitivities: gradient 2C/n
  (pooled) or 2C/(m·n_min) (thesis weights); output 2G/(nλ) or 2G/(m·n_min·λ), plus the local
  solvers' certified error.
* ``add_remove`` (one record added or removed): a count is itself a statistic of the data, so no
  party's count leaves it. The job names a public normaliser ``privacy.public_n`` (an agreed
  round figure, not the exact count) and every aggregate is divided by it:
  gradient  Σ_all clip_C(∇ℓ_i)/n̂, sensitivity C/n̂ (one clipped gradient more or less);
  output    Σ_j (n_j/n̂)·θ̂_j, each party weighting its own model by its own count, sensitivity
            3G/(n̂λ) + 2τ: for an addition at party j, (n_j+1)θ̂'_j − n_jθ̂_j =
            n_j(θ̂'_j − θ̂_j) + θ̂'_j with ‖θ̂'_j − θ̂_j‖ ≤ 2G/((n_j+1)λ) and ‖θ̂'_j‖ ≤ G/λ; a
            removal is the same with the roles swapped. Each party certifies its solver error
            ≤ τ·n̂/n_j, so the solvers add at most 2τ. The thesis's weights 1/(m·n_j) need every
            n_j and are refused under add/remove.
  A poor n̂ costs accuracy (the step size or the model's scale is off by n/n̂), never privacy.
* federated, ``sampling = "uniform"``: the N = ``privacy.public_n`` owners the job lists are public
  slots, exactly s = τN of them drawn each round without replacement, an absent or undrawn owner
  a zero update; one owner replaced or absent moves the sum by ≤ 2𝓛, so the sensitivity is 2𝓛/s
  under either adjacency and the event carries ``population`` = N (events module).
* knowledge transfer (``[transfer]``, an output job): the release is the teacher's scores on m
  public rows X̃ (:mod:`mpc_erm.models.public_features`), so every output sensitivity above is
  multiplied by ‖X̃‖₂ (certified, stated in the plan and recomputed by ``report verify``):
  ‖X̃(θ̂ − θ̂')‖ ≤ ‖X̃‖₂·‖θ̂ − θ̂'‖ for any neighbouring data sets, the noise is added over the m·K
  scores and the weights never leave the MPC.

**Noise.** ``sampler = "mpc"`` (daemons): the discrete Gaussian or discrete Laplace sampled
inside the MPC on a fixed-point grid. The Gaussian is accounted by RDP (or the zCDP conversion)
only, because its privacy-loss distribution is not the continuous one's (events module); the
continuous GDP and PLD accountants are refused for it, naming ``privacy.accountant``. δ is split:
99 % for the mechanism, :data:`SAMPLER_DELTA_SHARE` for the sampler's distance to the ideal law,
whose per-release TV budget the event carries and the engine must meet (it refuses before any
reveal otherwise). A pure-ε (discrete Laplace) job's δ is its sampler's alone: the same share of
the job's δ, so its report states (ε, δ/100). ``sampler = "ideal"`` (the in-process simulator): continuous noise, every
accountant, no sampler term.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from mpc_erm.spec import JobSpec

from . import _checks
from .accountants import noise_multiplier_for
from .distributed import NoiseSplit
from .errors import PlanError
from .events import Composition, DpEvent, GaussianRounds, NonPrivate, PureDp, compose, wor_sample_size
from .report import PrivacyReport, Security
from .sensitivity import gradient_sensitivity, l1_from_l2, output_perturbation_sensitivity
from .transfer import TransferPlan, transfer_plan

if TYPE_CHECKING:  # a type only: the plan's arithmetic is loaded without torch
    from mpc_erm.models.networks import NetworkBuilder

__all__ = ["SAMPLER_DELTA_SHARE", "PlanError", "PrivacyPlan", "PublicSizes", "TransferPlan", "plan_job",
           "public_sizes"]

SAMPLER_DELTA_SHARE = 0.01  # of the job's δ, for the in-MPC samplers' total-variation term
Sampler = Literal["mpc", "ideal"]
MPC_ACCOUNTANTS = ("rdp", "zcdp")


@dataclass(frozen=True)
class PublicSizes:
    """What every member may know about the record counts.

    ``counts``: every party's exact n_j (``replace`` only); ``public_n``: the public normaliser n̂
    (``add_remove`` only)."""

    counts: tuple[int, ...] | None = None
    public_n: int | None = None

    def __post_init__(self) -> None:
        if (self.counts is None) == (self.public_n is None):
            raise ValueError("PublicSizes: give exactly one of counts (replace) or public_n (add_remove)")
        if self.counts is not None and (not self.counts or any(int(c) != c or c < 1 for c in self.counts)):
            raise ValueError(f"counts: every party needs at least one row, got {list(self.counts)[:5]}")
        if self.public_n is not None and (isinstance(self.public_n, bool) or int(self.public_n) < 1):
            raise ValueError(f"public_n must be a positive integer, got {self.public_n!r}")

    @property
    def n(self) -> int:
        """The count aggregates are normalised by: Σ n_j (replace) or n̂ (add_remove)."""
        return sum(self.counts) if self.counts is not None else int(self.public_n)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PrivacyPlan:
    """A job's privacy, immutable. Make it with :meth:`make`; bind sizes with :meth:`with_sizes`."""

    method: str  # "output" | "gradient"
    mechanism: str  # "gaussian" | "laplace" | "l2_laplace" (ideal sampler only) | "none"
    sampler: Sampler
    adjacency: str
    weighting: str
    accountant: str  # what computes ε from the event: "rdp" | "zcdp" | "gdp" | "pld" | "pure" | "none"
    epsilon: float  # target ε of the job (the guarantee is ≤ this)
    delta: float  # total δ of the job, sampler term included
    rounds: int
    noise_multiplier: float | None  # Gaussian: σ / Δ₂
    epsilon_per_release: float | None  # Laplace: ε of each release (Δ₁/b)
    sampler_tv_per_release: float  # budget the engine must meet (0 for the ideal sampler)
    clip: float  # gradient: C; output: the loss's Lipschitz constant G on the minimisers' ball
    lam: float
    solver_tol: float
    ls_sigma: float
    public_n: int | None  # add_remove: the public normaliser n̂
    sampling_rate: float = 1.0  # gradient: Poisson rate q of each round's records (DP-SGD); 1: full batch
    sizes: PublicSizes | None = None
    dim: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    unit: str = "record"  # what one neighbouring data set adds or removes: "record", or "owner" (federated)
    # federated uniform sampling: N = public_n owner slots, exactly s = q·N drawn a round without
    # replacement; the noise multiplier is then relative to the replace-one shift 2·clip
    population: int | None = None
    # with population: each member's count of slots whose draws it sees (an owner its own slot), so
    # that ε holds against each such member's view as well as an outside observer's (member_view)
    member_rows: tuple[int, ...] = ()
    # distributed noise (mpc_erm.privacy.distributed): how many compute parties add a share and how
    # many of them carry the guarantee; None: the noise is sampled inside the MPC
    noise_split: NoiseSplit | None = None
    # knowledge transfer: the release is the teacher's scores on public rows (module doc)
    transfer: TransferPlan | None = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def make(cls, spec: JobSpec, *, clip: float, sampler: Sampler = "mpc", test_no_noise: bool = False,
             sizes: PublicSizes | None = None, dim: int | None = None,
             noise_split: NoiseSplit | None = None, transfer: TransferPlan | None = None) -> PrivacyPlan:
        """Plan ``spec`` (a :class:`mpc_erm.spec.JobSpec`); ``clip`` is C (gradient) or
        the loss's Lipschitz constant G (output), which the protocol layer knows.

        The event does not depend on ``sizes`` or ``dim`` (the noise multiplier is relative to the
        sensitivity, the TV budget is per release), so a daemon can reserve it at admission and
        the worker bind the agreed sizes later; the two plans have the same event.

        ``noise_split``: with ``privacy.noise = "distributed"``, the job's compute parties and how
        many of them its trust model counts honest (:func:`~.distributed.noise_split`); a plan made
        without one (a simulation of the spec alone) assumes 3 replicated parties and says so."""
        pv, tr = spec.privacy, spec.training
        adj, weighting, method = pv.adjacency, tr.weighting, spec.method
        eps, delta = float(pv.epsilon), float(pv.delta)
        rounds = tr.iterations if method == "gradient" else 1
        q = float(getattr(tr, "sampling_rate", 1.0))
        population = cls._population(spec)
        rows = cls._pooled_rows(spec)
        if rows is not None:  # exactly b of the N pooled rows a round: q = b/N, replace-one (spec checks)
            population, q = sum(rows), int(tr.batch_size) / sum(rows)
        if q < 1.0 and rows is None:
            if adj != "add_remove":
                raise PlanError("privacy.adjacency", "Poisson-subsampled rounds (training.sampling_rate < 1) are "
                                "accounted under add/remove adjacency: set adjacency = 'add_remove' and the public "
                                "normaliser privacy.public_n")
            if pv.accountant in ("gdp", "zcdp"):
                raise PlanError("privacy.accountant", f"{pv.accountant!r} is exact for full batches only; "
                                "subsampled rounds are accounted by 'rdp' or 'pld'")
        if adj == "add_remove":
            if pv.public_n is None:
                raise PlanError("privacy.public_n", "add/remove adjacency keeps every party's record count "
                                "private; name the public count the aggregates are divided by")
            if weighting == "thesis":
                raise PlanError("training.weighting", "the thesis's weights 1/(m·n_j) publish every party's count, "
                                "which add/remove adjacency protects; use 'pooled' with privacy.public_n")
        elif pv.public_n is not None:
            raise PlanError("privacy.public_n", "only for adjacency = 'add_remove' (under 'replace' the exact "
                            "counts are public and used)")
        if method == "output" and tr.ls_sigma != 0:
            raise PlanError("training.ls_sigma", "Laplacian smoothing applies to gradient rounds; output "
                            "perturbation releases one noisy model")
        base = dict(method=method, sampler=sampler, adjacency=adj, weighting=weighting, epsilon=eps, delta=delta,
                    rounds=rounds, clip=_checks.positive("clip", clip), lam=float(spec.model.lam),
                    solver_tol=float(tr.solver_tol), ls_sigma=float(tr.ls_sigma), public_n=pv.public_n,
                    sampling_rate=q, unit="owner" if getattr(spec, "federated", None) is not None else "record",
                    population=population,
                    member_rows=rows if rows is not None else (1,) if population is not None else (),
                    transfer=transfer)
        if test_no_noise:
            return cls(mechanism="none", accountant="none", noise_multiplier=None, epsilon_per_release=None,
                       sampler_tv_per_release=0.0, notes=("TEST-ONLY ZERO-NOISE RUN: NO PRIVACY",),
                       **base)._bound(sizes, dim)
        mech = "gaussian" if method == "gradient" else {"gaussian": "gaussian", "laplace_thesis": "laplace",
                                                         "l2_laplace": "l2_laplace"}[pv.mechanism]
        if pv.noise == "distributed":
            if mech != "gaussian":
                raise PlanError("privacy.noise", "distributed noise is Gaussian; set mechanism = 'gaussian'")
            base["noise_split"] = noise_split or NoiseSplit(3, 2)
            if noise_split is None:
                base["notes"] = ("distributed noise: assumed 3 replicated compute parties, one of which may be "
                                 "corrupt (the job file's trust model decides it for a real job)",)
        if mech == "l2_laplace" and sampler == "mpc":
            raise PlanError("privacy.mechanism", "'l2_laplace' is not sampled inside the MPC; use 'gaussian' (ε, δ) "
                            "or 'laplace_thesis' (pure ε per coordinate with Δ₁ = √d·Δ₂)")
        if mech == "gaussian":
            acc = pv.accountant or ("rdp" if sampler == "mpc" or q < 1.0 else "gdp")
            if sampler == "mpc" and acc not in MPC_ACCOUNTANTS:
                raise PlanError("privacy.accountant", f"{acc!r} is exact for the continuous Gaussian only; the "
                                "in-MPC discrete Gaussian is accounted by its Rényi divergence: use 'rdp' or 'zcdp'")
            if not delta > 0:
                raise PlanError("privacy.delta", "the Gaussian mechanism needs δ > 0")
            plan = cls(mechanism=mech, accountant=acc, noise_multiplier=1.0, epsilon_per_release=None,
                       sampler_tv_per_release=0.0, **base).at_epsilon(eps)
            if acc in ("rdp",) and plan.guarantee().epsilon > eps * (1 + 1e-9):  # pragma: no cover - guard
                raise PlanError("privacy.epsilon", "the calibrated noise does not meet the target (accountant bug)")
            return plan._bound(sizes, dim)
        # pure ε: per-coordinate Laplace (in MPC or ideal), or ℓ2-Laplace (ideal sampler only)
        if sampler == "mpc" and not delta > 0:
            raise PlanError("privacy.delta", "the in-MPC discrete Laplace is within a tiny total-variation distance "
                            "of the ideal one, which costs a δ; set delta > 0 (1e-10 is ample)")
        return cls(mechanism=mech, accountant="pure", noise_multiplier=None, epsilon_per_release=eps,
                   sampler_tv_per_release=0.0, **base).at_epsilon(eps)._bound(sizes, dim)

    def at_epsilon(self, epsilon: float) -> PrivacyPlan:
        """The same job (mechanism, accountant, δ, rounds, sampling, sizes) calibrated for the target
        ``epsilon``: the noise multiplier the accountant needs at δ less the sampler's share
        (Gaussian) or ε per release (pure ε), and the sampler's TV budget. :meth:`make` calibrates
        through it; a ledger refusal asks it for the largest ε that still fits."""
        eps = _checks.positive("epsilon", epsilon)
        if self.mechanism == "none":
            return self
        share = SAMPLER_DELTA_SHARE if self.sampler == "mpc" else 0.0
        if self.mechanism == "gaussian":
            # the sampler's share of δ, for the TV of every release of the job
            tv = share * self.delta / ((1.0 + math.exp(eps)) * self.rounds)
            z = noise_multiplier_for(self.accountant, eps, self.delta * (1.0 - share), self.rounds,  # type: ignore[arg-type]
                                     sampling_rate=self.sampling_rate, adjacency="add_remove",
                                     discrete=self.sampler == "mpc", population=self.population,
                                     member_rows=self.member_rows)
            return replace(self, epsilon=eps, noise_multiplier=z, sampler_tv_per_release=tv)
        # pure ε: the sampler's share as for the Gaussian, a budget far above what it needs (≈ d·5e-16
        # per release) and small enough that a data set's composition is not charged a whole job's δ
        return replace(self, epsilon=eps, epsilon_per_release=eps,
                       sampler_tv_per_release=share * self.delta / (1.0 + math.exp(eps)))

    @staticmethod
    def _population(spec: JobSpec) -> int | None:
        """N for a federated job that draws exactly τ·N owners a round ("uniform"), else None."""
        fed = getattr(spec, "federated", None)
        if fed is None or getattr(fed, "sampling", "poisson") != "uniform":
            return None
        pv, q = spec.privacy, float(spec.training.sampling_rate)
        if pv.public_n is None:
            raise PlanError("privacy.public_n", "uniform owner sampling draws τ·N of the N owners the job lists: "
                            "name N")
        if pv.accountant not in (None, "rdp"):
            raise PlanError("privacy.accountant", f"{pv.accountant!r}: rounds on a uniform sample of owners without "
                            "replacement are accounted by 'rdp' only")
        try:
            whole = q < 1.0 and wor_sample_size(int(pv.public_n), q) > 0
        except ValueError:
            whole = False
        if not whole:
            raise PlanError("training.sampling_rate", f"uniform owner sampling: τ·public_n = {q * pv.public_n:.12g} "
                            f"must be a whole number in [1, N = {pv.public_n}) (exactly s = τN owners a round), "
                            "so τ < 1")
        return int(pv.public_n)

    @staticmethod
    def _pooled_rows(spec: JobSpec) -> tuple[int, ...] | None:
        """The parties' public row counts (ascending) of a job whose batch is exactly b of the pooled
        rows (``training.batch_size``), else None."""
        tr, pv = spec.training, spec.privacy
        if getattr(tr, "batch_size", None) is None:
            return None
        if pv.accountant not in (None, "rdp"):
            raise PlanError("privacy.accountant", f"{pv.accountant!r}: rounds on a batch drawn without replacement "
                            "are accounted by 'rdp' only")
        assert pv.party_rows is not None  # JobSpec._batches
        return tuple(sorted(int(n) for n in pv.party_rows.values()))  # one order, whatever the file's

    def _bound(self, sizes: PublicSizes | None, dim: int | None) -> PrivacyPlan:
        if sizes is None and self.adjacency == "add_remove":
            sizes = PublicSizes(public_n=self.public_n)
        return self.with_sizes(sizes, dim) if sizes is not None or dim is not None else self

    def with_sizes(self, sizes: PublicSizes | None, dim: int | None) -> PrivacyPlan:
        """The same plan with the agreed public sizes and the model dimension bound."""
        if sizes is not None:
            if self.adjacency == "replace" and sizes.counts is None:
                raise ValueError("sizes: a replace-one plan normalises by the exact counts (PublicSizes.counts)")
            if self.adjacency == "add_remove" and (sizes.counts is not None or sizes.public_n != self.public_n):
                raise ValueError("sizes: an add/remove plan may know only the public normaliser privacy.public_n")
            if self.unit == "record" and self.population is not None and \
                    sorted(sizes.counts or ()) != sorted(self.member_rows):
                raise PlanError("privacy.party_rows", f"the job file states the counts {list(self.member_rows)}, "
                                f"the parties hold {list(sizes.counts or ())}; the accounting needs their true counts")
        if dim is not None:
            _checks.positive_int("dim", dim)
        return replace(self, sizes=sizes if sizes is not None else self.sizes, dim=dim if dim is not None else self.dim)

    # ------------------------------------------------------------------ what the consumers read

    @property
    def event(self) -> DpEvent:
        """The privacy event of the whole job (all its releases) — what the ledger composes."""
        if self.mechanism == "none":
            return NonPrivate(rounds=self.rounds, adjacency=self.adjacency)  # type: ignore[arg-type]
        if self.mechanism == "gaussian":
            return GaussianRounds(rounds=self.rounds, adjacency=self.adjacency,  # type: ignore[arg-type]
                                  sampler_tv=self.sampler_tv_per_release, noise_multiplier=self.noise_multiplier,
                                  sampling_rate=self.sampling_rate, discrete=self.sampler == "mpc",
                                  population=self.population, member_rows=self.member_rows)
        return PureDp(rounds=self.rounds, adjacency=self.adjacency,  # type: ignore[arg-type]
                      sampler_tv=self.sampler_tv_per_release, epsilon=self.epsilon_per_release)

    def guarantee(self, rounds: int | None = None) -> Composition:
        """(ε, δ) after ``rounds`` releases (default: all), by the plan's accountant.

        RDP and pure ε: :func:`~mpc_erm.privacy.events.compose` of the event, the computation the
        ledger and ``report verify`` use. zCDP, GDP and PLD (the job asked for them; GDP/PLD only
        for the ideal continuous Gaussian): that accountant, at the mechanism's share of δ."""
        ev = self.event if rounds is None else self.event.with_rounds(rounds)
        if self.accountant in ("rdp", "pure", "none") or ev.rounds == 0:
            return compose([ev], self.delta, self.adjacency)  # type: ignore[arg-type]
        from .accountants import epsilon_for

        tau = ev.total_tv
        d_mech = self.delta * (1.0 - SAMPLER_DELTA_SHARE) if self.sampler == "mpc" else self.delta
        eps = epsilon_for(self.accountant, self.noise_multiplier, ev.rounds, d_mech, self.sampling_rate,
                          adjacency="add_remove", discrete=self.sampler == "mpc", population=self.population,
                          member_rows=self.member_rows)
        d_s = (1.0 + math.exp(eps)) * tau
        return Composition(eps, d_mech + d_s, d_s, self.adjacency, self.accountant)  # type: ignore[arg-type]

    def _need_sizes(self) -> PublicSizes:
        if self.sizes is None:
            raise ValueError("the plan has no public sizes yet (bind them with with_sizes after the agreement)")
        return self.sizes

    @property
    def sample_size(self) -> int | None:
        """s = τ·N, the owners drawn each round under uniform sampling (None otherwise)."""
        return None if self.population is None else wor_sample_size(self.population, self.sampling_rate)

    @property
    def m(self) -> int | None:
        s = self.sizes
        return None if s is None or s.counts is None else len(s.counts)

    def sensitivity_l2(self) -> float:
        """ℓ2 sensitivity of one release, in real units, under the plan's adjacency (module doc).

        The formulas are :mod:`.sensitivity`'s: with the exact counts (replace), or with the one
        public count n̂ (add/remove gradient: C/n̂). The add/remove output release is this plan's own
        aggregate Σ_j (n_j/n̂)·θ̂_j, whose bound 3G/(n̂λ) + 2τ the module docstring derives. Uniform
        owner sampling (``population``): one owner's update replaced, or absent (a zero update),
        moves the sum by ≤ 2𝓛, so 2𝓛/s after the public weight 1/s — under either adjacency.
        Knowledge transfer: the model's bound times the public rows' ‖X̃‖₂."""
        return self._model_sensitivity_l2() * self._projection_norm()

    def _projection_norm(self) -> float:
        """‖X̃‖₂ of a knowledge-transfer release (1 for a release of the model itself)."""
        if self.transfer is None:
            return 1.0
        if self.transfer.norm is None:
            raise ValueError("the plan has no feature count yet: a knowledge-transfer release's sensitivity needs "
                             "its public rows' norm")
        return self.transfer.norm

    def _model_sensitivity_l2(self) -> float:
        s = self._need_sizes()
        if self.method == "gradient" and self.population is not None:  # one slot replaced: 2C on the sum of s
            return 2.0 * self.clip / (self.sampling_rate * s.n)
        if self.adjacency == "add_remove":
            if self.method == "gradient":  # a round's sum is divided by q·n̂, the public expected batch
                return gradient_sensitivity(self.clip, [s.n], "pooled", "add_remove") / self.sampling_rate
            return 3.0 * self.clip / (s.n * self.lam) + 2.0 * self.solver_tol
        counts, weighting = list(s.counts or ()), self.weighting
        if self.method == "gradient":
            return gradient_sensitivity(self.clip, counts, weighting, "replace")  # type: ignore[arg-type]
        w_max = max(counts) / sum(counts) if weighting == "pooled" else 1.0 / len(counts)
        base = output_perturbation_sensitivity(self.clip, self.lam, counts, weighting, "replace")  # type: ignore[arg-type]
        return base + 2.0 * w_max * self.solver_tol

    def sensitivity(self) -> float:
        """The sensitivity the noise is calibrated to: ℓ2, or ℓ1 = √d·ℓ2 for per-coordinate Laplace."""
        d2 = self.sensitivity_l2()
        if self.mechanism != "laplace":
            return d2
        if self.dim is None:
            raise ValueError("the plan has no dimension yet: the ℓ1 sensitivity needs d")
        return l1_from_l2(d2, self.dim)

    def noise_scale(self) -> float:
        """σ (gaussian), b (laplace) or Δ₂/ε (l2_laplace) in real units, for the ideal sampler; the
        MPC engine realises the same multiplier on its grid (its sensitivity includes rounding).
        Distributed noise: the whole release's σ, all parties' shares (√(k/h)·z·Δ₂)."""
        if self.mechanism == "none":
            return 0.0
        if self.mechanism == "gaussian":
            return float(self.noise_multiplier) * self.sensitivity() * self.noise_inflation  # type: ignore[arg-type]
        return self.sensitivity() / float(self.epsilon_per_release)  # type: ignore[arg-type]

    @property
    def noise(self) -> str:
        """Who makes the noise: "mpc" (sampled inside the MPC) or "distributed" (each party's share)."""
        return "mpc" if self.noise_split is None else "distributed"

    @property
    def noise_inflation(self) -> float:
        """The release's noise over what the guarantee needs: √(k/h) for distributed noise
        (mpc_erm.privacy.distributed), 1 for noise sampled inside the MPC."""
        return 1.0 if self.noise_split is None else self.noise_split.inflation

    def weight(self, party: int, own_count: int) -> float:
        """Public weight of party ``party``'s contribution (the caller's own count ``own_count``
        enters only under add/remove, where each party scales its own output model locally)."""
        s = self._need_sizes()
        if self.adjacency == "add_remove":
            return 1.0 / (self.sampling_rate * s.n) if self.method == "gradient" else own_count / s.n
        counts = s.counts or ()
        m, n = len(counts), sum(counts)
        if self.method == "gradient" and self.population is not None:  # the public batch b = q·N
            return 1.0 / (self.sampling_rate * n)
        if self.method == "gradient":
            return 1.0 / n if self.weighting == "pooled" else 1.0 / (m * counts[party])
        return counts[party] / n if self.weighting == "pooled" else 1.0 / m

    #: The relative slack the compute parties allow on a member bound for the float arithmetic of an
    #: honest clip (a float32 model's projection into the 𝓛-ball lands within a few float32 ulps).
    BOUND_SLACK = 2.0**-20

    def member_bound(self, member: int = 0) -> float:
        """The public ℓ2 bound of one member's weighted contribution to a release, which the compute
        parties check every contribution against on its shares (:mod:`mpc_erm.mpc.validation`).

        Federated (the owner is the unit): one update in the 𝓛-ball, weighted 1/(q·n̂). Gradient:
        the member's clipped gradient sum, ≤ its record count × C, times its weight. Output: its
        minimiser of a λ-strongly convex objective with a G-Lipschitz loss, ‖θ̂‖ ≤ G/λ, plus the
        certified solver error, times its weight. Under add/remove a member's record count is
        private: the bound is then that of a member holding all n̂ records (and an owner holding
        more is refused at its own terminal before it sends). Under replace the counts are public
        and ``member`` picks the member."""
        s = self._need_sizes()
        if self.unit == "owner":
            return self.clip / (self.sampling_rate * s.n)
        if self.adjacency == "add_remove":
            rows = s.n
            own = self.weight(member, rows)
            if self.method == "gradient" and self.sampling_rate < 1.0:
                return own * self.batch_cap() * self.clip
        else:
            rows = (s.counts or ())[member]
            own = self.weight(member, rows)
            if self.method == "gradient" and self.population is not None:  # at most b of its rows a round
                rows = min(rows, self.sample_size or rows)
        if self.method == "gradient":
            return own * rows * self.clip
        if self.lam <= 0:
            return math.inf
        return own * (self.clip / self.lam + self.solver_tol_for(rows)) * self._projection_norm()

    def batch_cap(self) -> int:
        """Poisson-subsampled rounds: the most rows a member's batch counts, b̄ with
        P(Binomial(n̂, q) > b̄) ≤ 2^-40 (Chernoff: P(X ≥ (1+δ)μ) ≤ exp(−δ²μ/(2+δ)), μ = q·n̂).

        A member's clipped sum is projected into the ball of radius b̄·C before it is weighted
        (:meth:`contribution_radius`): a no-op but with probability ≤ 2^-40, and projection onto
        a ball is 1-Lipschitz, so one record added or removed still moves the sum by ≤ C and the
        accounting is unchanged. The check then bounds a contribution by b̄·C/(q·n̂) instead of
        n̂·C/(q·n̂) = C/q, which at MNIST's q = 0.0043 is 150× tighter and leaves the check's
        exact square room in the ring."""
        mu = self.sampling_rate * self._need_sizes().n
        lg = 40.0 * math.log(2.0)
        excess = (lg + math.sqrt(lg * lg + 8.0 * mu * lg)) / (2.0 * mu)
        return min(self._need_sizes().n, math.ceil((1.0 + excess) * mu))

    def contribution_radius(self) -> float:
        """The ℓ2 radius a member's unweighted clipped gradient sum is projected into (Poisson
        rounds under add/remove: b̄·C, :meth:`batch_cap`); ∞ where the bound needs no projection."""
        if self.method == "gradient" and self.sampling_rate < 1.0 and self.adjacency == "add_remove" \
                and self.unit == "record":
            return self.batch_cap() * self.clip
        return math.inf

    def solver_tol_for(self, own_count: int) -> float:
        """Certified error each party's local solve must reach (output perturbation)."""
        if self.adjacency == "add_remove":
            return self.solver_tol * self._need_sizes().n / max(1, own_count)
        return self.solver_tol

    def accountant_statement(self) -> str:
        """The report's ``accountant`` line: which computation gives ε, for which distribution (with
        distributed noise, why the honest shares' sum meets the discrete Gaussian's RDP curve)."""
        line = self._accountant_line()
        if self.mechanism == "gaussian" and self.noise_split is not None:
            line += (f"; with distributed noise the curve is that of the honest compute parties' "
                     f"{self.noise_split.honest} discrete Gaussian shares (Kairouz–Liu–Steinke 2021 Prop. 14: the "
                     "Gaussian's RDP curve plus τ·d, τ < 1e-300 here)")
        return line

    def _accountant_line(self) -> str:
        what = {"rdp": "RDP (dp_accounting)", "zcdp": "zCDP (Bun–Steinke conversion)", "gdp": "exact GDP",
                "pld": "PLD (dp_accounting)", "pure": "pure ε, basic composition", "none": "none"}[self.accountant]
        if self.mechanism == "gaussian" and self.population is not None:
            discrete = (f"; the in-MPC discrete Gaussian meets its base RDP curve α/(2z²), z = "
                        f"{self.noise_multiplier:.6g}" if self.sampler == "mpc" else "")
            slots, shift = ("owners", "2𝓛") if self.unit == "owner" else ("pooled rows", "2C")
            return (f"{what} of the Gaussian on a uniform sample of s = {self.sample_size} of N = {self.population} "
                    f"{slots} without replacement (Wang–Balle–Kasiviswanathan 2019 Thm 27, replace-one shift {shift} = "
                    f"{2.0 * self.clip:.6g}{discrete}){self._member_views_line()}")
        if self.mechanism == "gaussian" and self.sampler == "mpc" and self.sampling_rate < 1.0:
            return (f"{what} of the Poisson-subsampled discrete Gaussian: its exact moments at integer orders, the "
                    "continuous Gaussian's binomial sum (Mironov–Talwar–Zhang 2019) in both directions (the addition "
                    "direction bounded by the removal one for a pair an involution swaps), interpolated between "
                    "integer orders")
        if self.mechanism == "gaussian" and self.sampler == "mpc":
            return f"{what} of the discrete Gaussian (CKS 2020 Prop. 5, additive over coordinates)"
        if self.mechanism == "laplace" and self.sampler == "mpc":
            return f"{what} of the discrete Laplace (CKS 2020 §4)"
        return what

    def public_statement(self) -> str:
        return self._adjacency_statement() + self._transfer_statement()

    def _transfer_statement(self) -> str:
        tr = self.transfer
        if tr is None:
            return ""
        rows = ("the public test file's rows" if tr.rows is None else f"{tr.rows} public rows") if tr.public is None \
            else tr.public.describe()
        norm = "" if tr.norm is None else f", ‖X̃‖₂ ≤ {tr.norm:.9g}"
        scores = "scores" if tr.outputs is None else f"{tr.outputs} score(s)"
        return (f"; knowledge transfer: the release is the teacher's {scores} on each of {rows} "
                f"(X̃{norm}), so the model's sensitivity is multiplied by ‖X̃‖₂; the teacher's weights are not "
                "released")

    def _member_views_line(self) -> str:
        if not self.member_rows:
            return ""
        own = "whether its own slot was" if self.unit == "owner" else "which of its own rows were"
        return ("; the larger, order by order, of that observer's curve and each member's own view, which knows "
                f"{own} drawn: the mixture over that draw of the curves on the others' slots")

    def _adjacency_statement(self) -> str:
        if self.unit == "owner" and self.population is not None:
            return (f"client-level adjacency: one data owner, with all its rows, replaced by another or absent; each "
                    f"round exactly s = τN = {self.sample_size} of the N = {self.population} listed owners "
                    f"(privacy.public_n, τ = {self.sampling_rate:.6g}) are drawn uniformly without replacement by a "
                    "secret shuffle among the three compute parties (three permutations, each known to one pair of "
                    "them), so no single compute party learns the sample (two together do: the trust model the job "
                    "states) and each owner learns only whether it was drawn; every owner sends shares each round "
                    f"(of a zero update when not drawn); each round's sum is divided by the public s = "
                    f"{self.sample_size}; replacing one owner's data, or its absence (a zero update), moves the sum "
                    f"by at most 2𝓛 = {2.0 * self.clip:.6g}; no owner's row count leaves it")
        if self.unit == "owner":
            return (f"client-level add/remove adjacency: one data owner, with all its rows, added or removed; each "
                    f"owner joins a round w.p. τ = {self.sampling_rate:.6g} by its own private coin and sends shares "
                    "of a zero update when it does not, so no member learns who was sampled (the compute parties "
                    "see only which owners' shares arrived in time); each round's sum is divided by the public "
                    f"τ·N with N = {self.public_n} owners (privacy.public_n); no owner's row count leaves it")
        if self.adjacency == "add_remove":
            if self.sampling_rate < 1.0:
                return (f"add/remove adjacency with Poisson sampling: each record joins a round w.p. q = "
                        f"{self.sampling_rate:.6g}, chosen by its own party, and no party's record or batch count "
                        f"leaves it; each round's sum is divided by the public expected batch q·n̂ with "
                        f"n̂ = {self.public_n} (privacy.public_n)")
            if self.method == "output":
                return (f"add/remove adjacency: no party's record count leaves it; each party weights its local model "
                        f"by its own count over the public normaliser n̂ = {self.public_n} (privacy.public_n)")
            return (f"add/remove adjacency: no party's record count leaves it; aggregates are divided by the public "
                    f"normaliser n̂ = {self.public_n} (privacy.public_n)")
        counts = self.sizes.counts if self.sizes is not None else None
        if self.population is not None:
            return (f"replace-one adjacency: one record replaced; every party's row count is public "
                    f"(privacy.party_rows: {list(self.member_rows)}); each round exactly b = {self.sample_size} of the "
                    f"N = {self.population} pooled rows are drawn uniformly without replacement by a secret shuffle "
                    "among the three parties (three permutations, each known to one pair of them), so no single "
                    "party learns which of another's rows were drawn (two together do: the trust model the job "
                    "states); each party learns which of its own rows were, and so how many of the others' "
                    f"(accounted: its view); each round's sum is divided by the public b = {self.sample_size}")
        return ("replace-one adjacency: the record counts are equal in neighbouring data sets; every party's exact "
                f"count is shared with the members and published{'' if counts is None else f' ({list(counts)})'}")

    def report(self, *, noise_scale: float, realisation: dict[str, Any] | None, trust_model: str, parties: int | None,
               parameters: dict[str, Any] | None = None, notes: tuple[str, ...] = (),
               security: Security | None = None) -> PrivacyReport:
        """The job's :class:`~mpc_erm.privacy.report.PrivacyReport`, from this (bound) plan and the
        engine's realisation of its noise (``noise_scale`` in real units) — nothing else."""
        counts = self.sizes.counts if self.sizes is not None else None
        common: dict[str, Any] = dict(
            adjacency=self.adjacency, trust_model=trust_model, security=security, parties=parties,
            n=sum(counts) if counts is not None else None, rounds=self.rounds, sampling_rate=self.sampling_rate,
            plan=self.describe(),
            realisation=realisation, parameters=parameters or {})
        if self.mechanism == "none":
            return PrivacyReport(mechanism="none", noise_scale=0.0, norm="l2", accountant="none", epsilon=math.inf,
                                 delta=1.0, notes=(*self.notes, *notes), **common)
        g = self.guarantee()
        l1 = self.mechanism == "laplace"
        return PrivacyReport(
            mechanism=self.mechanism, noise_scale=noise_scale, norm="l1" if l1 else "l2",
            sensitivity_l2=self.sensitivity_l2(), sensitivity_l1=self.sensitivity() if l1 else None,
            accountant=self.accountant_statement(), epsilon=g.epsilon, delta=g.delta - g.delta_sampler,
            delta_sampler=g.delta_sampler,
            notes=(f"the event {self.event.to_json()} is what the ledger composes", self.public_statement(),
                   *self._noise_notes(), *notes),
            **common,
        )

    def _noise_notes(self) -> tuple[str, ...]:
        """Who made the noise, for the report (nothing for noise sampled inside the MPC)."""
        if self.noise_split is None:
            return ()
        return (f"distributed noise: {self.noise_split.describe()}", *self.notes)

    def model_statement(self, rounds: int, trust_model: str, security: Security | None = None) -> dict[str, Any]:
        """What a model bundle's ``privacy`` block says of the model after ``rounds`` releases."""
        g = self.guarantee(rounds=rounds) if rounds else None
        return {"mechanism": self.mechanism, "noise_multiplier": self.noise_multiplier, "clip": self.clip,
                "sampling_rate": self.sampling_rate, "rounds": rounds, "adjacency": self.adjacency,
                "unit": self.unit, "population": self.population, "sample_size": self.sample_size,
                "accountant": self.accountant_statement(),
                "epsilon": None if g is None else g.epsilon, "delta": None if g is None else g.delta,
                "public": self.public_statement(), "trust_model": trust_model, "security": security}

    def describe(self) -> dict[str, Any]:
        """Everything needed to recompute the guarantee, for the report's ``plan`` section."""
        out: dict[str, Any] = {
            "method": self.method, "mechanism": self.mechanism, "sampler": self.sampler, "adjacency": self.adjacency,
            "weighting": self.weighting, "accountant": self.accountant, "target_epsilon": self.epsilon,
            "target_delta": self.delta, "rounds": self.rounds, "noise_multiplier": self.noise_multiplier,
            "epsilon_per_release": self.epsilon_per_release, "sampler_tv_per_release": self.sampler_tv_per_release,
            "sampler_delta_share": SAMPLER_DELTA_SHARE if self.sampler == "mpc" else 0.0,
            "clip" if self.method == "gradient" else "lipschitz_G": self.clip, "lam": self.lam,
            "solver_tol": self.solver_tol, "ls_sigma": self.ls_sigma, "public_n": self.public_n,
            "sampling_rate": self.sampling_rate, "unit": self.unit, "population": self.population,
            "sample_size": self.sample_size,
            "public_counts": None if self.sizes is None or self.sizes.counts is None else list(self.sizes.counts),
            "what_is_public": self.public_statement(), "dim": self.dim, "event": self.event.as_dict(),
            "noise": self.noise,
        }
        if self.noise_split is not None:
            out["noise_parties"], out["noise_honest"] = self.noise_split.parties, self.noise_split.honest
        if self.transfer is not None:
            out["transfer"] = self.transfer.describe()
        if self.sizes is not None:
            out["sensitivity_l2"] = self.sensitivity_l2()
            if self.dim is not None or self.mechanism != "laplace":
                out["sensitivity"] = self.sensitivity()
        return out


def public_sizes(spec: JobSpec, counts: Sequence[int] | None) -> PublicSizes:
    """What the plan may use about the counts: the agreed ``counts`` (replace), n̂ (add_remove)."""
    if spec.privacy.adjacency == "add_remove":
        return PublicSizes(public_n=spec.privacy.public_n)
    if counts is None:
        raise ValueError("sizes: a replace-one job needs the parties' agreed counts")
    return PublicSizes(counts=tuple(int(c) for c in counts))


def plan_job(spec: JobSpec, *, sampler: Sampler = "ideal", test_no_noise: bool = False,
             sizes: PublicSizes | None = None, n_features: int | None = None,
             builder: NetworkBuilder | None = None, noise_split: NoiseSplit | None = None,
             public_rows: np.ndarray | None = None) -> PrivacyPlan:
    """The job's :class:`PrivacyPlan`: what the daemon reserves at admission (no sizes yet), and,
    bound with the agreed sizes and the model's dimension, what the runs, the ledger and the report
    use (a network's dimension is its parameter count, known from the spec alone — for a plugin
    network, from its ``builder``, which only a party that has it can give). ``public_rows``: a
    knowledge-transfer job's public test file's features (``transfer.public = "public_test"``),
    which only a member holding the file can give."""
    # imported here: the model (and torch) only for planning a job, not for the plan's arithmetic,
    # which light commands (a ledger check, a report verify) load without torch
    from mpc_erm.models.job_model import clip_for, parameter_dim

    transfer = transfer_plan(spec, n_features, public_rows)
    dim = parameter_dim(spec, n_features, builder) if transfer is None else (
        transfer.dim if transfer.norm is not None else None)
    return PrivacyPlan.make(spec, clip=clip_for(spec), sampler=sampler, test_no_noise=test_no_noise, sizes=sizes,
                            dim=dim, noise_split=noise_split, transfer=transfer)
