"""`mpc-erm simulate …`: the in-process m-party simulator and the thesis reproductions."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import click

from mpc_erm.simulate import ExperimentConfig, run_experiment
from mpc_erm.simulate.methods import METHODS


def _csv(kind):  # noqa: ANN001, ANN202 - click callback factory
    def convert(_ctx, _param, value):  # noqa: ANN001, ANN202
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
@click.option("--methods", callback=_csv(str), help=f"comma list of: {', '.join(METHODS)}")
@click.option("--conventions", callback=_csv(str), help="exact (default), thesis, or exact,thesis")
@click.option("--seeds", callback=_csv(int), help="comma list of seeds, e.g. 0,1,2")
@click.option("--eval-every", type=int)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("simulate-out"),
              show_default=True, help="where result.json and the PNG plots go")
@click.option("--json", "as_json", is_flag=True, help="print the result summary as JSON")
def run(config_path: Path | None, out_dir: Path, as_json: bool, **flags: object) -> None:
    """Run methods × seeds on m simulated parties; write result.json and plots."""
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
    t = Table(title=f"{d['name']}: m={d['parties']}, n={d['n_train']}, d={d['d']}; non-private test "
                    f"{npv['score']} {npv['test_score']:.4f}")
    for col in ("calibration", "method", "seeds", "optimality gap", "rel. accuracy loss", "s/run"):
        t.add_column(col)
    for s in result["summary"]:
        t.add_row(s["convention"], s["method"], str(s["seeds"]),
                  f"{s['optimality_gap_mean']:.3e} ± {s['optimality_gap_std']:.1e}",
                  f"{s['relative_accuracy_loss_mean']:+.3e}", f"{s['seconds_mean']:.1f}")
    Console().print(t)
