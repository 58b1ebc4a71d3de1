"""Package-level promises: cheap import, provider metadata."""

from __future__ import annotations

import importlib
import subprocess
import sys


def test_top_level_import_pulls_in_neither_airflow_nor_spark():
    code = (
        "import sys, airflow_provider_dlq, airflow_provider_dlq.get_provider_info;"
        "bad=[m for m in ('airflow','pyspark','pulsar') if m in sys.modules];"
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"heavy imports at top level: {proc.stdout}"


def test_provider_info_lists_modules_that_import():
    from airflow_provider_dlq.get_provider_info import get_provider_info

    info = get_provider_info()
    assert info["package-name"] == "airflow-provider-dlq"
    modules = [
        m
        for kind in ("hooks", "operators", "sensors", "triggers")
        for e in info[kind]
        for m in e["python-modules"]
    ]
    for module in modules:
        importlib.import_module(module)
    for conn in info["connection-types"]:
        module, _, cls = conn["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), cls)
        assert hook.conn_type == conn["connection-type"]
