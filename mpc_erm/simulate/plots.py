"""PNG figures in the layout of the thesis's Figures 6.1–6.9: optimality gap and relative accuracy
loss against the iteration, one line per method (mean over seeds)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from mpc_erm.simulate.methods import LABELS, METHODS


def plot_experiment(result: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    it = np.asarray(result["iterations"])
    written = []
    for conv in sorted({r["convention"] for r in result["runs"]}):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for meth in METHODS:
            sel = [r for r in result["runs"] if r["convention"] == conv and r["method"] == meth]
            if not sel:
                continue
            for ax, key in zip(axes, ("optimality_gap", "relative_accuracy_loss")):
                y = np.mean([r[key] for r in sel], axis=0)
                ax.plot(it, np.maximum(np.abs(y), 1e-12), label=LABELS[meth])
        d = result["data"]
        for ax, title in zip(axes, ("Optimality gap  J(θ) − J(θ*)", "|Relative accuracy loss|")):
            ax.set_yscale("log")
            ax.set_xlabel("iteration")
            ax.set_title(title)
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{d['name']}: m = {d['parties']}, n = {d['n_train']}, "
                     f"ε = {result['config']['epsilon']}, δ = {result['config']['delta']} ({conv} calibration)")
        fig.tight_layout()
        path = out_dir / f"{d['name']}_m{d['parties']}_{conv}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
