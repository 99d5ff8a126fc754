"""Party config: the example loads, defaults and path resolution, and each bad config is refused
with a line naming the file and the field."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

import parties
from parties.config import ConfigError, PartyConfig, load_party_config, split_host_port

EXAMPLE = Path(parties.__file__).parent / "example-party.toml"

CLAIMS_SCHEMA = """
[label]
column = "fraud"
task = "binary"
positive = "yes"
negative = "no"

[[columns]]
name = "amount"
type = "numeric"
low = 0
high = 10000
"""

BASE = """\
listen = "127.0.0.1:7001"
state_dir = "st"

[identity]
name = "alice"
cert = "pki/alice.crt"
key = "pki/alice.key"
ca = "pki/ca.crt"

[peers.bob]
address = "bob.example.org:7002"
role = "party"

[datasets.adult]
format = "builtin"
name = "breast_cancer"
part = 0
of = 3
epsilon = 2.0
delta = 1e-5

[datasets.claims]
format = "csv"
path = "data/claims.csv"
label = "fraud"
epsilon = 1.0
delta = 0.0

[policy]
allowed_coordinators = ["coord"]
max_epsilon_per_job = 0.5
max_iterations = 100
"""


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str], Path]:
    """Write a config into a directory that holds the files it refers to."""
    (tmp_path / "pki").mkdir()
    for f in ("alice.crt", "alice.key", "ca.crt"):
        (tmp_path / "pki" / f).write_text("x")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "claims.csv").write_text("a,fraud\n1,0\n")

    def _write(text: str) -> Path:
        p = tmp_path / "party.toml"
        p.write_text(text)
        return p

    return _write


def test_example_file_loads(tmp_path: Path) -> None:
    cfg_path = tmp_path / "example-party.toml"
    shutil.copy(EXAMPLE, cfg_path)
    (tmp_path / "pki").mkdir()
    for f in ("alice.crt", "alice.key", "ca.crt"):
        (tmp_path / "pki" / f).write_text("x")
    cfg = load_party_config(cfg_path)
    assert cfg.identity.name == "alice"
    assert cfg.identity.cert == tmp_path / "pki" / "alice.crt"
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.advertise == cfg.listen == "127.0.0.1:7101"
    assert {n: p.role for n, p in cfg.peers.items()} == {"bob": "party", "carol": "party", "dealer": "dealer"}
    ds = cfg.datasets["adult"]
    assert (ds.format, ds.name, ds.part, ds.of, ds.epsilon, ds.delta) == ("builtin", "adult", 0, 3, 4.0, 1e-5)
    assert cfg.policy.allowed_methods == ["output", "gradient"] and cfg.policy.allow_test_only is False


def test_example_dealer_and_coordinator_configs_load(tmp_path: Path) -> None:
    from coordinator.config import load_coordinator_config
    from parties.config import load_dealer_config

    (tmp_path / "pki").mkdir()
    for f in ("dealer.crt", "dealer.key", "coordinator.crt", "coordinator.key", "ca.crt"):
        (tmp_path / "pki" / f).write_text("x")
    shutil.copy(EXAMPLE.parent / "example-dealer.toml", tmp_path / "dealer.toml")
    dealer = load_dealer_config(tmp_path / "dealer.toml")
    assert dealer.identity.name == "dealer" and set(dealer.peers) == {"alice", "bob", "carol"}
    coord_example = EXAMPLE.parents[1] / "coordinator" / "examples" / "coordinator.toml"
    shutil.copy(coord_example, tmp_path / "coordinator.toml")
    coord = load_coordinator_config(tmp_path / "coordinator.toml")
    assert coord.identity.name == "coordinator" and list(coord.parties) == ["alice", "bob", "carol"]
    assert coord.dealers == {"dealer": "127.0.0.1:7100"}
    # the example party's peers are where the coordinator example says they are
    (tmp_path / "pki" / "alice.crt").write_text("x")
    (tmp_path / "pki" / "alice.key").write_text("x")
    shutil.copy(EXAMPLE, tmp_path / "party.toml")
    party = load_party_config(tmp_path / "party.toml")
    assert coord.parties["alice"] == party.listen
    assert {n: coord.parties.get(n) or coord.dealers.get(n) for n in party.peers} == {
        n: p.address for n, p in party.peers.items()}


def test_defaults_and_paths_relative_to_the_config_file(write, tmp_path, monkeypatch) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # resolution must not depend on the working directory
    cfg = load_party_config(write(BASE.replace('state_dir = "st"\n', "")))
    assert cfg.advertise == "127.0.0.1:7001"
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.device == "auto"
    assert cfg.identity.ca == tmp_path / "pki" / "ca.crt" and cfg.identity.crl is None
    claims = cfg.datasets["claims"]
    assert claims.path == tmp_path / "data" / "claims.csv" and claims.label == "fraud"
    assert claims.feature_schema is None
    assert cfg.policy.allowed_methods == ["output", "gradient"] and not cfg.policy.allow_test_only


def test_explicit_values(write, tmp_path) -> None:
    crl = tmp_path / "revoked.crl"
    crl.write_text("x")
    text = BASE.replace('listen = "127.0.0.1:7001"',
                        'listen = "[::1]:7001"\nadvertise = "alice.example.org:443"\ndevice = "cuda"\nthreads = 4')
    text = text.replace('ca = "pki/ca.crt"', f'ca = "pki/ca.crt"\ncrl = "{crl}"')
    (tmp_path / "claims.toml").write_text(CLAIMS_SCHEMA)
    text = text.replace('label = "fraud"', 'label = "fraud"\nschema = "claims.toml"')
    text = text.replace('max_iterations = 100', 'max_iterations = 100\nallowed_methods = ["gradient"]\n'
                        "allow_test_only = true")
    text += '\n[models.tiny]\nentry_point = "acme_models.nets:build_tiny"\n'
    cfg = load_party_config(write(text))
    assert (cfg.listen, cfg.advertise, cfg.device, cfg.threads) == ("[::1]:7001", "alice.example.org:443", "cuda", 4)
    assert cfg.models["tiny"].entry_point == "acme_models.nets:build_tiny"
    assert cfg.identity.crl == crl and cfg.state_dir == tmp_path / "st"
    assert cfg.datasets["claims"].feature_schema == tmp_path / "claims.toml"
    assert cfg.datasets["claims"].schema().label.positive == "yes"
    assert cfg.policy.allowed_methods == ["gradient"] and cfg.policy.allow_test_only is True
    with pytest.raises(ValidationError, match="frozen"):  # a loaded config is not edited in place
        cfg.device = "cpu"  # type: ignore[misc]


BAD: list[tuple[str, Callable[[str], str], str]] = [
    ("zero epsilon", lambda t: t.replace("epsilon = 2.0", "epsilon = 0.0"),
     "datasets.adult.epsilon: must be > 0"),
    ("negative epsilon", lambda t: t.replace("epsilon = 2.0", "epsilon = -1.0"),
     "datasets.adult.epsilon: must be > 0"),
    ("infinite epsilon", lambda t: t.replace("epsilon = 2.0", "epsilon = inf"),
     "datasets.adult.epsilon: Input should be a finite number"),
    ("delta 1", lambda t: t.replace("delta = 1e-5", "delta = 1.0"), "datasets.adult.delta: must be < 1"),
    ("epsilon as string", lambda t: t.replace("epsilon = 1.0", 'epsilon = "1.0"'),
     "datasets.claims.epsilon: Input should be a valid number (got '1.0')"),
    ("missing delta", lambda t: t.replace("delta = 0.0\n", ""), "datasets.claims.delta: required"),
    ("upper-case identity", lambda t: t.replace('name = "alice"', 'name = "Alice"'),
     "identity.name: 'Alice' is not a valid name"),
    ("missing cert", lambda t: t.replace("pki/alice.crt", "pki/nope.crt"), "identity.cert: file not found: "),
    ("cert is a directory", lambda t: t.replace('"pki/alice.crt"', '"pki"'), "identity.cert: not a regular file"),
    ("missing crl", lambda t: t.replace('ca = "pki/ca.crt"', 'ca = "pki/ca.crt"\ncrl = "ca.crl"'),
     "identity.crl: file not found"),
    ("unknown key", lambda t: "colour = 1\n" + t, "colour: unknown field"),
    ("key after a table", lambda t: t.replace('role = "party"', 'role = "party"\ndevice = "cpu"'),
     "peers.bob.device: unknown field (not allowed here) (a top-level key?"),
    ("listen without port", lambda t: t.replace('"127.0.0.1:7001"', '"localhost"'),
     "listen: 'localhost' is not host:port"),
    ("port out of range", lambda t: t.replace("127.0.0.1:7001", "127.0.0.1:70000"),
     "listen: '127.0.0.1:70000': port must be an integer in 1..65535"),
    ("bad host", lambda t: t.replace("bob.example.org:7002", "bob_example:7002"),
     "peers.bob.address: 'bob_example:7002': 'bob_example' is not a host name"),
    ("bad IPv6", lambda t: t.replace("127.0.0.1:7001", "[::g]:7001"), "listen: '[::g]:7001': [::g] is not an IPv6"),
    ("wildcard listen, no advertise", lambda t: t.replace("127.0.0.1:7001", "0.0.0.0:7001"),
     "advertise: required when listen ('0.0.0.0:7001') binds a wildcard address"),
    ("device gpu", lambda t: 'device = "gpu"\n' + t, "device: must be 'cpu', 'cuda' or 'auto' (got 'gpu')"),
    ("zero threads", lambda t: "threads = 0\n" + t, "threads: must be >= 1 (got 0)"),
    ("plugin entry point as code", lambda t: t + '\n[models.tiny]\nentry_point = "os:system(1)"\n',
     "models.tiny.entry_point: String should match pattern"),
    ("threads as text", lambda t: 'threads = "4"\n' + t, "threads: Input should be a valid integer"),
    ("peer named like me", lambda t: t.replace("[peers.bob]", "[peers.alice]"),
     "peers.alice: a peer cannot have this party's own name"),
    ("bad peer name", lambda t: t.replace("[peers.bob]", '[peers."Bob Smith"]'), "peers.Bob Smith: 'Bob Smith' is not"),
    ("bad role", lambda t: t.replace('role = "party"', 'role = "observer"'),
     "peers.bob.role: must be 'party' or 'dealer' (got 'observer')"),
    ("csv without label", lambda t: t.replace('label = "fraud"\n', ""),
     "datasets.claims.label: required for format 'csv'"),
    ("label on builtin", lambda t: t.replace("part = 0", 'part = 0\nlabel = "y"'),
     "datasets.adult.label: not allowed for format 'builtin'"),
    ("builtin without name", lambda t: t.replace('name = "breast_cancer"\n', ""),
     "datasets.adult.name: required for format 'builtin'"),
    ("unknown builtin", lambda t: t.replace('"breast_cancer"', '"iris"'),
     "datasets.adult.name: unknown built-in data set 'iris'; valid: adult, breast_cancer"),
    ("part >= of", lambda t: t.replace("part = 0", "part = 3"), "datasets.adult.part: must be < of (3), got 3"),
    ("of = 0", lambda t: t.replace("of = 3", "of = 0"), "datasets.adult.of: must be >= 1"),
    ("part on csv", lambda t: t.replace('label = "fraud"', 'label = "fraud"\npart = 1'),
     "datasets.claims.part: only allowed for format 'builtin', not 'csv'"),
    ("csv without path", lambda t: t.replace('path = "data/claims.csv"\n', ""),
     "datasets.claims.path: required for format 'csv'"),
    ("missing data file", lambda t: t.replace("data/claims.csv", "data/gone.csv"),
     "datasets.claims.path: file not found: "),
    ("bad format", lambda t: t.replace('format = "csv"', 'format = "parquet"'),
     "datasets.claims.format: must be 'csv', 'libsvm', 'npz', 'idx', 'png' or 'builtin'"),
    ("labels on csv", lambda t: t.replace('label = "fraud"', 'label = "fraud"\nlabels = "data/claims.csv"'),
     "datasets.claims.labels: only allowed for format 'idx', not 'csv'"),
    ("idx without labels", lambda t: t.replace('format = "csv"', 'format = "idx"').replace('label = "fraud"\n', ""),
     "datasets.claims.labels: required for format 'idx'"),
    ("idx labels missing", lambda t: t.replace('format = "csv"', 'format = "idx"').replace(
        'label = "fraud"', 'labels = "data/gone.idx"'), "datasets.claims.labels: file not found: "),
    ("validation fraction too large",
     lambda t: t.replace('label = "fraud"', 'label = "fraud"\nvalidation_fraction = 0.6'),
     "datasets.claims.validation_fraction: must be <= 0.5"),
    ("validation fraction as text",
     lambda t: t.replace('label = "fraud"', 'label = "fraud"\nvalidation_fraction = "0.1"'),
     "datasets.claims.validation_fraction: Input should be a valid number"),
    ("schema file missing", lambda t: t.replace('label = "fraud"', 'label = "fraud"\nschema = "a b.toml"'),
     "datasets.claims.schema: file not found: "),
    ("schema not TOML", lambda t: t.replace('label = "fraud"', 'label = "fraud"\nschema = "pki/ca.crt"'),
     "datasets.claims.schema: "),
    ("public test without a schema",
     lambda t: t.replace('label = "fraud"', 'label = "fraud"\npublic_test = "pki/ca.crt"'),
     "datasets.claims.public_test: needs a schema"),
    ("public test missing", lambda t: t.replace('label = "fraud"', 'label = "fraud"\npublic_test = "nope.csv"'),
     "datasets.claims.public_test: file not found: "),
    ("no datasets", lambda t: t[: t.index("[datasets.adult]")] + t[t.index("[policy]"):], "datasets: required"),
    ("no policy", lambda t: t[: t.index("[policy]")], "policy: required"),
    ("no coordinators", lambda t: t.replace('["coord"]', "[]"), "policy.allowed_coordinators: must not be empty"),
    ("duplicate coordinator", lambda t: t.replace('["coord"]', '["coord", "coord"]'),
     "policy.allowed_coordinators: duplicate entries: coord"),
    ("unknown method", lambda t: t.replace("max_iterations = 100", 'max_iterations = 100\nallowed_methods = ["sgd"]'),
     "policy.allowed_methods.0: must be 'output' or 'gradient' (got 'sgd')"),
    ("zero iterations", lambda t: t.replace("max_iterations = 100", "max_iterations = 0"),
     "policy.max_iterations: must be >= 1"),
    ("fractional iterations", lambda t: t.replace("max_iterations = 100", "max_iterations = 1.5"),
     "policy.max_iterations: Input should be a valid integer (got 1.5)"),
    ("max epsilon 0", lambda t: t.replace("max_epsilon_per_job = 0.5", "max_epsilon_per_job = 0"),
     "policy.max_epsilon_per_job: must be > 0"),
    ("test-only as int", lambda t: t.replace("max_iterations = 100", "max_iterations = 100\nallow_test_only = 1"),
     "policy.allow_test_only: Input should be a valid boolean (got 1)"),
]


@pytest.mark.parametrize(("edit", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_is_refused_naming_the_field(write, edit, fragment) -> None:
    path = write(edit(BASE))
    assert edit(BASE) != BASE, "the edit did not apply"
    with pytest.raises(ConfigError) as info:
        load_party_config(path)
    msg = str(info.value)
    assert f"{path}: {fragment}" in msg, msg
    assert all(line.startswith(f"{path}: ") for line in msg.splitlines())
    assert isinstance(info.value, ValueError) and info.value.problems


def test_all_problems_are_reported_at_once(write) -> None:
    path = write(BASE.replace("epsilon = 2.0", "epsilon = 0.0").replace('role = "party"', 'role = "x"'))
    with pytest.raises(ConfigError) as info:
        load_party_config(path)
    assert [f for f, _ in info.value.problems] == ["peers.bob.role", "datasets.adult.epsilon"]
    assert len(str(info.value).splitlines()) == 2


def test_unreadable_and_malformed_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.toml: cannot read: No such file"):
        load_party_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("listen = \n")
    with pytest.raises(ConfigError, match=r"bad\.toml: invalid TOML: .*line 1"):
        load_party_config(bad)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"bin\.toml: not UTF-8 text"):
        load_party_config(binary)


def test_model_validate_without_a_file_resolves_against_cwd(write, tmp_path, monkeypatch) -> None:
    import tomllib

    write(BASE)
    monkeypatch.chdir(tmp_path)
    cfg = PartyConfig.model_validate(tomllib.loads(BASE))
    assert cfg.identity.key == tmp_path / "pki" / "alice.key"


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:1", ("127.0.0.1", 1)), ("a.b-c.org:65535", ("a.b-c.org", 65535)),
    ("[::1]:7000", ("::1", 7000)), ("localhost:80", ("localhost", 80)),
])
def test_split_host_port(text, expected) -> None:
    assert split_host_port(text) == expected


@pytest.mark.parametrize("text", ["", ":80", "host", "host:", "host:0", "host:-1", "host:x", "::1:80", "a..b:1",
                                  "-a:1", "host:１２"])
def test_split_host_port_rejects(text) -> None:
    with pytest.raises(ValueError):
        split_host_port(text)


def test_example_owner_config_loads_and_an_owner_data_set_must_be_add_remove(tmp_path: Path) -> None:
    from parties.config import load_owner_config

    (tmp_path / "pki").mkdir()
    for f in ("clinic-001.crt", "clinic-001.key", "ca.crt"):
        (tmp_path / "pki" / f).write_text("x")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "clinic.csv").write_text("a,diagnosis\n1,0\n")
    text = (EXAMPLE.parent / "example-owner.toml").read_text()
    (tmp_path / "owner.toml").write_text(text)
    cfg = load_owner_config(tmp_path / "owner.toml")
    assert cfg.identity.name == "clinic-001" and cfg.state_dir == tmp_path / "state"
    assert list(cfg.compute) == ["alice", "bob", "carol"] and cfg.datasets["clinics"].adjacency == "add_remove"
    (tmp_path / "owner.toml").write_text(text.replace('adjacency = "add_remove"', 'adjacency = "replace"'))
    with pytest.raises(ConfigError, match=r"datasets\.clinics\.adjacency: an owner's data set is \"add_remove\""):
        load_owner_config(tmp_path / "owner.toml")
    (tmp_path / "owner.toml").write_text(text.replace('bob = "bob.example.org:7001"\n', "").replace(
        'carol = "carol.example.org:7001"\n', ""))
    with pytest.raises(ConfigError, match=r"compute: "):
        load_owner_config(tmp_path / "owner.toml")  # one compute party cannot hide a share
