"""DP-Fed / DP-Fed-LS with data owners (:class:`~mpc_erm.protocols.fedls.DpFedLs`): each round the
sampled owners' updates (E local epochs, projected into the 𝓛-ball), their noisy mean, the public
step and its Laplacian smoothing.

Hosted by a data owner (its rows; whether it joins a round is its own coin, or the compute parties'
secret shuffle's bits it read at enrolment) or by a compute party (no rows; the owners' shares
arrive through its aggregator)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.protocols.aggregation import NoiseSpec, SecureAggregator
from mpc_erm.protocols.common import network_rows
from mpc_erm.protocols.fedls import DpFedLs, timing_statement
from mpc_erm.spec import JobSpec

from .curve import CurvePoint, ModelFacts, ModelWriter, RunResult
from .guard import RevealGuard
from .inputs import NoisePool, RunRows
from .linear import PROGRESS_EVERY

__all__ = ["FederatedRun"]


class _LastRelease:
    """The aggregator, remembering its last release (the audit log records it)."""

    def __init__(self, inner: SecureAggregator) -> None:
        self.inner = inner
        self.last: Tensor | None = None

    def aggregate(self, contributions: Tensor, weights: Tensor, noise: NoiseSpec) -> Tensor:
        self.last = self.inner.aggregate(contributions, weights, noise)
        return self.last


class FederatedRun:
    """The DP-Fed-LS rounds (module docstring). ``drawn(T)``: an owner's bits from the compute
    parties' secret shuffle, whether it is drawn in each round (uniform sampling); ``None``: each
    owner joins w.p. τ by its own coin (Poisson)."""

    released = "noisy mean of the data owners' updates"
    protocol = "dp_fed_ls"

    def __init__(self, spec: JobSpec, plan: PrivacyPlan, rows: RunRows | None, *, features: int,
                 noise: NoiseSpec | None = None, pool: NoisePool | None = None, device: torch.device | str = "cpu",
                 owners: int, drawn: Callable[[int], Sequence[bool]] | None = None) -> None:
        self.spec, self.plan, self.rows, self.noise, self.pool, self.owners = spec, plan, rows, noise, pool, owners
        self.fed = DpFedLs.for_job(spec, plan, rows.train.d if rows is not None else features, noise=noise,
                                   device=device)
        self.p, self.rounds, self.drawn = self.fed.p, int(plan.rounds), drawn
        # private: whether this owner joins a round and its batches are nobody else's to know or replay
        self.coin = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))
        self.members: list[tuple[Tensor, Tensor, torch.Generator]] = (
            [] if rows is None else [(*network_rows(rows.train, spec, device), self.coin)])
        self.draw: Callable[[int], list[int]] | None = None  # the simulator's draw over every owner
        self.joined: list[int] = []

    @classmethod
    def in_process(cls, spec: JobSpec, plan: PrivacyPlan, owners: Sequence[tuple[Tensor, Tensor]], features: int,
                   generator: torch.Generator, noise: NoiseSpec | None = None) -> FederatedRun:
        """Every owner's rows in this process (the simulator), as the model's inputs (``network_rows``,
        made once by the caller): each round's owners drawn as the plan says from ``generator``, each
        owner's local epochs from its own generator seeded by it."""
        run = cls(spec, plan, None, features=features, noise=noise, owners=len(owners))
        seeds = torch.randint(0, 2**62, (len(owners),), generator=generator).tolist()
        run.members = [(X, y, torch.Generator().manual_seed(int(s))) for (X, y), s in zip(owners, seeds, strict=True)]
        run.draw = lambda _t: run.fed.config.draw_owners(generator)
        return run

    def _sample(self) -> Callable[[int], list[int]]:
        if self.draw is not None:
            return self.draw
        if not self.members:  # a compute party holds no owner: the owners know whether they are drawn
            return lambda _t: []
        if self.drawn is not None and self.fed.config.uniform:
            bits = self.drawn(self.rounds)
            return lambda t: [0] if bits[t] else []
        tau = self.plan.sampling_rate
        return lambda _t: [0] if float(torch.rand((), generator=self.coin)) < tau else []

    def updates(self, t: int, owners: list[int]) -> Tensor:
        """The drawn owners' updates Δ of round ``t`` (from 0), one row each."""
        self.joined.append(t + 1)
        return torch.stack([self.fed.local_update(X, y, t, g) for X, y, g in (self.members[o] for o in owners)])

    def run(self, aggregator: SecureAggregator, guard: RevealGuard) -> RunResult:
        T, pool, noise = self.rounds, self.pool, self.noise
        if pool is not None and noise is not None:
            pool.prepare(noise, self.p, T)
        seen = _LastRelease(aggregator)
        curve: list[CurvePoint] = []

        def after_round(t: int, _owners: list[int]) -> None:
            assert seen.last is not None
            guard.after_release(t, T, self.released, seen.last)
            if guard.reports and (t % PROGRESS_EVERY == 0 or t == T):
                curve.append(guard.report(t, T))

        def before_reveal(t: int) -> None:
            guard.before_reveal(t)

        model = self.fed.train(seen, self.updates, self._sample(), after_round=after_round,
                               before_reveal=before_reveal)
        return RunResult(model.cpu(), curve, self.note(), self.parameters(), self.writer())

    def parameters(self) -> dict[str, object]:
        f, tr = self.spec.federated, self.spec.training
        assert f is not None
        return {"protocol": self.protocol, "model": self.spec.model.name, "local_epochs": f.local_epochs,
                "local_batch": f.local_batch, "local_lr": f.local_lr, "local_lr_decay": f.local_lr_decay,
                "global_lr": tr.learning_rate, "weight_decay": self.spec.model.lam, "ls_sigma": tr.ls_sigma,
                "smoothing": "post-processing of the revealed noisy mean, per parameter tensor (no privacy cost)"}

    def note(self) -> str:
        f, tr, plan = self.spec.federated, self.spec.training, self.plan
        assert f is not None
        drawn_how = (f"{self.fed.config.sample_size} of the {self.owners} owners are drawn each round without "
                     "replacement by a secret shuffle among the compute parties (each learns nothing of the sample; "
                     "each owner only its own bits)" if self.fed.config.uniform else
                     f"each owner joins w.p. τ = {tr.sampling_rate:g} by its own coin")
        return (f"DP-Fed{'-LS' if tr.ls_sigma else ''} with {self.owners} data owners: T = {tr.iterations} rounds, "
                f"{drawn_how}; a drawn owner runs E = {f.local_epochs} local epochs (b = {f.local_batch}, η_l = "
                f"{f.local_lr:g}·{f.local_lr_decay:g}^t), its update projected into the 𝓛 = {plan.clip:g} ball; each "
                f"owner sends additive shares of its update (zero when not sampled) to the compute parties; "
                f"accountant {plan.accountant!r}; " + timing_statement(f.send_after_s))

    def writer(self) -> ModelWriter:
        def write(d: Path, facts: ModelFacts) -> None:
            self.fed.save(d, self.plan, trust_model=facts.trust_model, job=facts.job(), security=facts.security)
        return write
