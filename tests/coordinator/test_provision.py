"""`mpc-erm provision`: one consortium file, one kit per member. Every generated config loads with
the loader its member runs (once the member's data is in place); each private key is in its own
kit only, 0600; each certificate verifies against the CA with its role and name; errors in the
consortium file name their field; and three kits started by their own start.sh run a job."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib
from cryptography import x509
from pydantic import ValidationError

from coordinator.config import load_coordinator_config
from coordinator.provision import load_consortium, provision
from mpc_erm.mpc import pki
from parties.config import ConfigError, DatasetConfig, load_dealer_config, load_owner_config, load_party_config
from tests.cli_main import run_main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "coordinator" / "examples" / "consortium.toml"
PARTIES = ("alice", "bob", "carol")
# A small schema in the format of mpc_erm.data.schema (the provisioner only copies it; the party
# config's loader parses it).
SCHEMA = """\
[label]
column = "diagnosis"
task = "binary"
positive = "malignant"
negative = "benign"

[[columns]]
name = "radius_mean"
type = "numeric"
low = 5.0
high = 30.0
"""


def write_consortium(d: Path, text: str | None = None) -> Path:
    """The example consortium file (or ``text``) in ``d``, with the schema file it names."""
    (d / "schemas").mkdir(parents=True, exist_ok=True)
    (d / "schemas" / "diagnosis.toml").write_text(SCHEMA)
    path = d / "consortium.toml"
    path.write_text(EXAMPLE.read_text() if text is None else text)
    return path


@pytest.fixture(scope="module")
def kits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("provision")
    provision(write_consortium(d), d / "out", days=30)
    return d / "out"


def put_data(kit: Path) -> None:
    """What a party does before its first job: its data where its config's path says."""
    (kit / "data").mkdir(exist_ok=True)
    (kit / "data" / "diagnosis.csv").write_text("radius_mean,diagnosis\n12.0,benign\n21.5,malignant\n")


# --------------------------------------------------------------------------- the example's kits


def test_every_config_loads_with_its_real_loader(kits: Path) -> None:
    assert sorted(p.name for p in kits.iterdir()) == ["README.txt", "alice", "bob", "ca", "carol", "coordinator",
                                                      "dealer"]
    with pytest.raises(ConfigError, match=r"datasets\.diagnosis\.path: file not found"):
        load_party_config(kits / "alice" / "party.toml")  # provisioned without the data: it lives at alice's
    for name in PARTIES:
        put_data(kits / name)
        cfg = load_party_config(kits / name / "party.toml")
        cfg.identity.load("party")  # key, certificate, CA, name and role: what the daemon checks
        others = {p: f"127.0.0.1:710{i + 1}" for i, p in enumerate(PARTIES) if p != name}
        assert {p: c.address for p, c in cfg.peers.items()} == {**others, "dealer": "127.0.0.1:7100"}
        assert cfg.peers["dealer"].role == "dealer" and cfg.listen == cfg.advertise
        assert cfg.policy.allowed_coordinators == ["coordinator"] and cfg.policy.max_iterations == 2000
        assert cfg.policy.max_epsilon_per_job == (0.5 if name == "bob" else 1.0)  # bob's override
        assert cfg.policy.allowed_methods == ["output", "gradient"] and not cfg.policy.allow_test_only
        ds = cfg.datasets["diagnosis"]
        assert (ds.format, ds.label, ds.epsilon, ds.delta) == ("csv", "diagnosis", 4.0, 1e-5)
        assert ds.path == kits / name / "data" / "diagnosis.csv"
        assert ds.validation_fraction == (0.1 if name == "carol" else 0.0)
        raw = tomllib.loads((kits / name / "party.toml").read_text())
        assert raw["datasets"]["diagnosis"]["schema"] == "schemas/diagnosis.toml"  # the kit's own copy
        assert (kits / name / "schemas" / "diagnosis.toml").read_text() == SCHEMA
    dealer = load_dealer_config(kits / "dealer" / "dealer.toml")
    dealer.identity.load("dealer")
    assert {p: c.address for p, c in dealer.peers.items()} == {p: f"127.0.0.1:710{i + 1}"
                                                               for i, p in enumerate(PARTIES)}
    assert not (kits / "dealer" / "schemas").exists()
    coord = load_coordinator_config(kits / "coordinator" / "coordinator.toml")
    coord.identity.load("coordinator")
    assert coord.members() == {**{p: ("party", f"127.0.0.1:710{i + 1}") for i, p in enumerate(PARTIES)},
                               "dealer": ("dealer", "127.0.0.1:7100")}
    assert coord.timeout_s == 30


