"""The `mpc-erm` command line: one console script, subcommands per area.

Every command exits non-zero with a one-line reason on bad input (errors name the field), and
`--json` gives machine-readable output where a command produces results.
"""

from __future__ import annotations

import click

from coordinator.cli.audit import audit
from coordinator.cli.budget import budget
from coordinator.cli.certs import certs
from coordinator.cli.data import data
from coordinator.cli.demo import demo
from coordinator.cli.errors import run_guarded
from coordinator.cli.job import job
from coordinator.cli.job_plan import plan as job_plan
from coordinator.cli.model import model
from coordinator.cli.provision import provision
from coordinator.cli.report import report
from coordinator.cli.simulate import simulate
from parties.cli import dealer, party
from parties.owner.cli import owner


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="mpc-erm", prog_name="mpc-erm")
def cli() -> None:
    """Secure multi-party differentially private ERM."""


cli.add_command(demo)
cli.add_command(simulate)
cli.add_command(certs)
cli.add_command(provision)
cli.add_command(data)
cli.add_command(party)
cli.add_command(dealer)
cli.add_command(job)
job.add_command(job_plan)
cli.add_command(budget)
cli.add_command(audit)
cli.add_command(report)
cli.add_command(model)
cli.add_command(owner)


def main() -> None:
    run_guarded(cli)
