"""A Spark standalone cluster on loopback from the installed pyspark: one master and two workers.

``start_cluster()`` starts ``org.apache.spark.deploy.master.Master`` and two
``org.apache.spark.deploy.worker.Worker`` (1 core each, so the cluster has the cores of ``local[2]``)
with ``spark-class`` on free loopback ports, waits until the master's JSON status lists both workers
ALIVE, and returns a :class:`SparkCluster` whose ``stop()`` ends exactly those processes (by PID) and
deletes their work and log folders. Executors are children of the workers; the benchmark samples their
memory through :attr:`SparkCluster.worker_pids`.

``python -m bench.spark_cluster`` starts one for a person and stops it on Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pulsar_standalone import free_port


class ClusterError(RuntimeError):
    """The Spark standalone cluster did not start."""


def spark_home() -> Path:
    """``SPARK_HOME``, else the installed pyspark package (which ships ``bin/spark-class`` and jars)."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home)
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class SparkCluster:
    """A running master and its workers. ``master_url`` is what ``spark-submit --master`` takes."""

    master_url: str
    ui_url: str
    directory: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    logs: list[IO[bytes]] = field(default_factory=list, repr=False)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    @property
    def worker_pids(self) -> list[int]:
        return self.pids[1:]

    def status(self) -> dict[str, object]:
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as response:
            data: dict[str, object] = json.loads(response.read())
        return data

    def alive_workers(self) -> int:
        try:
            workers = self.status().get("workers", [])
        except OSError:
            return 0
        if not isinstance(workers, list):
            return 0
        return sum(1 for w in workers if isinstance(w, dict) and w.get("state") == "ALIVE")

    def close(self) -> None:
        self.stop()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the workers, then the master (SIGTERM, SIGKILL after ``timeout_s``), by PID; delete files."""
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()
        self.processes.clear()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_cluster(
    scratch: Path | None = None,
    *,
    workers: int = 2,
    cores_per_worker: int = 1,
    worker_memory: str = "2g",
    log_dir: Path | None = None,
    timeout_s: float = 180.0,
) -> SparkCluster:
    """Start a master and ``workers`` workers on 127.0.0.1 and wait until every worker is ALIVE."""
    home = spark_home()
    spark_class = home / "bin" / "spark-class"
    if not spark_class.exists():
        raise ClusterError(
            f"{spark_class} not found; install pyspark (source scripts/env.sh) or set SPARK_HOME"
        )
    directory = Path(tempfile.mkdtemp(prefix="spark-cluster-", dir=scratch))
    port, ui_port = free_port(), free_port()
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(home),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(directory / "logs"),
        SPARK_WORKER_DIR=str(directory / "work"),
        PYSPARK_PYTHON=env.get("PYSPARK_PYTHON", sys.executable),
    )
    env.pop("PYTHONPATH", None)
    cluster = SparkCluster(
        master_url=f"spark://127.0.0.1:{port}", ui_url=f"http://127.0.0.1:{ui_port}", directory=directory
    )
    logs = log_dir or directory
    logs.mkdir(parents=True, exist_ok=True)

    def launch(name: str, args: list[str]) -> None:
        log = (logs / f"spark-{name}.log").open("wb")
        cluster.logs.append(log)
        # spark-class execs java: the PID is the JVM's.
        proc = subprocess.Popen([str(spark_class), *args], stdout=log, stderr=subprocess.STDOUT, env=env)
        cluster.processes.append(proc)

    try:
        launch(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
        )
        for i in range(workers):
            work = directory / f"work-{i}"
            work.mkdir()
            launch(
                f"worker-{i}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(free_port()),
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    str(cores_per_worker),
                    "--memory",
                    worker_memory,
                    "--work-dir",
                    str(work),
                    cluster.master_url,
                ],
            )
        deadline = time.monotonic() + timeout_s
        while cluster.alive_workers() < workers:
            dead = [p.pid for p in cluster.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise ClusterError(
                    f"Spark standalone cluster not ready after {timeout_s:.0f} s (exited: {dead}); see the "
                    f"spark-*.log files in {logs}"
                )
            time.sleep(0.5)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def main() -> int:
    cluster = start_cluster()
    print(
        f"master {cluster.master_url} (UI {cluster.ui_url}); pids {cluster.pids}; Ctrl-C stops it", flush=True
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