def test_each_private_key_is_only_in_its_own_kit(kits: Path) -> None:
    files = [p for p in kits.rglob("*") if p.is_file()]
    keys = sorted(str(p.relative_to(kits)) for p in files if p.suffix == ".key")
    assert keys == ["alice/pki/alice.key", "bob/pki/bob.key", "ca/ca.key", "carol/pki/carol.key",
                    "coordinator/pki/coordinator.key", "dealer/pki/dealer.key"]
    contents = {p: p.read_bytes() for p in files}
    for key in keys:
        pem = (kits / key).read_bytes()
        assert b"-----BEGIN PRIVATE KEY-----" in pem and stat.S_IMODE((kits / key).stat().st_mode) == 0o600
        assert [p for p, data in contents.items() if pem.strip() in data] == [kits / key]
    for p in files:  # and no other file holds a private key at all
        assert p.suffix == ".key" or b"-----BEGIN PRIVATE KEY" not in contents[p], p


def test_each_certificate_verifies_with_its_role_and_name(kits: Path) -> None:
    ca_pem = (kits / "ca" / "ca.crt").read_bytes()
    roles = {**dict.fromkeys(PARTIES, "party"), "dealer": "dealer", "coordinator": "coordinator"}
    for name, role in roles.items():
        pki_dir = kits / name / "pki"
        assert sorted(p.name for p in pki_dir.iterdir()) == sorted([f"{name}.crt", f"{name}.key", "ca.crt"])
        assert (pki_dir / "ca.crt").read_bytes() == ca_pem
        cert = (pki_dir / f"{name}.crt").read_bytes()
        assert pki.identity_of_certificate(cert) == (role, name)
        pki.verify_identity(pki.Identity(name=name, role=role, cert_pem=cert,  # type: ignore[arg-type]
                                         key_pem=(pki_dir / f"{name}.key").read_bytes(), ca_pem=ca_pem))
        san = x509.load_pem_x509_certificate(cert).extensions.get_extension_for_class(x509.SubjectAlternativeName)
        ips = [str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)]
        assert ips == ([] if role == "coordinator" else ["127.0.0.1"]), (name, ips)  # a listener's host


def test_scripts_and_readmes(kits: Path) -> None:
    for name in (*PARTIES, "dealer"):
        script = kits / name / "start.sh"
        role = "dealer" if name == "dealer" else "party"
        assert script.stat().st_mode & stat.S_IXUSR
        text = script.read_text()
        assert text.startswith("#!/bin/sh") and 'cd "$(dirname "$0")"' in text
        assert f"exec mpc-erm {role} serve --config {role}.toml" in text
        assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
        readme = (kits / name / "README.txt").read_text()
        assert f"pki/{name}.key" in readme and "NEVER share it" in readme
    submit = (kits / "coordinator" / "submit.sh").read_text()
    assert 'mpc-erm job submit --config "$(dirname "$0")/coordinator.toml" "$@"' in submit
    assert "mpc-erm job submit JOB.toml --config coordinator.toml" in (kits / "coordinator" / "README.txt").read_text()
    top = (kits / "README.txt").read_text()
    assert "OFFLINE" in top and "alice/" in top


# --------------------------------------------------------------------------- other shapes


