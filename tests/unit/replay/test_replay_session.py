"""The run's session through the public API: default parallelism, Spark Connect detection, the app's
code and the fix files shipped to a Connect server's Python workers."""

from __future__ import annotations

import os
import sys
import zipfile
from types import SimpleNamespace

import pytest

from spark_apps.dlq_replay import session
from spark_apps.dlq_replay.session import (
    add_pyfile,
    default_parallelism,
    is_connect,
    master_parallelism,
    ship_code,
    source_bundle,
)


@pytest.mark.parametrize(
    ("master", "cores", "expected"),
    [
        ("local", 8, 1),
        ("local[3]", 8, 3),
        ("local[*]", 8, 8),
        ("local[*]", None, None),  # a Connect server's cores are not this machine's
        ("local[4, 2]", 8, 4),  # with task retries
        ("local-cluster[2, 3, 1024]", 8, None),  # Spark's test master: asked of Spark
        ("spark://master:7077", 8, None),
        ("yarn", 8, None),
        (None, 8, None),
    ],
)
def test_a_master_says_its_parallelism_when_it_can(master, cores, expected):
    assert master_parallelism(master, cores) == expected


class _Conf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


class _Session:
    """A session with a runtime conf and added artifacts (weakly referencable, like SparkSession)."""

    def __init__(self, **conf):
        self.conf = _Conf(conf)
        self.artifacts: list[tuple[str, bool]] = []

    def addArtifacts(self, *paths, pyfile=False):
        self.artifacts += [(p, pyfile) for p in paths]


class _ConnectSession(_Session):
    pass


_ConnectSession.__module__ = "pyspark.sql.connect.session"


def test_default_parallelism_from_the_conf_then_the_master():
    given = _Session(**{"spark.default.parallelism": "12", "spark.master": "local[2]"})
    assert default_parallelism(given) == 12
    assert default_parallelism(_Session(**{"spark.master": "local[5]"})) == 5
    assert default_parallelism(_ConnectSession(**{"spark.master": "local[5]"})) == 5


def test_default_parallelism_of_a_cluster_comes_from_a_range_each_time(monkeypatch):
    jobs = []

    def ranged(spark):
        jobs.append(spark)
        return 2 * len(jobs)

    monkeypatch.setattr(session, "_range_partitions", ranged)
    spark = _Session(**{"spark.master": "spark://master:7077"})
    assert default_parallelism(spark) == 2
    assert default_parallelism(spark) == 4  # more executors registered meanwhile
    assert jobs == [spark, spark]
    jobs.clear()
    connect = _ConnectSession(**{"spark.master": "local[*]"})
    assert default_parallelism(connect) == 2  # the server's cores: asked, not guessed


def test_connect_sessions_are_told_by_their_class():
    assert is_connect(_ConnectSession())
    assert not is_connect(_Session())


def test_a_classic_session_ships_nothing():
    spark = _Session()
    assert ship_code(spark) is None
    assert spark.artifacts == []


def test_a_connect_session_gets_the_source_checkout_once(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    spark = _ConnectSession()
    shipped = ship_code(spark)
    assert shipped is not None
    assert ship_code(spark) == shipped
    assert spark.artifacts == [(shipped, True)]  # once per session, as a Python file
    with zipfile.ZipFile(shipped) as archive:
        names = set(archive.namelist())
    assert "spark_apps/dlq_replay/session.py" in names
    assert "pulsar_dlq_consumer/__init__.py" in names
    assert not [n for n in names if "__pycache__" in n or not n.endswith(".py")]
    assert shipped.startswith(str(tmp_path / "tmp"))
    assert source_bundle(str(tmp_path)).endswith(shipped.rsplit("/", 1)[1])  # named by its content


def test_a_connect_session_gets_the_zip_the_app_was_loaded_from(monkeypatch, tmp_path):
    bundle = tmp_path / "dlq_replay.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr("spark_apps/__init__.py", "")
    monkeypatch.setattr(session, "loaded_from_zip", lambda: str(bundle))
    spark = _ConnectSession()
    assert ship_code(spark) == str(bundle)
    assert spark.artifacts == [(str(bundle), True)]


def test_loaded_from_zip_finds_the_archive_of_a_module_path(monkeypatch, tmp_path):
    import spark_apps

    bundle = tmp_path / "dlq_replay.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr("spark_apps/__init__.py", "")
    assert session.loaded_from_zip() is None  # this checkout
    monkeypatch.setattr(spark_apps, "__file__", str(bundle / "spark_apps" / "__init__.py"))
    monkeypatch.setattr(spark_apps, "__loader__", SimpleNamespace())
    assert session.loaded_from_zip() == str(bundle)


def test_a_fix_file_is_shipped_and_importable_on_a_connect_client(tmp_path, monkeypatch):
    import tempfile

    fix = tmp_path / "connect_only_fix_module.py"
    fix.write_text("def fix(record):\n    return record\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(session, "_import_dir", [])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spark = _ConnectSession()
    add_pyfile(spark, str(fix))
    add_pyfile(spark, str(fix))
    assert spark.artifacts == [(str(fix), True)]
    assert session._import_dir[0].startswith(str(tmp_path))
    module = __import__("connect_only_fix_module")
    assert module.fix(1) == 1
    sys.modules.pop("connect_only_fix_module", None)
    folder = session._import_dir[0]
    session.remove_local_copies()
    assert session._import_dir == []
    assert folder not in sys.path
    assert not os.path.exists(folder)
    classic = _Session()
    add_pyfile(classic, str(fix))  # a classic session puts it on the driver's path itself
    assert classic.artifacts == [(str(fix), True)]
