"""`mpc-erm party serve` and `mpc-erm dealer serve`: run a daemon until SIGINT/SIGTERM (SIGHUP
re-reads the CRL named by ``identity.crl``, e.g. after ``mpc-erm certs revoke``);
`mpc-erm party health` and `mpc-erm dealer health`: probe a running daemon (container health checks);
`mpc-erm party progress`: this party's own view of a job's training (metrics on its own rows).

The daemon logs JSON lines to stderr and state_dir/daemon.log; stdout gets one JSON line once it
listens and takes jobs (``{"event": "listening", "port": …}``), so a script can start it with
``listen = "…:0"``, learn the port and submit.

``health`` reads the same config as ``serve``, dials the daemon's own address (its listen address;
``127.0.0.1`` or ``[::1]`` when listen binds a wildcard; its advertise address when listen has port
0) over mutual TLS with the daemon's own identity, pinning the server to that identity, and calls
``Health`` with a short deadline. It prints one JSON line and exits 0 if the daemon answered as
itself and takes jobs, else 1 with one ``error:`` line (never 2, which Docker reserves in health
checks): a daemon still at its start-up work (importing the job-file parser) answers
``starting``, and the JSON line says what it waits for (``"status": "starting"``). A daemon takes
jobs within seconds while its worker pool (torch and the job code) warms behind it: the ok line
then says ``"warming": …``, and a job taken meanwhile starts once every member's pool is warm.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

import click

_CONFIG = click.option("--config", "config_path", required=True,
                       type=click.Path(exists=True, dir_okay=False, path_type=Path), help="the daemon's TOML config")
# Tests run the daemon with a stand-in worker; never needed in a deployment.
_WORKER = click.option("--worker-module", default="parties.worker", hidden=True)


def _serve(config: object, worker_module: str) -> None:
    from parties.daemon import PartyDaemon
    from parties.logs import JsonFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)  # library warnings (e.g. refused TLS callers); the daemon logs itself

    daemon = PartyDaemon(config, worker_module=worker_module)  # type: ignore[arg-type]
    stop, reload = threading.Event(), threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        (reload if signum == signal.SIGHUP else stop).set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    from parties.logs import os_error_line

    try:
        daemon.start(wait_ready=False)
    except OSError as exc:  # the listen address, a data file, the state directory: one line naming it
        raise ValueError(os_error_line(exc)) from None
    try:  # its start-up work until it takes jobs (Health answers "starting" meanwhile); a signal still stops it
        while not daemon.wait_taking(0.5):
            if stop.is_set():
                daemon.stop()
                return
    except OSError as exc:
        daemon.stop()
        raise ValueError(os_error_line(exc)) from None
    click.echo(json.dumps({"event": "listening", "name": daemon.name, "role": daemon.role, "port": daemon.port,
                           "address": daemon.address}))
    sys.stdout.flush()
    while not stop.wait(0.5):
        if reload.is_set():
            reload.clear()
            daemon.reload_crl()
    daemon.stop()


@click.group()
def party() -> None:
    """Run a party daemon (next to the party's private data)."""


@party.command("serve")
@_CONFIG
@_WORKER
def party_serve(config_path: Path, worker_module: str) -> None:
    """Serve job control (gRPC + mTLS) on the config's listen address until interrupted."""
    from parties.config import load_party_config

    _serve(load_party_config(config_path), worker_module)


@click.group()
def dealer() -> None:
    """Run the Beaver-triple dealer daemon (a non-colluding third party; holds no data)."""


@dealer.command("serve")
@_CONFIG
@_WORKER
def dealer_serve(config_path: Path, worker_module: str) -> None:
    """Serve job control (gRPC + mTLS) on the config's listen address until interrupted."""
    from parties.config import load_dealer_config

    _serve(load_dealer_config(config_path), worker_module)


# Not exists=True: a missing file must exit 1 (unhealthy), not click's usage status 2.
_HEALTH_CONFIG = click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
                              help="the daemon's TOML config (the one it serves with)")
_ADDRESS = click.option("--address", default=None,
                        help="host:port to dial instead of the one derived from the config")
_TIMEOUT = click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1, max=300.0), default=3.0,
                        show_default=True, help="seconds to wait for the answer")


