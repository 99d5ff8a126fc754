"""Hostile job files and configs: every one is refused with a line naming the field, by the loader,
by the CLI (exit 2, no traceback, no state) and by a real daemon's SubmitJob (INVALID_ARGUMENT,
ledger, job table and audit log unchanged); and the job/config parsers, fuzzed, never raise
anything but their own validation error.

The corpus is data: ``hostile_inputs/<kind>/<case>.toml`` (kind: job, party, dealer, coordinator),
each file starting with ``# expect: <fragment>`` (the ``<field>: <reason>`` it must be refused
with), optionally ``# daemon: <fragment>`` (what SubmitJob says instead, or ``skip: why``) and
``# why:``. ``@@REPEAT n text@@`` stands for ``text`` n times (oversized values stay small on
disk). ``_valid.toml`` in each folder is the document every case is a mutation of: it must load.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.config import load_coordinator_config
from mpc_erm.jobs.jobfile import JobFile, JobFileError, load_job_file, parse_job_file
from parties.config import ConfigError, load_dealer_config, load_party_config

from .faults import stop_process_group

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).parent / "hostile_inputs"
KINDS = ("job", "party", "dealer", "coordinator")
KNOWN = {"alice", "bob", "carol", "dealer"}
_REPEAT = re.compile(rb"@@REPEAT (\d+) (.*?)@@", re.S)
MAX_LINE = 400  # no refusal line may quote an oversized value whole
MAX_LINES = 25  # nor list 100k problems


@dataclass(frozen=True)
class Case:
    kind: str
    name: str
    path: Path
    expect: str
    daemon: str | None

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"


def _header(data: bytes, key: str) -> str | None:
    m = re.search(rb"^# " + key.encode() + rb": (.*)$", data, re.M)
    return m[1].decode("utf-8") if m else None


def load_corpus() -> list[Case]:
    cases = []
    for kind in KINDS:
        for path in sorted((CORPUS / kind).glob("*.toml")):
            if path.name.startswith("_"):
                continue
            data = path.read_bytes()
            expect = _header(data, "expect")
            assert expect, f"{path}: no '# expect:' line"
            cases.append(Case(kind, path.stem, path, expect, _header(data, "daemon")))
    return cases


CASES = load_corpus()


def expand(data: bytes) -> bytes:
    return _REPEAT.sub(lambda m: m[2] * int(m[1]), data)


def test_the_corpus_is_large_and_covers_every_loader() -> None:
    by_kind = {k: sum(c.kind == k for c in CASES) for k in KINDS}
    assert len(CASES) >= 150 and all(by_kind.values()), by_kind
    assert len({c.id for c in CASES}) == len(CASES)


# --------------------------------------------------------------------------- the loaders


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the corpus configs point at (relative to the config): stub PEM files (the loader
    only checks that they are regular files), a tiny CSV and a 1 GiB sparse CSV (no disk used)."""
    d = tmp_path_factory.mktemp("configs")
    (d / "pki").mkdir()
    for f in ("alice.crt", "alice.key", "dealer.crt", "dealer.key", "coordinator.crt", "coordinator.key", "ca.crt"):
        (d / "pki" / f).write_text("x")
    (d / "data").mkdir()
    (d / "data" / "claims.csv").write_text("a,fraud\n1,0\n")
    with open(d / "data" / "huge.csv", "wb") as f:
        f.truncate((1 << 30) + 1)
    return d


LOADERS: dict[str, Callable[[Path], Any]] = {
    "job": lambda p: load_job_file(p, KNOWN),
    "party": load_party_config,
    "dealer": load_dealer_config,
    "coordinator": load_coordinator_config,
}
ERRORS = {"job": JobFileError, "party": ConfigError, "dealer": ConfigError, "coordinator": ConfigError}


def materialise(case: Case, directory: Path, name: str | None = None) -> Path:
    path = directory / (name or f"{case.kind}-{case.name}.toml")
    path.write_bytes(expand(case.path.read_bytes()))
    return path


def assert_names_the_field(message: str, source: Path, fragment: str) -> None:
    lines = message.splitlines()
    assert lines and all(line.startswith(f"{source}: ") for line in lines), lines[:3]
    assert any(fragment in line for line in lines), (fragment, lines[:5])
    assert len(lines) <= MAX_LINES and all(len(line) <= MAX_LINE + len(str(source)) for line in lines), \
        (len(lines), max(map(len, lines)))


