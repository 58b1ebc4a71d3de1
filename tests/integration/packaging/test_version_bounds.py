"""The declared version ranges at both ends: ``scripts/test-bounds.sh`` resolves the lowest and the newest
allowed versions of the direct dependencies (Airflow, the Spark provider, pulsar-client, ...) into fresh
venvs and runs the unit tests and ``test_pyspark_files.py`` there (PyPI must be reachable; uv's cache keeps
repeats short). The lowest end has Spark provider 5.5 (pyspark only), the newest the 6.x line, whose
pyspark-client is written over pyspark's Python files last, as pip does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]


# The lowest and the newest allowed versions; `scripts/test-bounds.sh highest-no-spark` (the
# Spark provider 6.x line without local Spark) is run by hand when those bounds move.
@pytest.mark.parametrize("mode", ["lowest", "highest"])
def test_unit_tests_pass_at_the_bounds(mode, record_figure):
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "test-bounds.sh"), mode],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    versions = re.findall(rf"\[bounds\] {re.escape(mode)}: (\S+==\S+)", result.stderr)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    record_figure(f"bounds {mode} ({time.monotonic() - started:.0f} s): {' '.join(versions)} -> {summary}")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in summary, summary
    assert "skipped" not in summary, summary
    pins = dict(v.lower().split("==") for v in versions)
    assert {"apache-airflow", "apache-airflow-providers-apache-spark", "pulsar-client"} <= set(pins), versions
    spark_provider_major = int(pins["apache-airflow-providers-apache-spark"].split(".")[0])
    if mode == "highest-no-spark":
        assert "pyspark" not in pins  # the Spark provider 6.x line: pyspark-client only
    elif mode == "highest":
        assert spark_provider_major >= 6, versions
        assert {"pyspark", "pyspark-client"} <= set(pins), versions
        assert "written over pyspark's Python files last" in result.stderr
    else:
        assert spark_provider_major == 5, versions
        assert "pyspark-client" not in pins
