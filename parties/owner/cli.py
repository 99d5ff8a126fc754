"""`mpc-erm owner join` / `owner fetch`: a data owner's side of one job run by compute parties.

The owner's operator runs ``join`` with the job file and the job id the coordinator printed at
``job submit``: the owner checks the job against its own policy and budget (its own ledger and
audit log in its ``state_dir``), sends only additive shares of its contribution to the compute
parties, and writes the public model and the privacy report to ``state_dir/jobs/<job id>/``.
With ``--leave`` (a one-release job: output perturbation) it returns once its shares are sent;
``fetch`` reads the release from the compute parties later and writes the model.

Every failure is one line on stderr, ``error: owner <name>, job <id>: <reason>`` (and, for a run
that had begun its rounds, what this owner's ledger was charged and why), with an exit code per
kind (``parties.owner.failures.EXIT_CODES``, listed in ``--help``); never a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

_PATH = click.Path(exists=True, dir_okay=False, path_type=Path)


def _job_options(f: Any) -> Any:
    """The options naming this owner and the job, the same for ``join`` and ``fetch``."""
    f = click.option("--job-id", required=True, help="the job id `mpc-erm job submit` printed")(f)
    f = click.option("--job", "job_path", required=True, type=_PATH, help="the job file (as submitted)")(f)
    return click.option("--config", "config_path", required=True, type=_PATH, help="the owner's TOML config")(f)


_EXITS = ("exit codes: 0 done (--leave: shares sent); 1 internal error; 2 refused before anything was sent (option, "
          "config, job file, this owner's policy or budget); 3 the job ended at the compute parties without this "
          "owner's model (a compute party lost, failed, cancelled); 4 a compute party refuses this owner (revoked, "
          "not listed); 5 the compute parties unreachable or not ready in time; 6 this owner's state directory "
          "cannot be written")


@click.group()
def owner() -> None:
    """A data owner's light process: no daemon, no MPC engine; one job at a time."""


def _guarded(name: str, job_id: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``, or exit with one line naming this owner, the job and the reason, and the exit
    code of its kind (``parties.owner.failures``): no traceback reaches the owner's operator."""
    from parties.owner.failures import owner_failure
    from parties.owner.process import OwnerRefused

    def fail(code: int, reason: str) -> None:
        click.echo(f"error: owner {name}, job {job_id}: {' '.join(reason.split())}", err=True)
        sys.exit(code)

    try:
        return run()
    except (OwnerRefused, ValueError) as exc:  # refused here, before anything was sent
        fail(2, str(exc))
    except Exception as exc:  # a failure of the run (or of this owner's own files), else a bug: one line
        known = owner_failure(exc, name)
        if known is None:
            fail(1, f"internal error ({type(exc).__name__}): {exc}")
        else:
            fail(known.exit_code, str(known) + (f"; {known.charged}" if known.charged else ""))
    raise AssertionError("unreachable")


@owner.command("join", epilog=_EXITS)
@_job_options
@click.option("--wait", "wait_s", default=600.0, show_default=True, type=click.FloatRange(1, 86_400),
              help="seconds to wait for the compute parties (the job's start, each round's release)")
@click.option("--leave", is_flag=True,
              help="a one-release job (method = \"output\"): return once the shares are sent; `owner fetch` later")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def join(config_path: Path, job_path: Path, job_id: str, wait_s: float, leave: bool, as_json: bool) -> None:
    """Contribute this owner's data to job JOB-ID: shares to the compute parties, the model back."""
    from parties.owner.process import run_owner_job

    cfg, job = _load(config_path, job_path, job_id)

    def on_round(t: int, mine: str, owners: int) -> None:
        if mine == "refused":  # on the terminal whatever the output format: this owner's data did not count
            click.echo(f"warning: round {t + 1}: the compute parties left this owner's contribution out: it failed "
                       "their check against the job's public bound on its norm (a bug in this installation, or "
                       "tampered shares)", err=True)
        if not as_json:
            click.echo(f"round {t + 1}/{job.spec.training.iterations}: {owners} owners summed"
                       + {"counted": "", "late": " (this owner was late: left out of this round)",
                          "refused": " (this owner's contribution was refused: left out)"}[mine])

    summary = _guarded(cfg.identity.name, job_id,
                       lambda: run_owner_job(cfg, job, job_id, wait_s=wait_s, on_round=on_round, leave=leave))
    where = Path(cfg.state_dir) / "jobs" / job_id
    if as_json:
        click.echo(json.dumps(summary))
    elif summary["status"] == "done":
        click.echo(f"done: ε = {summary['epsilon']:.4g}, δ = {summary['delta']:.3g}; model and privacy report in "
                   f"{where}")
    else:
        click.echo(("shares sent" if summary["status"] == "sent" else
                    "too late: the compute parties closed the round before this owner's shares arrived (charged, "
                    "not counted)") + f"; ε = {summary['epsilon']:.4g}, δ = {summary['delta']:.3g} charged; privacy "
                   f"report in {where}; the model: `mpc-erm owner fetch --config {config_path} --job {job_path} "
                   f"--job-id {job_id}` once the job has released it")


@owner.command("fetch", epilog=_EXITS)
@_job_options
@click.option("--wait", "wait_s", default=600.0, show_default=True, type=click.FloatRange(0, 86_400),
              help="seconds to wait for the compute parties to keep the release")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def fetch(config_path: Path, job_path: Path, job_id: str, wait_s: float, as_json: bool) -> None:
    """After `owner join --leave`: the released model of job JOB-ID, from the compute parties."""
    from parties.owner.process import fetch_owner_model

    cfg, job = _load(config_path, job_path, job_id)
    summary = _guarded(cfg.identity.name, job_id, lambda: fetch_owner_model(cfg, job, job_id, wait_s=wait_s))
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"done: ε = {summary['epsilon']:.4g}, δ = {summary['delta']:.3g} ({summary['owners_counted']} "
                   f"owners summed{'' if summary['counted'] else ', not this one: its shares came too late'}); "
                   f"model and privacy report in {Path(cfg.state_dir) / 'jobs' / job_id}")


def _load(config_path: Path, job_path: Path, job_id: str) -> tuple[Any, Any]:
    from mpc_erm.jobs.jobfile import load_job_file
    from parties.admission import JOB_ID_RE
    from parties.config import load_owner_config

    if not JOB_ID_RE.fullmatch(job_id):
        raise click.BadParameter("not a job id (as `mpc-erm job submit` prints it)", param_hint="--job-id")
    return load_owner_config(config_path), load_job_file(job_path)