@pytest.mark.parametrize("kind", KINDS)
def test_the_valid_documents_load(kind: str, config_dir: Path) -> None:
    """Each case is one defect in this document: were it invalid, the cases would prove nothing."""
    path = config_dir / f"{kind}-valid.toml"
    path.write_bytes((CORPUS / kind / "_valid.toml").read_bytes())
    assert LOADERS[kind](path) is not None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_loader_refuses_naming_the_field(case: Case, config_dir: Path) -> None:
    path = materialise(case, config_dir)
    t0 = time.monotonic()
    with pytest.raises(ERRORS[case.kind]) as err:
        LOADERS[case.kind](path)
    assert time.monotonic() - t0 < 20, "refusing must be quick"
    assert_names_the_field(str(err.value), path, case.expect)
    assert not (config_dir / "state").exists()  # loading a config creates nothing


# --------------------------------------------------------------------------- the CLI


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@pytest.fixture(scope="module")
def pki_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mpc_erm.mpc import pki

    d = tmp_path_factory.mktemp("pki")
    ca = pki.create_ca("hostile-input CA")
    for name, role in [("alice", "party"), ("bob", "party"), ("carol", "party"), ("dealer", "dealer"),
                       ("coordinator", "coordinator")]:
        pki.save_identity(pki.issue_identity(ca, name, role), d)  # type: ignore[arg-type]
    return d


def _coordinator_toml(pki_dir: Path, ports: dict[str, int]) -> str:
    parties = "".join(f'{n} = "127.0.0.1:{ports[n]}"\n' for n in ("alice", "bob", "carol"))
    return (f'timeout_s = 10\n\n[identity]\nname = "coordinator"\ncert = "{pki_dir / "coordinator.crt"}"\n'
            f'key = "{pki_dir / "coordinator.key"}"\nca = "{pki_dir / "ca.crt"}"\n\n[parties]\n{parties}\n'
            f'[dealers]\ndealer = "127.0.0.1:{ports["dealer"]}"\n')


def _cli_command(case: Case, work: Path, pki_dir: Path) -> tuple[list[str], Path]:
    """The command that feeds this case to the CLI, and the directory whose content must not change."""
    exe = [sys.executable, "-m", "coordinator.cli"]
    if case.kind == "job":  # a valid coordinator config with real certificates; nothing listens (port 9)
        coord = work / "coordinator.toml"
        coord.write_text(_coordinator_toml(pki_dir, dict.fromkeys(("alice", "bob", "carol", "dealer"), 9)))
        return [*exe, "job", "submit", str(materialise(case, work, "job.toml")), "--config", str(coord)], work
    path = materialise(case, work, f"{case.kind}.toml")
    if case.kind == "coordinator":
        return [*exe, "job", "list", "--config", str(path)], work
    return [*exe, case.kind, "serve", "--config", str(path)], work


