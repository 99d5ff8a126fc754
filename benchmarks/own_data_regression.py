"""A regression from raw CSV files through the daemons: California housing as three parties' files.

What a user bringing their own CSV files does, measured: the rows (20,640 block groups, dollars, raw counts) split
into three parties' CSV files and 4,000 held-out rows; a data schema with public bounds (the
census's extent and top-codes, not the data's minimum and maximum); the dry run (``forecast_job``,
what ``mpc-erm job plan`` prints) of ridge gradient perturbation; the same job through three
replicated party daemons with the in-MPC noise; the released model's R² on the held-out rows in
dollars, beside the forecast, the exact minimiser of the same objective on the same features, and
scikit-learn's least squares on the raw columns (no privacy, no bounds). Also the forecast of the
output perturbation the issue tried first.

    python -m benchmarks.own_data_regression --out benchmarks/results/own_data_housing.json

Needs ``../shared/data`` (or $MPC_ERM_DATA) for ``california_housing/cal_housing.csv.gz``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

SCHEMA = """
intercept = true
missing = "drop"

[label]
column = "median_house_value"
task = "regression"
low = 0            # dollars: the census top-codes values at 500,001
high = 500001
{columns}
"""
#: (column, public low, public high): California's extent, the census's top-codes, generous counts.
COLUMNS = (("longitude", -124.5, -114.0), ("latitude", 32.5, 42.0), ("housing_median_age", 0, 52),
           ("median_income", 0, 15), ("total_rooms", 0, 10000), ("households", 0, 2000))

JOB = """
method = "{method}"

[job]
name = "prices-{method}-{T}"
dataset = "prices"
parties = ["alice", "bob", "carol"]
trust = "replicated"

[model]
name = "ridge"
lam = 1e-3

[privacy]
epsilon = {eps}
delta = 1e-7
clip = 1.0
mechanism = "gaussian"

