"""No import circles in shipped code: each package's modules, with the imports inside functions counted
too (a lazy import hides a circle from Python, not from the next engineer)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "airflow_provider_dlq": REPO / "airflow_provider_dlq",
    "pulsar_dlq_consumer": REPO / "pulsar-dlq-consumer" / "pulsar_dlq_consumer",
    "spark_apps": REPO / "spark_apps",
}


def _modules(package: str, root: Path) -> dict[str, Path]:
    modules = {}
    for path in root.rglob("*.py"):
        name = ".".join((package, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        modules[name] = path
    return modules


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``path`` imports, at run time (``if TYPE_CHECKING:`` blocks left out)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and child.module:
                found.update(m for m in (child.module, *(f"{child.module}.{a.name}" for a in child.names)))
            elif isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found & modules.keys()


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            connect(node)
    return circles


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_circle(package):
    modules = _modules(package, PACKAGES[package])
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert _circles(graph) == []


def test_a_circle_is_found():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
