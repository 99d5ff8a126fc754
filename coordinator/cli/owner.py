"""`mpc-erm owner join`: a data owner's side of one job run by compute parties (issue 17).

The owner's operator runs it with the job file and the job id the coordinator printed at
``job submit``: the owner checks the job against its own policy and budget (its own ledger and
audit log in its ``state_dir``), sends only additive shares of its contribution to the compute
parties, and writes the public model and the privacy report to ``state_dir/jobs/<job id>/``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

_PATH = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group()
def owner() -> None:
    """A data owner's light process: no daemon, no MPC engine; one job at a time."""


@owner.command("join")
@click.option("--config", "config_path", required=True, type=_PATH, help="the owner's TOML config")
@click.option("--job", "job_path", required=True, type=_PATH, help="the job file (as submitted)")
@click.option("--job-id", required=True, help="the job id `mpc-erm job submit` printed")
@click.option("--wait", "wait_s", default=600.0, show_default=True, type=click.FloatRange(1, 86_400),
              help="seconds to wait for the compute parties (the job's start, each round's release)")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def join(config_path: Path, job_path: Path, job_id: str, wait_s: float, as_json: bool) -> None:
    """Contribute this owner's data to job JOB-ID: shares to the compute parties, the model back."""
    from mpc_erm.jobs.jobfile import load_job_file
    from parties.admission import JOB_ID_RE
    from parties.config import load_owner_config
    from parties.owner import run_owner_job

    if not JOB_ID_RE.fullmatch(job_id):
        raise click.BadParameter("not a job id (as `mpc-erm job submit` prints it)", param_hint="--job-id")
    cfg = load_owner_config(config_path)
    job = load_job_file(job_path)

    def on_round(t: int, counted_me: bool, owners: int) -> None:
        if not as_json:
            click.echo(f"round {t + 1}/{job.spec.training.iterations}: {owners} owners summed"
                       + ("" if counted_me else " (this owner was late: left out of this round)"))

    try:
        summary = run_owner_job(cfg, job, job_id, wait_s=wait_s, on_round=on_round)
    except (RuntimeError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"done: ε = {summary['epsilon']:.4g}, δ = {summary['delta']:.3g}; model and privacy report in "
                   f"{Path(cfg.state_dir) / 'jobs' / job_id}")
