"""Is the daemons' small deficit against the simulator their larger noise? The simulator again, at
the daemons' noise multiplier (issue 17).

``benchmarks.dp_fed_ls_daemons`` compares each daemon run with the in-process simulator at the same
ε, but the simulator calibrates the *continuous* Gaussian while the job's plan accounts the
in-MPC *discrete* Gaussian (by the general Zhu–Wang bound for Poisson subsampling,
docs/privacy.md §4), so the daemons add more noise at the same ε (16 % at ε = 6, 1–2 % at
ε = 7–9). This script reads a result file of ``dp_fed_ls_daemons`` and, for every run of a cell
with at least ``--min-runs`` runs, runs the simulator with the same seed at the noise the daemons
added (ν = z_daemons·𝓛 on the sum): if the daemons match it, what separates them from the
simulator at its own z is the accounting of the discrete noise, not the MPC.

    .venv/bin/python -m benchmarks.dp_fed_ls_same_z benchmarks/results/dp_fed_ls_daemons_poisson_cpu.json \\
        --out benchmarks/results/dp_fed_ls_same_z_poisson.json
"""

from __future__ import annotations

import argparse
import json
import logging
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
    tic = time.perf_counter()
    rows, cells = [], []
    only = None if a.epsilons is None else {float(e) for e in a.epsilons.split(",")}
    for (deadline, eps, sig), runs in daemon_cells(src["rows"]).items():
        if len(runs) < a.min_runs or (only is not None and eps not in only):
            continue
        same = []
        for r in sorted(runs, key=lambda r: r["seed"]):
            z = r["daemons"]["noise_multiplier"]
            s = run(epsilon=eps, ls_sigma=sig, seed=r["seed"], nu=z * clip, **same_setting)  # type: ignore[arg-type]
            rows.append({"epsilon_target": eps, "ls_sigma": sig, "seed": r["seed"], "noise_multiplier": z,
                         "daemons": r["daemons"]["test_accuracy"], "simulator_own_z": r["simulator"]["test_accuracy"],
                         "simulator_daemons_z": s["test_accuracy"], "seconds": s["seconds"]})
            same.append(rows[-1])
            own = r["simulator"]
            print(f"ε = {eps:g}, σ_LS = {sig:g}, seed {r['seed']}: daemons {100 * r['daemons']['test_accuracy']:.2f} "
                  f"%, simulator at the daemons' z {z:.3f}: {100 * s['test_accuracy']:.2f} % (at its own z "
                  f"{own['noise_multiplier']:.3f}: {100 * own['test_accuracy']:.2f} %)", flush=True)

        def mean(key: str, rs: list[dict[str, Any]] = same) -> float:
            return 100 * statistics.mean(x[key] for x in rs)

        diffs = [100 * (x["daemons"] - x["simulator_daemons_z"]) for x in same]
        cells.append({"epsilon_target": eps, "ls_sigma": sig, "round_deadline_s": deadline, "runs": len(same),
                      "daemons_mean": mean("daemons"), "simulator_own_z_mean": mean("simulator_own_z"),
                      "simulator_daemons_z_mean": mean("simulator_daemons_z"),
                      "daemons_minus_simulator_daemons_z": statistics.mean(diffs),
                      "standard_error": statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None})
    for c in cells:
        print(f"ε = {c['epsilon_target']:g}, σ_LS = {c['ls_sigma']:g} ({c['runs']} runs): daemons "
              f"{c['daemons_mean']:.2f} %, simulator at the daemons' z {c['simulator_daemons_z_mean']:.2f} %, at its "
              f"own z {c['simulator_own_z_mean']:.2f} %; daemons − simulator at the same z "
              f"{c['daemons_minus_simulator_daemons_z']:+.2f}"
              + ("" if c["standard_error"] is None else f" ± {c['standard_error']:.2f} (s.e.)"))
    if a.out:
        a.out.write_text(json.dumps({
            "benchmark": "dp_fed_ls_same_z", "machine": machine_info(),
            "command": "python -m benchmarks.dp_fed_ls_same_z " + " ".join(sys.argv[1:] if argv is None else argv),
            "source": str(a.daemons), "setting": same_setting,
            "what": "test accuracy of each daemon run beside the simulator's run of the "
            "same seed at the daemons' noise multiplier and at its own (continuous Gaussian) one",
            "cells": cells, "rows": rows, "wall_seconds": time.perf_counter() - tic}, indent=1) + "\n")


if __name__ == "__main__":
    main()
