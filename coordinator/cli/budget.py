"""`mpc-erm budget show`: a party's privacy budget per data set, read from its ledger (checked
against the party's audit log first, :mod:`parties.ledger_check`); `mpc-erm budget rebuild`: a
missing or damaged ledger rebuilt from the verified audit log."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import click


@click.group()
def budget() -> None:
    """Inspect a party's privacy-budget ledger."""


def _finite(x: object) -> object:
    """JSON has no inf: an unbounded spend (no valid composition bound) becomes null."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _num(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.6g}"


def _eps(x: float) -> str:
    """ε in a table cell: 4 significant digits (the ledger's figure is in --json)."""
    return "inf" if math.isinf(x) else f"{x:.4g}"


def _delta(x: float) -> str:
    """δ in a table cell: 3 significant digits, the exponent without padding (1e-5, not 1e-05)."""
    if x == 0:
        return "0"
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{x:.3g}")


#: The largest ε a job file may ask for (``privacy.epsilon``): the room left is stated up to it.
MAX_JOB_EPSILON = 100.0


def _next_job_event(epsilon: float, delta: float, adjacency: str) -> Any:
    """The event of "a further job of (ε, δ)": one Gaussian release with the noise sampled inside
    the MPC (an output job, or full-batch gradient rounds: T rounds at z are one release at z/√T),
    planned as a daemon plans one."""
    from mpc_erm.privacy.plan import plan_job
    from mpc_erm.spec import JobSpec

    privacy: dict[str, Any] = {"epsilon": epsilon, "delta": delta, "clip": 1.0, "adjacency": adjacency}
    if adjacency == "add_remove":
        privacy["public_n"] = 1000  # the event is relative to the sensitivity: n̂ does not enter it
    spec = JobSpec.model_validate({"method": "gradient", "model": {"name": "logistic", "lam": 1e-3},
                                   "privacy": privacy, "training": {"iterations": 1}})
    return plan_job(spec, sampler="mpc").event


def next_job(ledger: Any, row: Any, epsilon: float | None, delta: float | None) -> dict[str, Any]:
    """What a further job would do to a data set's total: the largest ε of such a job that
    admission takes now, and with ``epsilon`` the composed total it would bring (and whether it
    fits). Composition is not additive, so this — not lifetime minus spent — is the room left."""
    d = row.delta_total if delta is None else delta
    out: dict[str, Any] = {"delta": d, "largest_epsilon": None}
    if d >= row.delta_total * (1 + 1e-12):
        out["note"] = f"a job's δ above the lifetime δ {row.delta_total:g} never fits"
        return out
    out["largest_epsilon"] = ledger.largest_fitting(row.dataset, lambda e: _next_job_event(e, d, row.adjacency),
                                                    min(row.epsilon_total, MAX_JOB_EPSILON), rel_tol=0.005)
    if epsilon is not None:
        composed, fits = ledger.with_next(row.dataset, _next_job_event(epsilon, d, row.adjacency))
        out.update(epsilon=epsilon, total_after=_finite(composed.epsilon), admitted=fits)
    return out


@budget.command("show")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="the party's TOML config (its state_dir holds the ledger)")
@click.option("--next-epsilon", "next_epsilon", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="also state the total a further job of this ε would bring each data set to")
@click.option("--next-delta", "next_delta", type=click.FloatRange(min=0.0, max=1.0, min_open=True, max_open=True),
              default=None, help="that job's δ (default: the data set's lifetime δ)")
