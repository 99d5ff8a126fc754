"""The party daemon's TOML configuration, validated before the daemon touches a socket or a file.

Why so strict: a party's config is its security policy (who may submit jobs, how much ε a job and a
data set may spend). A typo must stop the daemon with a line naming the field, not silently fall
back to a default, so unknown keys are refused (``extra="forbid"``), numbers and booleans are
strict (TOML ``"1.0"`` is not a number, ``1`` is not ``true``), and all field problems are reported
at once as ``<file>: <dotted.field>: <reason>`` (cross-field checks, e.g. ``part < of``, run once
the fields of their table are valid).

The file is read by the strict TOML reader shared with job files (:mod:`mpc_erm.jobs.toml_reader`:
size, UTF-8, syntax, nesting). Relative paths are resolved against the config file's directory (not
the daemon's working directory), so a config and its keys can be moved together. See
``example-party.toml``.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

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

from mpc_erm.jobs.toml_reader import MAX_PROBLEMS, MAX_TOML_BYTES, TomlProblem, field_part, read_toml_file, short_repr
from mpc_erm.plugin_ids import ENTRY_POINT

__all__ = [
    "WILDCARD_HOSTS",
    "ConfigError",
    "ConfigModel",
    "DaemonConfig",
    "DatasetConfig",
    "DealerConfig",
    "load_model",
    "IdentityConfig",
    "OwnerConfig",
    "PartyConfig",
    "PeerConfig",
    "PolicyConfig",
    "load_daemon_identity",
    "load_dealer_config",
    "load_owner_config",
    "load_party_config",
    "check_name",
    "split_host_port",
    "validation_problems",
]

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_HOST_RE = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                      r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
#: Hosts that bind every interface: a daemon may listen on one, but peers cannot dial it.
WILDCARD_HOSTS = {"0.0.0.0", "::"}
#: A config is a few kB; a bigger file is refused before it is read (no /dev/zero, no 1 GB TOML).
MAX_CONFIG_BYTES = MAX_TOML_BYTES
#: Default and ceiling of ``datasets.<id>.max_bytes``: a data file larger than this is refused
#: before a byte of it is read (mpc_erm.data.loaders.DEFAULT_MAX_BYTES, 512 MiB).
DEFAULT_DATA_MAX_BYTES = 512 << 20
MAX_DATA_MAX_BYTES = 1 << 40


class ConfigError(ValueError):
    """A config that cannot be used; ``str()`` is one ``<file>: <field>: <reason>`` line per problem."""

    def __init__(self, path: str | os.PathLike[str], problems: list[tuple[str, str]]) -> None:
        self.path = Path(path)
        self.problems = problems
        super().__init__("\n".join(f"{self.path}: {f}: {r}" if f else f"{self.path}: {r}"
                                   for f, r in problems))


def check_name(v: str) -> str:
    """``v`` if it is a valid member, data set or plugin name (the :data:`Name` of every config),
    else a ValueError saying which characters are allowed."""
    if not _NAME_RE.fullmatch(v):
        raise ValueError(f"{short_repr(v)} is not a valid name: lower-case letters, digits, '_' and '-', "
                         "starting with a letter or digit, at most 63 characters")
    return v


def split_host_port(v: str, *, allow_zero: bool = False) -> tuple[str, int]:
    """``"host:port"`` → (host, port); IPv6 hosts in brackets (``"[::1]:7000"``). ``allow_zero``
    accepts port 0 (a listen address: the OS picks a free port, the daemon reports it)."""
    if len(v) > 300:  # a host name is at most 253 characters
        raise ValueError(f"{short_repr(v)} is not host:port (too long)")
    host, sep, port = v.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{v!r} is not host:port")
    low = 0 if allow_zero else 1
    if not port.isascii() or not port.isdigit() or len(port) > 5 or not low <= int(port) <= 65535:
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


Name = Annotated[str, AfterValidator(check_name)]
HostPort = Annotated[str, AfterValidator(_host_port)]
ListenAddress = Annotated[str, AfterValidator(_listen_address)]  # port 0: any free port
PositiveFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]


def _field_error(field: str, reason: str) -> PydanticCustomError:
    """An error for ``field`` (dotted, relative to the model) raised by a model-level check, so
    that the report still names the field rather than the enclosing table."""
    return PydanticCustomError("config_field", "{field}: {reason}", {"field": field, "reason": reason})


def _resolve(v: Path, info: ValidationInfo) -> Path:
    if "\x00" in str(v):
        raise ValueError(f"must not contain a NUL character: {short_repr(str(v))}")
    if len(str(v)) > 4096:  # PATH_MAX
        raise ValueError(f"path longer than 4096 characters: {short_repr(str(v))}")
    base = (info.context or {}).get("base_dir")
    try:
        v = v.expanduser()  # "~nosuchuser/x" raises RuntimeError
    except RuntimeError as exc:
        raise ValueError(f"{short_repr(str(v))}: {exc}") from None
    return (Path(base) / v if base is not None and not v.is_absolute() else v).absolute()


def _checks_files(info: ValidationInfo) -> bool:
    """Whether the files a config names must exist here (the default). ``mpc-erm provision``
    validates data set tables for other machines with ``context={"check_files": False}``: the
    paths are resolved and checked for form, but the data lives at each member's site."""
    return bool((info.context or {}).get("check_files", True))