def _tree(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*")}


def run_cli_cases(cases: list[Case], root: Path, pki_dir: Path, config_dir: Path, parallel: int) -> None:
    """Each case in its own `mpc-erm` process (``parallel`` at a time): exit 2, one ``error:`` line
    naming the field, no traceback, nothing created or changed in its directory."""
    pending = list(cases)
    running: list[tuple[Case, subprocess.Popen[bytes], Path, dict[str, tuple[int, int]]]] = []
    failures = []
    while pending or running:
        while pending and len(running) < parallel:
            case = pending.pop(0)
            work = root / case.id.replace("/", "-")
            work.mkdir()
            for sub in ("pki", "data"):
                os.symlink(config_dir / sub, work / sub)
            cmd, watched = _cli_command(case, work, pki_dir)
            before = _tree(watched)
            proc = subprocess.Popen(cmd, cwd=work, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            running.append((case, proc, watched, before))
        case, proc, watched, before = running.pop(0)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            failures.append(f"{case.id}: still running after 120 s (a daemon that started?)")
            continue
        text = err.decode("utf-8", "replace")
        if proc.returncode != 2 or "Traceback" in text or not text.startswith("error: ") or case.expect not in text:
            failures.append(f"{case.id}: exit {proc.returncode}, expected {case.expect!r}; stderr: {text[-600:]!r}")
        if len(text) > 8 * 1024:
            failures.append(f"{case.id}: {len(text)} bytes on stderr")
        if _tree(watched) != before:
            failures.append(f"{case.id}: files changed: {sorted(set(_tree(watched)) ^ set(before))}")
        if (watched / "state").exists():
            failures.append(f"{case.id}: a state directory was created")
    assert not failures, "\n".join(failures)


CLI_SUBSET = ["job/deep_arrays", "job/non_utf8_in_string", "party/dataset_file_1gib", "dealer/has_datasets",
              "coordinator/timeout_nan"]  # the whole corpus: the slow test below


def test_the_cli_refuses_a_representative_subset(tmp_path: Path, pki_dir: Path, config_dir: Path) -> None:
    chosen = [c for c in CASES if c.id in CLI_SUBSET]
    assert len(chosen) == len(CLI_SUBSET)
    run_cli_cases(chosen, tmp_path, pki_dir, config_dir, parallel=3)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_cli_refuses_the_whole_corpus(tmp_path: Path, pki_dir: Path, config_dir: Path) -> None:
    run_cli_cases(CASES, tmp_path, pki_dir, config_dir, parallel=2)


# --------------------------------------------------------------------------- a real daemon


def _snapshot(state: Path) -> dict[str, Any]:
    """Every row of every table of the daemon's SQLite files (read-only) and the audit log."""
    out: dict[str, Any] = {}
    for db in sorted(state.glob("*.sqlite3")):
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
            out[db.name] = {t: con.execute(f'SELECT * FROM "{t}"').fetchall() for t in tables}
        finally:
            con.close()
    audit = state / "audit.jsonl"
    out["audit.jsonl"] = audit.read_bytes() if audit.exists() else None
    return out


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, pki_dir: Path) -> Iterator[tuple[Any, Path]]:
    """``mpc-erm party serve`` (alice) as its own process, with a ledger for data set 'adult'."""
    import grpc

    from mpc_erm.mpc import pki, tls
    from mpc_erm.mpc._proto import party_pb2_grpc as pb_grpc

    d = tmp_path_factory.mktemp("alice")
    (d / "rows.npz").write_bytes(b"not read: every job here is refused before it runs")
    peers = "".join(f'\n[peers.{n}]\naddress = "127.0.0.1:{9 + i}"\nrole = "{r}"\n'
                    for i, (n, r) in enumerate([("bob", "party"), ("carol", "party"), ("dealer", "dealer")]))
    (d / "party.toml").write_text(
        f'listen = "127.0.0.1:0"\nstate_dir = "state"\n\n[identity]\nname = "alice"\n'
        f'cert = "{pki_dir / "alice.crt"}"\nkey = "{pki_dir / "alice.key"}"\nca = "{pki_dir / "ca.crt"}"\n{peers}\n'
        '[datasets.adult]\nformat = "npz"\npath = "rows.npz"\nepsilon = 3.0\ndelta = 1e-4\n\n'
        '[policy]\nallowed_coordinators = ["coordinator"]\nmax_epsilon_per_job = 0.5\nmax_iterations = 50\n')
    with open(d / "stderr.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "party", "serve", "--config",
                                 str(d / "party.toml")], cwd=d, env=_env(), stdout=subprocess.PIPE, stderr=log,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # {"event": "listening", "port": ...} once it serves
        assert line, f"the daemon did not start: {(d / 'stderr.log').read_text()[-2000:]}"
        port = json.loads(line)["port"]
        channel = tls.secure_channel(f"127.0.0.1:{port}", pki.load_identity(pki_dir, "coordinator"), "alice")
        grpc.channel_ready_future(channel).result(timeout=60)
        yield pb_grpc.PartyControlStub(channel), d / "state"
        channel.close()
    finally:
        stop_process_group(proc, 20)


def _submit_all(stub: Any, cases: list[Case]) -> list[str]:
    import grpc

    from mpc_erm.mpc._proto import party_pb2 as pb

    failures = []
    for i, case in enumerate(cases):
        text = expand(case.path.read_bytes()).decode("utf-8")
        try:
            stub.SubmitJob(pb.SubmitRequest(job_id=f"hostile{i}", job_toml=text), timeout=60)
            failures.append(f"{case.id}: accepted")
            continue
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""  # type: ignore[attr-defined]
        want = case.daemon or case.expect
        if code != grpc.StatusCode.INVALID_ARGUMENT or want not in details or len(details) > 8 * 1024:
            failures.append(f"{case.id}: {code.name} {details[:300]!r}, expected INVALID_ARGUMENT with {want!r}")
    return failures


def test_a_real_daemon_refuses_every_job_file_and_changes_nothing(daemon: tuple[Any, Path]) -> None:
    import grpc

    from mpc_erm.mpc._proto import party_pb2 as pb

    stub, state = daemon
    jobs = [c for c in CASES if c.kind == "job" and not (c.daemon or "").startswith("skip")]
    assert len(jobs) >= 60
    before = _snapshot(state)
    failures = _submit_all(stub, jobs)
    assert not failures, "\n".join(failures)
    assert _snapshot(state) == before  # ledger, job table and audit log: not a row changed
    assert list(stub.ListJobs(pb.ListRequest(), timeout=10).jobs) == []
    # The control: the valid job gets past validation, to the policy (ε 1 > 0.5), and is refused there.
    valid = (CORPUS / "job" / "_valid.toml").read_text()
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitJob(pb.SubmitRequest(job_id="control", job_toml=valid), timeout=60)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()
    assert "privacy.epsilon: 1 exceeds alice's max_epsilon_per_job" in err.value.details()
    assert _snapshot(state) == before


# --------------------------------------------------------------------------- fuzzing the parsers

BASE_JOB = (CORPUS / "job" / "_valid.toml").read_text()
BASE_TREE = parse_job_file(BASE_JOB).model_dump(mode="json")
TRIED = {"job": 0, "config": 0}
_KEYS = ["job", "method", "model", "privacy", "training", "name", "dataset", "parties", "trust", "dealer",
         "device", "test_no_noise", "lam", "n_classes", "huber_h", "epsilon", "delta", "mechanism", "accountant",
         "clip", "adjacency", "iterations", "learning_rate", "ls_sigma", "weighting", "solver_tol", "seed"]


def _key(s: str) -> str:
    return s if re.fullmatch(r"[A-Za-z0-9_-]+", s) else json.dumps(s)


def toml_value(v: Any) -> str:
    """Any TOML value inline (nested tables as inline tables), including nan/inf and huge ints."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")  # a JSON string is a TOML one
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    return str(v)  # dates


def toml_document(tree: dict[str, Any]) -> str:
    lines = [f"{_key(k)} = {toml_value(v)}" for k, v in tree.items() if not isinstance(v, dict)]
    for k, v in tree.items():
        if isinstance(v, dict):
            lines += [f"[{_key(k)}]", *(f"{_key(a)} = {toml_value(b)}" for a, b in v.items())]
    return "\n".join(lines) + "\n"


keys = st.one_of(st.sampled_from(_KEYS), st.text(min_size=0, max_size=12))
scalars = st.one_of(
    st.booleans(), st.integers(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
    st.text(max_size=30), st.sampled_from(["alice", "bob", "carol", "dealer", "output", "gradient", "dealer",
                                           "replicated", "adult", "../x", "softmax", "rdp", "gaussian"]),
    st.dates(),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(keys, inner, max_size=4)), max_leaves=12)


def _accepts_only_its_own_error(text: str) -> None:
    TRIED["job"] += 1
    try:
        job = parse_job_file(text, "fuzz.toml", KNOWN)
    except JobFileError as exc:
        assert all(line.startswith("fuzz.toml: ") for line in str(exc).splitlines())
        assert len(str(exc).splitlines()) <= MAX_LINES + 1
        return
    assert isinstance(job, JobFile)
    assert parse_job_file(job.to_toml()) == job  # what is accepted round-trips


@st.composite
def mutated_jobs(draw: st.DrawFn) -> str:
    """The valid job with one to three fields replaced, deleted or added (structure kept, so the
    field validators behind the first one are reached)."""
    tree = json.loads(json.dumps({k: v for k, v in BASE_TREE["spec"].items() if v is not None}))
    tree["job"] = {k: v for k, v in BASE_TREE["job"].items() if v is not None}
    for _ in range(draw(st.integers(1, 3))):
        table = draw(st.sampled_from(sorted(tree)))
        node = tree if not isinstance(tree[table], dict) else tree[table]
        key = draw(st.one_of(st.sampled_from(sorted(node) or ["x"]), keys))
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "delete":
            node.pop(key, None)
        else:
            node[key] = draw(values)
    return toml_document(tree)


@st.composite
def text_mutations(draw: st.DrawFn) -> str:
    """The valid job's text with characters inserted, deleted or replaced, or lines shuffled."""
    text = BASE_JOB
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "dup_line", "drop_line"]))
        if op == "insert":
            text = text[:i] + draw(st.text(min_size=1, max_size=8)) + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 8)):]
        elif op == "replace":
            text = text[:i] + draw(st.sampled_from(["[", "]", "=", '"', "'", "{", "}", ",", "\n", ".", "#",
                                                    "nan", "inf", "-", "0x", "\\u", "\x00"])) + text[i + 1:]
        else:
            lines = text.splitlines()
            j = draw(st.integers(0, len(lines) - 1))
            lines = lines[:j] + [lines[j]] * (2 if op == "dup_line" else 0) + lines[j + 1:]
            text = "\n".join(lines) + "\n"
    return text


