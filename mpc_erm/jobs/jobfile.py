"""The job file a user submits with ``mpc-erm job submit job.toml``.

A ``[job]`` table (name, dataset id, parties, trust model, dealer, device) plus the training spec
of :class:`mpc_erm.spec.JobSpec` at top level (``method``, ``[model]``, ``[privacy]``,
``[training]``); see ``coordinator/examples/*.toml``. The text is read by the strict reader of
:mod:`.toml_reader` (size, UTF-8, syntax, nesting); validation is strict (no string for a number,
no unknown key) and every problem is one line ``<file>: <dotted.field>: <reason>`` (``(file)``
for the file as a whole).
:meth:`JobFile.spec_digest` is what all parties compare before the MPC starts.
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mpc_erm.identity_names import validate_name
from mpc_erm.privacy.distributed import NoiseSplit, noise_split
from mpc_erm.privacy.report import Security
from mpc_erm.spec import FEDERATED_TRAINING_FIELDS, NETWORK_MODEL_FIELDS, NETWORK_TRAINING_FIELDS, JobSpec

from .toml_reader import (
    MAX_DEPTH,
    MAX_PROBLEMS,
    MAX_TOML_BYTES,
    TomlProblem,
    dotted,
    parse_toml,
    read_toml_file,
    too_deep,
)
from .toml_reader import short_repr as _short

__all__ = ["MAX_JOB_FILE_BYTES", "MAX_PARTIES", "MIN_PARTIES", "Device", "JobFile", "JobFileError", "JobTable",
           "Security", "Trust", "load_job_file", "parse_job_file"]

Trust = Literal["dealer", "replicated"]
Device = Literal["cpu", "cuda", "auto"]
MIN_PARTIES, MAX_PARTIES = 2, 16
#: A job with data owners names them all (the thesis's experiments run up to 50,000).
MAX_OWNERS = 100_000
#: A job file is a few hundred bytes, but its owner list may hold MAX_OWNERS names of up to 64
#: characters (about 6.7 MB); anything over this is refused before it is read (the daemon has the
#: same bound on SubmitJob's job_toml).
MAX_JOB_FILE_BYTES = 8 * MAX_TOML_BYTES
_SLUG = re.compile(r"[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?")
_DATASET = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_FIELD_PREFIX = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*): (.*)", re.S)  # "model.lam: reason" in a ValueError
_TOML_TYPES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "an array",
               dict: "a table", dt.date: "a date", dt.datetime: "a date-time", dt.time: "a time"}


class JobFileError(ValueError):
    """A job file that must not run; ``str()`` is one ``<file>: <field>: <reason>`` line per problem."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))

    @classmethod
    def of(cls, source: str, problem: TomlProblem) -> JobFileError:
        """The reader's problem as a job file error line: ``(file)`` names the file as a whole."""
        if problem.field is None:
            return cls([f"{source}: {problem.reason}"])
        return cls([f"{source}: {problem.field or '(file)'}: {problem.reason}"])


def _identity(name: str) -> str:
    if len(name) > 64:  # before the PKI's check, whose message quotes the whole name
        raise ValueError(f"must be 1-64 characters from [A-Za-z0-9._-], got {_short(name)}")
    try:
        return validate_name(name, "name")  # the PKI's alphabet: these names are certificate CNs
    except ValueError as exc:
        raise ValueError(str(exc).removeprefix("name: ")) from None


Identity = Annotated[str, AfterValidator(_identity)]


def _distinct(names: tuple[str, ...], what: str) -> tuple[str, ...]:
    """``names`` unless one repeats, case-insensitively: names become file names and certificate CNs."""
    seen: set[str] = set()
    for n in names:
        if n.lower() in seen:
            raise ValueError(f"duplicate {what} {n!r}")
        seen.add(n.lower())
    return names


def _security_problems(security: str, trust: str, parties: int) -> list[str]:
    """Why ``security`` cannot run with ``trust`` (docs/explanation/trust-models.md): a dealer is
    trusted by construction, and the malicious-secure protocol is for three parties."""
    if security != "malicious":
        return []
    if trust == "dealer":
        return ['security: "malicious" cannot run with trust = "dealer": the dealer makes every product\'s '
                "correlated randomness and is trusted by construction; a malicious-secure job needs "
                'trust = "replicated" (three compute parties, honest majority)']
    if parties != 3:
        return [f'security: "malicious" runs on exactly three compute parties (honest majority), not {parties}']
    return []


