"""`mpc-erm job submit|status|watch|result|cancel|list`: the coordinator's side of a job.

Every command reads the coordinator config (``--config``, default ``coordinator.toml`` or
``$MPC_ERM_COORDINATOR_CONFIG``) and talks to the members' daemons over mTLS. ``--json`` prints
machine-readable output (``watch --json``: one event per line). A job that ends failed or
cancelled makes ``watch`` (and ``submit --watch``) exit 1 with a one-line reason.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import click

from mpc_erm.jobs.status import TERMINAL

_CONFIG = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=Path("coordinator.toml"),
    envvar="MPC_ERM_COORDINATOR_CONFIG", show_default=True, help="the coordinator's TOML config",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="machine-readable output")


def _client(config_path: Path) -> Any:
    from coordinator.client import CoordinatorClient
    from coordinator.config import load_coordinator_config

    return CoordinatorClient(load_coordinator_config(config_path))


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def _when(t: float | None) -> str:
    return "" if not t else dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _progress_text(p: dict[str, Any] | None) -> str:
    if not p:
        return ""
    parts = []
    if "round" in p and "rounds" in p:
        parts.append(f"round {p['round']}/{p['rounds']}")
    if isinstance(p.get("epsilon_spent"), (int, float)):
        parts.append(f"ε {p['epsilon_spent']:.4g}")
    return ", ".join(parts)


@click.group()
def job() -> None:
    """Submit jobs to the parties, follow them and fetch their results."""


@job.command("submit")
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_CONFIG
@click.option("--watch", "follow", is_flag=True, help="then follow the job until it ends")
@_JSON
def submit(job_file: Path, config_path: Path, follow: bool, as_json: bool) -> None:
    """Send JOB_FILE to every party (and the dealer); each checks its policy and reserves budget.

    The job starts once every member has prepared it; if one refuses, the others end it by
    themselves (each member's answer is printed, and the exit status is 1)."""
    from coordinator.client import SubmitRefused

    with _client(config_path) as client:
        try:
            res = client.submit(job_file)
        except SubmitRefused as exc:
            if as_json:
                click.echo(json.dumps({"event": "refused", "job_id": exc.job_id, "refused_by": exc.refusals,
                                       "members": exc.answers}))
            else:
                click.echo(f"job {exc.job_id} refused by {', '.join(exc.refusals)}; it starts nowhere")
                for m, answer in exc.answers.items():
                    state, _, why = answer.partition(": ")
                    click.echo(f"  {m:<16} {state:<9} {why}".rstrip())
            sys.exit(1)
        if as_json:
            click.echo(json.dumps({"event": "submitted", **res}) if follow else json.dumps(res, indent=2))
        else:
            click.echo(f"job {res['job_id']} ({res['name']}) prepared by {', '.join(res['members'])}; "
                       "it starts once they have agreed")
            for m, v in res["members"].items():
                click.echo(f"  {m:<16} {v['status']:<9} {v.get('note') or ''}".rstrip())
            click.echo(f"  spec digest {res['spec_digest']}")
        if follow:
            _watch(client, res["job_id"], as_json, config_path)


@job.command("status")
@click.argument("job_id")
@_CONFIG
@_JSON
def status(job_id: str, config_path: Path, as_json: bool) -> None:
    """The job's status at each member."""
    from coordinator.client import overall_status

    with _client(config_path) as client:
        st = client.status(job_id)
    overall = overall_status([v["status"] for v in st.values()])
    if as_json:
        _echo_json({"job_id": job_id, "status": overall, "members": st})
        return
    first = next(iter(st.values()))
    click.echo(f"job {job_id} ({first.get('name', '?')}): {overall}")
    for m, v in st.items():
        line = f"  {m:<16} {v['status']:<10} {v.get('last_phase') or '':<12} {_progress_text(v.get('progress'))}"
        if v.get("reason"):
            line += f"  {v['reason']}"
        click.echo(line.rstrip())


@job.command("watch")
@click.argument("job_id")
@_CONFIG
@_JSON
def watch(job_id: str, config_path: Path, as_json: bool) -> None:
    """Follow the job: progress (round t/T, ε spent so far) until every member has finished."""
    with _client(config_path) as client:
        _watch(client, job_id, as_json, config_path)


def _watch(client: Any, job_id: str, as_json: bool, config_path: Path) -> None:
    from coordinator.client import overall_status

    members = client.job_members(job_id)
    final: dict[str, tuple[str, str]] = {}
    if as_json:
        for ev in client.watch(job_id, members=members):
            click.echo(json.dumps(ev, default=str))
            sys.stdout.flush()
            if ev["phase"] in TERMINAL:
                final[ev["member"]] = (ev["phase"], str(ev["payload"].get("message", "")))
    else:
        _watch_rich(client, job_id, members, final)
    missing = [m for m in members if m not in final]
    for m in missing:  # a member whose stream broke off: ask once more
        try:
            v = client.status(job_id).get(m, {})
            final[m] = (v.get("status", "unknown"), v.get("reason") or "")
        except ValueError as exc:
            final[m] = ("unknown", str(exc))
    overall = overall_status([s for s, _ in final.values()])
    if overall != "succeeded":
        why = "; ".join(f"{m}: {s}" + (f" ({r})" if r and r != s else "") for m, (s, r) in final.items()
                        if s != "succeeded")
        click.echo(f"error: job {job_id} {overall}: {why}", err=True)
        sys.exit(1)
    if not as_json:
        click.echo(f"next: mpc-erm job result {job_id} --out results/{job_id} --config {config_path}")


def _watch_rich(client: Any, job_id: str, members: list[str], final: dict[str, tuple[str, str]]) -> None:
    """One line per member: its phase, rounds done of T (epoch for DP-SGD), ε spent, elapsed time
    and the time left (estimated by rich from the recent round rate)."""
    from rich import progress as rp
    from rich.markup import escape

    with rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
                     rp.TextColumn("{task.fields[epoch]}ε spent {task.fields[eps]}"), rp.TimeElapsedColumn(),
                     rp.TextColumn("left"), rp.TimeRemainingColumn()) as prog:
        width = max(len(m) for m in members)
        tasks = {m: prog.add_task(f"{escape(m):<{width}}  waiting", total=None, eps="0", epoch="")
                 for m in members}
        for ev in client.watch(job_id, members=members):
            m, phase, p = ev["member"], ev["phase"], ev["payload"]
            if m not in tasks:
                continue
            task = tasks[m]
            update: dict[str, Any] = {"description": f"{escape(m):<{width}}  {escape(phase)}"}
            if isinstance(p.get("round"), int) and isinstance(p.get("rounds"), int):
                update.update(total=p["rounds"], completed=p["round"])
            if isinstance(p.get("epoch"), (int, float)):
                update["epoch"] = f"epoch {p['epoch']:.2f}  "
            if isinstance(p.get("epsilon_spent"), (int, float)):
                update["eps"] = f"{p['epsilon_spent']:.4g}"
            if phase == "succeeded":
                total = prog.tasks[task].total
                update["completed"] = total if total else 1
                update.setdefault("total", total or 1)
            prog.update(task, **update)
            if phase in TERMINAL:
                final[m] = (phase, str(p.get("message", "")))
                prog.console.print(f"{escape(m)}: {escape(phase)}"
                                   + (f" — {escape(final[m][1])}" if phase != "succeeded" else ""))
            elif phase == "error":
                prog.console.print(f"{escape(m)}: {escape(str(p.get('message', '')))}")


