"""Reference and results pages generated from the code at build time (run by mkdocs-gen-files).

Nothing here is hand-copied: the job file and config tables come from the pydantic models' fields
(types, defaults, bounds, and the comment or description the code gives each field), the gRPC page
from ``proto/*.proto``, the error codes from the modules that define them, the privacy report from
its model, and the results page from ``benchmarks/results/*.json``. A field, code or RPC added to
the code appears in the docs at the next ``make docs``.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any

import mkdocs_gen_files
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scrub import scrub  # noqa: E402  (docs/_scripts/scrub.py, shared with the hook)


def write(path: str, text: str) -> None:
    with mkdocs_gen_files.open(path, "w") as f:
        f.write(scrub(text))


def cell(text: Any) -> str:
    """A markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


# --------------------------------------------------------------------------- pydantic models → tables

def _field_comments(cls: type) -> dict[str, str]:
    """The comments the source gives each field: the comment lines right above it and any comment
    on its own lines, joined (``# a comment`` → ``a comment``)."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = src.splitlines()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out: dict[str, str] = {}
    body = ast.parse(src).body[0]
    for node in getattr(body, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above = []
        i = node.lineno - 1
        while i >= 1 and lines[i - 1].strip().startswith("#"):
            above.insert(0, comments.get(i, ""))
            i -= 1
        own = [comments[j] for j in range(node.lineno, (node.end_lineno or node.lineno) + 1) if j in comments]
        text = " ".join(c for c in above + own if c)
        if text:
            out[node.target.id] = text
    return out


def _comments(model: type[BaseModel]) -> dict[str, str]:
    out: dict[str, str] = {}
    for klass in reversed(model.__mro__):
        if isinstance(klass, type) and issubclass(klass, BaseModel) and klass is not BaseModel:
            out.update(_field_comments(klass))
    return out


def _strip_optional(ann: Any) -> Any:
    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(args) == 1:
            return _strip_optional(args[0])
    if origin is typing.Annotated:
        return _strip_optional(typing.get_args(ann)[0])
    return ann


def type_name(ann: Any) -> str:
    ann = _strip_optional(ann)
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Literal:
        return " \\| ".join(f'`{json.dumps(a)}`' for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args if a is not type(None))
    if origin in (tuple, list):
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"array of {type_name(args[0])}"
        if origin is tuple and args:
            return "array [" + ", ".join(type_name(a) for a in args) + "]"
        return f"array of {type_name(args[0])}" if args else "array"
    if origin is dict:
        return f"table of {type_name(args[1])}"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "table"
    return {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}.get(
        ann, "any" if ann is Any else getattr(ann, "__name__", str(ann)))


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (str, Path)):
        return json.dumps(str(v))
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{}" if not v else "{…}"
    if isinstance(v, float) and v.is_integer() and abs(v) >= 1e6:
        return f"{v:.0e}"
    if isinstance(v, int) and v >= 1 << 20 and v & (v - 1) == 0:
        return f"{v} (2^{v.bit_length() - 1})"
    return str(v)


def default_text(field: Any) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "—"
        if isinstance(value, BaseModel):
            return "its defaults"
        return f"`{_toml_value(value)}`"
    if field.default is None:
        return "unset"
    return f"`{_toml_value(field.default)}`"


_BOUND_NAMES = (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"), ("min_length", "at least"),
                ("max_length", "at most"), ("pattern", "matches"))


def bounds_text(field: Any) -> str:
    parts = []
    for meta in field.metadata:
        for attr, sign in _BOUND_NAMES:
            v = getattr(meta, attr, None)
            if v is None:
                continue
            if attr in ("min_length", "max_length"):
                unit = ("character" if v == 1 else "characters") if _strip_optional(field.annotation) is str \
                    else ("entry" if v == 1 else "entries")
                parts.append(f"{sign} {v} {unit}")
            elif attr == "pattern":
                parts.append(f"{sign} `{v}`")
            else:
                parts.append(f"{sign} {_toml_value(v)}")
    return ", ".join(parts)


# Where the code gives a field neither a description nor a comment, a short one (model.field → text).
# Everything else in the tables (types, defaults, bounds, and every other meaning) comes from the code.
DESCRIPTIONS = {
    "JobSpec.method": "`output`: output perturbation (one noisy average of the local models); `gradient`: gradient "
                      "rounds (linear models), DP-SGD (networks) or DP-Fed-LS (with `[federated]`)",
    "ModelSpec.hidden": "networks: hidden layer widths",
    "PrivacySpec.epsilon": "ε of the job's guarantee",
    "PrivacySpec.delta": "δ of the job's guarantee (the samplers' own term is added to it)",
    "PrivacySpec.adjacency": "neighbouring data sets: `replace` one record, or `add_remove` one (then `public_n`)",
    "PrivacySpec.noise": "`mpc`: sampled inside the MPC (no member knows it); `distributed`: each compute party adds "
                         "its own share, the honest ones' alone carrying the guarantee (√(k/h) times the noise, no "
                         "sampler circuit; Gaussian only)",
    "TrainingSpec.weighting": "`pooled`: weights n_j/n (the product's); `thesis`: per-party means (reproduction only)",
    "TrainingSpec.optimizer": "networks: the public optimiser step",
    "TrainingSpec.adam_betas": "adam: β₁, β₂",
    "TrainingSpec.schedule": "learning-rate schedule over the rounds",
    "JobTable.name": "the job's name (a slug); `job result NAME` finds the newest job of that name",
    "JobTable.dataset": "the data set id every party maps to its own file (`[datasets.<id>]` in its config)",
    "JobTable.parties": "the parties that run the job, by certificate name (with `owners`: the compute parties)",
    "JobTable.trust": "`dealer`: additive sharing with a dealer; `replicated`: 3 parties, honest majority, no dealer",
    "JobTable.dealer": "with `trust = \"dealer\"`: the dealer's identity",
    "JobTable.security": "what the compute parties are assumed to do: `semi-honest` (follow the protocol; the default) "
                         "or `malicious` (any one may deviate: three replicated parties holding their own rows, with "
                         "`privacy.noise = \"distributed\"`; never with a dealer)",
    "JobTable.device": "where the parties' local work runs (default: each party's own `device`)",
    "IdentityConfig.name": "this member's name: the name in its certificate",
    "IdentityConfig.cert": "its certificate (PEM)",
    "IdentityConfig.key": "its private key (PEM)",
    "IdentityConfig.ca": "the consortium's CA certificate",
    "IdentityConfig.crl": "the CA's revocation list (`mpc-erm certs revoke`); followed on disk while the daemon runs",
    "PeerConfig.address": "host:port of its daemon",
    "PeerConfig.role": "what it is",
    "PolicyConfig.allowed_coordinators": "coordinators whose jobs this party accepts",
    "PolicyConfig.allowed_methods": "job methods this party accepts",
    "DatasetConfig.format": "how the file is read (see above)",
    "DatasetConfig.path": "the data file (relative to the config file)",
    "DatasetConfig.label": "csv and png: the label column",
    "DatasetConfig.delta": "lifetime δ",
    "DatasetConfig.name": "builtin: the built-in data set's name",
    "DatasetConfig.part": "builtin: this party's shard (0-based)",
    "DatasetConfig.of": "builtin: the number of shards",
    "_DaemonConfig.listen": "host:port the daemon binds",
    "_DaemonConfig.state_dir": "the ledger, audit log, job store and job results",
    "_DaemonConfig.device": "where job workers put the model and its gradients (the MPC stays on the CPU)",
    "_DaemonConfig.peers": "the other members this daemon talks to, by name",
    "_DaemonConfig.policy": "what this daemon accepts",
    "LimitsConfig.control_calls_per_s": "control service: calls per second per caller",
    "LimitsConfig.control_burst": "control service: burst per caller",
    "LimitsConfig.transport_calls_per_s": "share transport: calls per second per peer",
    "LimitsConfig.transport_burst": "share transport: burst per peer",
    "LimitsConfig.owner_calls_per_s": "owner intake: calls per second per owner",
    "LimitsConfig.owner_burst": "owner intake: burst per owner",
    "OwnerConfig.state_dir": "this owner's ledger, audit log and results",
    "OwnerConfig.device": "where this owner's local gradients run",
    "OwnerConfig.max_epsilon_per_job": "the largest ε one job may spend of this owner's data",
    "OwnerConfig.allow_test_only": "test-only (noise-free) jobs refused unless true",
    "CoordinatorConfig.parties": "each party's daemon, name → host:port",
    "CoordinatorConfig.dealers": "each dealer's daemon, name → host:port",
    "CoordinatorConfig.timeout_s": "seconds per call (a submission gets twice this)",
    "PrivacyReport.schema_": "the report format's name and version",
    "PrivacyReport.mechanism": "the noise distribution (`none`: no noise, a non-private or test-only run)",
    "PrivacyReport.sensitivity_l2": "ℓ2 sensitivity of one release",
    "PrivacyReport.sensitivity_l1": "ℓ1 sensitivity of one release",
    "PrivacyReport.adjacency": "the neighbouring relation ε and δ are for",
    "PrivacyReport.accountant": "how the rounds were composed (RDP, PLD, GDP, zCDP, pure)",
    "PrivacyReport.epsilon": "ε of the guarantee",
    "PrivacyReport.delta": "δ of the accountant",
    "PrivacyReport.delta_sampler": "δ charged for the actual sampler's distance from the ideal distribution; "
                                   "the guarantee's δ is `delta + delta_sampler`",
    "PrivacyReport.rounds": "releases composed",
    "PrivacyReport.sampling_rate": "Poisson (or uniform) sampling rate of each round",
    "PrivacyReport.trust_model": "who must not collude (the engine's own words)",
    "PrivacyReport.parties": "members that contributed",
    "PrivacyReport.n": "records (replace-one: the parties' public counts; under add/remove no count is published, the "
                       "plan states the public n̂)",
    "PrivacyReport.realisation": "how the engine realised the plan's noise",
    "PrivacyReport.parameters": "the job's public parameters, incl. `audit_head` (this party's audit chain head after "
                                "the job's last release)",
    "PrivacyReport.notes": "plain statements about the run (e.g. what the simulator's sampler does not bound)",
}


def _described(model: type[BaseModel], name: str) -> str:
    for klass in model.__mro__:
        text = DESCRIPTIONS.get(f"{klass.__name__}.{name}")
        if text:
            return text
    return ""


def clean_doc(text: str) -> str:
    """Sphinx roles (``:class:`~a.B` ``) as code spans."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)


