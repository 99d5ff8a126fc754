"""`mpc-erm audit verify`: check a party's hash-chained audit log of charges and releases.
`mpc-erm audit privacy`: an empirical lower bound on a job's ε from one run with canaries."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from coordinator.cli.job_plan import SCHEMA_OPTION


@click.group()
def audit() -> None:
    """A party's tamper-evident log of every release and what it cost; an empirical privacy audit."""


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


@audit.command("privacy")
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@SCHEMA_OPTION
@click.option("--data", "data", multiple=True, required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="one CSV per party, in the job's party order (repeat): the rows the audit's run trains on")
@click.option("--canaries", default=1000, show_default=True, type=click.IntRange(20, 100_000),
              help="canary records, each put in the training data with probability ½")
@click.option("--seed", default=0, show_default=True, type=int, help="which canaries go in, and the run's noise")
@click.option("--confidence", default=0.95, show_default=True, type=click.FloatRange(0.5, 0.9999),
              help="of the lower bound")
@click.option("--broken-control", is_flag=True,
              help="audit the same job with its noise switched off: the bound must exceed the stated ε")
@click.option("--daemons", is_flag=True,
              help="run the job through three local party daemons (mTLS, the noise sampled inside the MPC) "
                   "instead of in process")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def privacy_cmd(job_file: Path, schema_path: Path, data: tuple[Path, ...], canaries: int, seed: int,
                confidence: float, broken_control: bool, daemons: bool, as_json: bool) -> None:
    """One run of JOB_FILE's job on --data with canaries added (in process, the daemons' run
    code), and a lower bound on its ε from guessing which canaries were in (Steinke–Nasr–Jagielski
    2023). Exits 1 when the bound exceeds the stated ε: the statement is then false. A bound
    near 0 says only that no violation was seen: a one-run audit has little power at small ε."""
    from coordinator.cli.job_plan import load_parts
    from mpc_erm.jobs import load_job_file
    from mpc_erm.simulate.audit import audit_job

    jf = load_job_file(job_file)
    owners = len(jf.job.owners)
    if not owners and len(data) != len(jf.job.parties):
        raise ValueError(f"--data: give one CSV for each of the job's {len(jf.job.parties)} parties "
                         f"({', '.join(jf.job.parties)}), got {len(data)}; a job with data owners takes any number, "
                         "dealt to its owners")
    if owners and daemons:
        raise ValueError("--daemons: a job with data owners is audited in process (its owners are not started here)")
    _, parts = load_parts(schema_path, data)
    if owners:  # the rows dealt to the job's owners, as `job plan` deals them
        from mpc_erm.simulate.forecast import deal_to_owners, pooled_rows

        pooled = pooled_rows(parts)
    if jf.spec.federated is not None:  # the canaries join the owners as owners
        from mpc_erm.simulate.audit import audit_federated_job

        a = audit_federated_job(jf.spec, deal_to_owners(pooled, owners, seed), canaries=canaries, seed=seed,
                                alpha=1.0 - confidence, broken_control=broken_control)
    elif jf.spec.model.is_network and not daemons:  # DP-SGD / DP-Adam / DP-SRM
        from mpc_erm.simulate.audit import audit_gradient_job, audit_network_job, has_input_columns

        # an mlp on flat rows: canary rows, each with an input column of its own; any other network
        # (a CNN's weights are shared across its pixels): gradient canaries
        audit_fn = audit_network_job if has_input_columns(jf.spec) else audit_gradient_job
        a = audit_fn(jf.spec, [pooled] if owners else parts, canaries=canaries, seed=seed,
                     alpha=1.0 - confidence, broken_control=broken_control)
    elif owners:  # record level: a gradient round sums the owners' clipped gradients, the pooled rows' sum
        held = [pooled] if jf.spec.method == "gradient" else deal_to_owners(pooled, owners, seed)
        a = audit_job(jf.spec, held, canaries=canaries, seed=seed, alpha=1.0 - confidence,
                      broken_control=broken_control)
    elif daemons:
        from coordinator.audit_daemons import audit_through_daemons

        a = audit_through_daemons(jf.spec, parts, canaries=canaries, seed=seed, alpha=1.0 - confidence,
                                  broken_control=broken_control)
    else:
        a = audit_job(jf.spec, parts, canaries=canaries, seed=seed, alpha=1.0 - confidence,
                      broken_control=broken_control)
    if as_json:
        click.echo(json.dumps({"job": jf.job.name, **a.describe()}, indent=2))
    else:
        what = "the same job with its noise switched off (control)" if broken_control else "the job as planned"
        where = "through three party daemons" if daemons else "in process"
        kind = "gradient canaries" if a.canary_kind == "gradients" else "canaries"
        click.echo(f"audited: {what}, {a.canaries} {kind} ({a.included} in), one run {where}")
        click.echo(f"stated ε = {a.stated_epsilon:.4g} at δ = {a.delta:.3g}")
        click.echo(f"empirical ε ≥ {a.epsilon_lower_bound:.4g} with confidence {a.confidence:.0%} "
                   f"({a.correct} of {a.guesses} guesses right)")
        click.echo("VIOLATED: the run leaks more than the stated ε" if a.violated else
                   "no violation seen (a lower bound; a one-run audit of small ε has little power)")
    if a.violated:
        sys.exit(1)
