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
@click.option("--expect-head", help="a head hash kept elsewhere (a job report's parameters.audit_head): it must be "
              "in the chain; later records (later jobs) may follow it")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def verify_cmd(config_path: Path, expect_head: str | None, as_json: bool) -> None:
    """Recompute every record's hash and link; exit 1 naming the first line that does not check."""
    from parties.audit import AUDIT_FILE, AuditError, verify
    from parties.config import load_party_config

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
        later = ""
        if v.after_expected is not None:
            later = ("; the expected head is the head" if v.after_expected == 0 else
                     f"; the expected head is record {v.records - v.after_expected}, "
                     f"{v.after_expected} later record(s) follow it")
        click.echo(f"{path}: {v.records} records, {v.jobs} jobs, {v.releases} releases; chain intact; head {v.head}"
                   + later)
