"""Per-example gradients for DP-SGD: torch.func (what ``mpc_erm.models.per_example_grads`` uses)
against Opacus's ``GradSampleModule`` and the plain loop of one backward pass per example, on the
networks a job can name, so that the one the product keeps is chosen by measurement.

For each network and device: examples per second of the per-example gradient of a batch (the
expected Poisson batch of the MNIST setting, 256), the median of ``--repeats`` timed calls after a
warm-up, each method's gradients compared with the loop's (max relative error, so that a fast
wrong answer cannot win), and the ratios to the loop measured in the same run. Opacus is optional
(not a product dependency): without it its rows say so.

    .venv/bin/python -m benchmarks.per_example --out benchmarks/results/per_example_cpu.json
    python -m benchmarks.per_example --device cuda --out per_example_cuda.json   # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks.aggregate import machine_info
from mpc_erm.models import build_network, flatten_grads, per_example_grads
from mpc_erm.models.networks import NetworkSpec

NETWORKS = {
    "mlp": NetworkSpec("mlp", (784,), 10, hidden=(256, 128)),
    "mnist_cnn": NetworkSpec("mnist_cnn", (1, 28, 28), 10),
    "cifar_cnn": NetworkSpec("cifar_cnn", (3, 32, 32), 10),
    "char_lstm": NetworkSpec("char_lstm", (32,), 64, hidden=(128,), vocab=64),
}
LOSS = nn.functional.cross_entropy


def _inputs(spec: NetworkSpec, n: int, device: str, g: torch.Generator) -> tuple[Tensor, Tensor]:
    if spec.name == "char_lstm":
        X = torch.randint(0, spec.vocab, (n, *spec.input_shape), generator=g)
    else:
        X = torch.rand(n, *spec.input_shape, generator=g)
    return X.to(device), torch.randint(0, spec.n_outputs, (n,), generator=g).to(device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _loop(model: nn.Module, X: Tensor, y: Tensor) -> Tensor:
    rows = []
    for i in range(X.shape[0]):
        model.zero_grad(set_to_none=True)
        LOSS(model(X[i : i + 1]), y[i : i + 1]).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    return torch.stack(rows)


def _torch_func(model: nn.Module, X: Tensor, y: Tensor) -> Tensor:
    return flatten_grads(per_example_grads(model, LOSS, X, y), model)


def _opacus(model: nn.Module) -> Callable[[nn.Module, Tensor, Tensor], Tensor] | str:
    try:
        from opacus import GradSampleModule
    except ImportError:
        return "opacus not installed"
    try:
        gsm = GradSampleModule(model, loss_reduction="sum")
    except Exception as exc:  # an architecture Opacus does not support
        return f"unsupported: {type(exc).__name__}: {exc}"

    def run(_m: nn.Module, X: Tensor, y: Tensor) -> Tensor:
        gsm.zero_grad(set_to_none=True)
        LOSS(gsm(X), y, reduction="sum").backward()
        return torch.cat([p.grad_sample.reshape(X.shape[0], -1) for p in gsm.parameters()], dim=1)

    return run


def _time(fn: Callable[[], Tensor], device: str, repeats: int) -> tuple[float, Tensor]:
    out = fn()  # warm-up (and the value compared)
    _sync(device)
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - tic)
    return statistics.median(times), out


def measure(name: str, device: str, batch: int, repeats: int, loop_rows: int) -> dict[str, Any]:
    spec = NETWORKS[name]
    g = torch.Generator().manual_seed(0)
    X, y = _inputs(spec, batch, device, g)
    model = build_network(spec, device)
    p = sum(t.numel() for t in model.parameters())
    row: dict[str, Any] = {"network": name, "parameters": p, "device": device, "batch": batch}
    # the loop is the baseline: timed on loop_rows examples (it is linear in the batch), compared on them
    t_loop, ref = _time(lambda: _loop(model, X[:loop_rows], y[:loop_rows]), device, max(1, repeats // 3))
    row["loop"] = {"examples_per_s": loop_rows / t_loop}
    methods: dict[str, Any] = {"torch_func": _torch_func, "opacus": _opacus(build_network(spec, device))}
    for label, fn in methods.items():
        if isinstance(fn, str):
            row[label] = {"skipped": fn}
            continue
        try:
            t, got = _time(lambda fn=fn: fn(model, X, y), device, repeats)
        except Exception as exc:  # a method that fails on a network is a result
            row[label] = {"failed": f"{type(exc).__name__}: {str(exc)[:200]}"}
            continue
        err = float(((got[:loop_rows] - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).max())
        row[label] = {"examples_per_s": batch / t, "seconds_per_batch": t, "vs_loop": (batch / t) / row["loop"][
            "examples_per_s"], "max_relative_error_vs_loop": err}
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--loop-rows", type=int, default=32, help="examples the per-example backward loop is timed on")
    ap.add_argument("--networks", default=",".join(NETWORKS))
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    rows = []
    for name in a.networks.split(","):
        row = measure(name, a.device, a.batch, a.repeats, a.loop_rows)
        rows.append(row)
        cells = [f"{k} {row[k]['examples_per_s']:,.0f}/s" if "examples_per_s" in row[k] else
                 f"{k} {next(iter(row[k].values()))}" for k in ("loop", "torch_func", "opacus")]
        print(f"{name} ({row['parameters']:,} params, {a.device}): " + "; ".join(cells), flush=True)
    res = {"benchmark": "per_example", "machine": machine_info(), "torch": torch.__version__,
           "cuda_device": torch.cuda.get_device_name() if a.device.startswith("cuda") else None,
           "what": "per-example gradients of a batch (examples/s, median of repeats), torch.func vs Opacus "
                   "GradSampleModule vs one backward per example (baseline, same run)", "rows": rows}
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()
