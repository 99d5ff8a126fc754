"""`mpc-erm party serve` and `mpc-erm dealer serve`: run a daemon until SIGINT/SIGTERM.

The daemon logs JSON lines to stderr and state_dir/daemon.log; stdout gets one JSON line once it
listens (``{"event": "listening", "port": …}``), so a script can start it with ``listen = "…:0"``
and learn the port.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from pathlib import Path

import click

_CONFIG = click.option("--config", "config_path", required=True,
                       type=click.Path(exists=True, dir_okay=False, path_type=Path), help="the daemon's TOML config")
# Tests run the daemon with a stand-in worker; never needed in a deployment.
_WORKER = click.option("--worker-module", default="parties.worker", hidden=True)


def _serve(config: object, worker_module: str) -> None:
    from parties.daemon import JsonFormatter, PartyDaemon

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)  # library warnings (e.g. refused TLS callers); the daemon logs itself

    daemon = PartyDaemon(config, worker_module=worker_module)  # type: ignore[arg-type]
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        daemon.start()
    except OSError as exc:
        raise ValueError(str(exc)) from None
    click.echo(json.dumps({"event": "listening", "name": daemon.name, "role": daemon.role, "port": daemon.port,
                           "address": daemon.address}))
    sys.stdout.flush()
    while not stop.wait(0.5):
        pass
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
