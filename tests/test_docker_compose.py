"""Static checks of the Docker deployment (docker/): no Docker daemon needed.

The full round (build the image, `compose up`, a real job, `down -v`) is docker/smoke.sh, which is
not part of CI: it needs a Docker daemon and takes minutes. What can be checked without one is
checked here: the compose file (by `docker compose config -q` / `docker-compose config -q` where
such a CLI is installed, and always by parsing it), that it wires every party to its own config,
key, data and state volumes, that the configs and the job file it mounts are valid for the
project's own loaders, the Dockerfile's shape, the build context, and the init step's scripts
(run for real on this machine: CA, identities, each party's share of Adult).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from coordinator.config import load_coordinator_config
from mpc_erm.jobs.jobfile import load_job_file
from mpc_erm.mpc import pki
from parties.config import load_dealer_config, load_party_config

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "docker-compose.yml"
PARTIES = ("alice", "bob", "carol")
DAEMONS = (*PARTIES, "dealer")

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed: the compose file cannot be parsed")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _mounts(svc: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """container path -> (source, mode) of a service's short-syntax volumes."""
    out = {}
    for v in svc.get("volumes", []):
        head = v[: v.index("}") + 1] if v.startswith("${") else ""  # ${VAR:-default} holds a ':'
        parts = v[len(head):].split(":")
        src, dst = head + parts[0], parts[1]
        out[dst] = (src, parts[2] if len(parts) > 2 else "rw")
    return out


def _source(src: str) -> Path:
    """A bind source relative to the compose file, with ${VAR:-default} taken at its default."""
    if src.startswith("${") and ":-" in src:
        src = src[src.index(":-") + 2 : src.rindex("}")]
    return (DOCKER / src).resolve()


# --------------------------------------------------------------------------- compose CLIs


def _compose_clis() -> list[Any]:
    clis = []
    v2 = shutil.which("docker") is not None and subprocess.run(
        ["docker", "compose", "version"], capture_output=True, timeout=60).returncode == 0
    clis.append(pytest.param(["docker", "compose"], id="compose-v2", marks=() if v2 else pytest.mark.skip(
        reason="`docker compose` (v2) is not installed here; the YAML is checked by the other tests")))
    v1 = shutil.which("docker-compose") is not None
    clis.append(pytest.param(["docker-compose"], id="compose-v1", marks=() if v1 else pytest.mark.skip(
        reason="`docker-compose` (v1) is not installed here; the YAML is checked by the other tests")))
    return clis


