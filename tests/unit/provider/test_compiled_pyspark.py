"""The compiled PySpark copy: made once per Spark and Python, found by the driver and the workers' daemon
only while spark-submit's zips are the ones it was made from (real zips, compileall and files; no Spark)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import zipfile
from pathlib import Path

import pytest

from airflow_provider_dlq import compiled_pyspark as cp
from airflow_provider_dlq.class_data import UNUSED_ARCHIVE_S
from airflow_provider_dlq.resources import spark_app_dir
from spark_apps import pyspark_imports


def fake_spark_home(root: Path, version: str = "1") -> Path:
    """A Spark home whose python/lib holds a one-module pyspark.zip and a py4j zip."""
    lib = root / "python" / "lib"
    lib.mkdir(parents=True)
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as archive:
        archive.writestr("pyspark/__init__.py", f"VERSION = {version!r}\n")
        archive.writestr("pyspark/daemon.py", "def manager():\n    pass\n")
        archive.writestr("pyspark/tests/test_x.py", "x = (\n")  # not compiled (and not compilable)
    with zipfile.ZipFile(lib / "py4j-0.10.9.9-src.zip", "w") as archive:
        archive.writestr("py4j/__init__.py", "")
    return root


def prepare(tmp_path: Path, home: Path, master: str = "local[2]", **conf: str) -> cp.CompiledCopy | None:
    env = {"SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable}
    return cp.CompiledPySpark(tmp_path / "cache").prepare(master, env, conf)


def test_constants_agree_with_the_apps_module():
    path = spark_app_dir() / "pyspark_imports.py"
    spec = importlib.util.spec_from_file_location("app_pyspark_imports", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (module.MARKER, module.DAEMON_MODULE, module.FOLDER_ENV) == (
        cp.MARKER,
        cp.DAEMON_MODULE,
        cp.FOLDER_ENV,
    )


def test_first_run_makes_the_copy_later_runs_reuse_it(tmp_path):
    home = fake_spark_home(tmp_path / "spark")
    copy = prepare(tmp_path, home)
    assert copy is not None
    folder = copy.folder
    assert (folder / "pyspark" / "__init__.py").read_text() == "VERSION = '1'\n"
    assert (folder / f"{cp.DAEMON_MODULE}.py").read_text() == (
        spark_app_dir() / "pyspark_imports.py"
    ).read_text()
    tag = sys.implementation.cache_tag
    assert (folder / "pyspark" / "__pycache__" / f"__init__.{tag}.pyc").is_file()
    assert (folder / "py4j" / "__pycache__" / f"__init__.{tag}.pyc").is_file()
    assert not (folder / "pyspark" / "tests" / "__pycache__").exists()
    made_from = json.loads((folder / cp.MARKER).read_text())["zips"]
    assert set(made_from) == {"pyspark.zip", "py4j-0.10.9.9-src.zip"}
    assert not list((tmp_path / "cache").glob("*.tmp"))

    marker_made = (folder / cp.MARKER).stat().st_mtime_ns
    again = prepare(tmp_path, home)
    assert again == copy
    assert (folder / cp.MARKER).stat().st_mtime_ns == marker_made  # reused, not made again

    assert copy.conf({"spark.executor.memory": "1g"}) == {
        "spark.executor.memory": "1g",
        cp.DAEMON_MODULE_CONF: cp.DAEMON_MODULE,
        cp.WORKERS_PYTHONPATH_CONF: str(folder),
    }
    theirs = copy.conf({cp.WORKERS_PYTHONPATH_CONF: "/theirs"})[cp.WORKERS_PYTHONPATH_CONF]
    assert theirs == f"{folder}{os.pathsep}/theirs"
    # spark-submit's own PYTHONPATH is not touched: its launcher looks PySpark up to find SPARK_HOME.
    expected_env = {"A": "1", "PYTHONPATH": "/given", cp.FOLDER_ENV: str(folder)}
    assert copy.env({"A": "1", "PYTHONPATH": "/given"}) == expected_env


def test_other_zips_get_their_own_copy(tmp_path):
    first = prepare(tmp_path, fake_spark_home(tmp_path / "spark-a", "1"))
    second = prepare(tmp_path, fake_spark_home(tmp_path / "spark-b", "2"))
    assert first is not None
    assert second is not None
    assert first.folder != second.folder
    assert (second.folder / "pyspark" / "__init__.py").read_text() == "VERSION = '2'\n"


def test_none_for_a_cluster_master_a_users_daemon_or_no_zips(tmp_path):
    home = fake_spark_home(tmp_path / "spark")
    assert prepare(tmp_path, home, master="spark://10.0.0.1:7077") is None
    assert prepare(tmp_path, home, master="yarn") is None
    assert prepare(tmp_path, home, **{cp.DAEMON_MODULE_CONF: "my_daemon"}) is None
    assert prepare(tmp_path, tmp_path / "no-spark-here") is None
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


def test_a_failed_compile_leaves_nothing_and_the_run_goes_on(tmp_path):
    home = fake_spark_home(tmp_path / "spark")
    env = {"SPARK_HOME": str(home), "PYSPARK_PYTHON": "false"}  # a "Python" that exits 1
    assert cp.CompiledPySpark(tmp_path / "cache").prepare("local[1]", env, {}) is None
    assert list((tmp_path / "cache").iterdir()) == []


def test_tidy_removes_stale_temporaries_and_long_unused_copies(tmp_path):
    home = fake_spark_home(tmp_path / "spark")
    cache = tmp_path / "cache"
    old = time.time() - UNUSED_ARCHIVE_S - 60
    cache.mkdir()
    for name in ("pyspark-0000000000000000", "pyspark-1111111111111111.abc.tmp", "pyspark-2222222222222222"):
        (cache / name).mkdir()
        (cache / name / "f").write_text("x")
    os.utime(cache / "pyspark-0000000000000000", (old, old))
    os.utime(cache / "pyspark-1111111111111111.abc.tmp", (old, old))
    copy = prepare(tmp_path, home)
    assert copy is not None
    left = sorted(p.name for p in cache.iterdir())
    assert left == sorted(["pyspark-2222222222222222", copy.folder.name])


def _zips(tmp_path: Path) -> tuple[Path, list[str]]:
    copy = prepare(tmp_path, fake_spark_home(tmp_path / "spark"))
    assert copy is not None
    lib = tmp_path / "spark" / "python" / "lib"
    return copy.folder, [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]


def test_prefer_compiled_moves_the_copy_ahead_of_its_zips(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "pyspark", raising=False)
    folder, zips = _zips(tmp_path)
    path = ["/app/bundle.zip", *zips, "/usr/lib/python3", str(folder), "/site-packages"]
    assert pyspark_imports.prefer_compiled(path) == str(folder)
    assert path == ["/app/bundle.zip", str(folder), *zips, "/usr/lib/python3", "/site-packages"]
    assert pyspark_imports.prefer_compiled(path) == str(folder)  # already ahead: unchanged
    assert path == ["/app/bundle.zip", str(folder), *zips, "/usr/lib/python3", "/site-packages"]


def test_prefer_compiled_inserts_the_folder_the_environment_names(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "pyspark", raising=False)
    folder, zips = _zips(tmp_path)
    path = ["/app/bundle.zip", *zips, "/site-packages"]
    monkeypatch.setenv(pyspark_imports.FOLDER_ENV, str(folder))
    assert pyspark_imports.prefer_compiled(path) == str(folder)
    assert path == ["/app/bundle.zip", str(folder), *zips, "/site-packages"]
    monkeypatch.setenv(pyspark_imports.FOLDER_ENV, str(tmp_path / "gone"))  # named but missing: path stays
    other = ["/app/bundle.zip", *zips]
    assert pyspark_imports.prefer_compiled(other) is None
    assert other == ["/app/bundle.zip", *zips]


def test_prefer_compiled_leaves_the_path_for_other_zips_or_an_imported_pyspark(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "pyspark", raising=False)
    folder, zips = _zips(tmp_path)
    only_one = [zips[0], str(folder)]
    assert pyspark_imports.prefer_compiled(only_one) is None
    assert only_one == [zips[0], str(folder)]
    with zipfile.ZipFile(zips[0], "a") as archive:  # Spark upgraded in place: the zip changed
        archive.writestr("pyspark/new.py", "")
    changed = [*zips, str(folder)]
    assert pyspark_imports.prefer_compiled(changed) is None
    assert changed == [*zips, str(folder)]
    no_copy = [*zips, str(tmp_path)]
    assert pyspark_imports.prefer_compiled(no_copy) is None
    monkeypatch.setitem(sys.modules, "pyspark", sys)  # imported already: too late to choose
    again, fresh = _zips(tmp_path / "again")
    imported = [*fresh, str(again)]
    assert pyspark_imports.prefer_compiled(imported) is None
    assert imported == [*fresh, str(again)]


@pytest.mark.parametrize("marker", ["", "{", '{"zips": {}}', '{"zips": []}', "[]"])
def test_prefer_compiled_ignores_a_broken_marker(tmp_path, monkeypatch, marker):
    monkeypatch.delitem(sys.modules, "pyspark", raising=False)
    folder, zips = _zips(tmp_path)
    (folder / cp.MARKER).write_text(marker)
    path = [*zips, str(folder)]
    assert pyspark_imports.prefer_compiled(path) is None
    assert path == [*zips, str(folder)]
