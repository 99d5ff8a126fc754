"""The coordinator's config and client without party daemons: config errors name the field, the
client's identity must be a coordinator's, a daemon's result stream is checked (names, sizes,
sha256) before anything lands in the output directory, and CLI errors are one line.

The client against real daemons is tested in tests/parties/test_daemon.py."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from coordinator.client import ClientError, CoordinatorClient, SubmitRefused, overall_status
from coordinator.config import CoordinatorConfig, load_coordinator_config
from mpc_erm.mpc import pki, tls
from mpc_erm.mpc._proto import party_pb2 as pb
from mpc_erm.mpc._proto import party_pb2_grpc as pb_grpc
from parties.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pki_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    ca = pki.create_ca("client test CA")
    for name, role in [("alice", "party"), ("coord", "coordinator")]:
        pki.save_identity(pki.issue_identity(ca, name, role), d)  # type: ignore[arg-type]
    return d


def write(tmp_path: Path, pki_dir: Path, body: str = "", who: str = "coord",
          parties: str = 'alice = "127.0.0.1:7101"') -> Path:
    p = tmp_path / "coordinator.toml"
    p.write_text(f"{body}\n[identity]\nname = \"{who}\"\ncert = \"{pki_dir / (who + '.crt')}\"\n"
                 f"key = \"{pki_dir / (who + '.key')}\"\nca = \"{pki_dir / 'ca.crt'}\"\n\n[parties]\n{parties}\n")
    return p


def test_config_loads_and_lists_members(tmp_path: Path, pki_dir: Path) -> None:
    cfg = load_coordinator_config(write(tmp_path, pki_dir, "timeout_s = 5.0",
                                        parties='alice = "127.0.0.1:7101"\n\n[dealers]\nd1 = "[::1]:7100"'))
    assert cfg.timeout_s == 5.0 and cfg.identity.cert == pki_dir / "coord.crt"
    assert cfg.members() == {"alice": ("party", "127.0.0.1:7101"), "d1": ("dealer", "[::1]:7100")}


@pytest.mark.parametrize(("body", "parties", "fragment"), [
    ("timeout = 5", 'alice = "127.0.0.1:7101"', "timeout: unknown field"),
    ("timeout_s = \"5\"", 'alice = "127.0.0.1:7101"', "timeout_s:"),
    ("", 'alice = "127.0.0.1:99999"', "parties.alice: '127.0.0.1:99999': port must be an integer in 1..65535"),
    ("", 'alice = "127.0.0.1:0"', "parties.alice: '127.0.0.1:0': port must be"),
    ("", 'Alice = "127.0.0.1:7101"', "parties.Alice: 'Alice' is not a valid name"),
    ("", 'alice = "127.0.0.1:7101"\n\n[dealers]\nalice = "127.0.0.1:7100"', "dealers: alice also listed under parties"),
    ("", "", "parties: must not be empty"),
])
def test_config_errors_name_the_field(tmp_path: Path, pki_dir: Path, body: str, parties: str, fragment: str) -> None:
    path = write(tmp_path, pki_dir, body, parties=parties)
    with pytest.raises(ConfigError) as info:
        load_coordinator_config(path)
    assert f"{path}: {fragment}" in str(info.value), str(info.value)


def test_client_needs_a_coordinator_certificate(tmp_path: Path, pki_dir: Path) -> None:
    cfg = load_coordinator_config(write(tmp_path, pki_dir, who="alice", parties='bob = "127.0.0.1:7101"'))
    with pytest.raises(ClientError, match=r"identity.cert: .* is for party/alice, not coordinator/alice"):
        CoordinatorClient(cfg)


def test_overall_status_and_refusal_message() -> None:
    assert overall_status(["succeeded", "succeeded"]) == "succeeded"
    assert overall_status(["succeeded", "running", "queued"]) == "running"
    assert overall_status(["succeeded", "cancelled", "failed"]) == "failed"
    err = SubmitRefused("j1", {"carol": "privacy.epsilon: 2 exceeds carol's max_epsilon_per_job (1)",
                               "bob": "alice at x is unreachable"})
    assert str(err).startswith("job refused by carol, bob: carol: privacy.epsilon")
    assert "\n" not in str(err)


# --------------------------------------------------------------------------- a daemon that lies


class _Daemon(pb_grpc.PartyControlServicer):
    """A daemon that answers GetStatus with 'succeeded' and streams whatever ``files`` says."""

    def __init__(self) -> None:
        self.chunks: list[pb.FileChunk] = []

    def GetStatus(self, request: pb.JobRef, context: grpc.ServicerContext) -> pb.JobInfo:
        return pb.JobInfo(job_id=request.job_id, status="succeeded", member="alice", parties=["alice"])

    def GetResult(self, request: pb.ResultRequest, context: grpc.ServicerContext) -> Iterator[pb.FileChunk]:
        yield from self.chunks


@pytest.fixture
def lying_daemon(pki_dir: Path) -> Iterator[tuple[_Daemon, int]]:
    servicer = _Daemon()
    server = grpc.server(ThreadPoolExecutor(4), interceptors=[
        tls.Authorizer({"/mpc_erm.v1.PartyControl/*": [("coordinator", "coord")]})])
    pb_grpc.add_PartyControlServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(pki.load_identity(pki_dir, "alice")))
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(None)


def _chunk(name: str, data: bytes, sha: str | None = None, size: int | None = None) -> pb.FileChunk:
    return pb.FileChunk(name=name, offset=0, data=data, last=True, size=len(data) if size is None else size,
                        sha256=sha or hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize(("chunks", "fragment"), [
    ([_chunk("../evil.txt", b"x")], "refused unsafe file name '../evil.txt'"),
    ([_chunk("/etc/evil", b"x")], "refused unsafe file name '/etc/evil'"),
    ([_chunk("metrics.json", b"{}", sha="0" * 64)], "file 'metrics.json' failed its check"),
    ([_chunk("metrics.json", b"{}", size=3)], "file 'metrics.json' failed its check"),
    ([pb.FileChunk(name="model.safetensors", offset=0, data=b"abc")], "the result stream ended inside"),
])
def test_result_stream_is_checked_before_files_land(tmp_path: Path, pki_dir: Path, lying_daemon: tuple[_Daemon, int],
                                                    chunks: list[pb.FileChunk], fragment: str) -> None:
    servicer, port = lying_daemon
    servicer.chunks = chunks
    cfg = load_coordinator_config(write(tmp_path, pki_dir, parties=f'alice = "127.0.0.1:{port}"'))
    out = tmp_path / "out" / "inner"
    with CoordinatorClient(cfg) as client, pytest.raises(ClientError, match="alice: .*" + fragment.replace(
            "(", r"\(").replace(")", r"\)")):
        client.result("j1", out)
    assert not (tmp_path / "out" / "evil.txt").exists() and not Path("/etc/evil").exists()
    assert list(out.iterdir()) == []  # no partial or unchecked file left behind


def test_result_writes_checked_files(tmp_path: Path, pki_dir: Path, lying_daemon: tuple[_Daemon, int]) -> None:
    servicer, port = lying_daemon
    data = bytes(range(256)) * 10
    h = hashlib.sha256(data).hexdigest()
    servicer.chunks = [pb.FileChunk(name="sub/model.bin", offset=0, data=data[:1000]),
                       pb.FileChunk(name="sub/model.bin", offset=1000, data=data[1000:], last=True, size=len(data),
                                    sha256=h),
                       _chunk("metrics.json", b"{}")]
    cfg: CoordinatorConfig = load_coordinator_config(write(tmp_path, pki_dir, parties=f'alice = "127.0.0.1:{port}"'))
    with CoordinatorClient(cfg) as client:
        res = client.result("j1", tmp_path / "out")
    assert (tmp_path / "out" / "sub" / "model.bin").read_bytes() == data
    assert res["source"] == "alice" and res["models_identical"]
    assert [f["name"] for f in res["files"]] == ["sub/model.bin", "metrics.json"]


# --------------------------------------------------------------------------- CLI errors


def _mpc_erm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_cli_errors_are_one_line_with_exit_2(tmp_path: Path, pki_dir: Path) -> None:
    r = _mpc_erm("job", "list", "--config", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "missing.toml: cannot read" in r.stderr
    closed = write(tmp_path, pki_dir, "timeout_s = 5.0", parties='alice = "127.0.0.1:1"')
    r = _mpc_erm("job", "status", "abc", "--config", str(closed))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "job abc: not found at any member (alice: alice at 127.0.0.1:1 is unreachable" in r.stderr
    r = _mpc_erm("budget", "show", "--config", str(closed))
    assert r.returncode == 2 and "unknown field" in r.stderr  # a coordinator config is not a party config