def _key(name: str, field: Any) -> str:
    return field.alias or name


def model_tables(model: type[BaseModel], table: str | None, level: int = 2,
                 skip: tuple[str, ...] = ()) -> str:
    """One markdown section for ``[table]`` (its scalar keys) and one per sub-table, recursively."""
    comments = _comments(model)
    keys, subs = [], []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        ann = _strip_optional(field.annotation)
        key = _key(name, field)
        origin, args = typing.get_origin(ann), typing.get_args(ann)
        nested = None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            nested = (f"{table}.{key}" if table else key, ann)
        elif origin is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
            nested = (f"{table}.{key}.<name>" if table else f"{key}.<name>", args[1])
        if nested is not None:
            subs.append((nested, field, name))
            continue
        desc = field.description or comments.get(name, "") or _described(model, name)
        keys.append(f"| `{key}` | {type_name(field.annotation)} | {default_text(field)} | "
                    f"{cell(bounds_text(field))} | {cell(desc)} |")
    head = "#" * level
    out = []
    if table is not None:
        out.append(f"{head} `[{table}]`\n")
    doc = inspect.getdoc(model)
    if doc and model.__doc__ and "A base class for creating Pydantic models" not in doc:
        out.append(clean_doc(doc.strip()) + "\n")
    if keys:
        out += ["| key | type | default | bounds | meaning |", "|---|---|---|---|---|", *keys, ""]
    for (sub_table, sub_model), field, name in subs:
        note = field.description or comments.get(name, "") or _described(model, name)
        section = model_tables(sub_model, sub_table, level=min(level + 1, 4))
        if note:
            first, _, rest = section.partition("\n")
            section = f"{first}\n\n{note}\n{rest}"
        if not field.is_required():
            first, _, rest = section.partition("\n")
            section = f"{first}\n\n*Optional table.*\n{rest}"
        out.append(section)
    return "\n".join(out) + "\n"


