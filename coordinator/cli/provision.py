"""`mpc-erm provision CONSORTIUM.toml --out DIR`: the CA and one startup kit per member from one file.

Why a command: a consortium's operator should not hand-write a TOML per member whose names and
addresses must agree with every other; see :mod:`coordinator.provision` for what a kit holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("provision")
@click.argument("consortium", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="where to write ca/ and one kit directory per member (must be empty unless --force)")
@click.option("--force", is_flag=True,
              help="write into a non-empty DIR, replacing its CA and the kits of these members")
@click.option("--days", type=int, default=365, show_default=True,
              help="validity of the member certificates (the CA's: 10 years, or longer)")
@click.option("--json", "as_json", is_flag=True, help="print what was written as JSON")
def provision(consortium: Path, out_dir: Path, force: bool, days: int, as_json: bool) -> None:
    """Make the consortium's CA and a startup kit per member (certificate, key, config, start script).

    CONSORTIUM is a TOML file naming each member, its role and address, and each party's data sets
    (example: coordinator/examples/consortium.toml). Give each kit to its member only; keep
    DIR/ca/ca.key offline.
    """
    from coordinator.provision import provision as run

    if days < 1:
        raise ValueError(f"--days: must be >= 1, got {days}")
    try:
        done = run(consortium, out_dir, force=force, days=days)
    except ValueError as exc:
        msg = str(exc)
        raise ValueError("--out:" + msg[len("out:"):] if msg.startswith("out:") else msg) from None
    if as_json:
        click.echo(json.dumps(done.to_dict(), indent=2))
        return
    click.echo(f"consortium {done.consortium!r}: CA and {len(done.kits)} kits written to {done.out}")
    click.echo(f"  {'member':<20}{'role':<13}{'address':<26}kit")
    for k in done.kits:
        click.echo(f"  {k.name:<20}{k.role:<13}{k.address or '-':<26}{k.dir}")
    click.echo(f"CA key {done.ca_key}: keep it offline; it is in no kit (needed only for "
               f"`mpc-erm certs issue|revoke --dir {done.ca_key.parent}`).")
    click.echo("next:")
    click.echo("  1. give each member its kit directory, and only its own (it holds the member's private key)")
    click.echo("  2. each party: put its data where its party.toml's [datasets.*] path says; every daemon: ./start.sh")
    coordinators = [k for k in done.kits if k.role == "coordinator"]
    if coordinators:
        click.echo(f"  3. the coordinator: mpc-erm job submit JOB.toml --config {coordinators[0].config} --watch")