def _malicious_job_problems(spec: JobSpec, test_no_noise: bool) -> list[str]:
    """What the malicious-secure mode does not cover yet: it proves every party's and every data
    owner's input and checks every opening, with each compute party's own noise share; the in-MPC
    sampler's circuits are not verified."""
    out = []
    if spec.privacy.noise != "distributed":
        out.append('privacy.noise: security = "malicious" needs noise = "distributed" (each compute party proves '
                   "its own noise share within its bound; the in-MPC sampler's circuits are not verified yet)")
    f = spec.federated
    if f is not None and f.sampling == "uniform":
        out.append('federated.sampling: security = "malicious" needs "poisson" (each owner tosses its own coin); '
                   "the compute parties' secret shuffle behind \"uniform\" is not verified yet")
    if test_no_noise:
        out.append('job.test_no_noise: not with security = "malicious" (a test switch of the semi-honest engine)')
    return out


class JobTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    dataset: str
    parties: tuple[Identity, ...]
    trust: Trust
    security: Security = "semi-honest"
    dealer: Identity | None = None
    device: Device | None = None
    # Tests only: the aggregate gets NO noise (to compare daemons with the simulator bit for bit).
    # Every party refuses such a job unless its policy sets allow_test_only.
    test_no_noise: bool = False
    # Many data owners (docs/explanation/architecture.md §2): ``parties`` are then the compute parties, which
    # hold no rows; each owner (a certificate with role "owner") sends shares of its contribution.
    owners: tuple[Identity, ...] = ()
    features: int | None = None  # with owners: the public feature count of every owner's rows
    # with owners: how long a round waits for the enrolled owners; one not in by then is left out
    # of that round by every compute party (the first round also waits for owners to enrol: 10×)
    round_deadline_s: float | None = None
    # The sha256 of the data schema every member must hold for ``dataset`` (`mpc-erm data check`
    # prints it); a member whose schema differs refuses the job before it joins anyone.
    schema_sha256: str | None = None

    @field_validator("schema_sha256")
    @classmethod
    def _sha256(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError(f"must be 64 lower-case hex digits (`mpc-erm data check` prints it), got {_short(v)}")
        return v

    @field_validator("owners")
    @classmethod
    def _owner_count(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(v) > MAX_OWNERS:
            raise ValueError(f"at most {MAX_OWNERS} owners, got {len(v)}")
        return _distinct(v, "owner")

    @field_validator("features")
    @classmethod
    def _features(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= 10_000_000:
            raise ValueError(f"must be 1 to 10000000, got {v}")
        return v

    @field_validator("name")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not _SLUG.fullmatch(v):
            raise ValueError(f"must be a slug (1-64 of [a-z0-9_-], starting and ending alphanumeric), got {_short(v)}")
        return v

    @field_validator("dataset")
    @classmethod
    def _dataset_id(cls, v: str) -> str:
        if not _DATASET.fullmatch(v):
            raise ValueError(f"must be a data set id (1-64 of [A-Za-z0-9._-], starting alphanumeric), got {_short(v)}")
        return v

    @field_validator("parties", "owners", mode="before")
    @classmethod
    def _array(cls, v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v  # TOML arrays arrive as lists; strict mode wants a tuple

    @field_validator("parties")
    @classmethod
    def _count(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not MIN_PARTIES <= len(v) <= MAX_PARTIES:
            raise ValueError(f"needs {MIN_PARTIES} to {MAX_PARTIES} parties, got {len(v)}")
        return _distinct(v, "party")

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> JobTable:
        problems = []
        if self.trust == "dealer" and self.dealer is None:
            problems.append('dealer: required when trust = "dealer" (the identity that deals Beaver triples)')
        if self.trust == "replicated":
            if self.dealer is not None:
                problems.append('dealer: only for trust = "dealer"; replicated sharing has no dealer')
            if len(self.parties) != 3:
                problems.append(f'parties: trust = "replicated" needs exactly 3, got {len(self.parties)}')
        problems += _security_problems(self.security, self.trust, len(self.parties))
        if self.dealer is not None and self.dealer.lower() in {p.lower() for p in self.parties}:
            problems.append(f"dealer: {self.dealer!r} is also a party; the dealer must be a separate identity")
        members = {p.lower() for p in self.parties} | ({self.dealer.lower()} if self.dealer else set())
        problems += [f"owners: {o!r} is also a compute party or the dealer" for o in self.owners
                     if o.lower() in members]
        if self.owners and self.features is None:
            problems.append("features: required with owners (the compute parties hold no rows to count them)")
        if self.features is not None and not self.owners:
            problems.append("features: only with owners (the parties' own rows give it)")
        if self.round_deadline_s is not None and not (self.owners and 0.1 <= self.round_deadline_s <= 3600):
            problems.append("round_deadline_s: 0.1 to 3600 seconds, and only with owners")
        known = (info.context or {}).get("known_parties")
        if known is not None:
            problems += [f"parties: unknown party {p!r}" for p in self.parties if p not in known]
            if self.dealer is not None and self.dealer not in known:
                problems.append(f"dealer: unknown identity {self.dealer!r}")
        if problems:
            raise ValueError("\n".join(problems))
        return self


class JobFile(BaseModel):
    """A whole job: the ``[job]`` table and the training spec every party must agree on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: JobTable
    spec: JobSpec
    # the digest, computed once: a job of 50,000 owners hashes a megabyte, and each owner asks often
    _digest: str | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _real_job(self) -> JobFile:
        problems = []
        if self.spec.seed is not None:
            problems.append("seed: simulation only (it seeds plaintext noise); a job samples its noise in the MPC")
        m = self.spec.model
        if m.n_classes is not None and m.name != "softmax" and not m.is_network:
            problems.append(f"model.n_classes: only for softmax and networks, not {m.name}")
        if self.job.owners:
            problems += _owner_job_problems(self.spec, len(self.job.owners))
            f = self.spec.federated
            if f is not None and f.sampling == "uniform" and (self.job.trust != "replicated"
                                                               or len(self.job.parties) != 3):
                problems.append("federated.sampling: \"uniform\" draws each round's owners by a secret shuffle among "
                                "exactly three compute parties: set job.trust = \"replicated\" with three parties "
                                "(or sampling = \"poisson\": each owner tosses its own coin)")
        elif self.spec.federated is not None:
            problems.append("federated: a federated job runs with data owners: list them in job.owners")
        problems += self._pooled_batch_problems()
        if self.job.security == "malicious":
            problems += _malicious_job_problems(self.spec, self.job.test_no_noise)
        shape = m.input_shape
        if self.job.owners and m.is_network and shape is not None and self.job.features is not None \
                and self.job.features != math.prod(shape):
            problems.append(f"job.features: model.input_shape {list(shape)} takes {math.prod(shape)} values per row, "
                            f"not {self.job.features}")
        if self.spec.method == "output" and self.spec.privacy.mechanism == "l2_laplace":
            problems.append("privacy.mechanism: 'l2_laplace' (the simulator's default) is not sampled inside the MPC; "
                            "set mechanism = \"gaussian\" ((ε, δ)) or \"laplace_thesis\" (pure ε, per-coordinate "
                            "discrete Laplace with Δ₁ = √d·Δ₂)")
        elif not problems:  # the job's privacy must be plannable as written (the daemons plan it the same way)
            from mpc_erm.privacy.plan import PlanError, plan_job

            try:
                plan_job(self.spec, sampler="mpc", test_no_noise=self.job.test_no_noise, noise_split=self.noise_split())
            except PlanError as exc:
                problems.append(str(exc))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _pooled_batch_problems(self) -> list[str]:
        """A batch of exactly b pooled rows (``training.batch_size``) is drawn by the three parties'
        secret shuffle, with every party's count public in ``privacy.party_rows``."""
        b, rows = self.spec.training.batch_size, self.spec.privacy.party_rows
        if b is None:
            return []
        out = []
        if self.job.owners:
            out.append("training.batch_size: a batch of the parties' pooled rows, not of data owners")
        if self.job.trust != "replicated" or len(self.job.parties) != 3:
            out.append('training.batch_size: the batch is drawn by a secret shuffle among exactly three parties: set '
                       'job.trust = "replicated" with three parties (or training.sampling_rate: Poisson batches)')
        if rows is not None and set(rows) != set(self.job.parties):
            out.append(f"privacy.party_rows: one public row count for each of job.parties {list(self.job.parties)}, "
                       f"got {sorted(rows)}")
        if self.job.security == "malicious":
            out.append('training.batch_size: security = "malicious" needs Poisson batches (training.sampling_rate); '
                       "the parties' secret shuffle is not verified yet")
        return out

    @classmethod
    def from_toml_dict(cls, raw: dict[str, Any], source: str = "<job>",
                       known_parties: Iterable[str] | None = None) -> JobFile:
        """Validate the parsed TOML (``[job]`` + JobSpec keys at top level); raises :class:`JobFileError`."""
        data: dict[str, Any] = {"spec": {k: v for k, v in raw.items() if k != "job"}}
        if "job" in raw:
            data["job"] = raw["job"]
        table = raw.get("job") if isinstance(raw.get("job"), dict) else {}
        # a softmax job may leave model.n_classes to the schema it pins: every member holds that schema
        # (its digest is compared before a share moves), so its label's classes are the job's
        pinned = bool(table.get("schema_sha256")) and not table.get("owners") and "federated" not in raw
        context = {"known_parties": None if known_parties is None else frozenset(known_parties),
                   "classes_from_schema": pinned}
        deep = too_deep(raw)
        if deep is not None:
            raise JobFileError([f"{source}: {deep}: nested more than {MAX_DEPTH} levels deep"])
        try:
            return cls.model_validate(data, strict=True, context=context)
        except ValidationError as exc:
            lines: list[str] = []
            errors = exc.errors()
            for err in errors:
                lines += _explain(err)
                if len(lines) >= MAX_PROBLEMS:
                    break
            if len(errors) > MAX_PROBLEMS or len(lines) > MAX_PROBLEMS:
                lines = lines[:MAX_PROBLEMS] + [f"(file): and more problems ({len(errors)} fields in all); "
                                                "fix these first"]
            raise JobFileError(f"{source}: {line}" for line in lines) from None

    def with_schema_classes(self, n_classes: int) -> JobFile:
        """This job with a softmax's ``model.n_classes`` taken from the pinned schema's classes where
        the job file leaves it out (itself otherwise): what a party trains and ``job plan`` forecasts.
        The job's digest stays the one of the file as written, which every member agrees on."""
        if not self.classes_from_schema:
            return self
        out = self.model_copy(update={"spec": self.spec.with_classes(n_classes)})
        out._digest = self.spec_digest()
        return out

    @property
    def classes_from_schema(self) -> bool:
        """A softmax job whose class count its pinned schema gives (``model.n_classes`` left out)."""
        return self.spec.model.name == "softmax" and self.spec.model.n_classes is None

    def canonical_json(self) -> str:
        return json.dumps(self._dump(), sort_keys=True, separators=(",", ":"))

    def _dump(self) -> dict[str, Any]:
        """The job as JSON; a job without owners reads as before owners existed (same digest)."""
        d = self.model_dump(mode="json")
        d["spec"] = self.spec._dump()
        if not self.job.owners:
            for k in ("owners", "features", "round_deadline_s"):
                d["job"].pop(k)
        if self.job.schema_sha256 is None:
            d["job"].pop("schema_sha256")  # a job without a pinned schema keeps its digest
        if self.job.security == "semi-honest":
            d["job"].pop("security")  # the default: a job that does not name it keeps its digest
        return d

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> JobFile:
        """A copy; one with ``update`` computes its own digest."""
        out = super().model_copy(update=update, deep=deep)
        if update:
            out._digest = None
        return out

    def noise_split(self) -> NoiseSplit:
        """How distributed noise (``privacy.noise = "distributed"``) is split among the job's compute
        parties, and how many of them its trust model counts honest (mpc_erm.privacy.distributed)."""
        return noise_split(self.job.trust, len(self.job.parties))

    def spec_digest(self) -> str:
        """sha256 (hex) of the canonical JSON of the whole job; every party compares it before the MPC."""
        if self._digest is None:
            self._digest = hashlib.sha256(self.canonical_json().encode()).hexdigest()
        return self._digest

    def to_toml(self) -> str:
        """The job as a TOML file that :func:`load_job_file` reads back to an equal object."""
        flat: dict[str, Any] = {"job": {k: v for k, v in self._dump()["job"].items() if v is not None}}
        # a linear job leaves the networks' fields at their defaults (JobSpec refuses anything else)
        fed = self.spec.federated is not None
        skip = None if self.spec.model.is_network else {
            "model": set(NETWORK_MODEL_FIELDS) - ({"init_seed"} if fed else set()),
            "training": set(NETWORK_TRAINING_FIELDS) - (set(FEDERATED_TRAINING_FIELDS) if fed else set())}
        flat.update(self.spec.model_dump(mode="json", exclude_none=True, exclude=skip))
        lines = [f"{k} = {_toml_value(v)}" for k, v in flat.items() if not isinstance(v, dict)]
        for table, body in flat.items():
            if isinstance(body, dict):
                lines += ["", f"[{table}]", *(f"{k} = {_toml_value(v)}" for k, v in body.items())]
        return "\n".join(lines) + "\n"


def _owner_job_problems(spec: JobSpec, owners: int) -> list[str]:
    """What a job with data owners supports: the thesis's full-batch gradient rounds or its output
    perturbation (one release of the owners' local minimisers, weighted n_j/n̂) on a linear model,
    or DP-Fed-LS (``[federated]``: local epochs at each owner, the owner the unit of privacy);
    owners added or removed (the normaliser n̂ is public; an owner's row count and whether it
    dropped out of a round then move no public weight)."""
    problems = []
    if spec.transfer is not None:
        problems.append("transfer: knowledge transfer runs on compute parties that hold their own rows (each scores "
                        "its certified local model on the public rows); a job with data owners cannot use it")
    if spec.model.is_network and spec.federated is None:
        problems.append(f"model.name: {spec.method} rounds with owners train a linear model, not "
                        f"{spec.model.name!r}; a network trains in a federated job ([federated])")
    if spec.privacy.adjacency != "add_remove":
        problems.append('privacy.adjacency: a job with owners needs "add_remove" with a public_n (owners may drop '
                        "out of a round; their row counts stay private)")
    elif spec.federated is not None and spec.privacy.public_n != owners:
        problems.append(f"privacy.public_n: a federated job's unit of privacy is the owner: set it to the number "
                        f"of owners ({owners}); each round's sum is divided by τ·public_n")
    return problems


def parse_job_file(text: str, source: str = "<job>", known_parties: Iterable[str] | None = None) -> JobFile:
    """Parse and validate job TOML; any problem (size, syntax, nesting, fields) is a :class:`JobFileError`."""
    try:
        raw = parse_toml(text, max_bytes=MAX_JOB_FILE_BYTES)
    except TomlProblem as problem:
        raise JobFileError.of(source, problem) from None
    return JobFile.from_toml_dict(raw, source, known_parties)


def load_job_file(path: str | os.PathLike[str], known_parties: set[str] | None = None) -> JobFile:
    """Read and validate a job file; with ``known_parties``, party and dealer names must be among them.
    Only a regular file of at most MAX_JOB_FILE_BYTES is read (not a FIFO or /dev/zero)."""
    source = os.fspath(path)
    try:
        raw = read_toml_file(path, max_bytes=MAX_JOB_FILE_BYTES)
    except TomlProblem as problem:
        raise JobFileError.of(source, problem) from None
    return JobFile.from_toml_dict(raw, source, known_parties)


# --------------------------------------------------------------------------- error lines


def _keys_at(loc: tuple[str | int, ...]) -> list[str]:
    cls: type[BaseModel] = JobFile
    for part in loc:
        field = cls.model_fields.get(str(part))
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        cls = ann
    keys = set(cls.model_fields)
    return sorted(keys - {"seed"} | {"job"} if cls is JobSpec else keys)


def _num(x: Any) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)  # "> 0", not "> 0.0"


def _reason(err: Any) -> str:
    kind, value = err["type"], err.get("input")
    ctx = {k: _num(v) for k, v in (err.get("ctx") or {}).items()}
    got = _TOML_TYPES.get(type(value), type(value).__name__)
    simple = {
        "missing": "required", "finite_number": "must be finite",
        "greater_than": f"must be > {ctx.get('gt')}", "greater_than_equal": f"must be >= {ctx.get('ge')}",
        "less_than": f"must be < {ctx.get('lt')}", "less_than_equal": f"must be <= {ctx.get('le')}",
        "literal_error": f"must be {ctx.get('expected')}, got {_short(value)}",
        "float_type": f"must be a number, got {got}", "int_type": f"must be an integer, got {got}",
        "int_from_float": f"must be an integer, got {_short(value)}", "string_type": f"must be a string, got {got}",
        "tuple_type": f"must be an array, got {got}", "model_type": f"must be a table, got {got}",
        "bool_type": f"must be a boolean, got {got}",
    }
    return simple.get(kind, err["msg"])


#: Keys and values other DP-SGD tools use, and what this job file says instead: the hint a guess
#: made from Opacus, TF-Privacy or Flower gets beside "unknown key" or a refused value.
_OTHER_TOOLS: dict[str, str] = {
    "epochs": "rounds are training.iterations (an epoch is about 1/training.sampling_rate of them)",
    "batch_size": "training.batch_size: exactly b of the parties' pooled rows a round (privacy.party_rows, "
                  "adjacency = 'replace'); or training.sampling_rate: each party draws each record into a round "
                  "with that probability (Poisson), the expected batch sampling_rate × privacy.public_n",
    "noise_multiplier": "the plan chooses it from privacy.epsilon and privacy.delta (`mpc-erm job plan` prints it)",
    "max_grad_norm": "the per-example clip is privacy.clip",
    "l2_norm_clip": "the per-example clip is privacy.clip",
    "lr": "the step is training.learning_rate",
    "target_epsilon": "ε is privacy.epsilon", "target_delta": "δ is privacy.delta",
}
_METHOD_WORDS = {"dpsgd", "dp-sgd", "dp_sgd", "dpadam", "dp-adam", "sgd", "adam", "fedavg", "dp-fedavg", "dpfedavg",
                 "srm", "dpsrm", "dp-srm", "dp_srm"}


def _explain(err: Any) -> list[str]:
    raw = tuple(err["loc"])
    loc = raw[1:] if raw[:1] == ("spec",) else raw  # the spec's tables sit at the file's top level
    if err["type"] == "extra_forbidden":
        keys = _keys_at(raw[:-1])
        near = difflib.get_close_matches(str(loc[-1]), keys, n=1)
        hint = (_OTHER_TOOLS.get(str(loc[-1])) or (f"did you mean {near[0]!r}?" if near else None)
                or f"expected one of {', '.join(keys)}")
        return [f"{dotted(loc)}: unknown key; {hint}"]
    value = err.get("input")
    if loc == ("method",) and isinstance(value, str) and value.strip().lower() in _METHOD_WORDS:
        return [f"method: must be 'output' or 'gradient', got {_short(value)}; DP-SGD, DP-Adam and DP-SRM are "
                "method = 'gradient' with a network [model] (mlp, mnist_cnn, ...), training.sampling_rate and "
                "training.optimizer; a job with data owners adds [federated] for DP-Fed "
                "(docs/tutorials/images.md has a whole network job)"]
    if err["type"] != "value_error":
        return [f"{dotted(loc) or '(file)'}: {_reason(err)}"]
    lines = []
    for line in str(err["ctx"]["error"]).splitlines():
        m = _FIELD_PREFIX.fullmatch(line)  # model-level checks name their field at the start of the message
        path, reason = (dotted(loc + tuple(m[1].split("."))), m[2]) if m else (dotted(loc), line)
        lines.append(f"{path or '(file)'}: {reason}")
    return lines


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)  # repr of a finite float is valid TOML (1e-05, 0.001, 1.0)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")  # a JSON string is a TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")