def gen_job_file() -> None:
    from mpc_erm.jobs.jobfile import JobTable
    from mpc_erm.spec import JobSpec

    text = ["# Job file (TOML)\n",
            "A job file is what the coordinator submits (`mpc-erm job submit JOB.toml`) and every member "
            "checks before it reserves any budget. Its top-level keys and tables are the training spec "
            "(`mpc_erm.spec.JobSpec`); the `[job]` table says who runs it "
            "(`mpc_erm.jobs.jobfile.JobTable`). Unknown keys are refused, naming the key. Examples: "
            "`coordinator/examples/*.toml`.\n",
            "*Generated from the pydantic models at build time.*\n",
            "## Top level\n",
            model_tables(JobSpec, None, level=2),
            model_tables(JobTable, "job", level=2)]
    write("reference/job-file.md", "\n".join(text))


def gen_configs() -> None:
    from coordinator.config import CoordinatorConfig
    from parties.config import DealerConfig, OwnerConfig, PartyConfig

    text = ["# Party, dealer, owner and coordinator configs (TOML)\n",
            "Each member reads one TOML file, validated by the pydantic models in `parties/config.py` "
            "(and `coordinator/config.py`); a problem is refused at start naming the key. Relative paths "
            "are relative to the config file. Examples: `parties/example-party.toml`, "
            "`parties/example-dealer.toml`, `parties/example-owner.toml`, "
            "`coordinator/examples/coordinator.toml`; `mpc-erm provision` writes them for a whole "
            "consortium.\n",
            "*Generated from the pydantic models at build time.*\n"]
    for title, model, command in (("Party daemon", PartyConfig, "mpc-erm party serve --config FILE"),
                                  ("Dealer daemon", DealerConfig, "mpc-erm dealer serve --config FILE"),
                                  ("Data owner", OwnerConfig, "mpc-erm owner join --config FILE …"),
                                  ("Coordinator", CoordinatorConfig, "mpc-erm job … --config FILE")):
        text.append(f"## {title}\n\nRead by `{command}`.\n")
        text.append(model_tables(model, None, level=3).replace("\n### Top level", ""))
    write("reference/config.md", "\n".join(text))


