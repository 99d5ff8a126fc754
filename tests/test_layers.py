"""Imports go one way (docs/explanation/architecture.md §3): mpc_erm → parties → coordinator, and benchmarks
are a leaf. Read from the source (every import statement, also those inside functions), so a lazy
import cannot hide a dependency."""

from __future__ import annotations

import ast
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