def _fuzz_settings(n: int) -> settings:
    return settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _job_fuzz(n: int) -> None:
    @_fuzz_settings(n)
    @given(st.one_of(st.dictionaries(keys, values, max_size=6).map(toml_document), mutated_jobs(),
                     text_mutations(), st.text(max_size=200)))
    def run(text: str) -> None:
        _accepts_only_its_own_error(text)

    run()


BASE_PARTY = (CORPUS / "party" / "_valid.toml").read_text()


def _config_fuzz(n: int, directory: Path) -> None:
    """The party config's loader on mutations of the valid config: only ConfigError."""
    import tomllib

    tree = tomllib.loads(BASE_PARTY)
    path = directory / "party.toml"

    @_fuzz_settings(n)
    @given(st.lists(st.tuples(st.sampled_from(["identity", "datasets", "policy", "peers", "top"]), keys,
                              st.one_of(values, st.none())), min_size=1, max_size=3))
    def run(edits: list[tuple[str, str, Any]]) -> None:
        t = json.loads(json.dumps(tree))
        for table, key, value in edits:
            node = t if table == "top" else t[table]
            if table in ("datasets", "peers") and node:  # into the first data set / peer
                node = node[sorted(node)[0]]
            if value is None:
                node.pop(key, None)
            else:
                node[key] = value
        path.write_text(_config_document(t))
        TRIED["config"] += 1
        try:
            load_party_config(path)
        except ConfigError as exc:
            assert all(line.startswith(f"{path}") for line in str(exc).splitlines())

    run()