[training]
iterations = {T}
learning_rate = 1.9
"""


def _files(root: Path, held_out: int, seed: int) -> dict[str, Path]:
    import numpy as np
    import pandas as pd

    from mpc_erm.data.sets import data_root

    df = pd.read_csv(data_root() / "california_housing" / "cal_housing.csv.gz")
    order = np.random.default_rng(seed).permutation(len(df))
    out = {"new": root / "new.csv"}
    df.iloc[order[:held_out]].to_csv(out["new"], index=False)
    rest = df.iloc[order[held_out:]]
    for k, p in enumerate(("alice", "bob", "carol")):
        out[p] = root / f"{p}.csv"
        rest.iloc[k::3].to_csv(out[p], index=False)
    return out


def run(iterations: list[int], epsilon: float, held_out: int = 4000, seed: int = 0, runs: int = 5) -> dict[str, Any]:
    import numpy as np
    import pandas as pd
    from sklearn.linear_model import LinearRegression
    from sklearn.metrics import r2_score

    from coordinator.consortium import LocalConsortium
    from mpc_erm import load_model
    from mpc_erm.data.schema import load_schema, read_csv_with_schema
    from mpc_erm.jobs import load_job_file
    from mpc_erm.jobs.status import TERMINAL
    from mpc_erm.simulate.forecast import forecast_job

    with tempfile.TemporaryDirectory(prefix="own-data-") as tmp:
        root = Path(tmp)
        files = _files(root, held_out, seed)
        schema_file = root / "schema.toml"
        schema_file.write_text(SCHEMA.format(columns="".join(
            f'\n[[columns]]\nname = "{c}"\ntype = "numeric"\nlow = {lo}\nhigh = {hi}\n' for c, lo, hi in COLUMNS)))
        schema = load_schema(schema_file)
        parts = [read_csv_with_schema(files[p], schema) for p in ("alice", "bob", "carol")]
        held = read_csv_with_schema(files["new"], schema)
        frame = pd.read_csv(files["new"], dtype=str, keep_default_na=False)
        truth = frame["median_house_value"].astype(float)
        raw = pd.concat([pd.read_csv(files[p]) for p in ("alice", "bob", "carol")])
        cols = [c for c, _, _ in COLUMNS]
        ols = LinearRegression().fit(raw[cols], raw["median_house_value"])
        sklearn_r2 = float(r2_score(truth, ols.predict(pd.read_csv(files["new"])[cols])))

        out_job = root / "output.toml"
        out_job.write_text(JOB.format(method="output", T=1, eps=epsilon).split("[training]")[0])
        fc_out = forecast_job(load_job_file(out_job).spec, parts, evaluate=held, runs=runs, seed=seed)
        out_band = fc_out.band()
        rows: list[dict[str, Any]] = []
        data = {p: {"format": "csv", "path": files[p], "schema": schema_file} for p in ("alice", "bob", "carol")}
        with LocalConsortium(root / "cons", dataset="prices", party_data=data, dealer=False,
                             budget_epsilon=10.0 * len(iterations), budget_delta=1e-5,
                             max_epsilon_per_job=epsilon, max_iterations=max(iterations)) as cons:
            for T in iterations:
                job = root / f"gradient-{T}.toml"
                job.write_text(JOB.format(method="gradient", T=T, eps=epsilon))
                fc = forecast_job(load_job_file(job).spec, parts, evaluate=held, runs=runs, seed=seed)
                tic = time.perf_counter()
                with cons.client() as client:
                    job_id = client.submit(job)["job_id"]
                    ends = {e["member"]: e["phase"] for e in client.watch(job_id)
                            if e["phase"] in TERMINAL or e["phase"] == "error"}
                    seconds = time.perf_counter() - tic
                    if set(ends.values()) != {"succeeded"}:
                        raise RuntimeError(f"gradient job T = {T} ended {ends}")
                    client.result(job_id, root / f"result-{T}")
                model = load_model(root / f"result-{T}")
                report = json.loads((root / f"result-{T}" / "privacy_report.json").read_text())
                band = fc.band()
                assert band is not None
                pred = np.asarray(model.predict(frame), dtype=float)
                rows.append({"iterations": T, "daemons_r2": float(r2_score(truth, pred)),
                             "daemons_seconds_submit_to_end": round(seconds, 2),
                             "forecast_r2_mean": band[0], "forecast_r2_10_90": [band[1], band[2]],
                             "forecast_noise_free_r2": fc.noise_free, "noise_std_per_coordinate": fc.noise_std,
                             "report_noise_scale": report["noise_scale"], "epsilon": report["epsilon"],
                             "delta": report["delta"], "accountant": report["accountant"]})
    return {
        "benchmark": "own_data_regression", "data": "California housing (StatLib), 3 parties' CSV files",
        "rows_per_party": [p.n for p in parts], "held_out_rows": held.n, "features": parts[0].d,
        "schema_columns": [list(c) for c in COLUMNS], "label_bounds_dollars": [0, 500001],
        "job": {"method": "gradient", "model": "ridge", "lam": 1e-3, "learning_rate": 1.9, "clip": 1.0,
                "epsilon": epsilon, "delta": 1e-7, "trust": "3 replicated party daemons, in-MPC noise"},
        "exact_minimiser_r2": fc_out.nonprivate, "sklearn_least_squares_raw_columns_r2": sklearn_r2,
        "gradient": rows,
        "output_forecast": {"noise_std_per_coordinate": fc_out.noise_std, "noise_to_signal": fc_out.noise_to_signal,
                            "r2_mean": None if out_band is None else out_band[0], "hopeless": fc_out.hopeless},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", default="300,1000", help="gradient rounds, comma-separated")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5, help="forecast runs per job")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    res = run([int(t) for t in a.iterations.split(",")], a.epsilon, runs=a.runs)
    res["command"] = "python -m benchmarks.own_data_regression" + (f" --iterations {a.iterations}"
                                                                     if a.iterations != "300,1000" else "")
    text = json.dumps(res, indent=1, default=float)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
