"""The party daemon's TOML configuration, validated before the daemon touches a socket or a file.

Why so strict: a party's config is its security policy (who may submit jobs, how much ε a job and a
data set may spend). A typo must stop the daemon with a line naming the field, not silently fall
back to a default, so unknown keys are refused (``extra="forbid"``), numbers and booleans are
strict (TOML ``"1.0"`` is not a number, ``1`` is not ``true``), and all field problems are reported
at once as ``<file>: <dotted.field>: <reason>`` (cross-field checks, e.g. ``part < of``, run once
the fields of their table are valid).

Relative paths are resolved against the config file's directory (not the daemon's working
directory), so a config and its keys can be moved together. See ``example-party.toml``.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import tomllib
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

__all__ = [
    "ConfigError",
    "DatasetConfig",
    "DealerConfig",
    "load_model",
    "IdentityConfig",
    "PartyConfig",
    "PeerConfig",
    "PolicyConfig",
    "load_dealer_config",
    "load_party_config",
    "split_host_port",
]

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_HOST_RE = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                      r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_SCHEMA_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,127}")
_WILDCARD_HOSTS = {"0.0.0.0", "::"}


class ConfigError(ValueError):
    """A config that cannot be used; ``str()`` is one ``<file>: <field>: <reason>`` line per problem."""

    def __init__(self, path: str | os.PathLike[str], problems: list[tuple[str, str]]) -> None:
        self.path = Path(path)
        self.problems = problems
        super().__init__("\n".join(f"{self.path}: {f}: {r}" if f else f"{self.path}: {r}"
                                   for f, r in problems))


def _name(v: str) -> str:
    if not _NAME_RE.fullmatch(v):
        raise ValueError(f"{v!r} is not a valid name: lower-case letters, digits, '_' and '-', "
                         "starting with a letter or digit, at most 63 characters")
    return v


def split_host_port(v: str, *, allow_zero: bool = False) -> tuple[str, int]:
    """``"host:port"`` → (host, port); IPv6 hosts in brackets (``"[::1]:7000"``). ``allow_zero``
    accepts port 0 (a listen address: the OS picks a free port, the daemon reports it)."""
    host, sep, port = v.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{v!r} is not host:port")
    low = 0 if allow_zero else 1
    if not port.isascii() or not port.isdigit() or not low <= int(port) <= 65535:
        zero = " (or 0: any free port)" if allow_zero else ""
        raise ValueError(f"{v!r}: port must be an integer in 1..65535{zero}")
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1])), int(port)
        except ValueError:
            raise ValueError(f"{v!r}: {host} is not an IPv6 address") from None
    if not _HOST_RE.fullmatch(host):
        raise ValueError(f"{v!r}: {host!r} is not a host name or IPv4 address (IPv6 goes in brackets)")
    return host, int(port)


def _host_port(v: str) -> str:
    split_host_port(v)
    return v


def _listen_address(v: str) -> str:
    split_host_port(v, allow_zero=True)
    return v


Name = Annotated[str, AfterValidator(_name)]
HostPort = Annotated[str, AfterValidator(_host_port)]
ListenAddress = Annotated[str, AfterValidator(_listen_address)]  # port 0: any free port
PositiveFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]


def _field_error(field: str, reason: str) -> PydanticCustomError:
    """An error for ``field`` (dotted, relative to the model) raised by a model-level check, so
    that the report still names the field rather than the enclosing table."""
    return PydanticCustomError("config_field", "{field}: {reason}", {"field": field, "reason": reason})


def _resolve(v: Path, info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base_dir")
    v = v.expanduser()
    return (Path(base) / v if base is not None and not v.is_absolute() else v).absolute()


def _existing_file(v: Path | None, info: ValidationInfo) -> Path | None:
    if v is None:
        return None
    p = _resolve(v, info)
    if not p.exists():
        raise ValueError(f"file not found: {p}")
    if not p.is_file():
        raise ValueError(f"not a regular file: {p}")
    return p


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class IdentityConfig(_Model):
    """This party's name (the CN/SAN of its certificate) and its TLS material."""

    name: Name
    cert: Path
    key: Path
    ca: Path
    crl: Path | None = None

    _files = field_validator("cert", "key", "ca", "crl")(_existing_file)

    def load(self, role: str) -> Any:
        """The TLS identity these files hold (a ``pki.Identity``), checked as every daemon and the
        coordinator need it: the key matches the certificate, the CA signed it, it is valid now,
        and it names ``name`` in ``role``. Raises ValueError naming the field."""
        from mpc_erm.mpc import pki

        try:
            cert, key, ca = self.cert.read_bytes(), self.key.read_bytes(), self.ca.read_bytes()
        except OSError as exc:
            raise ValueError(f"identity: cannot read: {exc}") from None
        try:
            got_role, got_name = pki.identity_of_certificate(cert)
        except ValueError as exc:
            raise ValueError(f"identity.cert: {exc}") from None
        if got_name != self.name:
            raise ValueError(f"identity.cert: {self.cert} is for {got_name!r}, not identity.name {self.name!r}")
        if got_role != role:
            raise ValueError(f"identity.cert: {self.cert} is for {got_role}/{got_name}, not {role}/{self.name} "
                             f"(a {role} needs a {role} certificate)")
        identity = pki.Identity(name=got_name, role=got_role, cert_pem=cert, key_pem=key, ca_pem=ca)
        try:
            pki.verify_identity(identity)
        except ValueError as exc:
            raise ValueError(f"identity: {exc}") from None
        return identity