@pytest.mark.parametrize("cli", _compose_clis())
def test_compose_config_is_valid_for_the_installed_cli(cli: list[str], tmp_path: Path) -> None:
    """`config -q` validates the file against the CLI's own schema; it needs no daemon."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPC_ERM_", "COMPOSE_", "DOCKER_HOST"))}
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-daemon.sock"  # prove that no daemon is asked
    r = subprocess.run([*cli, "-p", "mpcermcheck", "-f", str(COMPOSE_FILE), "config", "-q"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([*cli, "-p", "mpcermcheck", "-f", str(COMPOSE_FILE), "config", "--services"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert set(r.stdout.split()) == {"init", *DAEMONS, "coordinator"}


# --------------------------------------------------------------------------- the YAML itself


def test_compose_has_the_services_and_volumes(compose: dict[str, Any]) -> None:
    assert "version" not in compose and "name" not in compose  # v2 warns on one, v1 refuses the other
    services = compose["services"]
    assert set(services) == {"init", *DAEMONS, "coordinator"}
    volumes = set(compose["volumes"])
    want = {"ca", *(f"{p}-{k}" for p in PARTIES for k in ("keys", "data", "state")), "dealer-keys",
            "dealer-state", "coordinator-keys"}
    assert want <= volumes, want - volumes
    for name, svc in services.items():
        assert svc["image"] == "${MPC_ERM_IMAGE:-mpc-erm:latest}", name
        for src, _ in _mounts(svc).values():
            assert src in volumes or src.startswith(("./", "${")), f"{name}: undeclared volume {src}"
    build = services["init"]["build"]
    assert build["dockerfile"] == "docker/Dockerfile" and (DOCKER / build["context"]).resolve() == ROOT
    assert build["args"]["BASE_IMAGE"] == "${BASE_IMAGE:-python:3.11-slim}"


def test_each_party_has_its_own_config_keys_data_and_state(compose: dict[str, Any]) -> None:
    services = compose["services"]
    seen: dict[str, str] = {}
    for name in DAEMONS:
        svc = services[name]
        role = "dealer" if name == "dealer" else "party"
        assert svc["environment"]["MPC_ERM_ROLE"] == role
        m = _mounts(svc)
        config = svc["environment"]["MPC_ERM_CONFIG"]
        src, mode = m[config]
        assert _source(src) == DOCKER / "config" / f"{name}.toml" and mode == "ro"
        assert _source(src).is_file()
        assert m["/keys"] == (f"{name}-keys", "ro")
        assert m["/state"][0] == f"{name}-state"
        if role == "party":
            assert m["/data"] == (f"{name}-data", "ro")
        else:
            assert "/data" not in m  # the dealer holds no data
        for vol, _ in m.values():  # no volume shared between two daemons
            if not vol.startswith(("./", "${")):
                assert seen.setdefault(vol, name) == name, f"{vol} mounted by {seen[vol]} and {name}"
        assert svc["depends_on"]["init"]["condition"] == "service_completed_successfully"
        assert svc["healthcheck"]["test"] == ["CMD", "mpc-erm-healthcheck"]
        assert "ports" not in svc  # nothing published on the host
    coord = services["coordinator"]
    assert {k: v["condition"] for k, v in coord["depends_on"].items()} == dict.fromkeys(DAEMONS, "service_healthy")
    cm = _mounts(coord)
    assert cm["/keys"] == ("coordinator-keys", "ro") and cm["/out"][0] == "${MPC_ERM_OUT_DIR:-./out}"
    assert _source(cm["/etc/mpc-erm/job.toml"][0]).is_file()
    assert coord["command"][0] == "mpc-erm-run-job"
    # init writes every identity's keys into that identity's volume, and each party's data share
    init = services["init"]
    im = _mounts(init)
    env = init["environment"]
    idents = dict(p.split(":") for p in env["MPC_ERM_IDENTITIES"].split())
    assert idents == {**dict.fromkeys(PARTIES, "party"), "dealer": "dealer", "coordinator": "coordinator"}
    for n in idents:
        assert im[f"/identities/{n}"][0] == f"{n}-keys"
    assert env["MPC_ERM_DATA_PARTIES"].split() == list(PARTIES)
    for n in PARTIES:
        assert im[f"/datasets/{n}"][0] == f"{n}-data"
    assert init["user"] == "0:0" and im["/ca"][0] == "ca"
    assert all("/ca" not in _mounts(s) for n, s in services.items() if n != "init")  # the CA key stays put


# --------------------------------------------------------------------------- configs and job


def _localise(path: Path, tmp: Path, keys: Path, data: Path | None) -> Path:
    text = path.read_text().replace('"/keys/', f'"{keys}/').replace('"/state"', f'"{tmp / "state"}"')
    if data is not None:
        text = text.replace('"/data/', f'"{data}/')
    out = tmp / path.name
    out.write_text(text)
    return out


@pytest.fixture(scope="module")
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docker/bin/mpc-erm-init-consortium run for real (as the compose init service does, but as
    the current user): CA, identities, and each party's share of UCI Adult."""
    tmp = tmp_path_factory.mktemp("consortium")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{DOCKER / 'bin'}:{os.environ['PATH']}",
           "MPC_ERM_CA_DIR": str(tmp / "ca"), "MPC_ERM_KEYS_ROOT": str(tmp / "identities"),
           "MPC_ERM_DATA_ROOT": str(tmp / "datasets"), "MPC_ERM_UID": str(os.getuid()),
           "MPC_ERM_IDENTITIES": "alice:party bob:party carol:party dealer:dealer coordinator:coordinator",
           "MPC_ERM_DATA_PARTIES": "alice bob carol"}
    env.pop("MPC_ERM_DATA", None)
    env.pop("MPC_ERM_OUT", None)
    for _ in range(2):  # the second run must keep everything (idempotent)
        r = subprocess.run([str(DOCKER / "bin" / "mpc-erm-init-consortium")], env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    assert "keeping" in r.stdout and "nothing written" in r.stdout, r.stdout
    return tmp


def test_init_gives_each_identity_only_its_own_key(consortium: Path) -> None:
    ca_files = sorted(p.name for p in (consortium / "ca").iterdir())
    assert "ca.key" in ca_files and not [f for f in ca_files if f.endswith(".key") and f != "ca.key"]
    for name, role in [*((p, "party") for p in PARTIES), ("dealer", "dealer"), ("coordinator", "coordinator")]:
        d = consortium / "identities" / name
        assert sorted(p.name for p in d.iterdir()) == sorted(["ca.crt", f"{name}.crt", f"{name}.key"])
        assert stat.S_IMODE((d / f"{name}.key").stat().st_mode) == 0o600
        ident = pki.load_identity(d, name)
        assert ident.role == role
        pki.verify_identity(ident)


def test_init_writes_a_different_share_of_adult_per_party(consortium: Path) -> None:
    import numpy as np

    from mpc_erm.data import load_numpy

    shares = [load_numpy(consortium / "datasets" / p / "adult.npz", task="binary") for p in PARTIES]
    assert len({s.feature_names for s in shares}) == 1 and shares[0].d == 104
    assert sum(s.n for s in shares) == 30162 and max(s.n for s in shares) - min(s.n for s in shares) <= 1
    rows = [{r.tobytes() for r in np.asarray(s.X)} for s in shares]
    assert len(rows[0] & rows[1]) < 0.2 * len(rows[0])  # different rows (Adult has some duplicate rows)
    assert set(np.unique(np.concatenate([s.y for s in shares]))) == {-1.0, 1.0}


def test_configs_are_valid_for_the_daemons_and_coordinator(consortium: Path, tmp_path: Path) -> None:
    """The mounted configs, with /keys, /data and /state pointed at the init step's real output."""
    ports = {}
    for name in DAEMONS:
        sub = tmp_path / name
        sub.mkdir()
        path = _localise(DOCKER / "config" / f"{name}.toml", sub, consortium / "identities" / name,
                         consortium / "datasets" / name)
        cfg = load_dealer_config(path) if name == "dealer" else load_party_config(path)
        assert cfg.identity.name == name and cfg.listen.startswith("0.0.0.0:")
        assert cfg.advertise == f"{name}:{cfg.listen.rsplit(':', 1)[1]}"  # compose DNS name
        assert cfg.device == "cpu" and cfg.policy.allowed_coordinators == ["coordinator"]
        ports[name] = cfg.advertise
        assert set(cfg.peers) == set(DAEMONS) - {name}
        if name != "dealer":
            ds = cfg.datasets["adult"]
            assert ds.format == "npz" and ds.path == consortium / "datasets" / name / "adult.npz"
        peers = {n: p.address for n, p in cfg.peers.items()}
        ports.setdefault("_peers", {})[name] = peers
    for name, peers in ports.pop("_peers").items():
        for peer, addr in peers.items():
            assert addr == ports[peer], f"{name}'s peers.{peer} = {addr}, but {peer} advertises {ports[peer]}"
    sub = tmp_path / "coordinator"
    sub.mkdir()
    coord = load_coordinator_config(_localise(DOCKER / "config" / "coordinator.toml", sub,
                                              consortium / "identities" / "coordinator", None))
    assert coord.identity.name == "coordinator"
    assert {**coord.parties, **coord.dealers} == ports


def test_the_job_is_valid_and_one_the_worker_runs() -> None:
    job = load_job_file(DOCKER / "jobs" / "output-adult.toml", known_parties={*DAEMONS})
    assert job.spec.method == "output" and job.job.trust == "dealer" and job.job.dealer == "dealer"
    assert list(job.job.parties) == list(PARTIES) and job.job.dataset == "adult"
    pv = job.spec.privacy
    assert pv.epsilon == 1.0 and pv.delta == 1e-7
    assert pv.mechanism == "gaussian"  # not l2_laplace: the worker refuses it (no in-MPC sampler)
    assert job.spec.model.name == "logistic" and job.spec.model.lam == 1e-3


# --------------------------------------------------------------------------- image and context


def test_dockerfile_shape() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert lines[0] == "ARG BASE_IMAGE=python:3.11-slim"
    assert froms == ["FROM ${BASE_IMAGE} AS builder", "FROM ${BASE_IMAGE}"]
    final = lines[lines.index(froms[1]):]
    assert any(ln.startswith("USER ") and ln.split()[1] not in ("root", "0") for ln in final)
    assert any(ln.startswith("HEALTHCHECK ") and "mpc-erm-healthcheck" in ln for ln in final)
    assert any(ln.startswith("COPY --from=builder /opt/venv") for ln in final)
    assert not any(("apt-get" in ln or "pip install" in ln) for ln in final)  # nothing built or fetched there
    assert "python3 -m venv" in text and "PIP_NO_INDEX=1" in text and '"torch==2.13.0"' in text
    assert '--no-deps "crypten==0.4.1"' in text and "install_check" in text


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; a pattern matching a parent
    directory matches everything under it."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat[1:] if neg else pat
        if any(fnmatch.fnmatchcase(p, pat) or (pat.startswith("**/") and fnmatch.fnmatchcase(p, pat[3:]))
               for p in prefixes):
            ignored = not neg
    return ignored


def test_dockerignore_keeps_the_context_small() -> None:
    pats = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]
    for p in [".venv/bin/python", ".git/HEAD", "simulate-out/result.json", "docker/out/x/model.safetensors",
              "tests/test_smoothing.py", "benchmarks/results/aggregate_d122.json", "mpc_erm/__pycache__/x.pyc",
              "mpc_erm.egg-info/PKG-INFO", "docker/Dockerfile", "pki/alice.key"]:
        assert _ignored(p, pats), f"{p} would be sent to the Docker daemon"
    for p in ["docker/wheelhouse/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "pyproject.toml",
              "README.md", "mpc_erm/data/bundled/adult/adult.data.gz", "parties/worker.py",
              "parties/cli.py", "benchmarks/aggregate.py", "docker/bin/mpc-erm-entrypoint"]:
        assert not _ignored(p, pats), f"{p} is needed by docker/Dockerfile but excluded"
    gitignore = (ROOT / ".gitignore").read_text().split()
    assert "docker/wheelhouse/" in gitignore and "docker/out/" in gitignore


@pytest.mark.parametrize("script", ["bin/mpc-erm-entrypoint", "bin/mpc-erm-healthcheck", "bin/mpc-erm-init-consortium",
                                    "bin/mpc-erm-run-job", "bin/mpc-erm-split-adult", "smoke.sh", "build-base.sh",
                                    "build-wheelhouse.sh"])
def test_scripts_are_executable_and_parse(script: str) -> None:
    path = DOCKER / script
    assert os.access(path, os.X_OK), f"{path} is not executable"
    first = path.read_text().splitlines()[0]
    if "python" in first:
        compile(path.read_text(), str(path), "exec")
        return
    shell = "sh" if first == "#!/bin/sh" else "bash"
    r = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_healthcheck_of_a_container_without_a_daemon_passes() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MPC_ERM_ROLE"}
    assert subprocess.run([str(DOCKER / "bin" / "mpc-erm-healthcheck")], env=env, timeout=60).returncode == 0
