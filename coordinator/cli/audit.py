"""`mpc-erm audit verify`: check a party's hash-chained audit log of charges and releases."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click


@click.group()
def audit() -> None:
    """A party's tamper-evident log of every release and what it cost."""


@audit.command("verify")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="the party's TOML config (its state_dir holds audit.jsonl)")
@click.option("--expect-head", help="a head hash kept elsewhere (this party's copy of a job report's "
              "parameters.audit_head): it must be a record of the chain; later jobs' records may extend it")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def verify_cmd(config_path: Path, expect_head: str | None, as_json: bool) -> None:
    """Recompute every record's hash and link; exit 1 naming the first line that does not check."""
    from parties.audit import AUDIT_FILE, AuditError, normalise_head, verify
    from parties.config import load_party_config

    if expect_head is not None:
        expect_head = normalise_head(expect_head)  # a malformed head: one line, exit 2 (not "NOT valid")
    path = load_party_config(config_path).state_dir / AUDIT_FILE
    try:
        v = verify(path, expect_head)
    except AuditError as exc:
        if as_json:
            click.echo(json.dumps({"ok": False, "error": str(exc)}))
        else:
            click.echo(f"audit log NOT valid: {exc}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps({"ok": True, "path": str(path), **dataclasses.asdict(v)}))
    else:
        later = v.extension()
        click.echo(f"{path}: {v.records} records, {v.jobs} jobs, {v.releases} releases; chain intact; head {v.head}"
                   + (f"; {later}" if later else ""))