def gen_privacy_report() -> None:
    from mpc_erm.privacy.report import SCHEMA, PrivacyReport

    module_doc = inspect.getdoc(sys.modules[PrivacyReport.__module__]) or ""
    text = ["# `privacy_report.json`\n",
            "Every job writes one at every member (and `mpc-erm job result` downloads it): what was done "
            "to whose data, with which guarantee. `mpc-erm report verify privacy_report.json` recomputes "
            "its (ε, δ) from the report alone; `mpc-erm report explain` states it in plain language.\n",
            f"The `schema` key is `{SCHEMA}`.\n",
            module_doc + "\n",
            "*Generated from `mpc_erm.privacy.report.PrivacyReport` at build time.*\n",
            "## Keys\n",
            model_tables(PrivacyReport, None, level=3)]
    write("reference/privacy-report.md", "\n".join(text))


# --------------------------------------------------------------------------- error codes

def gen_errors() -> None:
    from coordinator.cli.errors import EXIT_USAGE
    from parties import public_errors
    from parties.owner import failures as owner_failures

    doc = public_errors.__doc__ or ""
    meaning = {}
    for line in doc.splitlines():
        m = re.match(r"([A-Z_]+)\s+(\S.*)", line.strip())
        if m and m.group(1) in public_errors.CODES:
            meaning[m.group(1)] = m.group(2)
    intro = doc.split("Codes:")[0].strip()
    text = ["# Error codes\n",
            "*Generated at build time from `parties/public_errors.py`, `parties/owner/failures.py` and "
            "`coordinator/cli/errors.py`.*\n",
            "## Public failure codes\n",
            intro + "\n",
            "| code | meaning |", "|---|---|",
            *[f"| `{c}` | {cell(meaning.get(c, ''))} |" for c in public_errors.CODES], "",
            "## `mpc-erm owner join` / `owner fetch` exit codes\n",
            (inspect.getdoc(owner_failures) or "").split("\n\n")[0] + "\n",
            "| exit code | meaning |", "|---|---|",
            *[f"| {k} | {cell(v)} |" for k, v in sorted(owner_failures.EXIT_CODES.items())], "",
            "## `mpc-erm` exit codes\n",
            "Every command ends a failure with one `error:` line naming the field or file at fault.\n",
            "| exit code | meaning |", "|---|---|",
            "| 0 | success |",
            "| 1 | the command ran and failed: a job that did not succeed, a verification that failed, "
            "a refused submission (each member's answer is printed) |",
            f"| {EXIT_USAGE} | bad input: an option, a config or job file field, a data file "
            "(the line names it), or a file that cannot be read |",
            "| 3 | `mpc-erm job plan` (and `job submit` reading its verdict): the noise would drown the "
            "signal; `--yes` submits anyway |",
            "| 130 | interrupted (Ctrl-C) |", ""]
    write("reference/errors.md", "\n".join(text))


