"""`mpc-erm provision`: one consortium file in, one startup kit per member out (the role of NVIDIA
FLARE's ``provision``).

Why: standing a consortium up by hand takes a CA, one ``certs issue`` per identity and four kinds
of hand-written TOML whose names, roles and addresses must agree; one wrong peer address or
coordinator name and a job fails at admission on another organisation's machine. Here every
config is derived from one file, so they agree by construction, and each is written as commented
TOML that its member can read and edit. Output::

    OUT/README.txt            what to hand to whom
    OUT/ca/ca.crt, ca.key     the consortium's CA. The operator keeps ca.key OFFLINE: it is in no
                              kit, and needed only to issue or revoke later (`mpc-erm certs … --dir OUT/ca`)
    OUT/<member>/             one kit per member, for that member only (it holds its private key):
        pki/<member>.key      0600, in this kit and nowhere else
        pki/<member>.crt, pki/ca.crt
        party.toml | dealer.toml | owner.toml | coordinator.toml
        start.sh (daemons) | join.sh (data owners) | submit.sh (coordinators)
        schemas/<file>        the public schema files its data sets name
        README.txt

The consortium file is validated like a party config (:mod:`parties.config`: unknown keys are
errors, every problem names its field, e.g. ``consortium.toml: members.alice.port: …``); its
data set tables are checked with the party config's own model, except that their files need not
exist here (the data lives at each member's site). See coordinator/examples/consortium.toml.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, Field, PrivateAttr, ValidationError, field_validator, model_validator

from coordinator.config import CoordinatorConfig
from mpc_erm.jobs.toml_reader import short_repr
from mpc_erm.mpc import pki
from parties.config import (
    WILDCARD_HOSTS,
    ConfigError,
    ConfigModel,
    DatasetConfig,
    DealerConfig,
    HostPort,
    Name,
    OwnerConfig,
    PartyConfig,
    PolicyConfig,
    load_model,
    split_host_port,
    validation_problems,
)

__all__ = ["DEFAULT_POLICY", "Consortium", "ConsortiumSpec", "Kit", "Member", "MemberSpec", "Provisioned",
           "load_consortium", "provision"]

Role = Literal["party", "dealer", "owner", "coordinator"]
CONFIG_FILE: dict[str, str] = {"party": "party.toml", "dealer": "dealer.toml", "owner": "owner.toml",
                               "coordinator": "coordinator.toml"}
SCRIPT_FILE: dict[str, str] = {"party": "start.sh", "dealer": "start.sh", "owner": "join.sh",
                               "coordinator": "submit.sh"}
#: A real consortium's policy for every party and dealer; ``[members.<name>.policy]`` overrides keys.
#: ``allowed_coordinators`` defaults to every coordinator of the consortium.
DEFAULT_POLICY: dict[str, Any] = {"allowed_methods": ["output", "gradient"], "max_epsilon_per_job": 1.0,
                                  "max_iterations": 2000, "allow_test_only": False}
_OWNER_POLICY = ("max_epsilon_per_job", "allow_test_only")  # what an owner's config has of a policy
#: The keys each role takes besides ``role`` (the rest are refused naming the member), and those it needs.
_ALLOWED: dict[str, frozenset[str]] = {
    "party": frozenset({"host", "port", "listen", "device", "threads", "policy", "datasets"}),
    "dealer": frozenset({"host", "port", "listen", "device", "threads", "policy"}),
    "owner": frozenset({"device", "policy", "datasets"}),
    "coordinator": frozenset({"timeout_s"}),
}
_REQUIRED: dict[str, tuple[str, ...]] = {"party": ("host", "port", "datasets"), "dealer": ("host", "port"),
                                         "owner": ("datasets",), "coordinator": ()}
CA_DAYS = 3650  # the CA outlives the member certificates, so `certs issue --dir OUT/ca` can renew them


# --------------------------------------------------------------------------- the consortium file


def _host(v: str) -> str:
    """A DNS name or an IP address (IPv6 without brackets) that peers dial."""
    try:
        ip = ipaddress.ip_address(v)
    except ValueError:
        try:
            split_host_port(f"{v}:1")  # the party config's own host rule
        except ValueError:
            raise ValueError(f"{short_repr(v)} is not a DNS name or an IP address") from None
        return v
    if str(ip) in WILDCARD_HOSTS:
        raise ValueError(f"{v!r} is a wildcard; host is the address peers dial (bind a wildcard with listen)")
    return str(ip)


Host = Annotated[str, AfterValidator(_host)]


class MemberSpec(ConfigModel):
    """One ``[members.<name>]`` table. Which keys a role takes is checked with the whole file."""

    role: Role
    host: Host | None = None  # what peers dial; also the certificate's SAN
    port: int | None = Field(None, strict=True, ge=1, le=65535)
    listen: HostPort | None = None  # where the daemon binds (default host:port), e.g. "0.0.0.0:7101"
    device: Literal["cpu", "cuda", "auto"] | None = None
    threads: int | None = Field(None, strict=True, ge=1, le=1024)  # the bounds of PartyConfig.threads
    timeout_s: float | None = Field(None, strict=True, gt=0, le=3600, allow_inf_nan=False)  # coordinators
    policy: dict[str, Any] | None = None  # checked, merged over DEFAULT_POLICY, by PolicyConfig itself
    datasets: dict[Name, DatasetConfig] | None = None
    _raw_datasets: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)  # as written, for the configs

    @model_validator(mode="wrap")
    @classmethod
    def _keep_raw(cls, data: Any, handler: Any) -> MemberSpec:
        """Keep the data set tables as the file gave them: they are copied into the configs verbatim
        (a validated path is resolved here, but it names a file at the member's site)."""
        m = handler(data)
        if isinstance(data, dict) and isinstance(data.get("datasets"), dict):
            m._raw_datasets = {k: dict(v) for k, v in data["datasets"].items()}
        return cast(MemberSpec, m)


class ConsortiumSpec(ConfigModel):
    """The whole consortium file."""

    name: str = Field("mpc-erm", min_length=1, max_length=61)  # the CA is "<name> CA"
    members: dict[Name, MemberSpec] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _printable(cls, v: str) -> str:
        if not v.isprintable():
            raise ValueError(f"must be printable text, got {short_repr(v)}")
        return v


@dataclass(frozen=True)
class Member:
    """A member as its kit is written: addresses, SANs, the merged policy, the data set tables."""

    name: str
    role: Role
    spec: MemberSpec
    address: str | None = None  # host:port peers dial (None: no listener)
    listen: str | None = None
    hosts: tuple[str, ...] = ()  # the certificate's SAN DNS names / IPs
    policy: dict[str, Any] = field(default_factory=dict)
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)  # as written, schema rewritten
    schemas: dict[str, Path] = field(default_factory=dict)  # kit file name -> source file


