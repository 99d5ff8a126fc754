"""Is the daemons' small deficit against the simulator their larger noise? The simulator again, at
the daemons' noise multiplier.

``benchmarks.dp_fed_ls_daemons`` compares each daemon run with the in-process simulator at the same
ε, but the simulator calibrates the *continuous* Gaussian while the job's plan accounts the in-MPC
*discrete* Gaussian, which the recorded runs accounted by the general Zhu–Wang bound for Poisson
subsampling, so the daemons added more noise at the same ε (16 % at ε = 6, 1–2 % at ε = 7–9). The
plan now accounts it by its exact moments (docs/explanation/privacy.md §4), within 5 % of the
continuous Gaussian's z under RDP (at ε = 6; less at larger ε). This script reads a result file of
``dp_fed_ls_daemons`` and, for every run of a cell with at least ``--min-runs`` runs, runs the
simulator with the same seed at the noise the daemons added (ν = z_daemons·𝓛 on the sum): if the
daemons match it, what separates them from the simulator at its own z is the accounting of the
discrete noise, not the MPC.

A simulator seed fixes everything random in its run — the initial weights, every owner's batch
order, the sampler and the noise — and the same seeds recur in every cell, so one seed's luck
recurs in every cell too; a daemon seed fixes only the initial weights (``init_seed``; the coins
and the noise are fresh). Runs pooled over cells are therefore not independent: ``pooled`` takes
the seed as the unit (each seed's mean over the cells, its standard error over seeds), and
``--extra-seeds K`` runs the simulator at K further seeds per cell, so its mean rests on more
than the daemons' five seeds.

    .venv/bin/python -m benchmarks.dp_fed_ls_same_z benchmarks/results/dp_fed_ls_daemons_poisson_cpu.json \\
        --epsilons 6,7,8,9 --extra-seeds 5 --out benchmarks/results/dp_fed_ls_same_z_poisson.json

An existing ``--out`` keeps its cells of other (round deadline, ε, σ_LS) and its command for them.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.aggregate import machine_info
from benchmarks.dp_fed_ls_daemons import cells as daemon_cells
from benchmarks.dp_fed_ls_mnist import run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("daemons", type=Path, help="a result file of benchmarks.dp_fed_ls_daemons")
    ap.add_argument("--min-runs", type=int, default=5, help="only cells with at least this many runs")
    ap.add_argument("--epsilons", help="only these ε (comma list); default: every cell with --min-runs runs")
    ap.add_argument("--extra-seeds", type=int, default=0,
                    help="the simulator also runs this many further seeds per cell (after the cell's largest)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's per-order convergence notes
    src = json.loads(a.daemons.read_text())
    setting = re.search(r"(\d+) owners × (\d+) rows, (\w+) τ = ([\d.]+), T = (\d+),.*𝓛 = ([\d.]+)", src["what"])
    if setting is None:
        raise SystemExit(f"{a.daemons}: its 'what' does not name the owners, rows, sampling, τ, T and 𝓛")
    owners, rows_each, sampling, rate, rounds, clip_text = setting.groups()
    clip = float(clip_text)  # 𝓛: the noise std on the sum is z·𝓛 (Poisson)
    if sampling != "poisson":
        raise SystemExit("only the Poisson setting: under uniform sampling the shift is 2𝓛 and the file's "
                         "simulator already uses the same accountant's z")
    same_setting = dict(sampling=sampling, owners=int(owners), rows=int(rows_each), rate=float(rate),
                        rounds=int(rounds), clip=clip)
    command = "python -m benchmarks.dp_fed_ls_same_z " + " ".join(sys.argv[1:] if argv is None else argv)
    tic = time.perf_counter()
    rows: list[dict[str, Any]] = []
    only = None if a.epsilons is None else {float(e) for e in a.epsilons.split(",")}
    for (deadline, eps, sig), runs in daemon_cells(src["rows"]).items():
        if len(runs) < a.min_runs or (only is not None and eps not in only):
            continue
        z = runs[0]["daemons"]["noise_multiplier"]  # the plan's: one per ε
        if any(r["daemons"]["noise_multiplier"] != z for r in runs):
            raise SystemExit(f"ε = {eps:g}, σ_LS = {sig:g}: the runs of one cell have different z")
        top = max(r["seed"] for r in runs)
        # each daemon run's seed (paired), then the simulator's further seeds (no daemon run)
        seeds = [(r["seed"], r) for r in sorted(runs, key=lambda r: r["seed"])]
        for seed, r in seeds + [(x, None) for x in range(top + 1, top + 1 + a.extra_seeds)]:
            s = run(epsilon=eps, ls_sigma=sig, seed=seed, nu=z * clip, **same_setting)  # type: ignore[arg-type]
            rows.append({"epsilon_target": eps, "ls_sigma": sig, "round_deadline_s": deadline, "seed": seed,
                         "noise_multiplier": z, "daemons": None if r is None else r["daemons"]["test_accuracy"],
                         "simulator_own_z": None if r is None else r["simulator"]["test_accuracy"],
                         "simulator_daemons_z": s["test_accuracy"], "seconds": s["seconds"], "command": command})
            print(f"ε = {eps:g}, σ_LS = {sig:g}, seed {seed}: "
                  + ("(further seed) " if r is None else f"daemons {100 * r['daemons']['test_accuracy']:.2f} %, ")
                  + f"simulator at the daemons' z {z:.3f}: {100 * s['test_accuracy']:.2f} %"
                  + ("" if r is None else f" (at its own z {r['simulator']['noise_multiplier']:.3f}: "
                                          f"{100 * r['simulator']['test_accuracy']:.2f} %)"), flush=True)
    fill = deadline_default(src)  # rows before they recorded their round deadline

    def key(x: dict[str, Any]) -> tuple[float, float, float]:
        return x.get("round_deadline_s", fill), x["epsilon_target"], x["ls_sigma"]

    new = {key(r) for r in rows}
    old = json.loads(a.out.read_text()) if a.out and a.out.exists() else {}
    if old and old.get("setting") != same_setting:
        raise SystemExit(f"--out: {a.out} holds another setting: {old.get('setting')}")
    kept = [{"command": old.get("command"), "round_deadline_s": fill, **r}
            for r in old.get("rows", []) if key(r) not in new]
    all_rows = sorted(kept + rows, key=lambda r: (r["epsilon_target"], r["ls_sigma"], r["seed"]))
    by_cell: dict[tuple[float, float, float], list[dict[str, Any]]] = {}
    for r in all_rows:
        by_cell.setdefault(key(r), []).append(r)
    cells = [cell_summary(e, s, d, [r for r in rs if r["daemons"] is not None], [r for r in rs if r["daemons"] is None])
             for (d, e, s), rs in sorted(by_cell.items(), key=lambda kv: (kv[0][1], kv[0][2]))]
    for c in cells:
        if key(c) not in new:
            continue
        print(f"ε = {c['epsilon_target']:g}, σ_LS = {c['ls_sigma']:g} ({c['runs']} runs): daemons "
              f"{c['daemons_mean']:.2f} %, simulator at the daemons' z {c['simulator_daemons_z_mean']:.2f} %, at its "
              f"own z {c['simulator_own_z_mean']:.2f} %; daemons − simulator at the same z "
              f"{c['daemons_minus_simulator_daemons_z']:+.2f}"
              + ("" if c["standard_error"] is None else f" ± {c['standard_error']:.2f} (s.e.)")
              + (f"; over {c['simulator_seeds']} simulator seeds {c['daemons_minus_simulator_all_seeds']:+.2f} ± "
                 f"{c['standard_error_all_seeds']:.2f}" if c["simulator_seeds"] > c["runs"] else ""))
    if a.out:
        a.out.write_text(json.dumps({
            "benchmark": "dp_fed_ls_same_z", "machine": machine_info(),
            "command": "several: each row's command" if kept else command,
            "source": str(a.daemons), "setting": same_setting,
            "what": "test accuracy of each daemon run beside the simulator's run of the same seed at the daemons' "
                    "noise multiplier and at its own (continuous Gaussian) one; rows with daemons null are the "
                    "simulator's further seeds (--extra-seeds); cell and pooled figures in percentage points",
            "cells": cells, "pooled": pooled(all_rows), "rows": all_rows,
            "wall_seconds_this_command": time.perf_counter() - tic}, indent=1) + "\n")


def deadline_default(src: dict[str, Any]) -> float:
    """The round deadline of a source file's cells (files before rows recorded it: one deadline)."""
    ds = {k[0] for k in daemon_cells(src["rows"])}
    return ds.pop() if len(ds) == 1 else math.nan