def health_target(config: object) -> str:
    """Where a local probe reaches the daemon: the listen address (a wildcard host replaced by
    loopback), or the advertise address when listen has port 0."""
    from parties.config import split_host_port

    host, port = split_host_port(config.listen, allow_zero=True)  # type: ignore[attr-defined]
    if port == 0:
        advertise = getattr(config, "advertise", None)
        if advertise is None:
            raise ValueError("listen: port 0 (any free port) and no advertise address: pass --address")
        return str(advertise)
    if host == "0.0.0.0":
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _health(config_path: Path, role: str, address: str | None, timeout_s: float) -> None:
    import grpc

    from mpc_erm.mpc import tls
    from mpc_erm.mpc.party_api import party_pb2 as pb
    from mpc_erm.mpc.party_api import party_pb2_grpc as pb_grpc
    from parties.config import ConfigError, load_daemon_identity, load_dealer_config, load_party_config, split_host_port

    def fail(msg: str) -> NoReturn:
        click.echo(f"error: {' '.join(msg.split())}", err=True)
        sys.exit(1)

    try:
        config = load_dealer_config(config_path) if role == "dealer" else load_party_config(config_path)
        identity = load_daemon_identity(config)
        if address is not None:
            split_host_port(address)
        target = address or health_target(config)
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
    name = config.identity.name
    channel = tls.secure_channel(target, identity, name, expected_role=role)  # type: ignore[arg-type]
    try:
        reply = pb_grpc.PartyControlStub(channel).Health(pb.HealthRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        fail(f"{role} {name} at {target}: {code.name if code else 'error'}: {exc.details() or ''}")  # type: ignore[attr-defined]
    finally:
        channel.close()
    if (reply.role, reply.name) != (role, name):  # pinning makes this unreachable; checked all the same
        fail(f"{target} answered as {reply.role}/{reply.name}, not {role}/{name}")
    state = {"status": "starting" if reply.starting else "ok", "name": reply.name, "role": reply.role,
             "address": target, "version": reply.version, "uptime_s": round(reply.uptime_s, 3),
             "queued": reply.queued, "running": reply.running}
    if reply.starting:  # answering, but not yet taking jobs: not healthy
        click.echo(json.dumps({**state, "waiting_for": reply.starting}))
        fail(f"{role} {name} at {target} is starting: it takes no job yet (waiting for {reply.starting})")
    if reply.warming:  # healthy: a job is taken, and its workers start once this is warm at every member
        state["warming"] = reply.warming
    click.echo(json.dumps(state))


@party.command("health")
@_HEALTH_CONFIG
@_ADDRESS
@_TIMEOUT
def party_health(config_path: Path, address: str | None, timeout_s: float) -> None:
    """Exit 0 if the party daemon of this config answers Health over mTLS as itself and takes
    jobs, else 1 ("starting": it answers, but its start-up work is not done)."""
    _health(config_path, "party", address, timeout_s)


@dealer.command("health")
@_HEALTH_CONFIG
@_ADDRESS
@_TIMEOUT
def dealer_health(config_path: Path, address: str | None, timeout_s: float) -> None:
    """Exit 0 if the dealer daemon of this config answers Health over mTLS as itself and takes
    jobs, else 1 ("starting": it answers, but its start-up work is not done)."""
    _health(config_path, "dealer", address, timeout_s)


def read_progress(state_dir: Path, job_id: str) -> list[dict]:
    """The curve points a job's worker appended to ``.private/progress.jsonl`` (round, ε spent, and
    the metrics on this party's training and validation rows); a torn last line is skipped."""
    from parties.admission import JOB_ID_RE

    if not JOB_ID_RE.fullmatch(job_id):
        raise click.BadParameter(f"{job_id!r} is not a job id", param_hint="JOB_ID")
    path = state_dir / "jobs" / job_id / ".private" / "progress.jsonl"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # being written
    return out


def _ended(state_dir: Path, job_id: str) -> bool:
    """Whether this party's daemon recorded the job as ended (or never heard of it)."""
    from parties.job_store import TERMINAL, JobStore

    store = JobStore.in_state_dir(state_dir)
    try:
        rec = store.get(job_id)
    finally:
        store.close()
    return rec is None or rec.status in TERMINAL


def _fmt(m: dict | None, key: str) -> str:
    v = None if m is None else m.get(key)
    return "" if v is None else f"{v:.4g}"


@party.command("progress")
@_HEALTH_CONFIG
@click.argument("job_id")
@click.option("--follow", is_flag=True, help="keep printing new points until the job's results are written")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per point")
def party_progress(config_path: Path, job_id: str, follow: bool, as_json: bool) -> None:
    """Training progress of JOB_ID on this party's own rows: ε spent, loss/objective and accuracy
    (or MSE) on its training rows and on its held-out validation rows (``validation_fraction`` in
    the data set's config). Read from this party's state directory: nothing here is ever sent."""
    import time

    from parties.config import ConfigError, load_party_config

    try:
        config = load_party_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    state_dir = Path(config.state_dir)
    shown = 0
    if not as_json:
        click.echo(f"{'round':>7} {'epoch':>7} {'ε spent':>8}  {'train loss':>10} {'train acc':>9}  "
                   f"{'val loss':>10} {'val acc':>9}")
    while True:
        points = read_progress(state_dir, job_id)
        for p in points[shown:]:
            if as_json:
                click.echo(json.dumps(p))
                continue
            own = p.get("own", {})
            tr, va = own.get("train"), own.get("validation")
            loss = "loss" if tr is not None and "loss" in tr else "objective"
            acc = "accuracy" if tr is not None and "accuracy" in tr else "mse"
            epoch = p.get("epoch")
            click.echo(f"{p['round']:>7} {'' if epoch is None else f'{epoch:.2f}':>7} {p['epsilon_spent']:>8.4g}  "
                       f"{_fmt(tr, loss):>10} {_fmt(tr, acc):>9}  {_fmt(va, loss):>10} {_fmt(va, acc):>9}")
        shown = len(points)
        if not follow or _ended(state_dir, job_id):
            break
        time.sleep(1.0)
    if not shown and not follow:
        click.echo(f"no progress recorded for job {job_id} at {config.identity.name}", err=True)