@dataclass(frozen=True)
class Consortium:
    path: Path
    name: str
    members: dict[str, Member]

    def of(self, *roles: str) -> list[Member]:
        return [m for m in self.members.values() if m.role in roles]


def load_consortium(path: str | os.PathLike[str]) -> Consortium:
    """Read and check a consortium file; every problem, each naming its field, in one ConfigError."""
    p = Path(path)
    spec = load_model(p, ConsortiumSpec, context={"check_files": False})
    problems: list[tuple[str, str]] = []
    problems += _check_roles(spec)
    problems += _check_addresses(spec)
    coordinators = [n for n, m in spec.members.items() if m.role == "coordinator"]
    members = {}
    for name, m in spec.members.items():
        policy, bad_policy = _policy(name, m, coordinators)
        datasets, schemas, bad_data = _datasets(p, name, m)
        problems += bad_policy + bad_data
        address, listen, hosts = _addresses(m)
        members[name] = Member(name, m.role, m, address, listen, hosts, policy, datasets, schemas)
    if problems:
        raise ConfigError(p, problems)
    return Consortium(p, spec.name, members)


def _check_roles(spec: ConsortiumSpec) -> list[tuple[str, str]]:
    problems = []
    for name, m in spec.members.items():
        if name in pki.RESERVED_NAMES:
            problems.append((f"members.{name}", f"{name!r} is reserved: OUT/{name} holds the consortium's CA"))
        for key in sorted(m.model_fields_set - _ALLOWED[m.role] - {"role"}):
            problems.append((f"members.{name}.{key}", f"not for a {m.role} (it takes: "
                                                      f"{', '.join(sorted(_ALLOWED[m.role])) or 'only role'})"))
        for key in _REQUIRED[m.role]:
            if getattr(m, key) is None:
                problems.append((f"members.{name}.{key}", f"required for a {m.role}"))
            elif key == "datasets" and not m.datasets:
                problems.append((f"members.{name}.{key}", "must not be empty"))
    counts = {r: sum(m.role == r for m in spec.members.values()) for r in ("party", "coordinator")}
    if counts["party"] < 2:
        problems.append(("members", f'a consortium needs at least 2 members with role "party", got {counts["party"]}'))
    if counts["coordinator"] < 1:
        problems.append(("members", 'a consortium needs a member with role "coordinator" (who submits jobs)'))
    return problems


