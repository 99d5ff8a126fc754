"""Simulation experiments: the thesis's figures (optimality gap and relative accuracy loss per
iteration, one line per method) on real data split across m simulated parties."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mpc_erm.data import load_dataset, partition_dirichlet, partition_equal
from mpc_erm.models import get_loss, objective_value
from mpc_erm.simulate.methods import METHODS, ONE_SHOT, Setting, nonprivate_optimum, run_method
from mpc_erm.simulate.parties import SimulatedParties

Progress = Callable[[str], None]


class ExperimentConfig(BaseModel):
    """A simulation experiment (TOML table ``[simulate]`` or CLI flags). Errors name the field."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = "breast_cancer"
    data_root: str | None = None
    n_train: int | None = Field(None, ge=1)
    n_test: int | None = Field(None, ge=1)
    parties: int = Field(10, ge=1, le=1_000_000)
    partition: Literal["equal", "dirichlet"] = "equal"
    dirichlet_alpha: float = Field(1.0, gt=0)
    model: Literal["logistic", "ridge", "huber_svm", "softmax"] = "logistic"
    lam: float = Field(1e-3, gt=0)
    epsilon: float = Field(0.5, gt=0)
    delta: float = Field(1e-3, gt=0, lt=1)
    G: float = Field(1.0, gt=0, description="Lipschitz bound / clipping norm")
    learning_rate: float = Field(1.0, gt=0)
    iterations: int = Field(1500, ge=1, le=100_000)
    conventions: list[Literal["exact", "thesis"]] = ["exact"]
    methods: list[str] = list(METHODS)
    seeds: list[int] = [0]
    eval_every: int = Field(10, ge=1)

    @field_validator("methods")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if x not in METHODS]
        if bad:
            raise ValueError(f"unknown method(s) {bad}; valid: {', '.join(METHODS)}")
        return v


def _split(cfg: ExperimentConfig, y: np.ndarray, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if cfg.partition == "equal":
        return partition_equal(n, cfg.parties, rng)
    return partition_dirichlet(y, cfg.parties, cfg.dirichlet_alpha, rng)


def run_experiment(cfg: ExperimentConfig, progress: Progress | None = None) -> dict:
    """Run every (convention, method, seed); return a JSON-ready dict of curves and summaries."""
    say = progress or (lambda _msg: None)
    kw = {k: v for k, v in (("n_train", cfg.n_train), ("n_test", cfg.n_test)) if v is not None}
    train, test = load_dataset(cfg.dataset, root=cfg.data_root, **kw)
    n_classes = train.n_classes if cfg.model == "softmax" else None
    loss = get_loss(cfg.model, **({"n_classes": n_classes} if n_classes else {}))
    Xtr, ytr = torch.from_numpy(np.array(train.X, dtype=np.float64)), torch.from_numpy(np.array(train.y))
    Xte, yte = torch.from_numpy(np.array(test.X, dtype=np.float64)), torch.from_numpy(np.array(test.y))
    theta_star = nonprivate_optimum(loss, Xtr, ytr, cfg.lam)
    j_star = float(objective_value(loss, theta_star, Xtr, ytr, cfg.lam))
    s_star = loss.score(theta_star, Xte, yte)
    regression = loss.task == "regression"

    def metrics(theta: torch.Tensor) -> tuple[float, float]:
        gap = float(objective_value(loss, theta, Xtr, ytr, cfg.lam)) - j_star
        s = loss.score(theta, Xte, yte)
        return gap, (s - s_star) if regression else (s_star - s)

    def score_from_loss(acc_loss: float) -> float:
        return s_star + acc_loss if regression else s_star - acc_loss

    grid = sorted(set(range(cfg.eval_every, cfg.iterations + 1, cfg.eval_every)) | {cfg.iterations})
    runs = []
    n_min = 0
    for seed in cfg.seeds:
        parties = SimulatedParties.from_partition(train, _split(cfg, np.asarray(train.y), train.n, seed))
        n_min = parties.sizes.n_min
        for convention in cfg.conventions:
            setting = Setting(model=cfg.model, lam=cfg.lam, epsilon=cfg.epsilon, delta=cfg.delta, G=cfg.G,
                              learning_rate=cfg.learning_rate, iterations=cfg.iterations,
                              convention=convention, n_classes=n_classes)
            for method in cfg.methods:
                gen = torch.Generator().manual_seed(1_000_003 * seed + METHODS.index(method))
                curve: dict[int, tuple[float, float]] = {}
                wanted = set(grid)

                def hook(t: int, theta: torch.Tensor, curve: dict = curve, wanted: set = wanted) -> None:
                    if t in wanted:
                        curve[t] = metrics(theta)

                t0 = time.perf_counter()
                run = run_method(method, setting, parties, gen, hook=hook)
                seconds = time.perf_counter() - t0
                if method in ONE_SHOT:
                    value = metrics(run.theta)
                    curve = {t: value for t in grid}
                gaps = [curve[t][0] for t in grid]
                losses = [curve[t][1] for t in grid]
                runs.append({
                    "method": method, "convention": convention, "seed": seed,
                    "final_optimality_gap": gaps[-1], "final_relative_accuracy_loss": losses[-1],
                    "final_test_score": score_from_loss(losses[-1]),
                    "optimality_gap": gaps, "relative_accuracy_loss": losses,
                    "seconds": seconds, "privacy": run.privacy,
                })
                say(f"{convention:6s} {method:17s} seed {seed}: gap {gaps[-1]:.3e}  "
                    f"acc loss {losses[-1]:+.3e}  ({seconds:.1f}s)")
    return {
        "config": cfg.model_dump(mode="json"),
        "data": {"name": train.name, "n_train": train.n, "n_test": test.n, "d": train.d,
                 "parties": cfg.parties, "party_size_min": n_min},
        "nonprivate": {"objective": j_star, "test_score": s_star,
                       "score": "mse" if regression else "accuracy"},
        "iterations": grid,
        "runs": runs,
        "summary": summarise(runs),
    }


def summarise(runs: list[dict]) -> list[dict]:
    """Mean and std over seeds of the final figures, per (convention, method)."""
    out = []
    keys = sorted({(r["convention"], r["method"]) for r in runs}, key=lambda k: (k[0], METHODS.index(k[1])))
    for conv, meth in keys:
        sel = [r for r in runs if r["convention"] == conv and r["method"] == meth]
        g = np.array([r["final_optimality_gap"] for r in sel])
        a = np.array([r["final_relative_accuracy_loss"] for r in sel])
        out.append({"convention": conv, "method": meth, "seeds": len(sel),
                    "optimality_gap_mean": float(g.mean()), "optimality_gap_std": float(g.std()),
                    "relative_accuracy_loss_mean": float(a.mean()), "relative_accuracy_loss_std": float(a.std()),
                    "test_score_mean": float(np.mean([r["final_test_score"] for r in sel])),
                    "epsilon": sel[0]["privacy"].get("epsilon"),
                    "seconds_mean": float(np.mean([r["seconds"] for r in sel]))})
    return out