# --------------------------------------------------------------------------- gRPC services

def _proto_items(src: str) -> list[dict[str, Any]]:
    """Services (with their RPCs), messages (with their fields) and enums of one .proto file, each
    with the comment lines above it and any trailing comment."""
    items: list[dict[str, Any]] = []
    pending: list[str] = []
    stack: list[dict[str, Any]] = []
    header: list[str] = []
    seen_decl = False
    for raw in src.splitlines():
        line = raw.strip()
        code, _, trailing = line.partition("//")
        code, trailing = code.strip(), trailing.strip()
        if not code:
            if line.startswith("//"):
                (pending if seen_decl or stack else header).append(trailing)
            elif not stack:
                if not seen_decl and header:
                    seen_decl = True  # a blank line after the file's opening comment ends it
                pending = []
            continue
        seen_decl = True
        comment = " ".join(pending + ([trailing] if trailing else []))
        pending = []
        m = re.match(r"(service|message|enum)\s+(\w+)\s*\{\s*(\})?", code)
        if m:
            item = {"kind": m.group(1), "name": m.group(2), "doc": comment, "children": []}
            (stack[-1]["children"] if stack else items).append(item)
            if not m.group(3):
                stack.append(item)
            continue
        m = re.match(r"oneof\s+(\w+)\s*\{", code)
        if m:
            oneof = {"kind": "oneof", "name": m.group(1), "doc": comment, "children": []}
            stack[-1]["children"].append(oneof)
            stack.append(oneof)
            continue
        if code.startswith("}"):
            if stack:
                stack.pop()
            continue
        m = re.match(r"rpc\s+(\w+)\s*\(\s*(stream\s+)?(\w+)\s*\)\s*returns\s*\(\s*(stream\s+)?(\w+)\s*\)", code)
        if m and stack:
            stack[-1]["children"].append({"kind": "rpc", "name": m.group(1), "request": (m.group(2) or "") + m.group(3),
                                          "reply": (m.group(4) or "") + m.group(5), "doc": comment})
            continue
        m = re.match(r"((?:repeated\s+)?[\w.<>, ]+?)\s+(\w+)\s*=\s*(\d+)\s*;", code)
        if m and stack:
            stack[-1]["children"].append({"kind": "field", "type": m.group(1), "name": m.group(2),
                                          "number": m.group(3), "doc": comment})
            continue
        m = re.match(r"(\w+)\s*=\s*(\d+)\s*;", code)
        if m and stack:
            stack[-1]["children"].append({"kind": "value", "name": m.group(1), "number": m.group(2), "doc": comment})
    paragraphs = "\n".join(header).split("\n\n")
    return [{"kind": "file", "doc": "\n\n".join(" ".join(p.split()) for p in paragraphs), "children": items}]