def _existing_file(v: Path | None, info: ValidationInfo) -> Path | None:
    if v is None:
        return None
    p = _resolve(v, info)
    if not _checks_files(info):
        return p
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ValueError(f"file not found: {short_repr(str(p))}") from None
    except OSError as exc:  # a component too long, not a directory, a loop of links, no permission
        raise ValueError(f"cannot use {short_repr(str(p))}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"not a regular file: {short_repr(str(p))}")
    return p


class ConfigModel(BaseModel):
    """The base of every config table: unknown keys refused, values frozen once validated (the
    party, dealer, owner and coordinator configs and the consortium file of ``mpc-erm provision``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class IdentityConfig(ConfigModel):
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


class PeerConfig(ConfigModel):
    """Another identity this party talks to, and where to reach it."""

    address: HostPort
    role: Literal["party", "dealer"]


class DatasetConfig(ConfigModel):
    """A data set this party offers, with its lifetime privacy budget (ε, δ).

    ``csv``/``libsvm``/``npz`` read ``path`` (``label`` names the csv label column; an npz may hold
    images X of shape (n, H, W) or (n, C, H, W)); ``idx`` reads images from ``path`` and their
    labels from ``labels`` (MNIST's format, pixels scaled to [0, 1]); ``png`` reads the CSV at
    ``path`` (columns ``file`` and ``label``, or the column ``label`` names) and the PNG images it
    lists beside it (greyscale or RGB, one size); ``builtin``
    loads the named data set of :mod:`mpc_erm.data` and keeps shard ``part`` of ``of`` (for
    demos and tests: every party then holds a disjoint slice of the same public set).
    """

    format: Literal["csv", "libsvm", "npz", "idx", "png", "builtin"]
    path: Path | None = None
    labels: Path | None = None  # idx: the labels' IDX file
    label: str | None = Field(None, min_length=1)
    # The public data schema (mpc_erm.data.schema): how raw rows become features and labels —
    # public bounds, categories, label mapping, intercept, missing values. csv only; its digest
    # is compared by every member before a share moves.
    feature_schema: Path | None = Field(None, alias="schema")
    epsilon: float = Field(strict=True, gt=0, le=1e6, allow_inf_nan=False)  # lifetime; a job asks <= 100
    delta: float = Field(strict=True, ge=0, lt=1, allow_inf_nan=False)
    # The relation the lifetime budget is stated under (mpc_erm.privacy.events): "replace" admits
    # every job (add/remove jobs are converted); "add_remove" admits only add/remove jobs.
    adjacency: Literal["replace", "add_remove"] = "replace"
    name: str | None = None
    part: int = Field(0, strict=True, ge=0, le=1_000_000)
    of: int = Field(1, strict=True, ge=1, le=1_000_000)
    # The file is refused, before it is read, when larger than this (here at start-up and again by
    # the job's loader), and a gzip file when it inflates past it: no party runs out of memory on
    # a file it was handed. Raise it deliberately for big data (memory: ~4-8 bytes per file byte).
    max_bytes: int = Field(DEFAULT_DATA_MAX_BYTES, strict=True, ge=1, le=MAX_DATA_MAX_BYTES)
    # Public bounds [low, high] every feature value must lie in; a row outside is refused naming
    # the file, column and row (None: no check; the worker still clips rows into the unit ball).
    feature_range: tuple[float, float] | None = None
    # Rows held out of every job on this data set (the same rows each time), for this party's own
    # validation metrics in the job's .private/ (never sent: no ε covers them).
    validation_fraction: float = Field(0.0, strict=True, ge=0.0, le=0.5, allow_inf_nan=False)
    # A labelled CSV of PUBLIC rows (a published test set, never this party's own data), read
    # through the schema: each job's curve scores the released model on it, and those figures go
    # to every member in metrics.json and training_curve.png without any ε covering them.
    public_test: Path | None = None

    _path = field_validator("path", "labels", "feature_schema", "public_test")(_existing_file)

    @field_validator("feature_range", mode="before")
    @classmethod
    def _range_array(cls, v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v  # TOML arrays arrive as lists

    @field_validator("feature_range")
    @classmethod
    def _range(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not (math.isfinite(v[0]) and math.isfinite(v[1]) and v[0] < v[1]):
            raise ValueError(f"must be [low, high] with finite low < high, got {list(v)}")
        return v

    @field_validator("feature_schema")
    @classmethod
    def _schema(cls, v: Path | None) -> Path | None:
        if v is not None and v.is_file():  # (a file the skip-existence context left unchecked is not read)
            from mpc_erm.data.dataset import DataError
            from mpc_erm.data.schema import load_schema  # lazy: pulls in pandas

            try:
                load_schema(v)
            except DataError as exc:
                raise ValueError(str(exc)) from None
        return v

    def schema(self) -> Any:
        """The parsed :class:`~mpc_erm.data.schema.DataSchema`, or None without a schema file."""
        if self.feature_schema is None:
            return None
        from mpc_erm.data.schema import load_schema

        return load_schema(self.feature_schema)

    @model_validator(mode="after")
    def _by_format(self, info: ValidationInfo) -> DatasetConfig:
        given = self.model_fields_set
        if self.format == "builtin":
            for f in ("path", "label", "labels", "max_bytes", "feature_range"):
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
        if self.feature_schema is not None and self.format != "csv":
            raise _field_error("schema", f"only for format 'csv' (a schema maps a table's columns), "
                                         f"not {self.format!r}")
        if self.format == "csv" and self.label is None and self.feature_schema is None:
            raise _field_error("label", "required for format 'csv' without a schema (the label column's name)")
        if self.public_test is not None and self.feature_schema is None:
            raise _field_error("public_test", "needs a schema (the public rows are read through it, as the "
                                              "training rows are)")
        if self.feature_schema is not None and self.feature_range is not None:
            raise _field_error("feature_range", "not with a schema (its columns carry their own public bounds)")
        if self.label is not None and self.feature_schema is not None and self.feature_schema.is_file():
            column = self.schema().label.column
            if self.label != column:
                raise _field_error("label", f"{self.label!r} differs from the schema's label column {column!r}")
        if self.format not in ("csv", "png") and self.label is not None:
            raise _field_error("label", f"only allowed for formats 'csv' and 'png', not {self.format!r}")
        if self.format == "idx" and self.labels is None:
            raise _field_error("labels", "required for format 'idx' (the labels' IDX file)")
        if self.format != "idx" and self.labels is not None:
            raise _field_error("labels", f"only allowed for format 'idx', not {self.format!r}")
        if not _checks_files(info):
            return self
        try:
            size = self.path.stat().st_size
        except OSError as exc:
            raise _field_error("path", f"cannot use {self.path}: {exc.strerror or exc}") from None
        if size > self.max_bytes:
            raise _field_error("path", f"{self.path} is {size:,} bytes, larger than max_bytes ({self.max_bytes:,}); "
                                       "refused before reading (raise max_bytes deliberately for a bigger file)")
        return self


class PolicyConfig(ConfigModel):
    """What this party accepts; checked for every job before the ledger is asked for budget."""

    allowed_coordinators: list[Name] = Field(min_length=1)
    allowed_methods: list[Literal["output", "gradient"]] = Field(
        default_factory=lambda: ["output", "gradient"], min_length=1)
    max_epsilon_per_job: float = Field(strict=True, gt=0, le=100, allow_inf_nan=False)  # a job asks <= 100
    max_iterations: int = Field(strict=True, ge=1, le=1_000_000)  # a job asks <= 1,000,000
    allow_test_only: bool = Field(False, strict=True)  # test-only noise / TFP refused unless true

    @field_validator("allowed_coordinators", "allowed_methods")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        dup = sorted({x for x in v if v.count(x) > 1})
        if dup:
            raise ValueError(f"duplicate entries: {', '.join(dup)}")
        return v


# --- per-peer limits (rate limits of the control service and of the job workers' share transport)
class LimitsConfig(ConfigModel):
    """``[limits]``: per caller identity, on the control service, on the workers' share transport and
    on a job's owner intake; a caller over its rate gets RESOURCE_EXHAUSTED. The defaults are far
    above what jobs, coordinators and data owners use (mpc_erm.mpc.ratelimit, mpc_erm.mpc.callers)."""

    control_calls_per_s: PositiveFloat = 200.0
    control_burst: int = Field(2000, strict=True, ge=1)
    transport_calls_per_s: PositiveFloat = 20_000.0
    transport_burst: int = Field(50_000, strict=True, ge=1)
    owner_calls_per_s: PositiveFloat = 200.0
    owner_burst: int = Field(2000, strict=True, ge=1)
    transport_max_message_bytes: int = Field(2 << 30, strict=True, ge=1 << 20)  # one tensor/object


class _DaemonConfig(ConfigModel):
    """What every daemon (party or dealer) has: identity, addresses, state, peers, policy."""

    identity: IdentityConfig
    listen: ListenAddress
    advertise: HostPort | None = Field(None, validate_default=True)  # = listen (None: listen has port 0)
    state_dir: Path = Field(Path("state"), validate_default=True)
    device: Literal["cpu", "cuda", "auto"] = "auto"
    # torch intra-op threads of a job worker (None: torch's default, every core); set it when
    # several daemons share one machine (the demo: 1), or the workers fight over the cores.
    threads: int | None = Field(None, strict=True, ge=1, le=1024)
    # jobs this daemon runs at once, each in its own worker process (memory: ~0.5 GB each); more
    # wait queued, oldest first. See parties.rendezvous for what happens at the bound.
    max_concurrent_jobs: int = Field(4, strict=True, ge=1, le=64)
    # how long a job worker waits on a peer (a share, a triple, an endpoint) before the job fails
    # naming that peer; an organisation's own choice: a slow link needs more, a quick abort less.
    peer_timeout_s: float = Field(120.0, strict=False, ge=5, le=3600, allow_inf_nan=False)
    peers: dict[Name, PeerConfig] = Field(default_factory=dict)
    policy: PolicyConfig
    limits: LimitsConfig = Field(default_factory=lambda: LimitsConfig())

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
        if host in WILDCARD_HOSTS:
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


class ModelPluginConfig(ConfigModel):
    """A network architecture installed at this party: ``entry_point`` is "package.module:function",
    the function building a torch.nn.Module from the job's NetworkSpec. A job pins the sha256 of the
    module's source (``mpc-erm model digest ENTRY_POINT``); a different source here refuses the job."""

    entry_point: str = Field(pattern=f"^{ENTRY_POINT}$")


class OwnerConfig(ConfigModel):
    """A data owner's light process (``mpc-erm owner join``): its identity (role
    ``owner``), the compute parties' daemons it may send shares to, its data sets with their
    lifetime budgets (kept in its own ledger), and the largest ε it lets one job spend."""

    identity: IdentityConfig
    state_dir: Path = Field(Path("state"), validate_default=True)
    device: Literal["cpu", "cuda", "auto"] = "auto"
    max_epsilon_per_job: float = Field(strict=True, gt=0, le=100, allow_inf_nan=False)
    allow_test_only: bool = Field(False, strict=True)
    # an owner that cannot reach a majority of the compute parties for this long gives the job up
    # (one that reaches any which says the job failed ends at once: parties.owner.failures)
    peer_timeout_s: float = Field(120.0, strict=False, ge=5, le=3600, allow_inf_nan=False)
    compute: dict[Name, HostPort] = Field(min_length=2)  # compute party → its daemon's control address
    datasets: dict[Name, DatasetConfig] = Field(min_length=1)

    _state = field_validator("state_dir")(lambda v, info: _resolve(v, info))

    @model_validator(mode="after")
    def _add_remove(self) -> OwnerConfig:
        for k, d in self.datasets.items():
            if d.adjacency != "add_remove":
                raise _field_error(f"datasets.{k}.adjacency", 'an owner\'s data set is "add_remove" (owners may '
                                                              "drop out of a round; the job's normaliser is public)")
        return self


def load_owner_config(path: str | os.PathLike[str]) -> OwnerConfig:
    """Read and validate a data owner's config; every problem is raised together as a ConfigError."""
    return load_model(path, OwnerConfig)


def plugin_entry_point(config: Any, plugin: str | None) -> str:
    """The entry point this party's config maps the job's ``model.plugin`` id to; ValueError naming
    the field and the party when it lists none (admission and the worker both ask here)."""
    models = getattr(config, "models", None) or {}
    entry = models.get(plugin or "")
    if entry is None:
        me = getattr(config.identity, "name", "this party")
        raise ValueError(f"model.plugin: {me} has no model plugin {plugin!r} "
                         f"(its config's [models] lists: {', '.join(sorted(models)) or 'none'})")
    return str(entry.entry_point)


class PartyConfig(_DaemonConfig):
    """The whole party daemon config (``mpc-erm party serve --config FILE``).

    ``advertise`` is None only when ``listen`` has port 0 and no advertise was given: the daemon
    then advertises the listen host with the port it was actually given.
    """

    datasets: dict[Name, DatasetConfig] = Field(min_length=1)
    # networks this party's own code may build (a job's model.name = "plugin", model.plugin = id):
    # never code a coordinator sends (mpc_erm.models.plugins)
    models: dict[Name, ModelPluginConfig] = Field(default_factory=dict)


class DealerConfig(_DaemonConfig):
    """The dealer daemon config (``mpc-erm dealer serve --config FILE``): a party config without
    datasets (and so without a ledger: the dealer sees no data and spends no budget)."""


DaemonConfig = PartyConfig | DealerConfig  # what a daemon (and each of its job's workers) is configured by


def load_daemon_identity(cfg: DaemonConfig) -> Any:
    """The daemon's TLS identity (a :class:`mpc_erm.mpc.pki.Identity`) from ``[identity]``
    (``IdentityConfig.load``) in the daemon's role."""
    return cfg.identity.load("dealer" if isinstance(cfg, DealerConfig) else "party")


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
        return f"must be {op} {ctx[key]} (got {short_repr(err['input'])})"
    if kind == "literal_error":
        return f"must be {ctx['expected']} (got {short_repr(err['input'])})"
    if kind == "too_short" and ctx.get("min_length") == 1:
        return "must not be empty"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if kind.endswith(("_type", "_parsing")) or kind == "finite_number":
        msg += f" (got {short_repr(err['input'])})"
    return msg


def validation_problems(exc: ValidationError) -> list[tuple[str, str]]:
    """A pydantic error as (dotted field, reason) pairs, at most :data:`MAX_PROBLEMS` of them: the
    lines of a :class:`ConfigError`."""
    out = []
    errors = exc.errors(include_url=False)
    for err in errors[:MAX_PROBLEMS]:
        loc = [field_part(x) for x in (str(y) for y in err["loc"]) if x != "[key]"]  # a bad key: name it
        if err["type"] == "config_field":
            loc += err["ctx"]["field"].split(".")
            reason = err["ctx"]["reason"]
        else:
            reason = _reason(err)
            if err["type"] == "extra_forbidden" and len(loc) > 1 and loc[-1] in _TOP_LEVEL:
                reason += " (a top-level key? in TOML it must come before the first [table])"
        out.append((".".join(loc), reason))
    if len(errors) > MAX_PROBLEMS:
        out.append(("", f"and {len(errors) - MAX_PROBLEMS} more problems; fix these first"))
    return out


def load_party_config(path: str | os.PathLike[str]) -> PartyConfig:
    """Read and validate a party config; every problem is raised together as a ConfigError."""
    return load_model(path, PartyConfig)


def load_dealer_config(path: str | os.PathLike[str]) -> DealerConfig:
    """Read and validate a dealer config; every problem is raised together as a ConfigError."""
    return load_model(path, DealerConfig)


def load_model(path: str | os.PathLike[str], model: type[_C], *, context: dict[str, Any] | None = None) -> _C:
    """Read a TOML file into ``model``; every problem (I/O, TOML, validation) in one ConfigError.
    Shared by the party, dealer and coordinator configs (and the consortium file of ``mpc-erm
    provision``, whose ``context`` adds ``check_files=False``)."""
    p = Path(path)
    try:
        raw = read_toml_file(p, max_bytes=MAX_CONFIG_BYTES)
    except TomlProblem as problem:
        raise ConfigError(p, [(problem.field or "", problem.reason)]) from None
    try:
        return model.model_validate(raw, context={**(context or {}), "base_dir": p.absolute().parent})
    except ValidationError as e:
        raise ConfigError(p, validation_problems(e)) from None
    except RecursionError:  # tomllib nests ~1000 deep; pydantic gives up earlier on some shapes
        raise ConfigError(p, [("", "tables or arrays nested too deeply")]) from None

