"""The managed JVM class-data archive: written once, installed only when complete, then mapped.

These run the machine's real ``java`` (Spark needs it anyway): ``java -XX:ArchiveClassesAtExit=F
-version`` writes a small real archive in well under a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from airflow_provider_dlq.class_data import (
    DRIVER_JAVA_OPTIONS,
    STALE_TEMP_S,
    UNUSED_ARCHIVE_S,
    ArchivePlan,
    ClassDataArchive,
    archive_key,
    java_binary,
)


def write_real_archive(java: str, path: os.PathLike[str]) -> None:
    """What the driver JVM does at exit when the plan says ``-XX:ArchiveClassesAtExit``."""
    options = ArchivePlan(java, Path(path), Path(path)).java_options().split()
    done = subprocess.run([java, *options, "-version"], check=True, capture_output=True)
    assert done.stdout == b"", "the JVM's class-data messages must stay off stdout"


@pytest.fixture
def java() -> str:
    found = java_binary()
    assert found, "java must be on PATH (Spark needs it)"
    return found


def test_first_run_writes_the_archive_and_later_runs_map_it(tmp_path, java):
    cache = ClassDataArchive(tmp_path / "cds")
    first = cache.plan()
    assert first is not None
    assert first.writing is not None
    assert first.java_options().split()[-1] == f"-XX:ArchiveClassesAtExit={first.writing}"
    write_real_archive(java, first.writing)
    assert first.finish(succeeded=True)
    assert first.path.is_file()
    assert not first.writing.exists()

    later = cache.plan()
    assert later is not None
    assert later.writing is None
    assert later.path == first.path
    assert later.java_options().split()[-1] == f"-XX:SharedArchiveFile={first.path}"
    started = subprocess.run(
        [java, *later.java_options().split(), "-version"], capture_output=True, check=False
    )
    assert started.returncode == 0
    assert started.stdout == b"", "JVM messages must stay off stdout (the app's summary line comes last)"
    assert not later.finish(succeeded=True)  # nothing to install when mapping


def test_a_truncated_archive_is_never_installed(tmp_path, java):
    plan = ClassDataArchive(tmp_path / "cds").plan()
    assert plan is not None
    assert plan.writing is not None
    write_real_archive(java, plan.writing)
    data = plan.writing.read_bytes()
    plan.writing.chmod(0o644)
    plan.writing.write_bytes(data[: len(data) // 2])  # e.g. the disk filled up while the JVM dumped it
    assert not plan.finish(succeeded=True)
    assert not plan.path.exists()
    assert not plan.writing.exists()
    assert not list(tmp_path.glob("**/hs_err*")), "the check's crash report must not be left behind"


def test_a_failed_or_killed_run_installs_nothing(tmp_path, java):
    plan = ClassDataArchive(tmp_path / "cds").plan()
    assert plan is not None
    assert plan.writing is not None
    write_real_archive(java, plan.writing)
    assert not plan.finish(succeeded=False)
    assert not plan.path.exists()
    assert not plan.writing.exists()


def test_conf_keeps_the_users_options_and_never_overrides_their_class_data_sharing(tmp_path):
    plan = ArchivePlan("java", tmp_path / "a.jsa")
    option = f"-XX:SharedArchiveFile={tmp_path / 'a.jsa'}"
    quiet = "-Xlog:disable -Xlog:all=warning:stderr:uptime,level,tags"
    assert plan.conf({}) == {DRIVER_JAVA_OPTIONS: f"{quiet} {option}"}
    assert plan.conf({"spark.x": "1", DRIVER_JAVA_OPTIONS: "-Dfoo=bar"}) == {
        "spark.x": "1",
        DRIVER_JAVA_OPTIONS: f"-Dfoo=bar {quiet} {option}",
    }
    # Their own JVM logging stays as they set it.
    logs = {DRIVER_JAVA_OPTIONS: "-Xlog:gc:file=/tmp/gc.log"}
    assert plan.conf(logs) == {DRIVER_JAVA_OPTIONS: f"-Xlog:gc:file=/tmp/gc.log {option}"}
    theirs = {DRIVER_JAVA_OPTIONS: "-XX:SharedArchiveFile=/opt/their.jsa"}
    assert plan.conf(theirs) == theirs


def test_the_key_follows_the_jvm_and_the_spark_jars(tmp_path, java):
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "spark-core_2.13-4.3.0.jar").write_bytes(b"x" * 10)
    before = archive_key(java, jars)
    assert archive_key(java, jars) == before
    (jars / "spark-core_2.13-4.3.0.jar").write_bytes(b"x" * 11)
    assert archive_key(java, jars) != before
    # The same jars reinstalled in the same folder (a new venv): Java rejects an archive whose jars' times
    # changed ("The top archive failed to load"), so the key changes with them.
    resized = archive_key(java, jars)
    jar = jars / "spark-core_2.13-4.3.0.jar"
    os.utime(jar, (jar.stat().st_atime, jar.stat().st_mtime - 60))
    assert archive_key(java, jars) != resized
    elsewhere = tmp_path / "other-venv" / "jars"  # the same jars installed in another place
    shutil.copytree(jars, elsewhere)
    assert archive_key(java, elsewhere) != archive_key(java, jars)


def test_stale_temporaries_and_long_unused_archives_are_removed(tmp_path):
    cds = tmp_path / "cds"
    cds.mkdir()
    old = time.time() - max(STALE_TEMP_S, UNUSED_ARCHIVE_S) - 60
    stale_tmp = cds / "dlq-replay-driver-aaaa.1234.tmp"
    fresh_tmp = cds / "dlq-replay-driver-aaaa.5678.tmp"
    unused = cds / "dlq-replay-driver-0000000000000000.jsa"
    for path in (stale_tmp, fresh_tmp, unused):
        path.write_bytes(b"x")
    for path in (stale_tmp, unused):
        os.utime(path, (old, old))
    plan = ClassDataArchive(cds).plan()
    assert plan is not None
    assert not stale_tmp.exists()
    assert not unused.exists()
    assert fresh_tmp.exists(), "another run may still be writing it"


def test_no_java_or_no_writable_folder_means_no_archive(tmp_path):
    assert ClassDataArchive(tmp_path).plan({"JAVA_HOME": str(tmp_path / "no-jdk"), "PATH": ""}) is None
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert ClassDataArchive(blocker / "cds").plan() is None
