"""`mpc-erm report verify`: recompute a job's (ε, δ) from its privacy report alone; `mpc-erm
report explain`: the report as a statement in plain language."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import numpy as np


@click.group()
def report() -> None:
    """A job's privacy report: what was released, with which guarantee."""


@report.command("verify")
@click.argument("report_path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--public-rows", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="a knowledge-transfer job on its data set's public test file: that file (CSV with --schema, or "
                   ".npz), to recompute the public rows' norm")
@click.option("--schema", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="the data schema the parties read --public-rows through (a CSV file)")
def verify_cmd(report_path: Path, as_json: bool, public_rows: Path | None, schema: Path | None) -> None:
    """Recompute ε and δ from REPORT_PATH (a privacy_report.json) with dp_accounting, check the
    sensitivity against what the report says is public and the noise against the grid it states;
    exit 1 if any check fails."""
    from mpc_erm.privacy.report import PrivacyReport
    from mpc_erm.privacy.verify import verify_report

    try:
        rep = PrivacyReport.from_json(report_path.read_bytes())
    except ValueError as exc:
        raise click.UsageError(f"{report_path}: not a privacy report ({' '.join(str(exc).split())[:300]})") from None
    v = verify_report(rep, None if public_rows is None else _public_features(public_rows, schema))
    if as_json:
        click.echo(json.dumps({"ok": v.ok, "epsilon": v.epsilon, "delta": v.delta,
                               "checks": [c.__dict__ for c in v.checks]}))
    else:
        for c in v.checks:
            click.echo(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:<12} {c.detail}")
        click.echo(f"{'holds' if v.ok else 'DOES NOT HOLD'}: ({v.epsilon:.6g}, {v.delta:.3g})-DP under "
                   f"{(rep.plan or {}).get('adjacency', rep.adjacency)} adjacency")
    if not v.ok:
        sys.exit(1)


def _public_features(path: Path, schema: Path | None) -> np.ndarray:
    """The public test file's features as the parties read them (a CSV through its schema)."""
    from mpc_erm.data.arrays import load_numpy
    from mpc_erm.data.schema import load_schema, read_csv_with_schema

    try:
        if path.suffix.lower() == ".csv":
            if schema is None:
                raise click.UsageError("--public-rows: a CSV file is read through the parties' schema: give --schema")
            return np.asarray(read_csv_with_schema(path, load_schema(schema)).X)
        return np.asarray(load_numpy(path).X)
    except (OSError, ValueError) as exc:
        raise click.UsageError(f"--public-rows: {' '.join(str(exc).split())[:300]}") from None


@report.command("explain")
@click.argument("report_path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", "job_name", help="the job's name, for the title (default: from model.json beside the report)")
def explain_cmd(report_path: Path, job_name: str | None) -> None:
    """REPORT_PATH (a privacy_report.json) as a statement a privacy officer can read (Markdown):
    the unit of privacy, the guarantee and what it means in numbers, what was released, who sees
    what under the trust model, the noise, and how to check it. `job result` saves it as
    privacy_statement.md."""
    from mpc_erm.privacy.report import PrivacyReport
    from mpc_erm.privacy.statement import job_statement

    try:
        rep = PrivacyReport.from_json(report_path.read_bytes())
    except ValueError as exc:
        raise click.UsageError(f"{report_path}: not a privacy report ({' '.join(str(exc).split())[:300]})") from None
    click.echo(job_statement(rep, job_name=job_name or job_name_beside(report_path)))


def job_name_beside(report_path: Path) -> str | None:
    """The job's name from the model bundle next to a report, if there is one."""
    try:
        meta = json.loads((report_path.parent / "model.json").read_text())
        return str(meta["job"]["name"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
