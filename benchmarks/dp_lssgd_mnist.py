"""DP-LSSGD Table 2 setting with a valid accountant: does Laplacian smoothing still help?

Setting (paper 000 §4.1, docs/explanation/papers.md §A4.1): multinomial logistic regression on MNIST, λ = 1e-4, 50
epochs, batch 128, step a/t, train 50K / validation 10K (we report the 10K MNIST test set too),
δ = 1e-5, ε ∈ {0.30, 0.25, 0.20, 0.15, 0.10}, LS σ ∈ {0, 1, 2, 3}, 5 runs.

The paper calibrates ν with its Theorem 2, whose conditions cannot hold at these settings (docs/explanation/papers.md
§A2, verified). Here each step is a Poisson-subsampled Gaussian (rate q = b/n, expected batch b,
per-example clip C, add/remove adjacency, sum divided by the public b) and σ is the smallest
noise multiplier for which Google's dp-accounting PLD accountant certifies (ε, δ) after all
steps. Smoothing is applied after the noise (post-processing).

"Learning rate 1/t, t the iteration index" cannot be meant literally: Σ_t 1/t grows like log T,
and even without noise 1/t per iteration reaches only 63 % test accuracy after 5 epochs, against
83 % with 1/t per epoch (measured here). We take t = the epoch (``--schedule epoch``, default) and
keep ``--schedule iteration`` to show the difference.

    .venv/bin/python -m benchmarks.dp_lssgd_mnist --out benchmarks/results/dp_lssgd_mnist.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from mpc_erm.data import load_dataset
from mpc_erm.models import get_loss
from mpc_erm.privacy import epsilon_for, noise_multiplier_for, sample_noise
from mpc_erm.smoothing import laplacian_smooth

PAPER_TABLE_2 = {  # test accuracy % (mean, std) from the paper, for side-by-side reading
    0.30: {0: (81.74, 0.96), 1: (84.21, 0.51), 2: (84.23, 0.65), 3: (85.11, 0.45)},
    0.25: {0: (81.45, 1.59), 1: (83.27, 0.35), 2: (83.65, 0.76), 3: (82.97, 0.48)},
    0.20: {0: (78.92, 1.14), 1: (81.56, 0.79), 2: (82.15, 0.59), 3: (82.22, 0.28)},
    0.15: {0: (77.03, 0.69), 1: (79.46, 1.33), 2: (80.77, 1.26), 3: (80.81, 1.03)},
    0.10: {0: (73.49, 1.60), 1: (76.29, 0.53), 2: (76.31, 0.93), 3: (77.13, 0.77)},
}


def train_one(X: torch.Tensor, y: torch.Tensor, *, lam: float, epochs: int, batch: int, clip: float,
              noise_multiplier: float, ls_sigma: float, step_a: float, seed: int,
              schedule: str = "epoch") -> torch.Tensor:
    """DP-(LS)SGD; the step is a/t with t the epoch (``schedule="epoch"``) or the iteration."""
    loss = get_loss("softmax", n_classes=10)
    n, d = X.shape
    gen = torch.Generator().manual_seed(seed)
    q = batch / n
    steps = int(round(epochs * n / batch))
    theta = torch.zeros(loss.param_dim(d), dtype=torch.float64)
    for t in range(1, steps + 1):
        take = torch.rand(n, generator=gen) < q  # Poisson subsampling: each row independently
        Xb, yb = X[take], y[take]
        g = loss.clipped_weighted_grad(theta, Xb, yb, torch.ones(Xb.shape[0], dtype=Xb.dtype), clip)
        noisy = (g + sample_noise("gaussian", noise_multiplier * clip, g.shape, gen)) / batch
        direction = laplacian_smooth(noisy + lam * theta, ls_sigma)
        k = t if schedule == "iteration" else 1 + (t - 1) * batch // n
        theta = theta - (step_a / k) * direction
    return theta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epsilons", default="0.30,0.25,0.20,0.15,0.10")
    ap.add_argument("--sigmas", default="0,1,2,3")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--lam", type=float, default=1e-4)
    ap.add_argument("--step-a", type=float, default=1.0, help="learning rate a/t")
    ap.add_argument("--schedule", default="epoch", choices=["epoch", "iteration"], help="what t counts")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--accountant", default="pld", choices=["pld", "rdp"])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/dp_lssgd_mnist.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)

    train, test = load_dataset("mnist")
    loss = get_loss("softmax", n_classes=10)
    X = torch.from_numpy(np.array(train.X[:50_000], dtype=np.float64))
    y = torch.from_numpy(np.array(train.y[:50_000]))
    Xv = torch.from_numpy(np.array(train.X[50_000:], dtype=np.float64))
    yv = torch.from_numpy(np.array(train.y[50_000:]))
    Xt, yt = torch.from_numpy(np.array(test.X, dtype=np.float64)), torch.from_numpy(np.array(test.y))
    n = X.shape[0]
    q = args.batch / n
    steps = int(round(args.epochs * n / args.batch))
    results = []
    for eps in [float(e) for e in args.epsilons.split(",")]:
        z = noise_multiplier_for(args.accountant, eps, args.delta, steps, sampling_rate=q, adjacency="add_remove")
        eps_check = epsilon_for(args.accountant, z, steps, args.delta, sampling_rate=q, adjacency="add_remove")
        for s in [float(v) for v in args.sigmas.split(",")]:
            accs, vaccs, secs = [], [], []
            for run in range(args.runs):
                t0 = time.perf_counter()
                theta = train_one(X, y, lam=args.lam, epochs=args.epochs, batch=args.batch, clip=args.clip,
                                  noise_multiplier=z, ls_sigma=s, step_a=args.step_a, seed=1000 * run + 7,
                                  schedule=args.schedule)
                secs.append(time.perf_counter() - t0)
                accs.append(100 * loss.score(theta, Xt, yt))
                vaccs.append(100 * loss.score(theta, Xv, yv))
            paper = PAPER_TABLE_2.get(round(eps, 2), {}).get(int(s))
            row = {"epsilon": eps, "delta": args.delta, "ls_sigma": s, "noise_multiplier": z,
                   "accountant_epsilon_at_z": eps_check, "test_accuracy_mean": float(np.mean(accs)),
                   "test_accuracy_std": float(np.std(accs)), "validation_accuracy_mean": float(np.mean(vaccs)),
                   "runs": args.runs, "seconds_per_run": float(np.mean(secs)),
                   "paper_test_accuracy": paper}
            results.append(row)
            print(json.dumps(row), flush=True)
    out = {
        "benchmark": "dp_lssgd_mnist",
        "setting": {**vars(args), "out": str(args.out), "n_train": n, "steps": steps, "sampling_rate": q,
                    "sampling": "Poisson", "adjacency": "add_remove", "loss": "softmax (multinomial logistic)"},
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": 1},
        "results": results,
        "smoothing_gain_points": {
            f"{e:.2f}": {f"sigma={s:g}": r["test_accuracy_mean"] - base["test_accuracy_mean"]
                         for r in results if r["epsilon"] == e and (s := r["ls_sigma"]) > 0
                         for base in [next(b for b in results if b["epsilon"] == e and b["ls_sigma"] == 0)]}
            for e in sorted({r["epsilon"] for r in results})
        } if any(r["ls_sigma"] == 0 for r in results) else {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
