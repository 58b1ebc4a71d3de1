"""The benchmark's memory sampler: the role of each process, and peaks per role and of the whole tree."""

from __future__ import annotations

import subprocess
import sys

from bench.procmon import MemoryPeaks, TreeMemorySampler, is_unexeced_jvm_child, role_of, rss_of_one_program

JVM = ["/usr/lib/jvm/bin/java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit"]
DAEMON = ["/venv/bin/python", "-m", "dlq_pyspark_daemon", "pyspark.worker"]


def test_memory_roles_of_a_spark_process_tree():
    assert role_of("java", JVM) == "jvm"
    assert role_of("python", ["/venv/bin/python", "-m", "pyspark.daemon", "pyspark.worker"]) == "py_workers"
    assert role_of("python", DAEMON) == "py_workers"  # the operator's compiled PySpark daemon
    assert (
        role_of("python3.11", ["/venv/bin/python3.11", "/b/dlq_replay_main.py", "--run-id", "r"])
        == "py_driver"
    )
    assert role_of("bash", ["bash", "/venv/bin/spark-submit"]) == "other"


def test_a_cluster_executor_or_connect_server_is_a_remote_jvm_and_its_python_works_for_tasks():
    server = ["/usr/lib/jvm/bin/java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit", "--class",
              "org.apache.spark.sql.connect.service.SparkConnectServer"]  # fmt: skip
    assert role_of("java", server, adopted=True) == "remote_jvm"
    assert role_of("python", DAEMON, adopted=True) == "py_workers"
    assert role_of("python3", ["/venv/bin/python3", "-c", "x"], adopted=True) == "py_workers"
    assert role_of("bash", ["bash", "-c", "x"], adopted=True) == "other"


def test_a_jvm_child_before_its_exec_is_not_counted_again():
    """A child of the JVM still running the JVM's command line (forked, not yet exec'd) shows the JVM's
    RSS; once it runs its own program, or when it is a forked Python worker, it counts."""
    assert is_unexeced_jvm_child(("jvm", JVM), list(JVM))
    assert is_unexeced_jvm_child(("remote_jvm", JVM), list(JVM))
    assert not is_unexeced_jvm_child(("jvm", JVM), ["chmod", "0644", "part-0.parquet"])
    assert not is_unexeced_jvm_child(("py_workers", DAEMON), list(DAEMON))
    assert not is_unexeced_jvm_child(None, list(JVM))


def test_a_process_that_execs_while_read_is_left_out_of_that_sample():
    """Read before its exec, a JVM's child has the JVM's RSS; read after, another name: not one program."""

    class Reading:
        def __init__(self, names: list[str], rss: int) -> None:
            self.names, self.rss = names, rss

        def name(self) -> str:
            return self.names.pop(0)

        def memory_info(self):
            return type("Memory", (), {"rss": self.rss})()

    assert rss_of_one_program(Reading(["java", "chmod"], 900 * 2**20), str) is None
    assert rss_of_one_program(Reading(["python3", "python3"], 64 * 2**20), str) == ("python3", 64 * 2**20)


def _holder(mib: int, seconds: float) -> str:
    return f"b = bytearray({mib} * 2**20); import time; time.sleep({seconds})"


def test_tree_sampler_sees_children_memory():
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {_holder(64, 2)!r}], check=True)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    sampler = TreeMemorySampler(proc.pid, interval_s=0.05).start()
    proc.wait(timeout=30)
    peaks = sampler.stop()
    assert peaks.samples > 5
    # the child alone holds 64 MiB: only a sampler that walks the tree sees more than that
    assert peaks.tree_peak > 64 * 2**20
    assert peaks.peak["py_driver"] == peaks.tree_peak


def test_an_adopted_root_and_its_children_count_in_the_tree_but_not_as_the_driver():
    """A Spark Connect server is no child of spark-submit: ``adopted_roots`` adds it and its children
    (its Python workers) to the run's tree, apart from the driver's own peak."""
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {_holder(48, 3)!r}], check=True)"
    server = subprocess.Popen([sys.executable, "-c", code])
    driver = subprocess.Popen([sys.executable, "-c", _holder(16, 2)])
    try:
        sampler = TreeMemorySampler(driver.pid, interval_s=0.05, adopted_roots=(server.pid,)).start()
        driver.wait(timeout=30)
        peaks = sampler.stop()
    finally:
        server.kill()
        server.wait(timeout=30)
    assert 16 * 2**20 < peaks.peak["py_driver"] < 48 * 2**20  # the driver's own process only
    assert peaks.peak["py_workers"] > 48 * 2**20  # the server and its child
    assert peaks.tree_peak >= peaks.peak["py_driver"] + 48 * 2**20
    mib = peaks.as_mib()
    assert set(mib) >= {"py_driver_mib", "jvm_mib", "py_workers_mib", "remote_jvm_mib", "tree_mib"}


def test_peaks_in_mib_name_every_role():
    peaks = MemoryPeaks()
    peaks.peak.update(jvm=300 * 2**20, py_driver=200 * 2**20, remote_jvm=700 * 2**20)
    peaks.tree_peak = 1200 * 2**20
    mib = peaks.as_mib()
    assert (mib["driver_mib"], mib["remote_jvm_mib"], mib["tree_mib"]) == (500.0, 700.0, 1200.0)