class PeerConfig(_Model):
    """Another identity this party talks to, and where to reach it."""

    address: HostPort
    role: Literal["party", "dealer"]


class DatasetConfig(_Model):
    """A data set this party offers, with its lifetime privacy budget (ε, δ).

    ``csv``/``libsvm``/``npz`` read ``path`` (``label`` names the csv label column); ``builtin``
    loads the named data set of :mod:`mpc_erm.data` and keeps shard ``part`` of ``of`` (for
    demos and tests: every party then holds a disjoint slice of the same public set).
    """

    format: Literal["csv", "libsvm", "npz", "builtin"]
    path: Path | None = None
    label: str | None = Field(None, min_length=1)
    feature_schema: str | None = Field(None, alias="schema")
    epsilon: PositiveFloat
    delta: float = Field(strict=True, ge=0, lt=1, allow_inf_nan=False)
    name: str | None = None
    part: int = Field(0, strict=True, ge=0)
    of: int = Field(1, strict=True, ge=1)

    _path = field_validator("path")(_existing_file)

    @field_validator("feature_schema")
    @classmethod
    def _schema(cls, v: str | None) -> str | None:
        if v is not None and not _SCHEMA_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not a schema id (letters, digits and _.:/@+-, at most 128)")
        return v

    @model_validator(mode="after")
    def _by_format(self) -> DatasetConfig:
        given = self.model_fields_set
        if self.format == "builtin":
            for f in ("path", "label"):
                if f in given:
                    raise _field_error(f, "not allowed for format 'builtin'")
            if self.name is None:
                raise _field_error("name", "required for format 'builtin' (a built-in data set name)")
            from mpc_erm.data import DATASETS  # lazy: pulls in pandas/scikit-learn

            if self.name not in DATASETS:
                raise _field_error("name", f"unknown built-in data set {self.name!r}; "
                                           f"valid: {', '.join(sorted(DATASETS))}")
            if self.part >= self.of:
                raise _field_error("part", f"must be < of ({self.of}), got {self.part}")
            return self
        for f in ("name", "part", "of"):
            if f in given:
                raise _field_error(f, f"only allowed for format 'builtin', not {self.format!r}")
        if self.path is None:
            raise _field_error("path", f"required for format {self.format!r}")
        if self.format == "csv" and self.label is None:
            raise _field_error("label", "required for format 'csv' (the label column's name)")
        if self.format != "csv" and self.label is not None:
            raise _field_error("label", f"only allowed for format 'csv', not {self.format!r}")
        return self


class PolicyConfig(_Model):
    """What this party accepts; checked for every job before the ledger is asked for budget."""

    allowed_coordinators: list[Name] = Field(min_length=1)
    allowed_methods: list[Literal["output", "gradient"]] = Field(
        default_factory=lambda: ["output", "gradient"], min_length=1)
    max_epsilon_per_job: PositiveFloat
    max_iterations: int = Field(strict=True, ge=1)
    allow_test_only: bool = Field(False, strict=True)  # test-only noise / TFP refused unless true

    @field_validator("allowed_coordinators", "allowed_methods")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        dup = sorted({x for x in v if v.count(x) > 1})
        if dup:
            raise ValueError(f"duplicate entries: {', '.join(dup)}")
        return v


