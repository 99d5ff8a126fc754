"""`mpc-erm model digest`: the source digest a job pins for a party's own network (model plugin)."""

from __future__ import annotations

import click


@click.group()
def model() -> None:
    """Networks a party builds with its own installed code (model plugins)."""


@model.command("digest")
@click.argument("entry_point")
def digest_cmd(entry_point: str) -> None:
    """Print the sha256 of ENTRY_POINT's module source ("package.module:function"), to put in a
    job file's model.plugin_digest. The module is read, not imported (its parent packages are, to find it)."""
    from mpc_erm.models.plugins import PluginError, source_digest

    try:
        click.echo(source_digest(entry_point))
    except PluginError as exc:
        raise click.UsageError(f"ENTRY_POINT: {exc}") from None
