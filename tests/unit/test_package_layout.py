"""The distributions' boundaries: who imports whom, and one error root per distribution."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROVIDER = REPO / "airflow_provider_dlq"
LIBRARY = REPO / "pulsar-dlq-consumer" / "pulsar_dlq_consumer"
SPARK_APP = REPO / "spark_apps"


def _imported_top_levels(folder: Path) -> dict[str, set[str]]:
    """``{top-level package: {"file:line", ...}}`` of every absolute import under ``folder``."""
    found: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_the_provider_never_imports_the_spark_app_or_test_tooling():
    imports = _imported_top_levels(PROVIDER)
    assert "spark_apps" not in imports, imports.get("spark_apps")
    assert "pulsar_standalone" not in imports, imports.get("pulsar_standalone")


def test_the_library_imports_neither_the_provider_nor_airflow_nor_spark():
    imports = _imported_top_levels(LIBRARY)
    for forbidden in ("airflow_provider_dlq", "airflow", "pyspark", "spark_apps"):
        assert forbidden not in imports, (forbidden, imports.get(forbidden))


def _exception_classes(folder: Path, package: str) -> list[type[BaseException]]:
    classes = []
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).with_suffix("")
        if rel.parts[0] == "dlq_consumer":  # the deprecated alias of the library (it warns on import)
            continue
        parts = [p for p in rel.parts if p != "__init__"]
        module = importlib.import_module(".".join([package, *parts]))
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                classes.append(obj)
    return classes


@pytest.mark.parametrize(
    ("folder", "package", "root", "outcomes"),
    [
        # TerminalError / RetryableError are what a handler raises to choose an outcome, not errors.
        (
            LIBRARY,
            "pulsar_dlq_consumer",
            "pulsar_dlq_consumer.errors.DlqConsumerError",
            {"TerminalError", "RetryableError"},
        ),
        (PROVIDER, "airflow_provider_dlq", "airflow_provider_dlq.errors.DlqProviderError", set()),
        # MalformedRecord (raised by a playbook fix to park a message), FixTimeoutError (raised inside
        # an overrunning fix call) and FixExit (raised in place of os._exit inside a fix call) become a
        # message's outcome; WorkerInterrupt is a SIGINT stopping the task. None is an error of the app.
        (
            SPARK_APP,
            "spark_apps",
            "spark_apps.dlq_replay.errors.ReplayError",
            {"MalformedRecord", "FixTimeoutError", "FixExit", "WorkerInterrupt"},
        ),
    ],
)
def test_one_error_root_per_distribution(folder, package, root, outcomes):
    module, _, name = root.rpartition(".")
    base = getattr(importlib.import_module(module), name)
    classes = _exception_classes(folder, package)
    assert len(classes) >= 3
    strays = sorted(
        f"{c.__module__}.{c.__qualname__}"
        for c in classes
        if not issubclass(c, base) and c.__name__ not in outcomes
    )
    assert strays == [], f"errors outside {root}: {strays}"