@click.option("--json", "as_json", is_flag=True, help="print the rows as JSON")
def show(config_path: Path, next_epsilon: float | None, next_delta: float | None, as_json: bool) -> None:
    """Per data set: ε and δ spent of its lifetime budget (open jobs' reservations counted), under the
    data set's adjacency, and the room left for a further job.

    ε spent is the live jobs' composition at the lifetime δ; δ spent is the same composition's least
    δ within the lifetime ε. The room left is not lifetime minus spent: jobs compose, they do not
    add up (two ε = 1 Gaussian jobs at δ = 1e-5 compose to 1.46, not 2). So it is stated as the largest ε a further
    job — one Gaussian release at --next-delta, the shape of an output job or of full-batch gradient
    rounds — could ask for now; with --next-epsilon, as the total such a job would bring."""
    from parties.config import load_party_config
    from parties.ledger import Ledger
    from parties.ledger_check import check_ledger

    cfg = load_party_config(config_path)
    check_ledger(cfg.state_dir)  # a missing or damaged ledger: one line naming the file, exit 2
    with Ledger.for_config(cfg) as ledger:
        rows = ledger.show()
        open_jobs = ledger.open_reservations()
        nexts = {r.dataset: next_job(ledger, r, next_epsilon, next_delta) for r in rows}
    if as_json:
        click.echo(json.dumps({
            "party": cfg.identity.name,
            "datasets": [{**{k: _finite(v) for k, v in dataclasses.asdict(r).items()}, "next_job": nexts[r.dataset]}
                         for r in rows],
            "open_reservations": [{"job_id": r.job_id, "dataset": r.dataset, "epsilon": r.epsilon, "delta": r.delta,
                                   "state": r.state} for r in open_jobs],
        }, indent=2))
        return
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # two rows per data set (ε, then δ) so that every figure fits 80 columns whole
    table = Table(title=f"privacy budget of {cfg.identity.name}", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    for col in ("data set", "adjacency", "jobs", "", "spent / lifetime", "next job up to"):
        table.add_column(col, justify="left" if col in ("data set", "adjacency", "") else "right",
                         overflow="fold")
    for r in rows:
        nxt = nexts[r.dataset]
        up_to = "none" if nxt["largest_epsilon"] is None else _eps(nxt["largest_epsilon"])
        table.add_row(escape(r.dataset), r.adjacency, str(r.jobs), "ε",
                      f"{_eps(r.epsilon_spent)} / {_eps(r.epsilon_total)}", up_to)
        table.add_row("", "", "", "δ", f"{_delta(r.delta_spent)} / {_delta(r.delta_total)}",
                      f"at δ {_delta(nxt['delta'])}", end_section=True)
    console = Console()
    console.print(table)
    console.print("next job up to: the largest ε of one more Gaussian job (one release, or full-batch rounds) that "
                  "admission takes now; jobs compose, they do not add up, so lifetime minus spent is not the room "
                  "left. A subsampled job's own largest ε is in its refusal.", markup=False, highlight=False)
    for r in rows:
        nxt = nexts[r.dataset]
        if "total_after" in nxt:
            total = "inf" if nxt["total_after"] is None else _eps(nxt["total_after"])
            console.print(f"{r.dataset}: a further job of ε = {nxt['epsilon']:g} (δ = {_delta(nxt['delta'])}) would "
                          f"bring the total to ε = {total} of {_eps(r.epsilon_total)}: "
                          f"{'admitted' if nxt['admitted'] else 'refused'}", markup=False, highlight=False)
    held = {r.dataset: r for r in rows if r.epsilon_reserved > 0 or r.delta_reserved > 0}
    for ds, r in held.items():
        n = sum(1 for j in open_jobs if j.dataset == ds and not j.revealed)
        console.print(f"{ds}: ε {_eps(r.epsilon_reserved)}, δ {_delta(r.delta_reserved)} reserved by {n} open "
                      "job(s), counted in remaining", markup=False, highlight=False)


@budget.command("explain")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="the party's TOML config (its state_dir holds the ledger)")
@click.option("--dataset", "datasets", multiple=True, help="only this data set (repeatable; default: every one)")
def explain(config_path: Path, datasets: tuple[str, ...]) -> None:
    """A data set's privacy spend in plain language (Markdown): each live job's own (ε, δ) beside
    what it costs at the data set's lifetime δ, the composed total, what remains, and why the
    ledger's figures differ from the jobs' reports."""
    from mpc_erm.privacy.statement import JobCharge, dataset_statement
    from parties.config import load_party_config
    from parties.job_store import JobStore
    from parties.ledger import Ledger
    from parties.ledger_check import check_ledger

    cfg = load_party_config(config_path)
    check_ledger(cfg.state_dir)
    with Ledger.for_config(cfg) as ledger:
        rows = {r.dataset: r for r in ledger.show()}
        unknown = [d for d in datasets if d not in rows]
        if unknown:
            raise click.BadParameter(f"no data set {unknown[0]!r} in this party's ledger (it has: "
                                     f"{', '.join(rows) or 'none'})", param_hint="--dataset")
        charges = {ds: ledger.charges(ds) for ds in (datasets or tuple(rows))}
    store = JobStore.in_state_dir(cfg.state_dir)
    try:
        names = {r.job_id: getattr(store.get(r.job_id), "name", None) for cs in charges.values() for r, _ in cs}
    finally:
        store.close()
    for ds, cs in charges.items():
        row = rows[ds]
        jobs = [JobCharge(r.job_id, r.state, r.epsilon, r.delta, ev, names.get(r.job_id)) for r, ev in cs]
        click.echo(dataset_statement(ds, party=cfg.identity.name, adjacency=row.adjacency,
                                     epsilon_total=row.epsilon_total, delta_total=row.delta_total, jobs=jobs))


