"""The Spark app uses only what Spark Connect serves: one program on local[n], a cluster and Connect.

Every module under ``spark_apps/`` (driver code and task code alike: a task function is pickled on the
driver) is read with ``ast``; the test fails naming ``file:line`` for each use of the classic-only API
(``sparkContext``, the JVM gateway and its wrappers, RDDs, accumulators, job groups, the status tracker)
or of processes started outside Spark (``subprocess``, ``multiprocessing``, process pools, ``os.fork``
and friends). Strings and comments may mention them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[3] / "spark_apps"

#: Attribute (or bare name) -> why it is not portable.
FORBIDDEN_ATTRIBUTES = {
    "sparkContext": "no SparkContext under Spark Connect",
    "SparkContext": "no SparkContext under Spark Connect",
    "_jvm": "the JVM gateway is not reachable under Spark Connect",
    "_jsc": "the JVM gateway is not reachable under Spark Connect",
    "_jdf": "the JVM gateway is not reachable under Spark Connect",
    "_jgd": "the JVM gateway is not reachable under Spark Connect",
    "_jc": "the JVM gateway is not reachable under Spark Connect",
    "_jsparkSession": "the JVM gateway is not reachable under Spark Connect",
    "rdd": "no RDDs under Spark Connect",
    "accumulator": "no accumulators under Spark Connect",
    "setJobGroup": "use spark.addTag / interruptTag",
    "setLocalProperty": "use spark.addTag / interruptTag",
    "statusTracker": "no status tracker under Spark Connect",
    "ProcessPoolExecutor": "no processes outside Spark",
    "fork": "no processes outside Spark",
    "system": "no processes outside Spark",
    "popen": "no processes outside Spark",
    "create_subprocess_exec": "no processes outside Spark",
    "create_subprocess_shell": "no processes outside Spark",
}
_OS_ONLY = {"fork", "system", "popen"}  # forbidden as os.<name> only (other objects may have them)
#: Modules whose import is forbidden (the module or anything under it).
FORBIDDEN_MODULES = {
    "subprocess": "no processes outside Spark",
    "multiprocessing": "no processes outside Spark",
    "pty": "no processes outside Spark",
}
#: Names whose import from a module is forbidden.
FORBIDDEN_IMPORTED_NAMES = {
    ("pyspark", "SparkContext"): "no SparkContext under Spark Connect",
    ("pyspark.context", "SparkContext"): "no SparkContext under Spark Connect",
    ("pyspark.core.context", "SparkContext"): "no SparkContext under Spark Connect",
    ("concurrent.futures", "ProcessPoolExecutor"): "no processes outside Spark",
}


def _module_forbidden(name: str) -> str | None:
    for module, why in FORBIDDEN_MODULES.items():
        if name == module or name.startswith(module + "."):
            return why
    return None


def forbidden_uses(source: str, filename: str) -> list[str]:
    """``file:line: what (why)`` for each non-portable use in ``source``."""
    tree = ast.parse(source, filename)
    hits: list[str] = []

    def hit(node: ast.AST, what: str, why: str) -> None:
        hits.append(f"{filename}:{getattr(node, 'lineno', 0)}: {what} ({why})")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                why = _module_forbidden(alias.name)
                if why:
                    hit(node, f"import {alias.name}", why)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            why = _module_forbidden(node.module)
            if why:
                hit(node, f"from {node.module} import ...", why)
            for alias in node.names:
                reason = FORBIDDEN_IMPORTED_NAMES.get((node.module, alias.name))
                if reason:
                    hit(node, f"from {node.module} import {alias.name}", reason)
        elif isinstance(node, ast.Attribute):
            reason = FORBIDDEN_ATTRIBUTES.get(node.attr)
            if reason is None and node.attr.startswith(("spawn", "exec", "posix_spawn")):
                reason = "no processes outside Spark" if _on_os(node) else None
            if reason is None or (node.attr in _OS_ONLY and not _on_os(node)):
                continue
            hit(node, f".{node.attr}", reason)
        elif isinstance(node, ast.Name) and node.id in ("SparkContext", "ProcessPoolExecutor"):
            hit(node, node.id, FORBIDDEN_ATTRIBUTES[node.id])
    return sorted(set(hits), key=lambda h: (h.split(":")[0], int(h.split(":")[1])))


def _on_os(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == "os"


def test_the_guard_finds_what_it_forbids_and_nothing_else():
    source = "\n".join(
        [
            "import subprocess",  # 1
            "from multiprocessing import Pool",  # 2
            "from pyspark import SparkContext",  # 3
            "n = df.rdd.getNumPartitions()",  # 4
            "spark.sparkContext.setJobGroup('g', 'd')",  # 5
            "jdf = df._jdf",  # 6
            "os.fork()",  # 7
            "os.execv('x', [])",  # 8
            "text = 'sparkContext rdd subprocess'  # _jvm in a comment",  # 9
            "from concurrent.futures import ThreadPoolExecutor",  # 10
            "platform.system()",  # 11
            "spark.addTag('dlq-replay')",  # 12
            "grouped.applyInArrow(f, schema)",  # 13
        ]
    )
    hits = forbidden_uses(source, "m.py")
    lines = sorted({int(h.split(":")[1]) for h in hits})
    assert lines == [1, 2, 3, 4, 5, 6, 7, 8], hits
    assert any(".setJobGroup" in h for h in hits)
    assert any(".sparkContext" in h for h in hits)


@pytest.mark.parametrize("path", sorted(APP.rglob("*.py")), ids=lambda p: str(p.relative_to(APP.parent)))
def test_no_module_of_the_spark_app_uses_what_spark_connect_lacks(path):
    rel = str(path.relative_to(APP.parent))
    hits = forbidden_uses(path.read_text(encoding="utf-8"), rel)
    assert not hits, "not portable to Spark Connect:\n" + "\n".join(hits)