def _config_document(t: dict[str, Any]) -> str:
    lines = [f"{_key(k)} = {toml_value(v)}" for k, v in t.items() if not isinstance(v, dict)]
    for k, v in t.items():
        if isinstance(v, dict):
            lines.append(f"{_key(k)} = {toml_value(v)}")
    return "\n".join(lines) + "\n"


def test_fuzz_the_job_parser_briefly(config_dir: Path) -> None:
    """A few seconds in CI on a quiet 2-core machine (~35 s under load 15); the long campaign is below."""
    start = TRIED["job"]
    _job_fuzz(500)
    assert TRIED["job"] - start >= 300
    print(f"job parser: {TRIED['job'] - start} examples")


def test_fuzz_the_party_config_briefly(config_dir: Path) -> None:
    start = TRIED["config"]
    _config_fuzz(80, config_dir)
    assert TRIED["config"] - start >= 50
    print(f"party config: {TRIED['config'] - start} examples")


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_fuzz_the_job_parser_long(config_dir: Path) -> None:
    start = TRIED["job"]
    _job_fuzz(20_000)
    print(f"job parser: {TRIED['job'] - start} examples")


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_fuzz_the_party_config_long(config_dir: Path) -> None:
    start = TRIED["config"]
    _config_fuzz(3_000, config_dir)
    print(f"party config: {TRIED['config'] - start} examples")
