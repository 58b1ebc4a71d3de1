"""The lean driver of a local replay: which masters get it, and how it joins what the user set."""

from __future__ import annotations

import os

import pytest

from airflow_provider_dlq.driver_footprint import (
    LEAN_STAGE_THREADS,
    LEAN_YOUNG_OPTION,
    MALLOC_ARENA_MAX,
    SERIAL_GC_OPTION,
    STAGE_THREAD_CONFS,
    lean_driver_conf,
    lean_driver_env,
    local_cores,
)

OPTIONS = "spark.driver.extraJavaOptions"
STAGE_POOLS = dict.fromkeys(STAGE_THREAD_CONFS, LEAN_STAGE_THREADS)


@pytest.mark.parametrize(
    ("master", "cores"),
    [
        ("local", 1),
        ("local[2]", 2),
        ("local[ 4 ]", 4),
        ("local[2,3]", 2),  # with task retries
        ("local[*]", os.cpu_count() or 1),
        ("local-cluster[2,1,1024]", None),  # separate executor JVMs
        ("spark://127.0.0.1:7077", None),
        ("yarn", None),
        ("k8s://https://10.0.0.1:443", None),
    ],
)
def test_local_cores_reads_local_masters_only(master, cores):
    assert local_cores(master) == cores


def test_a_local_master_gets_a_heap_sized_to_its_cores_and_the_serial_collector():
    conf = lean_driver_conf({"spark.sql.shuffle.partitions": "4"}, "local[2]")
    assert conf == {
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": "512m",
        OPTIONS: f"{SERIAL_GC_OPTION} {LEAN_YOUNG_OPTION}",
        **STAGE_POOLS,
    }
    assert lean_driver_conf({}, "local[8]")["spark.driver.memory"] == "2048m"
    assert lean_driver_conf({}, "local")["spark.driver.memory"] == "512m"


def test_what_the_user_set_wins_and_their_mapping_is_not_changed():
    mine = {"spark.driver.memory": "3g", OPTIONS: "-Dx=1"}
    conf = lean_driver_conf(mine, "local[2]")
    assert conf == {
        "spark.driver.memory": "3g",
        OPTIONS: f"-Dx=1 {SERIAL_GC_OPTION} {LEAN_YOUNG_OPTION}",
        **STAGE_POOLS,
    }
    assert mine == {"spark.driver.memory": "3g", OPTIONS: "-Dx=1"}
    # A chosen collector gets no young-generation size of ours either: it sizes its own.
    for chosen in ("-XX:+UseG1GC", "-Xmx2g -XX:+UseParallelGC", "-XX:+UseZGC", "-XX:+UseSerialGC -Xmn32m"):
        assert lean_driver_conf({OPTIONS: chosen}, "local[2]")[OPTIONS] == chosen
    for young in ("-Xmn128m", "-XX:NewRatio=2", "-XX:NewSize=64m -XX:MaxNewSize=64m"):
        assert lean_driver_conf({OPTIONS: young}, "local[2]")[OPTIONS] == f"{young} {SERIAL_GC_OPTION}"
    pool = STAGE_THREAD_CONFS[0]
    assert lean_driver_conf({pool: "64"}, "local[2]")[pool] == "64"


def test_a_cluster_master_is_left_alone():
    assert lean_driver_conf({"a": "1"}, "spark://127.0.0.1:7077") == {"a": "1"}
    assert lean_driver_env({"A": "1"}, "yarn") == {"A": "1"}


def test_a_local_driver_gets_two_malloc_arenas_unless_the_environment_sets_them(monkeypatch):
    monkeypatch.delenv(MALLOC_ARENA_MAX, raising=False)
    assert lean_driver_env({"A": "1"}, "local[2]") == {"A": "1", MALLOC_ARENA_MAX: "2"}
    assert lean_driver_env({MALLOC_ARENA_MAX: "4"}, "local[2]") == {MALLOC_ARENA_MAX: "4"}
    monkeypatch.setenv(MALLOC_ARENA_MAX, "8")  # the Airflow worker's own setting reaches spark-submit
    assert lean_driver_env({}, "local[2]") == {}
