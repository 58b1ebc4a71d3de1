"""The library imports where only Python is available (the Spark bundle vendors it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import importlib.abc, sys

    BLOCKED = ("airflow", "pulsar", "_pulsar", "opentelemetry", "pyspark")

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)")
            return None

    sys.meta_path.insert(0, Block())
    from pulsar_dlq_consumer import ConsumerMetrics, RetryPolicy, parse_error_context

    ctx = parse_error_context({"REAL_TOPIC": "t", "ORIGIN_MESSAGE_ID": "(1,2,-1,-1)"})
    assert ctx.context_format == "pulsar_dlq_policy", ctx
    assert RetryPolicy().resolve_delay(2) == 5.0
    ConsumerMetrics().terms.add(1, {"topic": "t"})  # no-op without OpenTelemetry
    print(sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
    """
)


def test_imports_without_airflow_pulsar_or_opentelemetry() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"
