"""`mpc-erm job submit|status|watch|result|cancel|list`: the coordinator's side of a job.

Every command reads the coordinator config (``--config``, default ``coordinator.toml`` or
``$MPC_ERM_COORDINATOR_CONFIG``) and talks to the members' daemons over mTLS. ``--json`` prints
machine-readable output (``watch --json``: one event per line). A job that ends failed,
cancelled or refused makes ``watch`` (and ``submit --watch``) exit 1 with a one-line reason; a
refused job is listed (``list``, ``status``) with the member that refused it and its public reason.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import sys
import time
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
@click.option("--yes", is_flag=True, help="submit even if the job's dry run (`job plan`) or its noise floor finds "
                                          "it hopeless")
@_JSON
def submit(job_file: Path, config_path: Path, follow: bool, yes: bool, as_json: bool) -> None:
    """Send JOB_FILE to every party (and the dealer); each checks its policy and reserves budget.

    First it reads the job's dry run (JOB.plan.json from `mpc-erm job plan`): a job whose noise
    would drown its signal is sent only with --yes (exit 3 otherwise). A job never planned is
    checked against its noise floor, the least noise/signal it can have on any data, from the job
    file alone (add/remove jobs, whose noise is fixed by the public n̂). The job starts once every
    member has prepared it; if one refuses, the others end it by themselves (each member's answer
    is printed, and the exit status is 1)."""
    from coordinator.client import SubmitRefused
    from mpc_erm.jobs import load_job_file

    from .job_plan import check_before_submit

    note = check_before_submit(job_file, load_job_file(job_file), yes=yes)
    if note and not as_json:
        click.echo(note, err=True)
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
    from coordinator.client import overall_status, refusal

    with _client(config_path) as client:
        st = client.status(job_id)
    overall = overall_status([v["status"] for v in st.values()])
    refused = refusal(st)
    if as_json:
        _echo_json({"job_id": job_id, "status": overall, "refused_by": refused, "members": st})
        return
    first = next(iter(st.values()))
    click.echo(f"job {job_id} ({first.get('name', '?')}): {overall}" + (_refused_text(refused) if refused else ""))
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
    """Follow the job until every member has finished: a line per member (phase, round t/T or
    epoch, ε spent, time taken and time left), then the command that fetches the result.
    --json: one event per line, training events with ``eta_s`` (seconds left at that event)."""
    with _client(config_path) as client:
        _watch(client, job_id, as_json, config_path)


class MemberProgress:
    """One member's progress, read from its events: round t of T, epoch, ε spent, the time it has
    run and the time it has left.

    Why by the events' own times (the daemon's clock) and not by when they arrive: a watch that
    joins a running job gets the past events in one burst, and a rate measured on arrival would
    make the time left nearly zero."""

    WINDOW = 20  # the time left comes from the rate over the last this-many training events

    def __init__(self) -> None:
        self.phase = "waiting"
        self.since: float | None = None  # its first event (prepared, or the worker starting)
        self.until: float | None = None  # its terminal event
        self.round: int | None = None
        self.rounds: int | None = None
        self.epoch: float | None = None
        self.eps: float | None = None
        self._points: collections.deque[tuple[float, int]] = collections.deque(maxlen=self.WINDOW)

    def update(self, ev: dict[str, Any]) -> None:
        t, p = float(ev.get("time") or 0.0), ev.get("payload") or {}
        self.phase = str(ev["phase"])
        if t and self.since is None:
            self.since = t
        if isinstance(p.get("round"), int) and isinstance(p.get("rounds"), int) and p["rounds"] > 0:
            self.round, self.rounds = p["round"], p["rounds"]
            if t and (not self._points or self._points[-1][1] < self.round):
                self._points.append((t, self.round))
        if isinstance(p.get("epoch"), (int, float)):
            self.epoch = float(p["epoch"])
        if isinstance(p.get("epsilon_spent"), (int, float)):
            self.eps = float(p["epsilon_spent"])
        if self.phase in TERMINAL:
            self.until = t or None
            if self.phase == "succeeded" and self.rounds:
                self.round = self.rounds

    def eta_s(self) -> float | None:
        """Seconds left at the last training event's time (None: not known yet, or ended)."""
        if self.until is not None or self.round is None or self.rounds is None or len(self._points) < 2:
            return None
        (t0, r0), (t1, r1) = self._points[0], self._points[-1]
        if t1 <= t0 or r1 <= r0:
            return None
        return max(0.0, (self.rounds - self.round) * (t1 - t0) / (r1 - r0))

    def left(self, now: float) -> float | None:
        """Seconds left now (the estimate at the last event, less the time since)."""
        eta = self.eta_s()
        return None if eta is None else max(0.0, self._points[-1][0] + eta - now)

    def elapsed(self, now: float) -> float | None:
        return None if self.since is None else max(0.0, (self.until or now) - self.since)