def _fields_table(children: list[dict[str, Any]], oneof: str = "") -> list[str]:
    rows = []
    for c in children:
        if c["kind"] == "field":
            rows.append(f"| `{c['name']}` | `{c['type']}` | {c['number']} | "
                        f"{cell(('one of `' + oneof + '`. ' if oneof else '') + c['doc'])} |")
        elif c["kind"] == "oneof":
            rows += _fields_table(c["children"], oneof=c["name"])
    return rows


def gen_grpc() -> None:
    text = ["# gRPC services\n",
            "Every channel is mutual TLS; every server checks the caller's certificate (identity and role) "
            "per method before anything else. Package `mpc_erm.v1`; the generated Python code is in "
            "`mpc_erm/mpc/_proto/` (`python -m mpc_erm.mpc._proto.generate` regenerates it).\n",
            "*Generated from `proto/*.proto` at build time: services, RPCs, messages and their comments.*\n"]
    for proto in sorted((ROOT / "proto").glob("*.proto")):
        (file_item,) = _proto_items(proto.read_text())
        text.append(f"## `{proto.name}`\n")
        if file_item["doc"]:
            text.append(file_item["doc"] + "\n")
        for item in file_item["children"]:
            if item["kind"] == "service":
                text.append(f"### service `{item['name']}`\n")
                if item["doc"]:
                    text.append(item["doc"] + "\n")
                text += ["| RPC | request | reply | what it does |", "|---|---|---|---|"]
                for rpc in item["children"]:
                    if rpc["kind"] == "rpc":
                        req, rep = rpc["request"], rpc["reply"]
                        text.append(f"| `{rpc['name']}` | [`{req}`](#{req.split()[-1].lower()}) | "
                                    f"[`{rep}`](#{rep.split()[-1].lower()}) | {cell(rpc['doc'])} |")
                text.append("")
        for item in file_item["children"]:
            if item["kind"] == "message":
                text.append(f"### `{item['name']}` {{#{item['name'].lower()}}}\n")
                if item["doc"]:
                    text.append(item["doc"] + "\n")
                rows = _fields_table(item["children"])
                if rows:
                    text += ["| field | type | number | meaning |", "|---|---|---|---|", *rows, ""]
                else:
                    text.append("No fields.\n")
            elif item["kind"] == "enum":
                text.append(f"### enum `{item['name']}` {{#{item['name'].lower()}}}\n")
                if item["doc"]:
                    text.append(item["doc"] + "\n")
                text += ["| value | number | meaning |", "|---|---|---|"]
                text += [f"| `{v['name']}` | {v['number']} | {cell(v['doc'])} |" for v in item["children"]]
                text.append("")
    write("reference/grpc.md", "\n".join(text))


# --------------------------------------------------------------------------- results

_SKIP_KEYS = {"machine", "curve", "curves_mean", "curves", "plots", "command", "what", "benchmark", "note"}
MAX_ROWS, MAX_COLS = 60, 12


def fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "—" if v is None else ("yes" if v else "no")
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(v, (list, tuple)):
        if all(not isinstance(x, (dict, list)) for x in v):
            return ", ".join(fmt(x) for x in v[:8]) + (f", … ({len(v)} values)" if len(v) > 8 else "")
        return f"({len(v)} entries)"
    text = cell(v)
    return text if len(text) <= 300 else text[:297] + "…"


