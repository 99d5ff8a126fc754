"""A network trained by DP-SGD / DP-Adam (:class:`~mpc_erm.protocols.dpsgd.DpSgd`): each member's
Poisson batches drawn from its own generator, the public step on a float64 CPU master copy (so
every member keeps the same public model whatever its device)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from mpc_erm.data.dataset import Dataset
from mpc_erm.models import model_digest
from mpc_erm.models.networks import NetworkBuilder
from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.protocols.aggregation import NoiseSpec, SecureAggregator
from mpc_erm.protocols.common import network_rows
from mpc_erm.protocols.dpsgd import DpSgd
from mpc_erm.protocols.row_draws import RowDraws
from mpc_erm.spec import JobSpec

from .curve import CurvePoint, ModelFacts, ModelWriter, RunResult
from .guard import RevealGuard
from .inputs import NoisePool, RunRows, with_next_noise
from .linear import PROGRESS_EVERY
from .metrics import network_metrics

__all__ = ["NetworkRun"]



class NetworkRun:
    """DP-SGD rounds of a network on this member's rows; a curve point once an expected pass
    over the rows (an epoch) and at the end."""

    released = "noisy sum of clipped per-example gradients of a Poisson batch"
    protocol = "dpsgd"

    def __init__(self, spec: JobSpec, plan: PrivacyPlan, rows: RunRows, *, noise: NoiseSpec | None = None,
                 pool: NoisePool | None = None, device: torch.device | str = "cpu",
                 builder: NetworkBuilder | None = None,
                 members: Sequence[tuple[Tensor, Tensor, torch.Generator | RowDraws]] | None = None,
                 draws: RowDraws | None = None) -> None:
        self.spec, self.plan, self.rows, self.noise, self.pool = spec, plan, rows, noise, pool
        self.job = DpSgd(spec, plan=plan, noise=noise, device=device, builder=builder)
        batch = "a Poisson batch" if spec.training.batch_size is None else "a batch drawn from the pooled rows"
        self.released = ("noisy sum of clipped per-example recursive-momentum increments of " if self.job.srm
                         else "noisy sum of clipped per-example gradients of ") + batch
        self.p, self.rounds = self.job.p, int(spec.training.iterations)
        if members is None:  # this member's batches: its own generator's, or its part of the pooled draw
            if (draws is None) != (spec.training.batch_size is None):
                raise ValueError("training.batch_size: a batch of the pooled rows needs this party's row draws "
                                 "(and only it)")
            own = draws if draws is not None else torch.Generator().manual_seed(secrets.randbits(63))
            members = [(*network_rows(rows.train, spec, device), own)]
        self.members = list(members)
        self.X, self.y = self.members[0][0], self.members[0][1]  # the curve's own rows: the first member's
        self.test = None if rows.test is None else network_rows(rows.test, spec, device)
        self.validation = None if rows.validation is None else network_rows(rows.validation, spec, device)

    @classmethod
    def in_process(cls, spec: JobSpec, plan: PrivacyPlan, first: Dataset, rows: Sequence[tuple[Tensor, Tensor]],
                   generators: Sequence[torch.Generator | RowDraws], noise: NoiseSpec | None = None) -> NetworkRun:
        """Every party's rows in this process as the network's inputs (``network_rows``, made once
        by the caller), each drawing its Poisson batches from its own generator (the simulator);
        ``first``: the first party's data set, whose names and classes the bundle records."""
        return cls(spec, plan, RunRows(first), noise=noise,
                   members=[(X, y, g) for (X, y), g in zip(rows, generators, strict=True)])

    def contributions(self) -> Tensor:
        """Each member's clipped gradient sum over its batch, one row each."""
        return torch.cat([self.job.local_contribution(X, y, g)[0] for X, y, g in self.members])

    def model_digest(self) -> str:
        """The initial weights' digest (public: every member must build the same network)."""
        return model_digest(self.job.model)

    def run(self, aggregator: SecureAggregator, guard: RevealGuard) -> RunResult:
        job, T, pool, noise = self.job, self.rounds, self.pool, self.noise
        if pool is not None and noise is not None:
            guard.announce("offline", f"sampling {T * self.p} noise values inside the MPC, streamed: one round "
                                      "ahead, while the local gradients are computed")
            pool.prepare(noise, self.p, T)
        curve: list[CurvePoint] = []
        epoch = max(1, round(1.0 / job.q)) if job.q < 1.0 else PROGRESS_EVERY  # rounds per expected pass

        def local_sum(_model: nn.Module) -> tuple[Tensor, None]:
            guard.check()  # the batch size (second value of local_contribution) stays here
            return with_next_noise(pool, noise, self.p, self.contributions), None

        def after_round(t: int, noisy: Tensor) -> None:
            guard.after_release(t, T, self.released, noisy)
            if guard.reports and (t % epoch == 0 or t == T):  # a pass over this member's rows costs one evaluation
                own = {"train": network_metrics(job.model, self.X, self.y)}
                if self.validation is not None:
                    own["validation"] = network_metrics(job.model, *self.validation)
                test = None if self.test is None else network_metrics(job.model, *self.test)
                curve.append(guard.report(t, T, test=test, own=own, extra={"epoch": round(t * job.q, 3)}))

        model = job.train(aggregator, local_sum, before_reveal=guard.before_reveal, after_round=after_round)
        tr = self.spec.training
        name = {"adam": "Adam", "srm": "SRM"}.get(tr.optimizer, "SGD")
        srm = (f" (γ = {job.gamma:g}, C₁ = {job.clip_gradient:g}, C₂ = {job.clip_difference:g}"
               + ("" if tr.max_step is None else f", steps at most {tr.max_step:g}") + ")") if job.srm else ""
        note = (f"DP-{name} of {self.spec.model.name} ({self.p} parameters): "
                f"T = {T} rounds, {self._batches()}, clip C = {job.clip:g}{srm}, Laplacian "
                f"smoothing σ = {tr.ls_sigma:g} per parameter tensor; accountant {self.plan.accountant!r}")
        return RunResult(model, curve, note, self.parameters(), self.writer(), extra={"parameters": self.p})

    def _batches(self) -> str:
        b = self.spec.training.batch_size
        if b is None:
            return f"Poisson rate q = {self.job.q:g} per party"
        return f"b = {b} of the pooled rows a round, without replacement"

    def parameters(self) -> dict[str, object]:
        tr = self.spec.training
        return {"protocol": self.protocol, "model": self.spec.model.name, "optimizer": tr.optimizer}

    def writer(self) -> ModelWriter:
        rows, spec = self.rows, self.spec
        schema, ds = rows.schema, rows.train
        classes = (schema.label.class_names if schema is not None else
                   ["negative", "positive"] if ds.task == "binary" else list(range(int(spec.model.n_classes or 0))))

        def write(d: Path, facts: ModelFacts) -> None:
            self.job.save(d, classes=classes, feature_names=list(ds.feature_names) or None,
                          trust_model=facts.trust_model, security=facts.security,
                          schema=None if schema is None else schema.to_dict())
        return write
