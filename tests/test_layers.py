"""How the code is layered, read from the source (every import statement, also those inside
functions, so a lazy import cannot hide a dependency):

- imports go one way (docs/explanation/architecture.md §3): mpc_erm → parties → coordinator, and
  benchmarks are a leaf;
- no modules import each other in a circle, however long (:func:`runtime_graph` says what counts);
- no module imports or reads another module's private names (a private module is its package's);
- inside mpc_erm, a layer imports lower layers only (:data:`LAYERS`);
- and product files name no issue numbers: the history is CHANGELOG.md's.

Each exception is listed with its reason where the test that allows it is."""

from __future__ import annotations

import ast
import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: package -> top-level packages it must never import
FORBIDDEN = {
    "mpc_erm": {"parties", "coordinator", "benchmarks"},
    "parties": {"coordinator", "benchmarks"},
    "coordinator": {"benchmarks"},
}


def imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_go_one_way(package: str) -> None:
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}"
           for path in sorted((ROOT / package).rglob("*.py"))
           for line, name in imports(path) if name.split(".")[0] in FORBIDDEN[package]]
    assert not bad, "\n".join(bad)


def test_benchmarks_use_the_product_not_its_demo_or_cli() -> None:
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}"
           for path in sorted((ROOT / "benchmarks").rglob("*.py"))
           for line, name in imports(path)
           if name.startswith(("coordinator.demo", "coordinator.cli")) and name != "coordinator.cli.errors"]
    assert not bad, "\n".join(bad)


# ==================================================================================== the module graph
#
# One parse per module: every import statement (also those inside functions) resolved to the project
# module it loads, relative imports included. ``from pkg import name`` imports the module pkg.name when
# that is a module, else it takes ``name`` from pkg (its __init__).

PACKAGES = ("mpc_erm", "parties", "coordinator", "benchmarks")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # the project module this statement loads
    name: str | None  # the name it takes from that module (None: the module itself)
    runtime: bool  # False under ``if TYPE_CHECKING:``, which never runs


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _encloses(package: str, module: str) -> bool:
    return module == package or module.startswith(package + ".")


def _longest_module(dotted: str) -> str | None:
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:``."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _from_source(module: str, node: ast.ImportFrom) -> str:
    """The absolute name of the module a ``from … import`` in ``module`` reads from."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


@functools.cache
def _parsed(module: str) -> ast.Module:
    path = MODULES[module]
    return ast.parse(path.read_text(), str(path))


@functools.cache
def project_imports(module: str) -> tuple[Import, ...]:
    """The project modules ``module`` imports (standard library and third parties left out)."""
    tree = _parsed(module)
    skip = _type_checking_only(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _longest_module(alias.name)
                if target:
                    out.append(Import(node.lineno, target, None, id(node) not in skip))
        elif isinstance(node, ast.ImportFrom):
            source = _from_source(module, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in MODULES:
                    out.append(Import(node.lineno, f"{source}.{alias.name}", None, id(node) not in skip))
                elif source in MODULES:
                    out.append(Import(node.lineno, source, alias.name, id(node) not in skip))
    return tuple(out)


# ============================================================================================ cycles

#: the packages whose modules must not import each other in a circle (benchmarks is a leaf: FORBIDDEN)
CYCLE_PACKAGES = ("mpc_erm", "parties", "coordinator")


def runtime_graph() -> dict[str, set[str]]:
    """module -> the modules importing it runs, the packages' __init__ included by this rule:

    ``import a.b.c`` runs ``a/__init__``, then ``a/b/__init__``, then ``a.b.c``. The packages that
    enclose the importer are not edges: the importer is their submodule, so their __init__ is
    already running or done when it imports anything, and a package's __init__ importing its own
    submodules (re-exports) is the one direction that import order allows. So
    ``pkg/__init__`` → ``pkg.sub`` is a cycle only if ``pkg.sub`` (or what it imports) takes a
    name from ``pkg`` itself (``from pkg import name`` where ``name`` is not a submodule, or
    ``from . import name`` of that kind): the __init__ is then half run. An outside module that
    imports ``pkg.sub`` depends on ``pkg/__init__`` too (it runs first), and so on everything that
    __init__ imports. Only statements that run count (not those under ``if TYPE_CHECKING:``), but
    wherever they stand: an import inside a function is a cycle at its first call instead of at
    import time. ``importlib.import_module`` calls (the lazy re-exports of mpc_erm.privacy and
    mpc_erm.jobs) are not statements and are not followed."""
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        if module.split(".")[0] not in CYCLE_PACKAGES:
            continue
        targets: set[str] = set()
        for imp in project_imports(module):
            if not imp.runtime or imp.module.split(".")[0] not in CYCLE_PACKAGES:
                continue
            targets.add(imp.module)
            parts = imp.module.split(".")
            targets |= {p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                        if p in MODULES and not _encloses(p, module)}
        targets.discard(module)
        graph[module] = targets
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one module: each module in one reaches every other."""
    reach = {v: _reachable(graph, v) for v in graph}
    comps = {frozenset(u for u in reach[v] if v in reach[u]) for v in graph}
    return sorted(sorted(c) for c in comps if len(c) > 1)


