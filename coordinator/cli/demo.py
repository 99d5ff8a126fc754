"""`mpc-erm demo`: real daemons on loopback, UCI Adult split over 3 parties, two private models."""

from __future__ import annotations

import json
import math
import signal
import sys
from pathlib import Path
from typing import Any

import click


class _Terminated(Exception):
    """SIGINT/SIGTERM/SIGHUP: unwind so that every daemon is stopped on the way out."""


class _Interrupts:
    """Signal handler that raises :class:`_Terminated` and remembers that it did.

    Why remember: a signal handler's exception is raised at whatever bytecode runs next, and if
    that is a finaliser (a generator's ``finally``, a gRPC object's ``__del__``), Python prints
    "Exception ignored" and goes on: a Ctrl-C was seen to vanish and the demo to run to the end
    with status 0. :meth:`check` raises again at the demo's next progress event."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, signum: int, _frame: object) -> None:
        self.seen.append(signal.Signals(signum).name)
        raise _Terminated(self.seen[0])

    def check(self) -> None:
        if self.seen:
            raise _Terminated(self.seen[0])


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("demo-out"), show_default=True,
              help="where the job files, results, logs and summary.json go")
@click.option("--parties", type=click.IntRange(2, 5), default=3, show_default=True, help="party daemons")
@click.option("--trust", type=click.Choice(["dealer", "replicated"]), default="dealer", show_default=True,
              help="dealer: Beaver triples from the dealer daemon; replicated: 3-party replicated sharing")
@click.option("--iterations", type=click.IntRange(1, 2000), default=50, show_default=True,
              help="T of the gradient-perturbation job")
@click.option("--keep-state", is_flag=True, help="keep the PKI, configs and ledgers under OUT/consortium")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def demo(out: Path, parties: int, trust: str, iterations: int, keep_state: bool, as_json: bool) -> None:
    """Start 3 party daemons and a dealer on loopback (fresh CA, mutual TLS), each with a third of
    UCI Adult; run an output- and a gradient-perturbation job at ε = 1, δ = 1e-5; print accuracy
    against the non-private model, the (ε, δ) spent and the wall time."""
    from rich.console import Console
    from rich.table import Table

    from coordinator.end_to_end import default_jobs, run_jobs

    if trust == "replicated" and parties != 3:
        raise click.BadParameter("replicated sharing is for exactly 3 parties", param_hint="--parties")
    console = Console(stderr=True, highlight=False)
    last: dict[str, str] = {}

    interrupts = _Interrupts()

    def on_event(job: str, ev: dict[str, Any]) -> None:
        interrupts.check()
        p = ev.get("payload") or {}
        phase = ev["phase"]
        if phase == "training" and "round" in p:
            line = f"round {p['round']}/{p['rounds']}, ε spent {p.get('epsilon_spent', 0):.3g}"
        elif phase in ("prepared", "queued", "running", "agreed", "offline", "local", "reveal", "succeeded", "failed",
                       "cancelled", "refused", "error"):
            line = phase + (f": {p.get('message') or p.get('reason')}" if p.get("message") or p.get("reason") else "")
        else:
            return
        if last.get(job) != line:  # the parties report the same progress: say it once
            last[job] = line
            console.print(f"  [dim]{job}[/dim] {ev['member']}: {line}")

    def on_status(message: str) -> None:
        interrupts.check()
        console.print(f"[bold]demo[/bold] {message}")

    old = {s: signal.signal(s, interrupts) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        summary = run_jobs(out, jobs=default_jobs(iterations), parties=parties, trust=trust, keep_state=keep_state,
                           on_event=on_event, on_status=on_status)
        interrupts.check()  # a signal whose exception a finaliser swallowed after the last event
    except (KeyboardInterrupt, _Terminated) as exc:
        console.print(f"[red]demo interrupted ({exc or type(exc).__name__}); every daemon was stopped[/red]")
        sys.exit(130)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
    else:
        t = Table(title=f"Private logistic regression on UCI Adult, {parties} parties ({trust}), real daemons")
        for col in ("job", "test acc.", "non-private", "ε", "δ", "data set ε spent", "time", "status"):
            t.add_column(col, justify="left" if col in ("job", "status") else "right")
        for j in summary["jobs"]:
            t.add_row(j["job"], _fmt(j["accuracy"], ".4f"), _fmt(j["nonprivate_accuracy"], ".4f"),
                      _fmt(j["epsilon"], ".4f"), _fmt(j["delta"], ".2g"), _fmt(j["ledger_epsilon"], ".4f"),
                      f"{j['wall_s']:.1f} s", j["status"] if not j["reason"] else f"{j['status']}: {j['reason']}")
        Console(width=None if sys.stdout.isatty() else 120).print(t)
        click.echo(f"total {summary['wall_s']:.1f} s; models, privacy reports, metrics and curves in {out}/")
    if any(j["status"] != "succeeded" for j in summary["jobs"]):
        sys.exit(1)