def _check_addresses(spec: ConsortiumSpec) -> list[tuple[str, str]]:
    """Two listeners on one host:port cannot both be dialled (host names compare case-insensitively)."""
    seen: dict[tuple[str, int], str] = {}
    problems = []
    for name, m in spec.members.items():
        if m.host is None or m.port is None:
            continue
        key = (m.host.lower(), m.port)
        if key in seen:
            problems.append((f"members.{name}.port", f"{_join(m.host, m.port)} is also {seen[key]}'s address: "
                                                     "two members cannot listen on the same host:port"))
        else:
            seen[key] = name
    return problems


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _addresses(m: MemberSpec) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(address peers dial, listen address, certificate SANs); a coordinator or owner has no listener."""
    if m.host is None or m.port is None:
        return None, None, ()
    address = _join(m.host, m.port)
    listen = m.listen or address
    bind_host = split_host_port(listen)[0]
    hosts = (m.host,) if bind_host in WILDCARD_HOSTS or bind_host.lower() == m.host.lower() else (m.host, bind_host)
    return address, listen, hosts


def _policy(name: str, m: MemberSpec, coordinators: list[str]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The member's policy: DEFAULT_POLICY with its overrides, checked by PolicyConfig itself."""
    where = f"members.{name}.policy"
    given = dict(m.policy or {})
    problems = []
    if not coordinators:  # reported once for the file ("members"), not once per member
        return given, problems
    if m.role == "owner":
        for key in sorted(set(given) - set(_OWNER_POLICY)):
            problems.append((f"{where}.{key}", f"not for an owner (it takes: {', '.join(_OWNER_POLICY)})"))
            given.pop(key)
    merged = {"allowed_coordinators": coordinators, **DEFAULT_POLICY, **given}
    try:
        PolicyConfig.model_validate(merged)
    except ValidationError as exc:
        problems += [(f"{where}.{f}" if f else where, reason) for f, reason in validation_problems(exc)]
    listed = merged["allowed_coordinators"] if m.role != "owner" else []
    for c in listed if isinstance(listed, list) else []:
        if c not in coordinators:
            problems.append((f"{where}.allowed_coordinators", f"{short_repr(c)} is not a coordinator of this "
                                                              f"consortium ({', '.join(coordinators) or 'none'})"))
    if m.role == "owner":
        merged = {k: merged[k] for k in _OWNER_POLICY}
    return merged, problems


_Problems = list[tuple[str, str]]