def cell_summary(eps: float, sig: float, deadline: float, same: list[dict[str, Any]],
                 extra: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell: the paired comparison (same seeds) and, with the further seeds, the daemons'
    mean against the simulator's over all its seeds (Welch's standard error)."""
    def pct(rs: list[dict[str, Any]], k: str) -> list[float]:
        return [100 * r[k] for r in rs]

    d, s_all = pct(same, "daemons"), pct(same + extra, "simulator_daemons_z")
    diffs = [x - y for x, y in zip(d, pct(same, "simulator_daemons_z"))]
    return {"epsilon_target": eps, "ls_sigma": sig, "round_deadline_s": deadline, "runs": len(same),
            "daemons_mean": statistics.mean(d), "simulator_own_z_mean": statistics.mean(pct(same, "simulator_own_z")),
            "simulator_daemons_z_mean": statistics.mean(pct(same, "simulator_daemons_z")),
            "daemons_minus_simulator_daemons_z": statistics.mean(diffs),
            "standard_error": _se(diffs),
            "simulator_seeds": len(s_all), "simulator_daemons_z_all_seeds_mean": statistics.mean(s_all),
            "daemons_minus_simulator_all_seeds": statistics.mean(d) - statistics.mean(s_all),
            "standard_error_all_seeds": _welch(d, s_all)}


def pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Daemons − simulator at the same z over the file's cells, per ε and over all, with the seed
    as the unit (module docstring): each seed's mean over the cells that ran it, then the mean and
    standard error over seeds — paired (the daemon runs' seeds) and unpaired (every simulator
    seed, Welch)."""
    out: dict[str, Any] = {}
    groups = {f"epsilon {e:g}": [r for r in rows if r["epsilon_target"] == e]
              for e in sorted({r["epsilon_target"] for r in rows})}
    for name, rs in {**groups, "all": rows}.items():
        cells_n = len({(r["epsilon_target"], r["ls_sigma"]) for r in rs})
        ran = [r for r in rs if r["daemons"] is not None]  # the rows with a daemon run
        paired = _seed_means(ran, lambda r: 100 * (r["daemons"] - r["simulator_daemons_z"]))
        dm = _seed_means(ran, lambda r: 100 * r["daemons"])
        sm = _seed_means(rs, lambda r: 100 * r["simulator_daemons_z"])
        out[name] = {"cells": cells_n, "daemon_seeds": len(dm), "simulator_seeds": len(sm),
                     "paired_by_seed": statistics.mean(paired), "paired_by_seed_standard_error": _se(paired),
                     "all_seeds": statistics.mean(dm) - statistics.mean(sm), "all_seeds_standard_error": _welch(dm, sm),
                     "paired_runs_naive_standard_error": _se([100 * (r["daemons"] - r["simulator_daemons_z"])
                                                              for r in ran])}
    return out


def _seed_means(rs: list[dict[str, Any]], value: Any) -> list[float]:
    by: dict[int, list[float]] = {}
    for r in rs:
        by.setdefault(r["seed"], []).append(value(r))
    return [statistics.mean(v) for _, v in sorted(by.items())]


def _se(xs: list[float]) -> float | None:
    return statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else None


def _welch(a: list[float], b: list[float]) -> float | None:
    if len(a) < 2 or len(b) < 2:
        return None
    return math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))


if __name__ == "__main__":
    main()
