"""`mpc-erm party health` / `dealer health` against real daemons on 127.0.0.1 (gRPC + mTLS).

The probe is what the Docker image's HEALTHCHECK runs: it must exit 0 only when the daemon of
its config answers as itself, and 1 (never Docker's reserved 2) for anything else — nobody
listening, another identity at the address, a broken config.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from coordinator.cli import cli
from mpc_erm.mpc import pki
from parties.cli import health_target
from parties.config import load_dealer_config, load_party_config
from parties.daemon import PartyDaemon

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pki_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    ca = pki.create_ca("health test CA")
    for name, role in [("alice", "party"), ("bob", "party"), ("dealer", "dealer")]:
        pki.save_identity(pki.issue_identity(ca, name, role), d)  # type: ignore[arg-type]
    return d


def free_port() -> int:
    """A free port below the ephemeral range (see coordinator.consortium.free_port)."""
    from coordinator.consortium import free_port as below_ephemeral

    return below_ephemeral("127.0.0.1")


def write_config(root: Path, pki_dir: Path, name: str, listen: str, *, dealer: bool = False,
                 advertise: str | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "rows.npz").write_bytes(b"stand-in: health never reads the data")
    lines = [f'listen = "{listen}"'] + ([f'advertise = "{advertise}"'] if advertise else []) + [
        'state_dir = "state"', "", "[identity]", f'name = "{name}"', f'cert = "{pki_dir / (name + ".crt")}"',
        f'key = "{pki_dir / (name + ".key")}"', f'ca = "{pki_dir / "ca.crt"}"']
    if not dealer:
        lines += ["", "[datasets.adult]", 'format = "npz"', 'path = "rows.npz"', "epsilon = 1.0", "delta = 1e-5"]
    lines += ["", "[policy]", 'allowed_coordinators = ["coord"]', "max_epsilon_per_job = 1.0", "max_iterations = 10"]
    path = d / ("dealer.toml" if dealer else "party.toml")
    path.write_text("\n".join(lines) + "\n")
    return path


def serve(path: Path, dealer: bool = False) -> PartyDaemon:
    cfg = load_dealer_config(path) if dealer else load_party_config(path)
    d = PartyDaemon(cfg, log_to_stderr=False)
    d.start()
    return d


@pytest.fixture
def alice(tmp_path: Path, pki_dir: Path) -> Iterator[tuple[Path, PartyDaemon]]:
    path = write_config(tmp_path, pki_dir, "alice", f"127.0.0.1:{free_port()}")
    d = serve(path)
    try:
        yield path, d
    finally:
        d.stop()


def health(role: str, path: Path, *extra: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, [role, "health", "--config", str(path), "--timeout", "5", *extra])
    return r.exit_code, r.stdout, r.stderr


def test_party_health_ok(alice: tuple[Path, PartyDaemon]) -> None:
    path, d = alice
    code, out, err = health("party", path)
    assert code == 0, err
    got = json.loads(out)
    assert got["status"] == "ok" and (got["name"], got["role"]) == ("alice", "party")
    assert got["address"] == f"127.0.0.1:{d.port}" and got["queued"] == 0 and got["running"] == 0
    assert got["uptime_s"] >= 0 and got["version"]


def test_health_as_the_installed_console_command(alice: tuple[Path, PartyDaemon]) -> None:
    """The exit status a container's HEALTHCHECK sees: the real entry point in a fresh process."""
    path, _ = alice
    ok = subprocess.run([sys.executable, "-m", "coordinator.cli", "party", "health", "--config", str(path)],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["name"] == "alice"
    missing = subprocess.run([sys.executable, "-m", "coordinator.cli", "party", "health", "--config",
                              str(path.parent / "nope.toml")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "nope.toml: cannot read" in missing.stderr


def test_dealer_health_ok_and_wrong_role_refused(tmp_path: Path, pki_dir: Path) -> None:
    path = write_config(tmp_path, pki_dir, "dealer", f"127.0.0.1:{free_port()}", dealer=True)
    d = serve(path, dealer=True)
    try:
        code, out, err = health("dealer", path)
        assert code == 0, err
        assert (json.loads(out)["role"], json.loads(out)["name"]) == ("dealer", "dealer")
        code, _, err = health("party", path)  # a dealer config is not a party config
        assert code == 1 and "datasets: required" in err
    finally:
        d.stop()


def test_nobody_listening_is_unhealthy(tmp_path: Path, pki_dir: Path) -> None:
    port = free_port()
    path = write_config(tmp_path, pki_dir, "alice", f"127.0.0.1:{port}")
    code, out, err = health("party", path, "--timeout", "1")
    assert code == 1 and out == ""
    assert err.startswith(f"error: party alice at 127.0.0.1:{port}: ")
    assert "UNAVAILABLE" in err or "DEADLINE_EXCEEDED" in err


def test_another_identity_at_the_address_is_unhealthy(tmp_path: Path, pki_dir: Path) -> None:
    """bob's daemon listens where alice's config says alice is: the pinned handshake fails."""
    port = free_port()
    bob = serve(write_config(tmp_path, pki_dir, "bob", f"127.0.0.1:{port}"))
    try:
        assert health("party", tmp_path / "bob" / "party.toml")[0] == 0
        code, out, err = health("party", write_config(tmp_path, pki_dir, "alice", f"127.0.0.1:{port}"))
        assert code == 1 and out == "" and "party alice at" in err
    finally:
        bob.stop()


def test_address_override_and_bad_config(alice: tuple[Path, PartyDaemon], tmp_path: Path) -> None:
    path, d = alice
    code, out, _ = health("party", path, "--address", f"localhost:{d.port}")
    assert code == 0 and json.loads(out)["address"] == f"localhost:{d.port}"
    code, _, err = health("party", path, "--address", "no-port")
    assert code == 1 and "'no-port' is not host:port" in err
    bad = tmp_path / "bad.toml"
    bad.write_text(path.read_text().replace("max_iterations = 10", "max_iterations = 0"))
    code, _, err = health("party", bad)
    assert code == 1 and "policy.max_iterations: must be >= 1" in err


@pytest.mark.parametrize(("listen", "advertise", "target"), [
    ("127.0.0.1:7101", None, "127.0.0.1:7101"),
    ("0.0.0.0:7101", "alice:7101", "127.0.0.1:7101"),  # a container: dial itself on loopback
    ("[::]:7101", "alice:7101", "[::1]:7101"),
    ("alice:7101", None, "alice:7101"),
    ("127.0.0.1:0", "alice:7200", "alice:7200"),  # port 0: only the advertised port is known
])
def test_health_target(tmp_path: Path, pki_dir: Path, listen: str, advertise: str | None, target: str) -> None:
    cfg = load_party_config(write_config(tmp_path, pki_dir, "alice", listen, advertise=advertise))
    assert health_target(cfg) == target


def test_health_target_port_zero_without_advertise(tmp_path: Path, pki_dir: Path) -> None:
    cfg = load_party_config(write_config(tmp_path, pki_dir, "alice", "127.0.0.1:0"))
    with pytest.raises(ValueError, match="pass --address"):
        health_target(cfg)