def _datasets(path: Path, name: str, m: MemberSpec) -> tuple[dict[str, dict[str, Any]], dict[str, Path], _Problems]:
    """The member's data set tables as its config gets them, and the schema files its kit needs.

    A ``schema`` is a file relative to the consortium file; the kit gets a copy in ``schemas/`` and
    the config names that copy. Everything else is copied verbatim (paths are the member's own)."""
    tables: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Path] = {}
    problems = []
    for ds_id, ds in (m.datasets or {}).items():
        where = f"members.{name}.datasets.{ds_id}"
        table = dict(m._raw_datasets[ds_id])
        if m.role == "owner" and ds.adjacency != "add_remove":
            problems.append((f"{where}.adjacency", 'an owner\'s data set is "add_remove" (owners may drop out of '
                                                   "a round; the job's normaliser is public)"))
        if "schema" in table:
            src = Path(str(table["schema"])).expanduser()
            src = src if src.is_absolute() else path.absolute().parent / src
            if not src.is_file():
                problems.append((f"{where}.schema", f"file not found: {short_repr(str(src))} (a schema file, "
                                                    f"relative to {path.name})"))
            elif src.name in schemas and schemas[src.name].resolve() != src.resolve():
                problems.append((f"{where}.schema", f"{src} and {schemas[src.name]} would both be "
                                                    f"schemas/{src.name} in {name}'s kit; rename one"))
            schemas[src.name] = src
            table["schema"] = f"schemas/{src.name}"
        tables[ds_id] = table
    return tables, schemas, problems


# --------------------------------------------------------------------------- the kits


@dataclass(frozen=True)
class Kit:
    name: str
    role: str
    address: str | None  # where peers dial it (None: a coordinator or owner has no listener)
    dir: Path
    config: Path
    script: Path


@dataclass(frozen=True)
class Provisioned:
    consortium: str
    out: Path
    ca_cert: Path
    ca_key: Path
    kits: tuple[Kit, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"consortium": self.consortium, "out": str(self.out),
                "ca": {"cert": str(self.ca_cert), "key": str(self.ca_key),
                       "sha256_fingerprint": pki.fingerprint(self.ca_cert.read_bytes())},
                "kits": [{"name": k.name, "role": k.role, "address": k.address, "dir": str(k.dir),
                          "config": str(k.config), "script": str(k.script)} for k in self.kits]}


