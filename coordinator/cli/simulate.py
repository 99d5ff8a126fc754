"""`mpc-erm simulate …`: the in-process m-party simulator and the thesis reproductions."""

from __future__ import annotations

import json
from pathlib import Path

import click
import tomllib

# Method names for --help only (the simulator validates them); importing mpc_erm.simulate here
# would load torch for every `mpc-erm` command. tests/simulate/test_cli.py keeps them in sync.
METHOD_NAMES = "mpc_grad_p, mpc_out_p, pathak, local_out_p, local_obj_p, local_grad_p, rajkumar_agarwal"


def _csv(kind):
    def convert(_ctx, _param, value):
        if value is None:
            return None
        return [kind(v.strip()) for v in value.split(",") if v.strip()]

    return convert


@click.group()
def simulate() -> None:
    """Run the thesis's experiments in-process (no network, plaintext aggregation)."""


@simulate.command("run")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="TOML file with the experiment (top level or a [simulate] table); flags override it.")
@click.option("--dataset", help="breast_cancer (default, ships with scikit-learn), adult, kddcup99, diabetes, …")
@click.option("--data-root", help="folder with the shipped data sets (default: $MPC_ERM_DATA or ../shared/data)")
@click.option("--n-train", type=int)
@click.option("--n-test", type=int)
@click.option("--parties", "-m", type=int, help="number of simulated parties m")
@click.option("--partition", type=click.Choice(["equal", "dirichlet"]))
@click.option("--model", type=click.Choice(["logistic", "ridge", "huber_svm", "softmax"]))
@click.option("--lam", type=float, help="λ")
@click.option("--epsilon", type=float)
@click.option("--delta", type=float)
@click.option("--iterations", "-T", type=int)
@click.option("--learning-rate", type=float)
@click.option("--methods", callback=_csv(str), help=f"comma list of: {METHOD_NAMES}")
@click.option("--conventions", callback=_csv(str), help="exact (default), thesis, or exact,thesis")
@click.option("--seeds", callback=_csv(int), help="comma list of seeds, e.g. 0,1,2")
@click.option("--eval-every", type=int)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("simulate-out"),
              show_default=True, help="where result.json and the PNG plots go")
@click.option("--json", "as_json", is_flag=True, help="print the result summary as JSON")
def run(config_path: Path | None, out_dir: Path, as_json: bool, **flags: object) -> None:
    """Run methods × seeds on m simulated parties; write result.json and plots."""
    from mpc_erm.simulate import ExperimentConfig, run_experiment
    from mpc_erm.simulate.plots import plot_experiment

    values: dict = {}
    if config_path is not None:
        raw = tomllib.loads(config_path.read_text())
        values = raw.get("simulate", raw)
    values.update({k: v for k, v in flags.items() if v is not None})
    cfg = ExperimentConfig(**values)
    echo = (lambda _m: None) if as_json else (lambda m: click.echo(m, err=True))
    result = run_experiment(cfg, progress=echo)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "result.json").write_text(json.dumps(result, indent=1))
    plots = plot_experiment(result, out_dir)
    if as_json:
        click.echo(json.dumps({"summary": result["summary"], "nonprivate": result["nonprivate"],
                               "data": result["data"], "result": str(out_dir / "result.json"),
                               "plots": [str(p) for p in plots]}, indent=1))
        return
    _print_summary(result)
    click.echo(f"wrote {out_dir / 'result.json'} and {', '.join(str(p) for p in plots)}")


def _print_summary(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    d, npv = result["data"], result["nonprivate"]
    metric = npv["score"]
    t = Table(title=f"{d['name']}: m={d['parties']} parties, n={d['n_train']}, d={d['d']}; "
                    f"non-private test {metric} {npv['test_score']:.4f}", title_justify="left")
    for col in ("calibration", "method", "ε", "opt. gap", f"test {metric}", "s"):
        t.add_column(col, no_wrap=True)
    for s in result["summary"]:
        eps = s.get("epsilon")
        t.add_row(s["convention"], s["method"], "—" if eps is None else f"{eps:g}",
                  f"{s['optimality_gap_mean']:.2e}", f"{s['test_score_mean']:.4f}", f"{s['seconds_mean']:.1f}")
    Console().print(t)
    click.echo("exact: the product's calibration; thesis: the thesis's formulas as printed "
               "(see docs/explanation/privacy-arithmetic.md). rajkumar_agarwal spends ε per round.")


@simulate.command("table-6-1")
@click.option("--m", "m", type=int, default=100, show_default=True)
@click.option("--n-min", type=int, default=500, show_default=True)
@click.option("--lam", type=float, default=0.01, show_default=True)
@click.option("--epsilon", type=float, default=0.5, show_default=True)
@click.option("--G", "G", type=float, default=1.0, show_default=True)
@click.option("--T", "T", type=int, default=100, show_default=True)
@click.option("--delta", type=float, default=1e-3, show_default=True, help="δ for the Gaussian methods")
@click.option("--dim", type=int, default=122, show_default=True, help="d for the ℓ2-Laplace columns")
@click.option("--samples", type=int, default=1000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def table_6_1_cmd(m: int, n_min: int, lam: float, epsilon: float, G: float, T: int, delta: float, dim: int,
                  samples: int, seed: int, as_json: bool) -> None:
    """Thesis Table 6.1: noise per method, as printed, as sampled, and correctly calibrated."""
    from mpc_erm.simulate.table61 import table_6_1

    t = table_6_1(m=m, n_min=n_min, lam=lam, eps=epsilon, G=G, T=T, delta=delta, dim=dim,
                  samples=samples, seed=seed)
    if as_json:
        click.echo(json.dumps(t, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    tab = Table(title="Thesis Table 6.1 (×10⁻³)")
    for col in ("method", "thesis scale", "printed", "std (ours)", "std (thesis)", "correct mechanism",
                "correct coord. std"):
        tab.add_column(col)
    for r in t["methods"]:
        tab.add_row(r["method"], f"{r['thesis_scale'] * 1e3:.3g}", f"{r['thesis_printed_scale'] * 1e3:.3g}",
                    f"{r['empirical_std'] * 1e3:.3g}", f"{r['thesis_printed_empirical_std'] * 1e3:.3g}",
                    r["correct_mechanism"].split(" ")[0], f"{r['correct_coordinate_std'] * 1e3:.3g}")
    Console().print(tab)
