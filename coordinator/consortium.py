"""A whole consortium on one machine: CA, identities, configs, and the daemons as real processes.

What ``mpc-erm demo`` and the end-to-end tests start: one ``mpc-erm party serve`` process per
party, one ``mpc-erm dealer serve`` for the dealer, each in its own process group with its own
state directory, every channel mutual TLS under a fresh CA. Each party holds shard ``i`` of ``m``
of a built-in data set (disjoint rows, public split seed). ``host_of``/``wrap`` let a caller put
each daemon on its own address, e.g. in its own network namespace (``ip netns exec NS …``).

:meth:`LocalConsortium.stop` (and leaving the ``with`` block, also on KeyboardInterrupt) ends
every daemon and every worker it started: SIGTERM to each process group, SIGKILL after a grace
period.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpc_erm.mpc import pki

__all__ = ["PARTY_NAMES", "ConsortiumError", "LocalConsortium", "Member"]

PARTY_NAMES = ("alice", "bob", "carol", "dave", "erin")
COORDINATOR = "coordinator"
DEALER = "dealer"


class ConsortiumError(RuntimeError):
    """A daemon did not start (its log's tail is in the message)."""



def _toml_value(v: Any) -> str:
    """A party_data value as TOML: numbers as numbers, anything else (paths, names) as a string."""
    return json.dumps(v if isinstance(v, int | float) else str(v))


def _toml_fields(fields: Mapping[str, Any]) -> list[str]:
    """A data set entry's fields as ``key = value`` TOML lines."""
    return [f"{k} = {_toml_value(v)}" for k, v in fields.items()]


@dataclass
class Member:
    name: str
    role: str  # "party" | "dealer"
    host: str
    port: int
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class LocalConsortium:
    """``m`` party daemons (+ a dealer) under ``root``; ``dataset`` is a built-in data set name."""

    root: Path
    parties: int = 3
    dataset: str = "adult"
    dealer: bool = True
    budget_epsilon: float = 3.0
    budget_delta: float = 1e-4
    max_epsilon_per_job: float = 1.0
    allow_test_only: bool = False
    device: str = "auto"
    threads: int | None = 1  # torch threads per job worker: the daemons share this machine
    peer_timeout_s: float | None = None  # daemons' peer_timeout_s (None: the config's default, 120 s)
    host_of: Callable[[str], str] = field(default=lambda _name: "127.0.0.1")
    wrap: Callable[[str], Sequence[str]] = field(default=lambda _name: ())
    start_timeout_s: float = 60.0
    # more ids for the same built-in shard, each with its own budget: a test-only zero-noise job
    # exhausts the budget of the data set it touches (parties.ledger), so a soak gives each one its own
    scratch_datasets: Sequence[str] = ()
    # a party's own files instead of its shard of the built-in data set: {party: {"format": "idx",
    # "path": ..., "labels": ...}} (the fields of a party config's [datasets.<id>] entry)
    party_data: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # more data sets at some parties, each with the consortium's budget: {party: {id: fields}}
    extra_datasets: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    max_iterations: int = 2000  # each party's policy: the most rounds a job may ask for
    crl: bool = False  # every daemon's identity.crl is pki/crl.pem (empty at first: publish_crl replaces it)
    members: dict[str, Member] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not 2 <= self.parties <= len(PARTY_NAMES):
            raise ValueError(f"parties: must be 2..{len(PARTY_NAMES)} (got {self.parties})")
        self.root = Path(self.root)

    # ------------------------------------------------------------------ files

    @property
    def pki_dir(self) -> Path:
        return self.root / "pki"

    @property
    def party_names(self) -> list[str]:
        return list(PARTY_NAMES[: self.parties])

    @property
    def coordinator_config(self) -> Path:
        return self.root / "coordinator.toml"

    def write(self) -> None:
        """CA, one identity per member and the coordinator, every config; ports chosen free now."""
        self.root.mkdir(parents=True, exist_ok=True)
        ca = pki.create_ca("mpc-erm demo CA", valid_days=2)
        pki.save_ca(ca, self.pki_dir)
        roles = {n: "party" for n in self.party_names} | ({DEALER: "dealer"} if self.dealer else {})
        for name, role in roles.items():
            host = self.host_of(name)
            hosts = sorted({host, "127.0.0.1", "localhost"})
            pki.save_identity(pki.issue_identity(ca, name, role, valid_days=2, hosts=hosts), self.pki_dir)  # type: ignore[arg-type]
            d = self.root / name
            d.mkdir(exist_ok=True)
            self.members[name] = Member(name, role, host, free_port(host), d / f"{role}.toml", d / "daemon.log")
        pki.save_identity(pki.issue_identity(ca, COORDINATOR, "coordinator", valid_days=2), self.pki_dir)
        if self.crl:
            self.publish_crl(())
        for i, m in enumerate(self.members.values()):
            m.config.write_text(self._daemon_toml(m, i))
        self.coordinator_config.write_text(self._coordinator_toml())

    @property
    def crl_path(self) -> Path:
        return self.pki_dir / "crl.pem"

    def publish_crl(self, serials: Iterable[int]) -> None:
        """The CA revokes ``serials``: a fresh CRL replaces ``crl_path`` whole (as ``mpc-erm certs
        revoke`` does); the daemons and their jobs' servers honour it from their next look at it."""
        tmp = self.crl_path.with_suffix(".tmp")
        tmp.write_bytes(pki.create_crl(pki.load_ca(self.pki_dir), serials, valid_days=2))
        os.replace(tmp, self.crl_path)

    def _identity_toml(self, name: str) -> list[str]:
        p = self.pki_dir
        return ["[identity]", f'name = "{name}"', f'cert = "{p / (name + ".crt")}"', f'key = "{p / (name + ".key")}"',
                f'ca = "{p / "ca.crt"}"', *([f'crl = "{self.crl_path}"'] if self.crl else []), ""]

    def _daemon_toml(self, me: Member, index: int) -> str:
        lines = [f'listen = "{me.address}"', 'state_dir = "state"', f'device = "{self.device}"',
                 *([f"threads = {self.threads}"] if self.threads else []),
                 *([f"peer_timeout_s = {self.peer_timeout_s!r}"] if self.peer_timeout_s else []), "",
                 *self._identity_toml(me.name)]
        for peer in self.members.values():
            if peer.name != me.name:
                lines += [f"[peers.{peer.name}]", f'address = "{peer.address}"', f'role = "{peer.role}"', ""]
        if me.role == "party":
            own = self.party_data.get(me.name)
            source = (_toml_fields(own) if own is not None else
                      ['format = "builtin"', f'name = "{self.dataset}"', f"part = {index}", f"of = {self.parties}"])
            blocks = [(ds_id, source) for ds_id in (self.dataset, *self.scratch_datasets)]
            blocks += [(ds_id, _toml_fields(f)) for ds_id, f in self.extra_datasets.get(me.name, {}).items()]
            for ds_id, fields in blocks:
                lines += [f"[datasets.{ds_id}]", *fields, f"epsilon = {self.budget_epsilon!r}",
                          f"delta = {self.budget_delta!r}", ""]
        lines += ["[policy]", f'allowed_coordinators = ["{COORDINATOR}"]', 'allowed_methods = ["output", "gradient"]',
                  f"max_epsilon_per_job = {self.max_epsilon_per_job!r}", f"max_iterations = {self.max_iterations}",
                  f"allow_test_only = {'true' if self.allow_test_only else 'false'}"]
        return "\n".join(lines) + "\n"

    def _coordinator_toml(self) -> str:
        lines = ["timeout_s = 120", "", *self._identity_toml(COORDINATOR), "[parties]"]
        lines += [f'{m.name} = "{m.address}"' for m in self.members.values() if m.role == "party"]
        if self.dealer:
            lines += ["", "[dealers]", f'{DEALER} = "{self.members[DEALER].address}"']
        return "\n".join(lines) + "\n"

    def add_owner(self, name: str, datasets: Mapping[str, Mapping[str, Any]], *, max_epsilon_per_job: float = 10.0,
                  allow_test_only: bool = False, root: Path | None = None, device: str | None = None) -> Path:
        """A data owner of this consortium: its identity (role ``owner``) from the
        consortium's CA, and an owner config naming every compute party's daemon and ``datasets``
        ({id: the fields of a ``[datasets.<id>]`` entry: format, path or name/part/of, epsilon,
        delta}; always add/remove), and where its local steps run (``device``: cpu, cuda or auto;
        default the config's, auto); its ``peer_timeout_s`` is the daemons'. Written under
        ``root/<name>/`` (default: ``self.root/owners``);
        returns the config's path, for ``mpc-erm owner join --config``."""
        d = Path(root or self.root / "owners") / name
        d.mkdir(parents=True)
        pki.save_identity(pki.issue_identity(pki.load_ca(self.pki_dir), name, "owner", valid_days=2), d)
        lines = ['state_dir = "state"', f"max_epsilon_per_job = {max_epsilon_per_job!r}",
                 f"allow_test_only = {'true' if allow_test_only else 'false'}",
                 *([f"peer_timeout_s = {self.peer_timeout_s!r}"] if self.peer_timeout_s else []),
                 *([f'device = "{device}"'] if device else []), "", "[identity]", f'name = "{name}"',
                 f'cert = "{d / (name + ".crt")}"', f'key = "{d / (name + ".key")}"',
                 f'ca = "{self.pki_dir / "ca.crt"}"', "", "[compute]",
                 *(f'{m.name} = "{m.address}"' for m in self.members.values() if m.role == "party")]
        for ds_id, fields in datasets.items():
            lines += ["", f"[datasets.{ds_id}]", *_toml_fields(fields), 'adjacency = "add_remove"']
        (d / "owner.toml").write_text("\n".join(lines) + "\n")
        return d / "owner.toml"

    # ------------------------------------------------------------------ processes

    def start(self) -> None:
        """Start every daemon and wait until each one listens (its first stdout line)."""
        if not self.members:
            self.write()
        for m in self.members.values():
            cmd = [*self.wrap(m.name), sys.executable, "-m", "coordinator.cli", m.role, "serve", "--config",
                   str(m.config)]
            log = open(m.log, "ab")  # the child keeps its own copy of the descriptor
            try:
                m.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                          cwd=m.config.parent, start_new_session=True, env=_child_env())
            finally:
                log.close()
        try:
            for m in self.members.values():
                self._await_listening(m)
        except BaseException:  # one member did not start: stop the others, leave nothing behind
            self.stop(grace_s=5.0)
            raise

    def _await_listening(self, m: Member) -> None:
        assert m.proc is not None and m.proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout_s
        buf = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([m.proc.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(m.proc.stdout.fileno(), 4096)
                buf += chunk
                if b"\n" in buf:
                    try:
                        event = json.loads(buf.split(b"\n", 1)[0])
                    except ValueError:
                        event = {}
                    if event.get("event") == "listening":
                        return
                if not chunk and m.proc.poll() is not None:
                    break
            elif m.proc.poll() is not None:
                break
        raise ConsortiumError(f"{m.role} daemon {m.name!r} did not start (exit {m.proc.poll()}); "
                              f"log {m.log}:\n{self.log_tail(m.name)}")

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join(self.members[name].log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal one daemon's whole process group (daemon and its job workers)."""
        proc = self.members[name].proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every process group, then SIGKILL what is left after ``grace_s``."""
        live = [m for m in self.members.values() if m.proc is not None]
        for m in live:
            self.kill(m.name, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for m in live:
            assert m.proc is not None
            try:
                m.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for m in live:
            assert m.proc is not None
            try:  # the group may outlive its leader (a worker still ending): kill it whole
                os.killpg(m.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            m.proc.wait()
            if m.proc.stdout is not None:
                m.proc.stdout.close()
            m.proc = None

    def __enter__(self) -> LocalConsortium:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client(self) -> Any:
        from coordinator.client import CoordinatorClient
        from coordinator.config import load_coordinator_config

        return CoordinatorClient(load_coordinator_config(self.coordinator_config))


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str) -> int:
    """A port free on ``host`` now (127.0.0.1 for hosts this namespace cannot bind), chosen BELOW
    the kernel's ephemeral range: a port from that range (what binding port 0 gives) can be taken
    by any outgoing connection's local end, or a worker's transport server, before the daemon
    that was promised it binds it (seen in CI: "Failed to bind to address 127.0.0.1:60221")."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, max(10001, low))
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    with socket.socket() as s:  # pragma: no cover - every candidate busy
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child_env() -> dict[str, str]:
    """The daemons import this checkout's packages whatever their working directory."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