def provision(consortium: str | os.PathLike[str], out: str | os.PathLike[str], *, force: bool = False,
              days: int = 365) -> Provisioned:
    """Write a new CA and every member's kit into ``out``. All is written into a scratch directory
    beside ``out`` first and moved in at the end, so an error while writing leaves ``out`` as it was.
    ``force`` replaces the CA (every earlier kit's certificate then fails) and these members' kits."""
    if not isinstance(days, int) or days < 1:
        raise ValueError(f"days: must be >= 1, got {days!r}")
    c = load_consortium(consortium)
    out = Path(out)
    _check_out(out, c, force)
    where = out.absolute()
    where.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{where.name}.provision-", dir=where.parent))
    try:
        ca = pki.create_ca(f"{c.name} CA", valid_days=max(days, CA_DAYS))
        pki.save_ca(ca, staging / "ca")
        for m in c.members.values():
            _write_kit(c, m, ca, staging / m.name, days)
        (staging / "README.txt").write_text(_out_readme(c))
        _install(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    kits = tuple(Kit(m.name, m.role, m.address, out / m.name, out / m.name / CONFIG_FILE[m.role],
                     out / m.name / SCRIPT_FILE[m.role]) for m in c.members.values())
    return Provisioned(c.name, out, out / "ca" / pki.CA_CERT_FILE, out / "ca" / pki.CA_KEY_FILE, kits)


def _check_out(out: Path, c: Consortium, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} exists and is not a directory")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise ValueError(f"out: {out} is not empty (use --force to replace its CA and the kits of these members)")
    for m in c.members.values():  # a kit used in place holds the member's ledger: spent budget is never reset
        state = out / m.name / "state"
        if state.exists():
            raise ValueError(f"out: {state} holds {m.name}'s budget ledger and audit log; not even --force "
                             "deletes it (move it away first)")


def _install(staging: Path, out: Path) -> None:
    """Move the staged CA, kits and README into ``out``, replacing entries of the same name."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        if out.exists():
            out.rmdir()
        staging.rename(out)
        return
    for entry in staging.iterdir():
        target = out / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        entry.rename(target)


_VALIDATOR: dict[str, type[Any]] = {"party": PartyConfig, "dealer": DealerConfig, "owner": OwnerConfig,
                                    "coordinator": CoordinatorConfig}


def _write_kit(c: Consortium, m: Member, ca: pki.CertificateAuthority, d: Path, days: int) -> None:
    identity = pki.issue_identity(ca, m.name, m.role, valid_days=days, hosts=m.hosts)
    pki.save_identity(identity, d / "pki")
    for file_name, src in m.schemas.items():
        (d / "schemas").mkdir(exist_ok=True)
        shutil.copyfile(src, d / "schemas" / file_name)
    config = d / CONFIG_FILE[m.role]
    config.write_text(_RENDER[m.role](c, m))
    try:  # the loader the member will run, less the data files, which live at its site
        load_model(config, _VALIDATOR[m.role], context={"check_files": False})
    except ConfigError as exc:
        raise ValueError(f"members.{m.name}: the generated {config.name} is refused by its loader: "
                         f"{'; '.join(f'{f}: {r}' for f, r in exc.problems)}") from None
    script = d / SCRIPT_FILE[m.role]
    script.write_text(_script(m))
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    (d / "README.txt").write_text(_kit_readme(c, m))


# --------------------------------------------------------------------------- TOML text


def _toml(v: Any) -> str:
    """A TOML value (the data set tables' values: strings, numbers, booleans, arrays)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return repr(v)
    if isinstance(v, float):  # finite (validated); repr is valid TOML, written as people write it: 1e-5, 4.0
        mantissa, e, exponent = repr(v).partition("e")
        return f"{mantissa}e{int(exponent)}" if e else mantissa
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")  # a JSON string is a TOML basic string
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def _kv(key: str, value: Any, comment: str = "", *, off: bool = False) -> str:
    """``key = value`` (``off``: commented out), with a comment aligned as in the hand-written examples."""
    line = f"{'# ' if off else ''}{key} = {_toml(value)}"
    return f"{line:<31} # {comment}" if comment else line


def _header(c: Consortium, m: Member, command: str) -> list[str]:
    return [f"# {m.name}: {m.role} of consortium {c.name!r}, written by `mpc-erm provision {c.path.name}` "
            f"on {dt.date.today().isoformat()}.",
            f"# Used by: {command}",
            "# Edit freely: every key is checked when it is read (unknown keys are errors naming the field),",
            "# and relative paths are resolved against this file's directory (the kit).", ""]


def _identity(m: Member) -> list[str]:
    return ["# Who this member is (the name in its certificate) and its TLS files, in pki/ beside this file.",
            "[identity]", f'name = "{m.name}"', f'cert = "pki/{m.name}.crt"',
            _kv("key", f"pki/{m.name}.key", "PRIVATE: never share it or copy it off this machine"),
            _kv("ca", "pki/ca.crt", "the consortium's CA certificate (public)"),
            _kv("crl", "pki/crl.pem", "the revocation list the CA operator sends (`certs revoke`)", off=True),
            ""]


def _dataset_tables(m: Member) -> list[str]:
    lines = []
    for ds_id, table in m.datasets.items():
        lines += [f"[datasets.{ds_id}]", *(f"{k} = {_toml(v)}" for k, v in table.items()), ""]
    return lines


def _policy_lines(policy: dict[str, Any]) -> list[str]:
    return [_kv(k, v, "true accepts test-only noise (never in production)" if k == "allow_test_only" else "")
            for k, v in policy.items()]


def _daemon_toml(c: Consortium, m: Member) -> str:
    peers = [p for p in c.of("party", "dealer") if p.name != m.name and (m.role == "party" or p.role == "party")]
    lines = [*_header(c, m, f"mpc-erm {m.role} serve --config {CONFIG_FILE[m.role]} (./start.sh)"),
             "# Where the daemon binds, and the address every peer dials (the certificate names its host).",
             _kv("listen", m.listen), _kv("advertise", m.address),
             _kv("state_dir", "state", "the budget ledger and audit log: back it up, never delete it"
                 if m.role == "party" else "its job table"),
             _kv("device", m.spec.device or "auto", '"cpu", "cuda" or "auto" (CUDA when available)'),
             _kv("threads", m.spec.threads or 4, "torch threads per job worker (default: all cores)",
                 off=not m.spec.threads),
             "# max_concurrent_jobs = 4       # jobs run at once, each in its own worker process; more wait queued",
             "# peer_timeout_s = 120          # how long a job waits on a peer before it fails naming that peer",
             "", *_identity(m), "# The other members this daemon talks to, by certificate name."]
    for p in peers:
        lines += [f"[peers.{p.name}]", f"address = {_toml(p.address)}", f'role = "{p.role}"', ""]
    if m.role == "party":
        lines += ["# The data sets this party offers, by id (a job names the id). `path` is where the data lives",
                  "# on this machine: absolute, or relative to this kit. `epsilon`/`delta` are the data set's",
                  "# lifetime budget: the ledger refuses any job that would take its total spend past them.",
                  *_dataset_tables(m)]
    lines += ["# What this daemon accepts: jobs from other coordinators, with other methods, asking more than",
              "# max_epsilon_per_job or more than max_iterations rounds are refused before any share moves.",
              "[policy]", *_policy_lines(m.policy), "",
              "# Per caller identity (optional; the defaults are far above what jobs and coordinators use).",
              "# [limits]", "# control_calls_per_s = 200.0", "# transport_calls_per_s = 20000.0"]
    return "\n".join(lines) + "\n"


def _owner_toml(c: Consortium, m: Member) -> str:
    lines = [*_header(c, m, "mpc-erm owner join --config owner.toml --job JOB.toml --job-id ID (./join.sh)"),
             _kv("state_dir", "state", "its own budget ledger and audit log: back it up, never delete it"),
             _kv("device", m.spec.device or "auto", "its local gradients on a GPU when it has one"),
             "# The largest ε one job may spend of this owner's data; test-only noise is refused unless true.",
             *_policy_lines(m.policy), "", *_identity(m),
             "# The compute parties' daemons this owner sends shares to.", "[compute]",
             *(f"{p.name} = {_toml(p.address)}" for p in c.of("party")), "",
             "# This owner's data sets, by id. `path` is where the data lives on this machine: absolute, or",
             "# relative to this kit. `epsilon`/`delta`: the lifetime budget, kept in this owner's ledger.",
             *_dataset_tables(m)]
    return "\n".join(lines).rstrip("\n") + "\n"


def _coordinator_toml(c: Consortium, m: Member) -> str:
    dealers = c.of("dealer")
    lines = [*_header(c, m, "mpc-erm job submit JOB.toml --config coordinator.toml (./submit.sh JOB.toml)"),
             _kv("timeout_s", m.spec.timeout_s or 30.0, "per call (a submission gets twice this)"),
             "", *_identity(m), "# Where the members' daemons listen, by certificate name.", "[parties]",
             *(f"{p.name} = {_toml(p.address)}" for p in c.of("party")), ""]
    if dealers:
        lines += ["[dealers]                         # for trust = \"dealer\" jobs",
                  *(f"{p.name} = {_toml(p.address)}" for p in dealers)]
    else:
        lines += ['# No dealer in this consortium: jobs use trust = "replicated" (3 parties).']
    return "\n".join(lines) + "\n"


_RENDER: dict[str, Callable[[Consortium, Member], str]] = {
    "party": _daemon_toml, "dealer": _daemon_toml, "owner": _owner_toml, "coordinator": _coordinator_toml}


# --------------------------------------------------------------------------- scripts and READMEs


def _script(m: Member) -> str:
    if m.role in ("party", "dealer"):
        return ("#!/bin/sh\n"
                f"# Start {m.name}'s {m.role} daemon from this kit (needs `mpc-erm` on PATH); stop it with Ctrl-C\n"
                f"# or SIGTERM. It listens on {m.listen}; peers dial {m.address}.\n"
                'cd "$(dirname "$0")" || exit 1\n'
                f"exec mpc-erm {m.role} serve --config {CONFIG_FILE[m.role]}\n")
    if m.role == "owner":
        return ("#!/bin/sh\n"
                f"# Join a job as data owner {m.name!r}: ./join.sh --job JOB.toml --job-id ID\n"
                "# (the job file as submitted, and the id `mpc-erm job submit` printed).\n"
                'exec mpc-erm owner join --config "$(dirname "$0")/owner.toml" "$@"\n')
    return ("#!/bin/sh\n"
            f"# Submit a job as coordinator {m.name!r}: ./submit.sh JOB.toml [--watch]\n"
            "# Other job commands: export MPC_ERM_COORDINATOR_CONFIG=\"$PWD/coordinator.toml\"; mpc-erm job status ID\n"
            'exec mpc-erm job submit --config "$(dirname "$0")/coordinator.toml" "$@"\n')


def _kit_readme(c: Consortium, m: Member) -> str:
    cfg, script = CONFIG_FILE[m.role], SCRIPT_FILE[m.role]
    daemon = m.role in ("party", "dealer")
    files = [(cfg, "this member's config, commented; edit it" + (" and restart to change it" if daemon else "")),
             (script, {"owner": "joins a job: ./join.sh --job JOB.toml --job-id ID",
                       "coordinator": "submits a job: ./submit.sh JOB.toml --watch"}.get(
                 m.role, "starts the daemon: ./start.sh (needs mpc-erm on PATH)")),
             (f"pki/{m.name}.key", "this member's PRIVATE KEY (0600): NEVER share it or copy it off this machine"),
             (f"pki/{m.name}.crt", "this member's certificate (public)"),
             ("pki/ca.crt", "the consortium's CA certificate (public; the CA's key is in no kit)")]
    if m.schemas:
        files.append(("schemas/", "the public data schemas its data sets name (the same at every member)"))
    if m.role != "coordinator":
        files.append(("state/", "made on first start: " + ("its job table" if m.role == "dealer" else
                                                           "the budget ledger and audit log; back it up, never "
                                                           "delete it")))
    width = max(len(f) for f, _ in files) + 2
    lines = [f"{m.name}: the {m.role} kit of consortium {c.name!r} (mpc-erm provision, {dt.date.today()})", "",
             "What is here:", *(f"  {f:<{width}}{what}" for f, what in files)]
    if m.datasets:
        lines += ["", "Before the first job, put the data where the config's [datasets.*] path says",
                  "(relative paths are relative to this kit):"]
        lines += [f"  {ds_id}: {t.get('path', 'built-in ' + str(t.get('name')))}" for ds_id, t in m.datasets.items()]
    if daemon:
        lines += ["", f"It listens on {m.listen}; the other members dial {m.address}.",
                  f"Is it up?  mpc-erm {m.role} health --config {cfg}"]
    if m.role == "coordinator":
        lines += ["", "Submit and follow a job (job file examples: coordinator/examples/ in mpc-erm):",
                  "  mpc-erm job submit JOB.toml --config coordinator.toml --watch",
                  "  mpc-erm job result JOB_ID --out results/ --config coordinator.toml"]
    return "\n".join(lines) + "\n"


def _out_readme(c: Consortium) -> str:
    lines = [f"Consortium {c.name!r}: startup kits written by `mpc-erm provision {c.path.name}` on {dt.date.today()}.",
             "",
             "ca/          the consortium's certificate authority. ca.key makes anyone a member: keep it OFFLINE",
             "             (not on a daemon's machine, in no kit). It is needed only to issue or revoke later:",
             "             mpc-erm certs issue --dir ca ... / mpc-erm certs revoke --dir ca ...",
             "<member>/    one startup kit per member. Give each kit to its member only, over a channel you",
             "             trust: it holds that member's private key (pki/<member>.key).",
             "", f"{'member':<20}{'role':<13}{'address':<26}kit"]
    lines += [f"{m.name:<20}{m.role:<13}{m.address or '-':<26}{m.name}/" for m in c.members.values()]
    return "\n".join(lines) + "\n"