@budget.command("rebuild")
@click.option("--state-dir", "state_dir", type=click.Path(file_okay=False, path_type=Path),
              help="the party's state directory (ledger.sqlite3 and audit.jsonl)")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="the party's TOML config instead (its state_dir; its budget totals are written at once)")
@click.option("--force", is_flag=True, help="rebuild even when the ledger matches the audit log")
@click.option("--json", "as_json", is_flag=True, help="print what was done as JSON")
def rebuild(state_dir: Path | None, config_path: Path | None, force: bool, as_json: bool) -> None:
    """Rebuild a missing or damaged ledger from the verified audit log (stop the daemon first).

    The damaged file is moved aside (ledger.sqlite3.damaged-<UTC time>); every job the log
    charged is inserted as committed with the log's data set, ε, δ, spec digest and mechanism.
    Budget totals come from the config (the daemon writes them when it starts)."""
    from parties.ledger import Ledger
    from parties.ledger_check import rebuild_ledger

    if (state_dir is None) == (config_path is None):
        raise click.UsageError("give exactly one of --state-dir and --config")
    cfg = None
    if config_path is not None:
        from parties.config import load_party_config

        cfg = load_party_config(config_path)
        state_dir = cfg.state_dir
    assert state_dir is not None
    r = rebuild_ledger(state_dir, force=force)
    # the totals: written from the config as the daemon does (data sets it does not name keep total = spent)
    with Ledger.for_config(cfg) if cfg is not None else Ledger(r.ledger) as led:
        rows = {row.dataset: row for row in led.show()}
    unset = [ds for ds in r.placeholder_totals if cfg is None or ds not in cfg.datasets]
    spent = {ds: _finite(row.epsilon_spent) for ds, row in rows.items()}
    if as_json:
        click.echo(json.dumps({"ledger": str(r.ledger), "audit": str(r.audit), "audit_head": r.audit_head,
                               "moved_to": None if r.moved_to is None else str(r.moved_to),
                               "restored": list(r.restored), "kept": list(r.kept),
                               "no_configured_total": unset, "epsilon_spent": spent}, indent=2))
        return
    click.echo(f"{r.ledger}: rebuilt from {r.audit} (head {r.audit_head[:16]}…): {len(r.restored)} charged job(s) "
               "restored as committed" + (f", {len(r.kept)} spent row(s) of the old file kept" if r.kept else ""))
    if r.moved_to is not None:
        click.echo(f"the old file is at {r.moved_to}")
    for ds, row in rows.items():
        click.echo(f"  {ds}: ε spent {_num(row.epsilon_spent)} of {_num(row.epsilon_total)}"
                   + (" (no configured total yet: the daemon writes it at start)" if ds in unset else ""))
