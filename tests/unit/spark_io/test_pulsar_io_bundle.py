"""The ``--py-files`` bundle: contents, the vendored library, and the no-Airflow guard."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from airflow_provider_dlq.bundle import BundleError, airflow_imports, build_bundle, library_dir, main
from airflow_provider_dlq.resources import spark_app_dir


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
            "pulsar_dlq_consumer/__init__.py",
            "pulsar_dlq_consumer/context.py",
        ):
            assert required in names
        assert not [n for n in names if "__pycache__" in n or not n.endswith((".py", ".pyc"))]
        sources = {n for n in names if n.endswith(".py")}
        assert {n + "c" for n in sources} == names - sources  # each module compiled beside its source
        # Only the app and the vendored library: nothing of the provider (it imports Airflow).
        assert {n.split("/")[0] for n in names} == {"spark_apps", "pulsar_dlq_consumer"}
        for name in sources:
            assert airflow_imports(archive.read(name).decode(), name) == []
    first = paths.zip_path.read_bytes()
    assert build_bundle(tmp_path / "again").zip_path.read_bytes() == first  # reproducible


def test_airflow_imports_are_found_anywhere_in_a_module():
    source = "import os\nimport airflow_provider_dlq\n\ndef f():\n    from airflow.models import DAG\n"
    assert airflow_imports(source, "m.py") == ["m.py:5"]
    assert airflow_imports("import airflow.sdk as sdk", "n.py") == ["n.py:1"]
    assert airflow_imports("from . import airflow", "rel.py") == []


def tiny_sources(tmp_path: Path) -> tuple[Path, Path]:
    """An app package (with its main file) and a library package, both otherwise empty."""
    app, lib = tmp_path / "app", tmp_path / "lib"
    for pkg in (app, lib):
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
    (app / "dlq_replay_main.py").write_text("")
    return app, lib


def test_bundle_refuses_a_module_that_imports_airflow(tmp_path):
    app, lib = tiny_sources(tmp_path)
    (app / "bad.py").write_text("from airflow.hooks.base import BaseHook\n")
    with pytest.raises(BundleError, match=r"must not import Airflow.*spark_apps/bad\.py:1"):
        build_bundle(tmp_path / "out", app_dir=app, lib_dir=lib)
    (app / "bad.py").write_text("x = 1\n")
    (lib / "otel.py").write_text("def f():\n    import airflow.sdk\n")
    with pytest.raises(BundleError, match=r"pulsar_dlq_consumer/otel\.py:2"):
        build_bundle(tmp_path / "out", app_dir=app, lib_dir=lib)
    (lib / "otel.py").unlink()
    paths = build_bundle(tmp_path / "out", app_dir=app, lib_dir=lib)
    with zipfile.ZipFile(paths.zip_path) as archive:
        assert sorted(n for n in archive.namelist() if n.endswith(".py")) == [
            "pulsar_dlq_consumer/__init__.py",
            "spark_apps/__init__.py",
            "spark_apps/bad.py",
            "spark_apps/dlq_replay_main.py",
        ]


def test_bundle_vendors_the_installed_library_from_its_one_source():
    import pulsar_dlq_consumer

    assert library_dir() == Path(pulsar_dlq_consumer.__file__).parent
    assert spark_app_dir().name == "spark_apps"
    assert (spark_app_dir() / "dlq_replay_main.py").is_file()


def test_cli_prints_the_paths(tmp_path, capsys):
    assert main(["--dest", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"zip={tmp_path / 'dlq_replay.zip'}" in out
    assert f"main={tmp_path / 'dlq_replay_main.py'}" in out


IMPORT_FROM_ZIP = """
import sys
sys.path.insert(0, sys.argv[1])
import spark_apps.mod as mod
print(mod.__file__, mod.VALUE)
"""


def test_modules_import_from_their_compiled_copy_and_only_while_it_matches_the_source(tmp_path):
    """Every process of a run imports the bundle without compiling it; a pyc that no longer matches
    its source (a zip edited by hand) is ignored, never run."""
    import subprocess
    import sys

    app, lib = tiny_sources(tmp_path)
    (app / "mod.py").write_text("VALUE = 1\n")
    zip_path = build_bundle(tmp_path / "out", app_dir=app, lib_dir=lib).zip_path

    def imported(path: Path) -> str:
        command = [sys.executable, "-c", IMPORT_FROM_ZIP, str(path)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert imported(zip_path) == f"{zip_path}/spark_apps/mod.pyc 1"
    edited = tmp_path / "edited.zip"
    with zipfile.ZipFile(zip_path) as old, zipfile.ZipFile(edited, "w") as new:
        for name in old.namelist():
            new.writestr(name, b"VALUE = 2\n" if name == "spark_apps/mod.py" else old.read(name))
    assert imported(edited).endswith(" 2")  # the stale pyc of VALUE = 1 was not used
