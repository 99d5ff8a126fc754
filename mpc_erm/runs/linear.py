"""The thesis's linear models: output perturbation (one release of the weighted local
minimisers) and gradient perturbation (T full-batch rounds of clipped gradient sums).

A run's member either holds rows (a party with its own data, a data owner, the simulator) or holds
none and hands in no row (a compute party whose aggregator collects the owners' shares)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

from mpc_erm.data.dataset import Dataset
from mpc_erm.models.bundle import save_linear_weights
from mpc_erm.privacy.plan import PrivacyPlan
from mpc_erm.protocols import GradientPerturbation, OutputPerturbation
from mpc_erm.protocols.aggregation import NoiseSpec, SecureAggregator
from mpc_erm.protocols.knowledge_transfer import KnowledgeTransfer
from mpc_erm.spec import JobSpec

from .curve import CurvePoint, ModelFacts, ModelWriter, RunResult
from .guard import RevealGuard
from .inputs import NoisePool, RunRows, concurrently, with_next_noise
from .metrics import linear_metrics

__all__ = ["GradientRun", "OutputRun", "PROGRESS_EVERY", "TransferRun", "linear_run_class"]

PROGRESS_EVERY = 5  # rounds between curve points (and the last round)


R = TypeVar("R", bound="_LinearRun")


def _tensors(ds: Dataset, device: torch.device | str) -> tuple[Tensor, Tensor]:
    return (torch.as_tensor(np.array(ds.X), dtype=torch.float64, device=device),
            torch.as_tensor(np.array(ds.y), device=device))


class _LinearRun:
    """What both linear runs share: the members' rows in this process as tensors with their public
    weights (one member at a party or an owner; none at a compute party serving owners; every
    party's in the simulator), the curve point, the bundle writer. ``owners``: the job's count of
    data owners when they, not parties, hold the rows."""

    released: str
    protocol: str

    def __init__(self, spec: JobSpec, plan: PrivacyPlan, rows: RunRows | None, *, features: int, weight: float = 1.0,
                 noise: NoiseSpec | None = None, pool: NoisePool | None = None, device: torch.device | str = "cpu",
                 owners: int | None = None) -> None:
        self.spec, self.plan, self.rows, self.noise, self.pool, self.device = spec, plan, rows, noise, pool, device
        self.owners = owners
        self.features = rows.train.d if rows is not None else int(features)
        self.members: list[tuple[Tensor, Tensor]] = [] if rows is None else [_tensors(rows.train, device)]
        self.weights = torch.tensor([weight] if rows is not None else [], dtype=torch.float64)
        self.model: Tensor | None = None

    @classmethod
    def in_process(cls: type[R], spec: JobSpec, plan: PrivacyPlan, parts: Sequence[Dataset],
                   noise: NoiseSpec | None = None) -> R:
        """Every party's rows in this process, each with the plan's weight (the simulator): the
        same contributions the parties' workers make, summed by an in-process aggregator."""
        run = cls(spec, plan, None, features=parts[0].d, noise=noise)
        run.members = [_tensors(p, "cpu") for p in parts]
        run.weights = torch.tensor([plan.weight(j, p.n) for j, p in enumerate(parts)], dtype=torch.float64)
        return run

    def _point(self, guard: RevealGuard, t: int, rounds: int, theta: Tensor) -> CurvePoint:
        loss, lam, rows = self.proto.loss, self.spec.model.lam, self.rows  # type: ignore[attr-defined]
        if rows is None:
            return guard.report(t, rounds)
        own = {"train": linear_metrics(loss, theta, rows.train, lam)}
        if rows.validation is not None:
            own["validation"] = linear_metrics(loss, theta, rows.validation, lam)
        test = None if rows.test is None else linear_metrics(loss, theta, rows.test, lam)
        return guard.report(t, rounds, test=test, own=own)

    def writer(self, theta: Tensor) -> ModelWriter:
        """Writes ``theta``'s bundle: weights, loss, classes, feature names, the data schema (so
        ``predict`` takes raw rows) and the plan's privacy statement."""
        m, rows, plan = self.spec.model, self.rows, self.plan
        names = None if rows is None else [str(f) for f in rows.train.feature_names] or None
        schema = None if rows is None or rows.schema is None else rows.schema.to_dict()

        def write(d: Path, facts: ModelFacts) -> None:
            save_linear_weights(d, theta, job_id=facts.job_id, job_digest=facts.spec_digest, loss=m.name,
                                n_classes=m.n_classes, feature_names=names, schema=schema,
                                privacy=plan.model_statement(plan.rounds, facts.trust_model, facts.security),
                                job={"name": facts.name, "dataset": facts.dataset})
        return write


class OutputRun(_LinearRun):
    """Output perturbation: each member's certified local minimiser θ̂_j, weighted by its public
    weight, summed once with the noise (:class:`~mpc_erm.protocols.OutputPerturbation`)."""

    released = "noisy weighted sum of the local models"
    protocol = "output_perturbation"
    rounds = 1

    def __init__(self, spec: JobSpec, plan: PrivacyPlan, rows: RunRows | None, **kw: object) -> None:
        super().__init__(spec, plan, rows, **kw)  # type: ignore[arg-type]
        self.proto = OutputPerturbation(spec, None, self.features, plan=plan, noise=self.noise)
        self.p = self.proto.p
        self.local: Tensor | None = None

    def solve_locally(self) -> Tensor:
        """θ̂_j for each member's rows, one row each (a data owner solves before it enrols, so the
        compute parties' one round does not wait on it)."""
        if self.local is None:
            self.local = torch.stack([self.proto.local_model(X, y).to("cpu", torch.float64)
                                      for X, y in self.members]) if self.members else torch.zeros(0, self.p,
                                                                                                dtype=torch.float64)
        return self.local

    def run(self, aggregator: SecureAggregator, guard: RevealGuard) -> RunResult:
        pool, noise = self.pool, self.noise
        fill = (lambda: None) if pool is None or noise is None else (lambda: pool.prepare(noise, self.p, 1))
        if self.members:
            guard.announce("local", "local solve and offline noise, concurrently")
        local = concurrently(self.solve_locally, fill)
        guard.before_reveal(1)
        guard.announce("reveal", "the one release", round=1, rounds=1, epsilon_spent=guard.epsilon_after(1))
        released = self.proto.release(aggregator, local, self.weights)
        guard.after_release(1, 1, self.released, released)
        theta = self.model_from(released)
        self.model = theta.cpu()
        curve = [self._point(guard, 1, 1, theta)] if guard.reports else []
        return RunResult(self.model, curve, self.note(), self.parameters(),
                         self.writer(self.model))

    def model_from(self, released: Tensor) -> Tensor:
        """The model the release gives: the release itself (the noisy weighted sum of the models)."""
        return released

    def parameters(self) -> dict[str, object]:
        return {"protocol": self.protocol, "loss": self.spec.model.name, "lam": self.spec.model.lam,
                "solver_tol": self.spec.training.solver_tol}

    def note(self) -> str:
        plan = self.plan
        if self.owners is not None:
            return (f"output perturbation with {self.owners} data owners: each owner solves its λ = "
                    f"{self.spec.model.lam:g} regularised ERM locally (certified), weights its minimiser by n_j/n̂ "
                    f"with its own count and the public n̂ = {plan.public_n}, and sends additive shares of it to "
                    f"the compute parties, which add the noise once; {plan.mechanism}, accountant {plan.accountant!r}")
        how = "n_j/n̂ (each party its own count)" if plan.adjacency == "add_remove" else (
            "n_j/n" if plan.weighting == "pooled" else "1/m")
        return f"output perturbation: locally solved models averaged with weights {how}"


class TransferRun(OutputRun):
    """Knowledge transfer (DPSL-KT, :mod:`~mpc_erm.protocols.knowledge_transfer`): each member's
    certified local minimiser θ̂_j, weighted, hands in its scores on the job's public rows; the one
    release is their noisy sum, and the model is the student fitted to it in the clear."""

    released = "noisy weighted sum of the local models' scores on the public rows"
    protocol = "knowledge_transfer"

    def __init__(self, spec: JobSpec, plan: PrivacyPlan, rows: RunRows | None, **kw: object) -> None:
        super().__init__(spec, plan, rows, **kw)
        self.transfer = KnowledgeTransfer(spec, self.features, plan, noise=self.noise)
        self.p = self.transfer.release_dim  # what the aggregator sums and the noise covers

    def solve_locally(self) -> Tensor:
        """Each member's scores of its certified local minimiser on the public rows, one row each."""
        if self.local is None:
            self.local = torch.stack([self.transfer.scores(self.proto.local_model(X, y).to("cpu", torch.float64))
                                      for X, y in self.members]) if self.members else torch.zeros(0, self.p,
                                                                                                dtype=torch.float64)
        return self.local

    def model_from(self, released: Tensor) -> Tensor:
        return self.transfer.student(released.cpu())

    def parameters(self) -> dict[str, object]:
        tr = self.spec.transfer
        assert tr is not None
        return {**super().parameters(), "public_rows": tr.rows, "public_norm": self.transfer.transfer.norm,
                "student_sparsity": tr.student_sparsity, "student_iterations": tr.student_iterations}

    def note(self) -> str:
        tr, plan = self.spec.transfer, self.plan
        assert tr is not None and plan.transfer is not None
        student = ("least squares (minimum norm)" if tr.student_sparsity is None else
                   f"iterative hard thresholding to {tr.student_sparsity} non-zeros, {tr.student_iterations} steps")
        return (f"knowledge transfer (DPSL-KT with a certified output-perturbation teacher): each party's λ = "
                f"{self.spec.model.lam:g} local minimiser is weighted and scored on {tr.rows} public rows inside "
                f"the MPC; one release of the noisy scores (‖X̃‖₂ ≤ {plan.transfer.norm:.6g} times the model's "
                f"sensitivity), {plan.mechanism}; the student is fitted to them in the clear by {student}")


class GradientRun(_LinearRun):
    """Gradient perturbation: T full-batch rounds, each the members' clipped gradient sums with
    the noise (:class:`~mpc_erm.protocols.GradientPerturbation`), the public step on the release."""

    released = "noisy weighted sum of clipped gradients"
    protocol = "gradient_perturbation"

    def __init__(self, spec: JobSpec, plan: PrivacyPlan, rows: RunRows | None, **kw: object) -> None:
        super().__init__(spec, plan, rows, **kw)  # type: ignore[arg-type]
        self.proto = GradientPerturbation(spec, None, self.features, plan=plan, noise=self.noise)
        self.p = self.proto.p
        self.rounds = int(spec.training.iterations)

    def run(self, aggregator: SecureAggregator, guard: RevealGuard) -> RunResult:
        T, pool, noise = self.rounds, self.pool, self.noise
        if pool is not None and noise is not None:
            guard.announce("offline", f"sampling {T * self.p} noise values inside the MPC, streamed: one round "
                                      "ahead, while the local gradients are computed")
            pool.prepare(noise, self.p, T)
        curve: list[CurvePoint] = []

        def local_sum(theta: Tensor) -> tuple[Tensor, Tensor]:
            guard.check()
            return with_next_noise(pool, noise, self.p, lambda: self.contributions(theta)), self.weights

        def after_round(t: int, theta: Tensor, noisy: Tensor) -> None:
            guard.after_release(t, T, self.released, noisy)
            if guard.reports and (t % PROGRESS_EVERY == 0 or t == T):
                curve.append(self._point(guard, t, T, theta))

        theta = self.proto.train(aggregator, local_sum, before_reveal=guard.before_reveal, after_round=after_round)
        self.model = theta.cpu()
        return RunResult(self.model, curve, self.note(), self.parameters(), self.writer(self.model))

    def contributions(self, theta: Tensor) -> Tensor:
        """Each member's clipped gradient sum at θ, one row each (no row: no member here)."""
        if not self.members:
            return torch.zeros(0, self.p, dtype=torch.float64)
        return torch.cat([self.proto.local_contribution(theta.to(self.device), X, y).to("cpu", torch.float64)
                          for X, y in self.members])

    def parameters(self) -> dict[str, object]:
        out: dict[str, object] = {"protocol": self.protocol, "loss": self.spec.model.name}
        if self.spec.training.sparsity is not None:
            out["sparsity"] = self.spec.training.sparsity
        return out

    def note(self) -> str:
        tr, plan = self.spec.training, self.plan
        sparse = ("" if tr.sparsity is None else f"; DP-IGHT: after each step θ keeps its {tr.sparsity} largest "
                  "entries (hard thresholding of the public θ: post-processing, the guarantee is unchanged)")
        if self.owners is None:
            return (f"gradient perturbation: T = {tr.iterations} full-batch rounds, clip C = {self.proto.clip:g}; "
                    f"accountant {plan.accountant!r}{sparse}")
        return (f"gradient perturbation with {self.owners} data owners: T = {tr.iterations} full-batch rounds, clip "
                f"C = {self.proto.clip:g}; each owner sends additive shares of its clipped gradient sum to the compute "
                f"parties; accountant {plan.accountant!r}{sparse}")


def linear_run_class(spec: JobSpec) -> type[OutputRun] | type[GradientRun]:
    """The run class of a linear job: gradient rounds, the output release, or its knowledge-transfer
    form (what :func:`mpc_erm.runs.run_for` and the simulator's in-process job both build)."""
    if spec.method == "gradient":
        return GradientRun
    return OutputRun if spec.transfer is None else TransferRun