def _clock(seconds: float | None) -> str:
    """m:ss, or h:mm:ss from an hour on; "?" when not known."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _watch(client: Any, job_id: str, as_json: bool, config_path: Path) -> None:
    from coordinator.client import overall_status

    members = client.job_members(job_id)
    final: dict[str, tuple[str, str]] = {}
    if as_json:
        progress = {m: MemberProgress() for m in members}
        for ev in client.watch(job_id, members=members):
            p = progress.get(ev["member"])
            if p is not None:
                p.update(ev)
                if isinstance(ev["payload"].get("round"), int) and (eta := p.eta_s()) is not None:
                    ev = {**ev, "eta_s": round(eta, 1)}
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
    """One line per member: its phase, rounds done of T (epoch for DP-SGD), ε spent, the time it
    has run and the time it has left (MemberProgress: by the events' times)."""
    from rich import progress as rp
    from rich.markup import escape
    from rich.text import Text

    class Times(rp.ProgressColumn):
        def render(self, task: rp.Task) -> Text:
            p: MemberProgress = task.fields["p"]
            now = time.time()
            if p.until is not None:
                return Text(f"took {_clock(p.elapsed(now))}")
            return Text(f"{_clock(p.elapsed(now))}, {_clock(p.left(now))} left")

    def figures(p: MemberProgress) -> str:
        parts = ([f"epoch {p.epoch:.2f}"] if p.epoch is not None else []) + (
            [f"ε spent {p.eps:.3g}"] if p.eps is not None else [])
        return " ".join(parts)

    # narrow enough for 80 columns: "carol  training ━━━━━━━━━━ 50/100 epoch 5.00 ε spent 0.5 1:41, 1:39 left"
    with rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(bar_width=10), rp.MofNCompleteColumn(),
                     rp.TextColumn("{task.fields[figures]}"), Times()) as prog:
        width = max(len(m) for m in members)
        state = {m: MemberProgress() for m in members}
        tasks = {m: prog.add_task(f"{escape(m):<{width}} waiting", total=None, figures="", p=state[m])
                 for m in members}
        for ev in client.watch(job_id, members=members):
            m, phase, payload = ev["member"], ev["phase"], ev["payload"]
            if m not in tasks:
                continue
            p = state[m]
            p.update(ev)
            update: dict[str, Any] = {"description": f"{escape(m):<{width}} {escape(phase):<9}",
                                      "figures": figures(p)}
            if p.rounds is not None and p.round is not None:
                update.update(total=p.rounds, completed=p.round)
            if phase == "succeeded" and p.rounds is None:  # a member without rounds (the dealer): done
                update.update(total=1, completed=1)
            prog.update(tasks[m], **update)
            if phase in TERMINAL:
                final[m] = (phase, str(payload.get("message", "")))
                prog.console.print(f"{escape(m)}: {escape(phase)}"
                                   + (f" — {escape(final[m][1])}" if phase != "succeeded" else ""))
            elif phase == "error":
                prog.console.print(f"{escape(m)}: {escape(str(payload.get('message', '')))}")


@job.command("result")
@click.argument("job_id")
@_CONFIG
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="directory for the model, privacy report, metrics and training-curve plot")
@_JSON
def result(job_id: str, config_path: Path, out_dir: Path, as_json: bool) -> None:
    """Download the job's results (checked by sha256) and compare the model across parties.
    JOB_ID may also be a job's name (the newest job of that name)."""
    with _client(config_path) as client:
        job_id = client.resolve(job_id)
        res = client.result(job_id, out_dir)
    statement = _write_statement(Path(res["out_dir"]), quiet=as_json)
    if statement is not None:
        res["privacy_statement"] = str(statement)
    if as_json:
        _echo_json(res)
        return
    click.echo(f"job {job_id}: results from {res['source']} in {res['out_dir']}")
    for f in res["files"]:
        click.echo(f"  {f['name']:<28} {f['size']:>10} B  sha256 {f['sha256'][:16]}…")
    if statement is not None:
        click.echo(f"  {statement.name:<28} the privacy report in plain language (mpc-erm report explain)")
    verdict = "identical at every party" if res["models_identical"] else "NOT identical across parties"
    click.echo(f"  model: {verdict} ({', '.join(res['model_sha256'])})")
    if not res["models_identical"]:
        sys.exit(1)


def _write_statement(out: Path, *, quiet: bool = False) -> Path | None:
    """privacy_statement.md beside a fetched privacy_report.json (made here, from the report alone)."""
    from mpc_erm.privacy.report import PrivacyReport
    from mpc_erm.privacy.statement import job_statement

    from .report import job_name_beside

    report = out / "privacy_report.json"
    try:
        parsed = PrivacyReport.from_json(report.read_bytes())
    except (OSError, ValueError) as exc:  # no report, or not one this version reads: the files stand as fetched
        if report.is_file() and not quiet:
            click.echo(f"note: {report.name} is not a privacy report this version reads ({type(exc).__name__}); "
                       "no privacy_statement.md written", err=True)
        return None
    dest = out / "privacy_statement.md"
    dest.write_text(job_statement(parsed, job_name=job_name_beside(report)))
    return dest


@job.command("cancel")
@click.argument("job_id")
@_CONFIG
@click.option("--reason", default="", help="recorded with the job")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0.0, max=600.0), default=15.0, show_default=True,
              help="seconds to wait for every member to end the job (a running worker gets its daemon's cancel "
                   "grace to stop); 0: print the members' first answers")
@_JSON
def cancel(job_id: str, config_path: Path, reason: str, wait_s: float, as_json: bool) -> None:
    """Cancel the job at every member (its budget is released unless it already revealed) and print
    each member's state once it has ended the job (exit 1 if one has not within --wait)."""
    with _client(config_path) as client:
        res = client.cancel(job_id, reason, wait_s=wait_s)
    ending = [m for m, v in res.items() if v.get("ending")]
    if as_json:
        _echo_json({"job_id": job_id, "members": res})
    else:
        for m, v in res.items():
            line = f"{m}: {v['status']}" + (f" ({v['reason']})" if v.get("reason") else "")
            click.echo(line + (f"; cancel requested, not ended after {wait_s:g} s" if v.get("ending") else ""))
    if ending and wait_s > 0:
        sys.exit(1)


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
                   f"({j['method']}, {j['dataset']})" + (_refused_text(j["refused_by"]) if j.get("refused_by") else ""))


def _refused_text(r: dict[str, str]) -> str:
    """`` by <member> (<CODE>: <public reason>)``: who refused a job and why."""
    return f" by {r['member']} ({r['code']}" + (f": {r['reason']})" if r["reason"] else ")")