@job.command("result")
@click.argument("job_id")
@_CONFIG
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="directory for the model, privacy report, metrics and training-curve plot")
@_JSON
def result(job_id: str, config_path: Path, out_dir: Path, as_json: bool) -> None:
    """Download the job's results (checked by sha256) and compare the model across parties."""
    with _client(config_path) as client:
        res = client.result(job_id, out_dir)
    if as_json:
        _echo_json(res)
        return
    click.echo(f"job {job_id}: results from {res['source']} in {res['out_dir']}")
    for f in res["files"]:
        click.echo(f"  {f['name']:<28} {f['size']:>10} B  sha256 {f['sha256'][:16]}…")
    verdict = "identical at every party" if res["models_identical"] else "NOT identical across parties"
    click.echo(f"  model: {verdict} ({', '.join(res['model_sha256'])})")
    if not res["models_identical"]:
        sys.exit(1)


@job.command("cancel")
@click.argument("job_id")
@_CONFIG
@click.option("--reason", default="", help="recorded with the job")
@_JSON
def cancel(job_id: str, config_path: Path, reason: str, as_json: bool) -> None:
    """Cancel the job at every member (its budget is released unless it already revealed)."""
    with _client(config_path) as client:
        res = client.cancel(job_id, reason)
    if as_json:
        _echo_json({"job_id": job_id, "members": res})
        return
    for m, v in res.items():
        click.echo(f"{m}: {v['status']}" + (f" ({v['reason']})" if v.get("reason") else ""))


@job.command("list")
@_CONFIG
@click.option("--limit", type=click.IntRange(min=0), default=0, help="at most this many (newest first); 0: all")
@_JSON
def list_jobs(config_path: Path, limit: int, as_json: bool) -> None:
    """Jobs known to the configured members, newest first."""
    with _client(config_path) as client:
        jobs = client.list(limit)
    if as_json:
        _echo_json(jobs)
        return
    if not jobs:
        click.echo("no jobs")
        return
    for j in jobs:
        click.echo(f"{j['job_id']}  {_when(j['created_at'])}  {j['status']:<10} {j['name']} "
                   f"({j['method']}, {j['dataset']})")