OWNERS = """\
name = "clinics"

[members.coord]
role = "coordinator"

[members.alice]
role = "party"
host = "alice.example.org"
port = 7201
listen = "0.0.0.0:7201"
threads = 1

[members.alice.datasets.cancer]
format = "builtin"
name = "breast_cancer"
part = 0
of = 2
epsilon = 2.0
delta = 1e-6

[members.bob]
role = "party"
host = "::1"
port = 7202

[members.bob.datasets.cancer]
format = "builtin"
name = "breast_cancer"
part = 1
of = 2
epsilon = 2.0
delta = 1e-6

[members.clinic-001]
role = "owner"

[members.clinic-001.policy]
max_epsilon_per_job = 2.0

[members.clinic-001.datasets.clinics]
format = "csv"
path = "/srv/clinic/data.csv"
label = "diagnosis"
epsilon = 10.0
delta = 1e-4
adjacency = "add_remove"
"""


def test_owners_wildcard_listen_ipv6_and_no_dealer(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = provision(write_consortium(tmp_path, OWNERS), out)
    assert [(k.name, k.role, k.address) for k in done.kits] == [
        ("coord", "coordinator", None), ("alice", "party", "alice.example.org:7201"), ("bob", "party", "[::1]:7202"),
        ("clinic-001", "owner", None)]
    alice = load_party_config(out / "alice" / "party.toml")  # built-in data: nothing to put in place
    assert (alice.listen, alice.advertise, alice.threads) == ("0.0.0.0:7201", "alice.example.org:7201", 1)
    assert {p: c.address for p, c in alice.peers.items()} == {"bob": "[::1]:7202"}  # no dealer
    assert alice.policy.allowed_coordinators == ["coord"]
    cert = x509.load_pem_x509_certificate((out / "alice" / "pki" / "alice.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "alice.example.org" in san.get_values_for_type(x509.DNSName)
    assert not san.get_values_for_type(x509.IPAddress)  # the wildcard it binds is no name to dial
    bob_cert = x509.load_pem_x509_certificate((out / "bob" / "pki" / "bob.crt").read_bytes())
    assert [str(ip) for ip in bob_cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)] == ["::1"]
    coord = load_coordinator_config(out / "coord" / "coordinator.toml")
    assert coord.members() == {"alice": ("party", "alice.example.org:7201"), "bob": ("party", "[::1]:7202")}
    with pytest.raises(ConfigError, match=r"datasets\.clinics\.path: file not found: '/srv/clinic/data.csv'"):
        load_owner_config(out / "clinic-001" / "owner.toml")  # the path as given: the owner's own machine
    text = (out / "clinic-001" / "owner.toml").read_text()
    (tmp_path / "clinic.csv").write_text("diagnosis\n1\n")
    (out / "clinic-001" / "owner.toml").write_text(text.replace("/srv/clinic/data.csv", str(tmp_path / "clinic.csv")))
    owner = load_owner_config(out / "clinic-001" / "owner.toml")
    owner.identity.load("owner")
    assert owner.compute == {"alice": "alice.example.org:7201", "bob": "[::1]:7202"}
    assert (owner.max_epsilon_per_job, owner.allow_test_only) == (2.0, False)
    assert "exec mpc-erm owner join" in (out / "clinic-001" / "join.sh").read_text()


# --------------------------------------------------------------------------- errors name the field


def _edit(old: str, new: str, count: int = 1) -> tuple[str, str, int]:
    return old, new, count


BAD: list[tuple[str, list[tuple[str, str, int]], str]] = [
    ("duplicate name", [_edit("[members.bob]", "[members.alice]")],
     "invalid TOML: Cannot declare ('members', 'alice') twice"),
    ("same name but case", [_edit("members.bob", "members.Alice", -1)],
     "members.Alice: 'Alice' is not a valid name: lower-case letters, digits, '_' and '-'"),
    ("duplicate port", [_edit("port = 7102", "port = 7101")],
     "members.bob.port: 127.0.0.1:7101 is also alice's address"),
    ("bad name", [_edit("members.carol", "members.-carol", -1)], "members.-carol: '-carol' is not a valid name"),
    ("reserved name", [_edit("members.carol", "members.ca", -1)], "members.ca: 'ca' is reserved"),
    ("unknown member key", [_edit("port = 7101", "port = 7101\ncolour = \"red\"")],
     "members.alice.colour: unknown field"),
    ("unknown top-level key", [_edit('name = "hospitals"', 'nmae = "hospitals"')], "nmae: unknown field"),
    ("unknown data set key", [_edit("epsilon = 4.0", "epsilon = 4.0\nepsilom = 1.0")],
     "members.alice.datasets.diagnosis.epsilom: unknown field"),
    ("unknown policy key", [_edit("max_epsilon_per_job = 0.5", "max_eps = 0.5")],
     "members.bob.policy.max_eps: unknown field"),
    ("port out of range", [_edit("port = 7101", "port = 71010")], "members.alice.port: must be <= 65535 (got 71010)"),
    ("wildcard host", [_edit('host = "127.0.0.1"\nport = 7101', 'host = "0.0.0.0"\nport = 7101')],
     "members.alice.host: '0.0.0.0' is a wildcard"),
    ("party without port", [_edit("port = 7103\n", "")], "members.carol.port: required for a party"),
    ("dealer with data", [_edit("port = 7100", 'port = 7100\n[members.dealer.datasets.x]\nformat = "builtin"\n'
                                "name = \"adult\"\nepsilon = 1.0\ndelta = 0.0")],
     "members.dealer.datasets: not for a dealer"),
    ("coordinator with a host", [_edit("timeout_s = 30", 'timeout_s = 30\nhost = "127.0.0.1"')],
     "members.coordinator.host: not for a coordinator"),
    ("bad data set", [_edit("epsilon = 4.0", "epsilon = 0.0")],
     "members.alice.datasets.diagnosis.epsilon: must be > 0"),
    ("missing schema", [_edit('schema = "schemas/diagnosis.toml"', 'schema = "schemas/nope.toml"')],
     "members.alice.datasets.diagnosis.schema: file not found"),
    ("policy out of bounds", [_edit("max_epsilon_per_job = 0.5", "max_epsilon_per_job = 1000.0")],
     "members.bob.policy.max_epsilon_per_job: must be <= 100"),
    ("unknown coordinator", [_edit("max_epsilon_per_job = 0.5", 'allowed_coordinators = ["eve"]')],
     "members.bob.policy.allowed_coordinators: 'eve' is not a coordinator of this consortium"),
    ("one party", [_edit('role = "party"', 'role = "dealer"', 2)], "members: a consortium needs at least 2"),
    ("no coordinator", [_edit('role = "coordinator"\ntimeout_s = 30', 'role = "dealer"\nhost = "a"\nport = 1')],
     'members: a consortium needs a member with role "coordinator"'),
]


@pytest.mark.parametrize(("edits", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_errors_name_the_field(tmp_path: Path, edits: list[tuple[str, str, int]], fragment: str) -> None:
    text = EXAMPLE.read_text()
    for old, new, count in edits:
        assert old in text, old
        text = text.replace(old, new, count)
    path = write_consortium(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        provision(path, tmp_path / "out")
    assert f"{path}: {fragment}" in str(info.value), str(info.value)
    assert not (tmp_path / "out").exists()  # nothing written


def test_out_must_be_empty_unless_forced_and_a_ledger_is_never_replaced(tmp_path: Path) -> None:
    path, out = write_consortium(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"^out: .* is not empty \(use --force"):
        provision(path, out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    first = provision(path, out, force=True)
    ca_before = first.ca_cert.read_bytes()
    assert (out / "notes.txt").read_text() == "mine" and (out / "alice" / "party.toml").exists()
    (out / "alice" / "stale.txt").write_text("x")
    provision(path, out, force=True)  # a new CA and fresh kits
    assert first.ca_cert.read_bytes() != ca_before and not (out / "alice" / "stale.txt").exists()
    (out / "alice" / "state").mkdir()
    with pytest.raises(ValueError, match="alice/state holds alice's budget ledger"):
        provision(path, out, force=True)
    assert not list(tmp_path.glob(".out.provision-*"))  # no scratch directory left behind


def test_load_consortium_without_data_or_kits(tmp_path: Path) -> None:
    c = load_consortium(write_consortium(tmp_path))
    assert c.name == "hospitals" and [m.name for m in c.of("party")] == list(PARTIES)
    assert c.members["alice"].datasets["diagnosis"]["path"] == "data/diagnosis.csv"  # as given
    assert c.members["alice"].schemas == {"diagnosis.toml": tmp_path / "schemas" / "diagnosis.toml"}


# --------------------------------------------------------------------------- the CLI


def test_cli_provision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path, out = write_consortium(tmp_path), tmp_path / "kits"
    code, stdout, err = run_main(monkeypatch, capsys, "provision", str(path), "--out", str(out), "--days", "10")
    assert code == 0, err
    assert "alice               party        127.0.0.1:7101" in stdout and "keep it offline" in stdout
    assert f"mpc-erm job submit JOB.toml --config {out / 'coordinator' / 'coordinator.toml'}" in stdout
    code, _, err = run_main(monkeypatch, capsys, "provision", str(path), "--out", str(out))
    assert code == 2 and err.startswith(f"error: --out: {out} is not empty") and err.strip().count("\n") == 0
    code, stdout, err = run_main(monkeypatch, capsys, "provision", str(path), "--out", str(out), "--force", "--json")
    assert code == 0, err
    info = json.loads(stdout)
    assert [k["name"] for k in info["kits"]] == ["coordinator", "dealer", *PARTIES]
    assert info["ca"]["key"] == str(out / "ca" / "ca.key")
    path.write_text(path.read_text().replace("port = 7102", "port = 7101"))
    code, _, err = run_main(monkeypatch, capsys, "provision", str(path), "--out", str(tmp_path / "other"))
    assert code == 2 and err.startswith(f"error: {path}: members.bob.port: "), err
    code, _, err = run_main(monkeypatch, capsys, "provision", str(path), "--out", str(tmp_path / "o"), "--days", "0")
    assert code == 2 and err.startswith("error: --days: must be >= 1"), err


@pytest.mark.parametrize("command", ["issue", "request"])
def test_certs_refuse_names_no_config_accepts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str], command: str) -> None:
    d = str(tmp_path)
    assert run_main(monkeypatch, capsys, "certs", "init", "--dir", d)[0] == 0
    for name in ("Alice", "p.1", "_x", "a" * 64):  # each accepted by `certs` before, refused by every config
        code, _, err = run_main(monkeypatch, capsys, "certs", command, "--dir", d, "--name", name, "--role", "party")
        assert code == 2 and err.startswith("error: --name: ") and err.strip().count("\n") == 0, err
        assert "is not a valid name: lower-case letters, digits, '_' and '-'" in err, err
        assert not list(tmp_path.glob(f"{name}.*"))
    code, _, err = run_main(monkeypatch, capsys, "certs", command, "--dir", d, "--name", "ca", "--role", "party")
    assert code == 2 and "reserved" in err
    code, _, err = run_main(monkeypatch, capsys, "certs", command, "--dir", d, "--name", "clinic_0-1", "--role",
                             "owner")
    assert code == 0, err


# --------------------------------------------------------------------------- end to end


JOB = """\
method = "gradient"

[job]
name = "provisioned-gradient"
dataset = "cancer"
parties = ["alice", "bob", "carol"]
trust = "replicated"

[model]
name = "logistic"
lam = 1e-3

[privacy]
epsilon = 1.0
delta = 1e-6
accountant = "rdp"
clip = 1.0

[training]
iterations = 3
learning_rate = 1.0
"""


def _await_listening(proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
    """The daemon's first stdout line is {"event": "listening", ...} once it serves."""
    import select

    assert proc.stdout is not None
    deadline, buf = time.monotonic() + timeout_s, b""
    while time.monotonic() < deadline and b"\n" not in buf:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
        elif proc.poll() is not None:
            break
    if b"\n" not in buf or json.loads(buf.split(b"\n", 1)[0]).get("event") != "listening":
        raise AssertionError(f"daemon did not start (exit {proc.poll()}): {log.read_text()[-2000:]}")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each daemon's process group (daemon and job workers), SIGKILL what is left."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


@pytest.mark.e2e
@pytest.mark.slow  # `make test-all`; default suite: test_walkthrough.py starts provisioned kits' start.sh and
# runs a job through them
def test_provisioned_kits_run_a_job(tmp_path: Path) -> None:
    from coordinator.client import CoordinatorClient
    from coordinator.consortium import free_port

    ports: list[int] = []
    while len(ports) < 3:
        port = free_port("127.0.0.1")
        ports += [port] if port not in ports else []
    text = 'name = "e2e"\n\n[members.coordinator]\nrole = "coordinator"\ntimeout_s = 60\n'
    for i, (name, port) in enumerate(zip(PARTIES, ports)):
        text += (f'\n[members.{name}]\nrole = "party"\nhost = "127.0.0.1"\nport = {port}\nthreads = 1\n'
                 f'\n[members.{name}.datasets.cancer]\nformat = "builtin"\nname = "breast_cancer"\npart = {i}\n'
                 f"of = 3\nepsilon = 4.0\ndelta = 1e-5\n")
    (tmp_path / "consortium.toml").write_text(text)
    out = provision(tmp_path / "consortium.toml", tmp_path / "kits").out
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONUNBUFFERED": "1"}
    (tmp_path / "job.toml").write_text(JOB)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name in PARTIES:
            with open(tmp_path / f"{name}.log", "wb") as log:
                procs.append(subprocess.Popen([str(out / name / "start.sh")], stdout=subprocess.PIPE, stderr=log,
                                              stdin=subprocess.DEVNULL, cwd=tmp_path, env=env,
                                              start_new_session=True))
        for name, proc in zip(PARTIES, procs):
            _await_listening(proc, tmp_path / f"{name}.log")
        with CoordinatorClient(load_coordinator_config(out / "coordinator" / "coordinator.toml")) as client:
            assert {m: h.get("role") for m, h in client.health().items()} == dict.fromkeys(PARTIES, "party")
            job_id = client.submit(tmp_path / "job.toml")["job_id"]
            ends = {ev["member"]: ev for ev in client.watch(job_id)
                    if ev["phase"] in ("succeeded", "failed", "cancelled", "error")}
            assert {m: e["phase"] for m, e in ends.items()} == dict.fromkeys(PARTIES, "succeeded"), ends
            client.result(job_id, tmp_path / "result")
        report = json.loads((tmp_path / "result" / "privacy_report.json").read_text())
        assert report["rounds"] == 3 and report["parties"] == 3 and report["epsilon"] <= 1.0
        for name in PARTIES:  # each daemon kept its ledger in its own kit
            assert (out / name / "state" / "ledger.sqlite3").exists()
    finally:
        _stop(procs)


def test_the_party_config_checks_files_unless_told_not_to(tmp_path: Path) -> None:
    """parties.config's ``check_files`` context: off only for provisioning; a daemon's config still
    refuses a data file that is not there."""
    table = {"format": "csv", "path": "nowhere.csv", "label": "y", "epsilon": 1.0, "delta": 0.0}
    with pytest.raises(ValidationError, match="file not found"):
        DatasetConfig.model_validate(table, context={"base_dir": tmp_path})
    ds = DatasetConfig.model_validate(table, context={"base_dir": tmp_path, "check_files": False})
    assert ds.path == tmp_path / "nowhere.csv"
