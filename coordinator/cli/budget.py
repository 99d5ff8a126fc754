"""`mpc-erm budget show`: a party's privacy budget per data set, read from its ledger."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import click


@click.group()
def budget() -> None:
    """Inspect a party's privacy-budget ledger."""


def _finite(x: object) -> object:
    """JSON has no inf: an unbounded spend (no valid composition bound) becomes null."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _num(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.6g}"


@budget.command("show")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="the party's TOML config (its state_dir holds the ledger)")
@click.option("--json", "as_json", is_flag=True, help="print the rows as JSON")
def show(config_path: Path, as_json: bool) -> None:
    """Per data set: total (ε, δ), ε spent (revealed jobs), reserved (queued/running), remaining."""
    from parties.config import load_party_config
    from parties.ledger import Ledger

    cfg = load_party_config(config_path)
    with Ledger.for_config(cfg) as ledger:
        rows = ledger.show()
        open_jobs = ledger.open_reservations()
    if as_json:
        click.echo(json.dumps({
            "party": cfg.identity.name,
            "datasets": [{k: _finite(v) for k, v in dataclasses.asdict(r).items()} for r in rows],
            "open_reservations": [{"job_id": r.job_id, "dataset": r.dataset, "epsilon": r.epsilon, "delta": r.delta,
                                   "state": r.state} for r in open_jobs],
        }, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"privacy budget of {cfg.identity.name}")
    for col in ("dataset", "ε total", "ε spent", "ε reserved", "ε remaining", "δ total", "δ spent", "jobs",
                "accountant"):
        table.add_column(col, justify="left" if col in ("dataset", "accountant") else "right")
    for r in rows:
        table.add_row(r.dataset, _num(r.epsilon_total), _num(r.epsilon_spent), _num(r.epsilon_reserved),
                      _num(r.epsilon_remaining), _num(r.delta_total), _num(r.delta_spent), str(r.jobs), r.accountant)
    Console().print(table)