def test_no_import_cycles_between_modules() -> None:
    graph = runtime_graph()
    report = []
    for comp in strongly_connected(graph):
        report.append("cycle: " + ", ".join(comp))
        report += [f"  {MODULES[m].relative_to(ROOT)}:{imp.line}: imports {imp.module}"
                   for m in comp for imp in project_imports(m) if imp.runtime and imp.module in comp
                   and imp.module != m]
    assert not report, "\n".join(report)


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The positive control: a circle of three and a tail are found as the circle alone."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]


# ===================================================================================== private names

#: private names imported across modules that are allowed for now: (file, the private name)
PRIVATE_EXCEPTIONS: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_outside(module: str, target: str) -> str | None:
    """The first private part of the module path ``target`` whose package does not enclose
    ``module`` (a private module is its own package's business: mpc_erm.privacy._checks may be
    imported within mpc_erm.privacy, mpc_erm.mpc._proto within mpc_erm.mpc)."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if _private(part) and not _encloses(".".join(parts[:i]), module):
            return ".".join(parts[: i + 1])
    return None


def private_uses(module: str) -> list[tuple[int, str]]:
    """(line, private name) for every private name of another module that ``module`` imports
    (``from x import _y``, a private module outside its package) or reads (``x._y``, x a module)."""
    out = []
    bound: dict[str, str] = {}  # local name -> the project module it is bound to
    for imp in project_imports(module):
        hidden = _private_outside(module, imp.module)
        if hidden:
            out.append((imp.line, hidden))
        elif imp.name and _private(imp.name) and imp.module != module:
            out.append((imp.line, f"{imp.module}.{imp.name}"))
    for node in ast.walk(_parsed(module)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in MODULES:
                    bound[alias.asname] = alias.name
                elif not alias.asname and alias.name.split(".")[0] in MODULES:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source = _from_source(module, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in MODULES:
                    bound[alias.asname or alias.name] = f"{source}.{alias.name}"
    for node in ast.walk(_parsed(module)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                owner = ".".join([bound[value.id], *reversed(chain)])
                if owner in MODULES and owner != module:
                    out.append((node.lineno, f"{owner}.{node.attr}"))
    return out


def test_no_module_uses_another_modules_private_names() -> None:
    bad = []
    for module, path in MODULES.items():
        rel = path.relative_to(ROOT).as_posix()
        bad += [f"{rel}:{line}: {name}" for line, name in private_uses(module)
                if not any(rel == f and (name == p or name.startswith(p + ".")) for f, p in PRIVATE_EXCEPTIONS)]
    assert not bad, "\n".join(bad)


# ============================================================================== layers inside mpc_erm

#: The layers of mpc_erm by rank: a module imports its own layer and lower ranks only. The
#: architecture's rank 0 has a real order inside it, kept here as fractions: data, smoothing and the
#: one-file spellings plugin_ids and identity_names, and lazy_exports (a package's names loaded on
#: first use), import none of the others; spec (the job's
#: training spec, pydantic only) reads plugin_ids; models reads data (a model bundle's schema) and
#: spec (the model a spec names); privacy reads spec (the plan of a spec) and, to plan a job, models
#: (its dimension and clip); jobs (the job file) reads spec, privacy and identity_names. Then
#: protocols, runs (one run per job kind), and mpc and simulate, which import neither each other nor
#: anything above. mpc_erm/__init__.py is the package's face (load_model): it may import any layer,
#: none imports it.
LAYERS = {
    "data": 0, "smoothing": 0, "plugin_ids": 0, "identity_names": 0, "lazy_exports": 0,
    "spec": 0.25, "models": 0.5, "privacy": 0.75, "jobs": 0.9,
    "protocols": 1,
    "runs": 2,
    "mpc": 3, "simulate": 3,
}
#: imports from a lower layer to a higher one allowed: (importer, imported module)
LAYER_EXCEPTIONS: set[tuple[str, str]] = set()


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_mpc_erm_layers_import_only_downwards() -> None:
    bad = []
    for module, path in MODULES.items():
        layer = _layer(module)
        if module.split(".")[0] != "mpc_erm" or layer is None:
            continue
        if layer not in LAYERS:
            bad.append(f"{path.relative_to(ROOT)}: layer {layer!r} has no rank in LAYERS")
            continue
        for imp in project_imports(module):
            if imp.module.split(".")[0] != "mpc_erm" or (module, imp.module) in LAYER_EXCEPTIONS:
                continue
            target = _layer(imp.module)
            if target == layer:
                continue
            rank = math.inf if target is None else LAYERS.get(target, math.inf)
            if rank >= LAYERS[layer]:
                bad.append(f"{path.relative_to(ROOT)}:{imp.line}: {layer} (rank {LAYERS[layer]}) imports "
                           f"{imp.module} (rank {rank})")
    assert not bad, "\n".join(bad)


# ===================================================================================== issue numbers

#: "issue 17", "Issues 15", "issue #3", "(#17)": history belongs in CHANGELOG.md, not in the product
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? ?#?[0-9]+|\(#[0-9]+\)")
PRODUCT_FILES = ("mpc_erm", "parties", "coordinator", "benchmarks", "docker", "proto", "docs", "README.md",
                 "pyproject.toml")
PRODUCT_SUFFIXES = (".py", ".proto", ".toml", ".md")
#: files (or folders, ending in /) allowed to name issue numbers for now
ISSUE_NUMBERS_ALLOWED: tuple[str, ...] = ()


def _product_files() -> list[Path]:
    out = []
    for name in PRODUCT_FILES:
        p = ROOT / name
        out += [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.suffix in PRODUCT_SUFFIXES and f.is_file())
    return [p for p in out if "__pycache__" not in p.parts]


def test_product_files_name_no_issue_numbers() -> None:
    bad = []
    for path in _product_files():
        rel = path.relative_to(ROOT).as_posix()
        if any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in ISSUE_NUMBERS_ALLOWED):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            bad += [f"{rel}:{n}: {m.group(0)!r}" for m in ISSUE_NUMBER.finditer(line)]
    assert not bad, "\n".join(bad)


def test_the_issue_pattern_tells_an_issue_from_a_reference() -> None:
    found = [bool(ISSUE_NUMBER.search(s)) for s in ("(issue 17)", "Issues 15 and 16", "issue #3", "see (#17)",
                                                     "python/cpython#106905", "tissue 3", "crypten-findings.md #3")]
    assert found == [True, True, True, True, False, False, False]
