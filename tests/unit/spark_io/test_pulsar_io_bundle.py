"""The ``--py-files`` bundle: contents, the vendored library, and the no-Airflow guard."""

from __future__ import annotations

import zipfile

import pytest

from spark_apps.dlq_replay.bundle import BundleError, airflow_imports, build_bundle, main


def test_bundle_holds_the_app_and_the_vendored_library_only(tmp_path):
    paths = build_bundle(tmp_path / "out")
    assert paths.zip_path.name == "dlq_replay.zip"
    assert paths.main_path.read_text().startswith('"""spark-submit entry point')
    with zipfile.ZipFile(paths.zip_path) as archive:
        names = set(archive.namelist())
        for required in (
            "spark_apps/__init__.py",
            "spark_apps/dlq_replay/__init__.py",
            "spark_apps/dlq_replay/pulsar_io/source.py",
            "spark_apps/dlq_replay/bundle.py",
            "airflow_provider_dlq/__init__.py",
            "airflow_provider_dlq/dlq_consumer/__init__.py",
            "airflow_provider_dlq/dlq_consumer/context.py",
        ):
            assert required in names
        assert not [n for n in names if "__pycache__" in n or not n.endswith(".py")]
        assert not [
            n
            for n in names
            if n.startswith("airflow_provider_dlq/")
            and n.count("/") > 1
            and not n.startswith("airflow_provider_dlq/dlq_consumer/")
        ]
        for name in names:
            assert airflow_imports(archive.read(name).decode(), name) == []
    first = paths.zip_path.read_bytes()
    assert build_bundle(tmp_path / "again").zip_path.read_bytes() == first  # reproducible


def test_airflow_imports_are_found_anywhere_in_a_module():
    source = "import os\nimport airflow_provider_dlq\n\ndef f():\n    from airflow.models import DAG\n"
    assert airflow_imports(source, "m.py") == ["m.py:5"]
    assert airflow_imports("import airflow.sdk as sdk", "n.py") == ["n.py:1"]
    assert airflow_imports("from . import airflow", "rel.py") == []


def test_bundle_refuses_a_module_that_imports_airflow(tmp_path):
    root = tmp_path / "src"
    for pkg in ("spark_apps", "airflow_provider_dlq", "airflow_provider_dlq/dlq_consumer"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "spark_apps" / "dlq_replay_main.py").write_text("")
    (root / "spark_apps" / "bad.py").write_text("from airflow.hooks.base import BaseHook\n")
    with pytest.raises(BundleError, match=r"must not import Airflow.*spark_apps/bad\.py:1"):
        build_bundle(tmp_path / "out", source_root=root)
    (root / "spark_apps" / "bad.py").write_text("x = 1\n")
    (root / "airflow_provider_dlq" / "hooks.py").write_text("import airflow\n")  # not bundled: fine
    assert build_bundle(tmp_path / "out", source_root=root).zip_path.is_file()


def test_cli_prints_the_paths(tmp_path, capsys):
    assert main(["--dest", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"zip={tmp_path / 'dlq_replay.zip'}" in out
    assert f"main={tmp_path / 'dlq_replay_main.py'}" in out
