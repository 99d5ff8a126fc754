"""`python -m benchmarks`: help, one-line errors, and tiny real runs returning the documented JSON;
and benchmarks are a leaf (the product's `mpc-erm` has no `bench` and never imports them)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from benchmarks.__main__ import cli
from coordinator.cli import cli as product_cli


def _run(*args: str) -> dict:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_help_works_without_torch() -> None:
    for args in (["--help"], ["aggregate", "--help"], ["sampler", "--help"], ["e2e", "--help"]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0 and "Usage:" in res.output
    code = "import sys, benchmarks.__main__; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "python -m benchmarks" in proc.stdout and "aggregate" in proc.stdout


def test_the_product_cli_has_no_bench() -> None:
    assert "bench" not in product_cli.commands
    res = CliRunner().invoke(product_cli, ["bench", "--help"])
    assert res.exit_code == 2 and "No such command 'bench'" in res.output
    code = "import sys, coordinator.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'benchmarks'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stderr


def test_bad_input_is_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "aggregate", "--parties", "2",
                           "--trust", "replicated"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: trust 'replicated' needs exactly 3 parties"


@pytest.mark.slow  # `make test-all`; default suite: the bench CLI's input checks: the tests below
def test_tiny_sampler_run(tmp_path) -> None:
    out = tmp_path / "s.json"
    r = _run("sampler", "--mechanism", "laplace", "--samples", "2000", "--randn-samples", "200", "--parties", "2",
             "--reference-samples", "20000", "--json", "--out", str(out))
    assert json.loads(out.read_text()) == r
    assert {"machine", "parameters", "mpc", "crypten_randn", "reference", "targets"} <= set(r)
    assert r["machine"]["cpu_count"] >= 1 and r["machine"]["torch"]
    assert "dealer" in r["trust_model"]
    mpc = r["mpc"]
    assert mpc["samples_per_second"] > 0 and mpc["rounds"] > 0 and mpc["bytes_per_sample"] > 0
    for block in (mpc, r["crypten_randn"], r["reference"]):
        st = block["stats"]
        assert {"ks_continuous", "rel_std_error", "tails", "max_abs_z"} <= set(st)
        assert set(st["tails"]) == {"3sigma", "4sigma", "5sigma"}
        assert 0 <= st["ks_continuous"] < 0.2  # a gross error, not a statistical test
    assert mpc["stats"]["n"] == 2000 and mpc["stats"]["outside_support"] == 0
    assert {"ks_exact_pmf", "ks_ideal_discrete"} <= set(mpc["stats"])
    assert r["crypten_randn"]["stats"]["n"] == 200


@pytest.mark.slow  # `make test-all`; default suite: the bench CLI's input checks: the tests below
def test_tiny_aggregate_run() -> None:
    r = _run("aggregate", "--parties", "2", "--dim", "10", "--rounds", "3", "--noise", "none",
             "--crypten-rounds", "2", "--trust", "tfp", "--json")
    assert {"machine", "parameters", "ours", "raw_grpc_floor", "crypten_gloo", "ratios", "targets"} <= set(r)
    assert r["ours"]["latency"]["rounds"] == 3 and r["raw_grpc_floor"]["latency"]["rounds"] == 3
    assert r["crypten_gloo"]["rounds_run"] == 2
    for block in ("ours", "raw_grpc_floor", "crypten_gloo"):
        lat = r[block]["latency"]
        assert 0 < lat["p50_s"] <= lat["p95_s"]
    assert r["ours"]["exactness_check"]["max_abs_error"] <= 2 * 2.0**-17 + 1e-12
    # the reveal (the range check's count riding along), then the parties' agreement on it
    assert r["ours"]["per_aggregate_party0"]["rounds"] == 2
    assert r["ratios"]["ours_over_floor_p50"] > 0
    assert "tests only" in r["ours"]["trust_model"] and "zero noise" in r["ours"]["trust_model"]
    assert [t["applies"] for t in r["targets"]] == [False, False, False, False]


def test_the_readme_table_of_daemon_runs_is_the_json_s() -> None:
    """docs/how-to/benchmarks.md's tables of DP-Fed-LS cells through the daemons on this machine (uniform with the
    owners in 2 or in 8 processes, and Poisson) are what ``benchmarks.dp_fed_ls_daemons --table``
    makes of the committed JSONs, line for line: a figure in docs/how-to/benchmarks.md cannot drift from the
    measurement."""
    from pathlib import Path

    from benchmarks.dp_fed_ls_daemons import cell_table, markdown_table

    root = Path(__file__).resolve().parents[1]
    readme = (root / "docs" / "how-to" / "benchmarks.md").read_text().splitlines()  # the benchmarks how-to page
    for name in ("uniform_cpu", "uniform_cpu_procs8", "poisson_cpu"):
        rows = json.loads((root / f"benchmarks/results/dp_fed_ls_daemons_{name}.json").read_text())["rows"]
        for made in (markdown_table(rows), cell_table(rows)):
            if not made:
                continue
            table = made.splitlines()
            start = readme.index(table[2])  # the first row: both files' tables share the header
            assert readme[start - 2:start + len(table) - 2] == table, name


def test_cells_with_several_runs_are_summarised_by_their_mean_and_spread() -> None:
    import statistics

    from benchmarks.dp_fed_ls_daemons import cell_table

    def row(eps: float, sig: float, seed: int, daemons: float, sim: float, deadline: float = 120.0) -> dict:
        return {"epsilon_target": eps, "ls_sigma": sig, "seed": seed,
                "daemons": {"test_accuracy": daemons, "round_deadline_s": deadline},
                "simulator": {"test_accuracy": sim}, "paper": {"mean": 0.8545, "std": 0.0024}}

    acc = [0.881, 0.884, 0.879, 0.886, 0.883]
    rows = [row(7, 0, i, a, a - 0.001) for i, a in enumerate(acc)] + [row(7, 1, 0, 0.88, 0.88)]
    assert cell_table(rows[-1:]) == ""  # one run: nothing to summarise
    # the same (ε, σ_LS) under another round deadline is another setting, not more runs of this one
    rows += [row(7, 0, 5, 0.5, 0.5, deadline=30.0)]
    lines = cell_table(rows).splitlines()
    assert len(lines) == 3  # the header, its rule, the one cell with several runs
    mean, sd = 100 * statistics.mean(acc), 100 * statistics.stdev(acc)
    assert lines[2] == (f"| 7 | 0 | 120 s | 5 | {mean:.2f} ± {sd:.2f} | {mean - 0.1:.2f} ± {sd:.2f} | "
                        f"85.45 ± 0.24 | {mean - 85.45:+.2f} |")


def test_append_keeps_rows_only_of_the_same_setting(tmp_path: pathlib.Path) -> None:
    """``dp_fed_ls_daemons --append`` adds rows to a result file whose one description ("what")
    must hold for all of them: a run of another setting (owners, sampling, processes, …) into
    that file is refused before anything runs, and the file is left as it was. The committed
    file is the uniform setting its documented command (docs/how-to/benchmarks.md) appends to (--owner-procs 2)."""
    from pathlib import Path

    from benchmarks import dp_fed_ls_daemons as bench

    root = Path(__file__).resolve().parents[1]
    committed = root / "benchmarks/results/dp_fed_ls_daemons_uniform_cpu.json"
    out = tmp_path / "cells.json"
    out.write_bytes(committed.read_bytes())
    for other in (["--owner-procs", "4"], ["--sampling", "poisson", "--owner-procs", "2"],
                  ["--owners", "999", "--owner-procs", "2"]):
        with pytest.raises(SystemExit) as info:  # the last --sampling counts
            bench.main(["--sampling", "uniform", *other, "--append", "--out", str(out)])
        assert "holds another setting" in str(info.value)
    assert out.read_bytes() == committed.read_bytes()
    kept = bench._kept_rows(committed, bench._what(_Args("uniform", 1000, 50, 0.05, 30, 2, "cpu")))
    assert len(kept) == len(json.loads(committed.read_text())["rows"])


class _Args:
    def __init__(self, sampling: str, owners: int, rows: int, rate: float, rounds: int, owner_procs: int,
                 owner_device: str) -> None:
        self.sampling, self.owners, self.rows, self.rate, self.rounds = sampling, owners, rows, rate, rounds
        self.owner_procs, self.owner_device = owner_procs, owner_device


def test_tiny_many_owners_run(tmp_path: pathlib.Path) -> None:
    """The per-round cost benchmark runs the daemon's own compute-party round (IntakeAggregator):
    every owner counted in every round at every compute party, online and intake times in each."""
    out = tmp_path / "m.json"
    subprocess.run([sys.executable, "-m", "benchmarks.many_owners", "--owners", "4", "--dim", "20", "--rounds", "2",
                    "--threads", "4", "--out", str(out)], check=True, timeout=300, capture_output=True)
    (r,) = json.loads(out.read_text())["results"]
    assert r["owners"] == 4 and r["agreed"] == [4, 4, 4] and len(r["round_s_per_round"]) == 2
    assert 0 < r["intake_s_p50"] and 0 < r["online_s_p50"] and r["mpc_bytes_per_round_per_party"] > 0
    assert len(r["owner_side"]["owner_round_s"]) == 2


@pytest.mark.data
@pytest.mark.long  # 45 s of daemons and owners for a benchmark's bookkeeping: CI's long run keeps it
def test_each_dp_fed_ls_daemons_run_has_owners_with_fresh_ledgers(tmp_path: pathlib.Path) -> None:
    """Runs of ``dp_fed_ls_daemons`` are independent repetitions: each gets new owners (identity,
    ledger, audit log), so no owner's ledger composes one run's job with another's. Three ε = 9
    jobs on the same four owners' rows would compose past the sampler's term and be refused; here
    every run trains with all four owners counted in both rounds. ``dp_fed_ls_same_z`` then reruns
    the simulator in those runs' setting at their z. Needs MNIST (the paper's data)."""
    out = tmp_path / "fed.json"
    subprocess.run([sys.executable, "-m", "benchmarks.dp_fed_ls_daemons", "--owners", "4", "--rows", "20",
                    "--rounds", "2", "--rate", "0.5", "--epsilons", "9", "--sigmas", "0", "--seeds", "0,1,2",
                    "--round-deadline", "30", "--out", str(out)], check=True, timeout=600, capture_output=True)
    rows = json.loads(out.read_text())["rows"]
    assert [r["seed"] for r in rows] == [0, 1, 2]
    for r in rows:
        d = r["daemons"]
        assert d["owners_failed"] == {} and d["owners_per_round"] == [4, 4], d
        assert 0.0 < d["test_accuracy"] <= 1.0
    # the simulator again at these runs' noise multiplier, in their setting (read from the file)
    same = tmp_path / "same_z.json"
    subprocess.run([sys.executable, "-m", "benchmarks.dp_fed_ls_same_z", str(out), "--min-runs", "3",
                    "--extra-seeds", "2", "--out", str(same)], check=True, timeout=600, capture_output=True)
    res = json.loads(same.read_text())
    assert res["setting"] == {"sampling": "poisson", "owners": 4, "rows": 20, "rate": 0.5, "rounds": 2, "clip": 0.4}
    assert [r["noise_multiplier"] for r in res["rows"]] == [rows[0]["daemons"]["noise_multiplier"]] * 5
    # the daemon runs' seeds, paired, then the simulator's further seeds (no daemon run)
    assert [(r["seed"], r["daemons"] is None) for r in res["rows"]] == [(0, False), (1, False), (2, False),
                                                                          (3, True), (4, True)]
    (cell,) = res["cells"]
    assert cell["runs"] == 3 and cell["simulator_seeds"] == 5 and 0.0 < cell["simulator_daemons_z_mean"] <= 100.0
    sim = [100 * r["simulator_daemons_z"] for r in res["rows"]]
    assert cell["simulator_daemons_z_all_seeds_mean"] == pytest.approx(sum(sim) / 5)
    assert cell["daemons_minus_simulator_all_seeds"] == pytest.approx(cell["daemons_mean"] - sum(sim) / 5)
    # one cell: the seed-clustered pooled figures are the cell's own
    assert res["pooled"]["all"]["paired_by_seed"] == pytest.approx(cell["daemons_minus_simulator_daemons_z"])
    assert res["pooled"]["all"]["simulator_seeds"] == 5 and res["pooled"]["all"]["daemon_seeds"] == 3