def _flat(d: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if k in _SKIP_KEYS and not prefix:
            continue
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth < 2:
            out.update(_flat(v, key + ".", depth + 1))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            continue  # tables of their own
        else:
            out[key] = v
    return out


def _table_of(rows: list[dict[str, Any]]) -> list[str]:
    flat = [_flat(r) for r in rows]
    cols: list[str] = []
    for r in flat:
        for k in r:
            if k not in cols:
                cols.append(k)
    dropped = len(cols) - MAX_COLS
    cols = cols[:MAX_COLS]
    out = ["| " + " | ".join(cell(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in flat[:MAX_ROWS]:
        out.append("| " + " | ".join(fmt(r.get(c, "")) if c in r else "" for c in cols) + " |")
    notes = []
    if len(flat) > MAX_ROWS:
        notes.append(f"first {MAX_ROWS} of {len(flat)} rows")
    if dropped > 0:
        notes.append(f"{dropped} more columns in the JSON")
    if notes:
        out.append(f"\n*({'; '.join(notes)})*")
    return out + [""]


def _lists_of_dicts(d: dict[str, Any], prefix: str = "") -> list[tuple[str, list[dict[str, Any]]]]:
    out = []
    for k, v in d.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            out.append((prefix + k, v))
        elif isinstance(v, dict) and not prefix:
            out += _lists_of_dicts(v, k + ".")
    return out


def _commands(d: dict[str, Any]) -> list[str]:
    found: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            c = x.get("command")
            if isinstance(c, str) and c not in found and not c.startswith("several"):
                found.append(c)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(d)
    return found


def _machine(m: Any) -> str:
    if not isinstance(m, dict):
        return ""
    parts = []
    if "cpu_count" in m:
        parts.append(f"{m['cpu_count']} CPUs")
    for k in ("processor", "torch", "cuda_device", "gpu", "date_utc"):
        if m.get(k):
            parts.append(f"{k}: {m[k]}")
    return "; ".join(parts)


def documented_commands() -> dict[str, str]:
    """file name → the command the benchmarks how-to gives for it (for files that record none)."""
    text = (ROOT / "docs" / "how-to" / "benchmarks.md").read_text()
    found: dict[str, str] = {}
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            m = re.search(r"--out benchmarks/results/([\w/.-]+\.json)", line)
            if m and "python" in line:
                found.setdefault(m.group(1), line.split("  #")[0].strip())
    flat = " ".join(text.split())
    for cmd in re.findall(r"`((?:\.venv/bin/)?python3? -m benchmarks[^`]*)`", flat):
        m = re.search(r"--out benchmarks/results/([\w/.-]+\.json)", cmd)
        if m:
            found.setdefault(m.group(1), cmd)
    return found


DOCUMENTED = documented_commands()


def _result_section(rel: str, d: Any, plots_out: dict[str, str]) -> list[str]:
    out = [f"## `{rel}`\n"]
    if not isinstance(d, dict):
        return out + ["(not a JSON object)\n"]
    if d.get("benchmark"):
        out.append(f"**benchmark:** `{d['benchmark']}`  ")
    machine = _machine(d.get("machine"))
    if machine:
        out.append(f"**machine:** {cell(machine)}  ")
    if d.get("what"):
        out.append(f"**what:** {cell(d['what'])}")
    if d.get("note"):
        out.append(f"\n**note:** {cell(d['note'])}")
    out.append("")
    commands = _commands(d)
    if commands:
        out.append("Recorded command" + ("s" if len(commands) > 1 else "") + ":\n")
        shown = commands[:6]
        out += ["```sh", *shown, "```", ""]
        if len(commands) > len(shown):
            out.append(f"*({len(commands) - len(shown)} more in the JSON)*\n")
    elif rel in DOCUMENTED:
        out += ["The file records no command; the [benchmarks how-to](../how-to/benchmarks.md) gives this one:\n",
                "```sh", DOCUMENTED[rel], "```", ""]
    else:
        out.append("*No command is recorded in this file; see the [benchmarks how-to](../how-to/benchmarks.md).*\n")
    if d.get("benchmark") == "dp_fed_ls_daemons" and isinstance(d.get("rows"), list):
        from benchmarks.dp_fed_ls_daemons import cell_table, markdown_table

        try:  # the benchmark's own tables (--table); files older than its row format get the generic one
            runs, cells = markdown_table(d["rows"]), cell_table(d["rows"])
        except (KeyError, TypeError, ValueError):
            runs = cells = ""
        if runs:
            out += ["### Runs\n", runs, ""]
            if cells:
                out += ["### Cells with several runs\n", cells, ""]
            d = {k: v for k, v in d.items() if k != "rows"}
    scalars = _flat(d)
    if scalars:
        out += ["### Key fields\n", "| field | value |", "|---|---|"]
        items = list(scalars.items())
        out += [f"| `{cell(k)}` | {fmt(v)} |" for k, v in items[:80]]
        if len(items) > 80:
            out.append(f"\n*(first 80 of {len(items)} fields)*")
        out.append("")
    for name, rows in _lists_of_dicts(d):
        nested = any(isinstance(v, list) and v and all(isinstance(x, dict) for x in v)
                     for r in rows for v in r.values())
        if nested:
            for i, r in enumerate(rows[:MAX_ROWS]):
                label = next((str(r[k]) for k in ("setting", "dataset", "method", "name", "job") if k in r), str(i))
                if "dataset" in r and "parties" in r:
                    label = f"{r['dataset']}, m = {r['parties']}"
                out.append(f"### `{name}`: {cell(label)}\n")
                flat = _flat(r)
                if flat:
                    out += ["| field | value |", "|---|---|",
                            *[f"| `{cell(k)}` | {fmt(v)} |" for k, v in flat.items()], ""]
                for sub, subrows in _lists_of_dicts(r):
                    out += [f"`{sub}`:\n", *_table_of(subrows)]
                for p in r.get("plots", []) if isinstance(r.get("plots"), list) else []:
                    src = ROOT / p
                    if src.is_file():
                        plots_out[src.name] = str(src)
                        out.append(f"![{src.name}](plots/{src.name})\n")
        else:
            out += [f"### `{name}`\n", *_table_of(rows)]
    return out


def gen_results() -> None:
    results = ROOT / "benchmarks" / "results"
    files = sorted(results.glob("*.json")) + sorted(results.glob("*/*.json"))
    plots: dict[str, str] = {}
    body: list[str] = []
    index = ["| file | benchmark | what |", "|---|---|---|"]
    for path in files:
        rel = str(path.relative_to(results))
        try:
            d = json.loads(path.read_text())
        except ValueError as exc:
            body += [f"## `{rel}`\n", f"Not readable as JSON: {cell(exc)}\n"]
            continue
        what = d.get("what", "") if isinstance(d, dict) else ""
        anchor = re.sub(r"[^a-z0-9]+", "", rel.lower())
        bench = d.get("benchmark", "") if isinstance(d, dict) else ""
        index.append(f"| [`{rel}`](#{anchor}) | {f'`{bench}`' if bench else ''} | "
                     f"{fmt(what)[:160]} |")
        section = _result_section(rel, d, plots)
        section[0] = f"## `{rel}` {{#{anchor}}}\n"
        body += section
    for png in sorted((results / "plots").glob("*.png")):
        plots.setdefault(png.name, str(png))
    unplaced = [name for name in sorted(plots) if f"(plots/{name})" not in "\n".join(body)]
    if unplaced:
        body += ["## Plots\n", *[f"![{n}](plots/{n})\n" for n in unplaced]]
    for name, src in plots.items():
        with mkdocs_gen_files.open(f"results/plots/{name}", "wb") as f:
            f.write(Path(src).read_bytes())
    text = ["# Results\n",
            "Every measurement the project keeps, as committed in `benchmarks/results/` (JSON written by "
            "`python -m benchmarks …`). This page is generated from those files at build time: each "
            "section shows the file's recorded command(s), its key fields and its tables, so no figure "
            "here is copied by hand. What the figures mean, and how to run each benchmark, is on the "
            "[benchmarks how-to](../how-to/benchmarks.md).\n",
            f"{len(files)} files.\n", *index, "", *body]
    write("results/index.md", "\n".join(text))


gen_job_file()
gen_configs()
gen_privacy_report()
gen_errors()
gen_grpc()
gen_results()