class _DaemonConfig(_Model):
    """What every daemon (party or dealer) has: identity, addresses, state, peers, policy."""

    identity: IdentityConfig
    listen: ListenAddress
    advertise: HostPort | None = Field(None, validate_default=True)  # = listen (None: listen has port 0)
    state_dir: Path = Field(Path("state"), validate_default=True)
    device: Literal["cpu", "cuda", "auto"] = "auto"
    # torch intra-op threads of a job worker (None: torch's default, every core); set it when
    # several daemons share one machine (the demo: 1), or the workers fight over the cores.
    threads: int | None = Field(None, strict=True, ge=1, le=1024)
    peers: dict[Name, PeerConfig] = Field(default_factory=dict)
    policy: PolicyConfig

    @field_validator("advertise", mode="before")
    @classmethod
    def _advertise_default(cls, v: Any, info: ValidationInfo) -> Any:
        # advertise defaults to listen, unless listen binds a wildcard that peers cannot dial.
        if v is not None:
            return v
        listen = info.data.get("listen")
        if listen is None:
            raise ValueError("defaults to listen, which is missing or invalid")
        host, port = split_host_port(listen, allow_zero=True)
        if host in _WILDCARD_HOSTS:
            raise ValueError(f"required when listen ({listen!r}) binds a wildcard address: "
                             "peers need an address to dial")
        if port == 0:
            return None  # the daemon advertises host:<the port it was given>
        return listen

    @field_validator("state_dir")
    @classmethod
    def _state_dir(cls, v: Path, info: ValidationInfo) -> Path:
        return _resolve(v, info)

    @model_validator(mode="after")
    def _peers_are_others(self) -> _DaemonConfig:
        if self.identity.name in self.peers:
            raise _field_error(f"peers.{self.identity.name}",
                               "a peer cannot have this party's own name (identity.name)")
        return self


class PartyConfig(_DaemonConfig):
    """The whole party daemon config (``mpc-erm party serve --config FILE``).

    ``advertise`` is None only when ``listen`` has port 0 and no advertise was given: the daemon
    then advertises the listen host with the port it was actually given.
    """

    datasets: dict[Name, DatasetConfig] = Field(min_length=1)


class DealerConfig(_DaemonConfig):
    """The dealer daemon config (``mpc-erm dealer serve --config FILE``): a party config without
    datasets (and so without a ledger: the dealer sees no data and spends no budget)."""


_C = TypeVar("_C", bound=_DaemonConfig)
_TOP_LEVEL = set(PartyConfig.model_fields)

_SHORT = {"missing": "required", "extra_forbidden": "unknown field (not allowed here)"}
_BOUNDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"), "less_than": ("<", "lt"),
           "less_than_equal": ("<=", "le")}


def _reason(err: dict[str, Any]) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _SHORT:
        return _SHORT[kind]
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        return f"must be {op} {ctx[key]} (got {err['input']!r})"
    if kind == "literal_error":
        return f"must be {ctx['expected']} (got {err['input']!r})"
    if kind == "too_short" and ctx.get("min_length") == 1:
        return "must not be empty"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if kind.endswith(("_type", "_parsing")) or kind == "finite_number":
        msg += f" (got {err['input']!r})"
    return msg


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors(include_url=False):
        loc = [str(x) for x in err["loc"] if x != "[key]"]  # a bad table key: name the key itself
        if err["type"] == "config_field":
            loc += err["ctx"]["field"].split(".")
            reason = err["ctx"]["reason"]
        else:
            reason = _reason(err)
            if err["type"] == "extra_forbidden" and len(loc) > 1 and loc[-1] in _TOP_LEVEL:
                reason += " (a top-level key? in TOML it must come before the first [table])"
        out.append((".".join(loc), reason))
    return out


def load_party_config(path: str | os.PathLike[str]) -> PartyConfig:
    """Read and validate a party config; every problem is raised together as a ConfigError."""
    return load_model(path, PartyConfig)


def load_dealer_config(path: str | os.PathLike[str]) -> DealerConfig:
    """Read and validate a dealer config; every problem is raised together as a ConfigError."""
    return load_model(path, DealerConfig)


def load_model(path: str | os.PathLike[str], model: type[_C]) -> _C:
    """Read a TOML file into ``model``; every problem (I/O, TOML, validation) in one ConfigError.
    Shared by the party, dealer and coordinator configs."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(p, [("", f"cannot read: {e.strerror or e}")]) from None
    except UnicodeDecodeError as e:
        raise ConfigError(p, [("", f"not UTF-8 text: {e.reason}")]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(p, [("", f"invalid TOML: {e}")]) from None
    try:
        return model.model_validate(raw, context={"base_dir": p.absolute().parent})
    except ValidationError as e:
        raise ConfigError(p, _problems(e)) from None

