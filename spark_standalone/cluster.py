"""A Spark standalone cluster on loopback (one master, N workers) from the installed pyspark.

pyspark's wheel ships ``bin/spark-class`` but not ``sbin/start-master.sh``, so the daemons are started
the way those scripts would in the foreground: ``spark-class org.apache.spark.deploy.master.Master`` and
``... deploy.worker.Worker``, each on free loopback ports, with its work dir, logs and local dirs in one
private temp dir. Every daemon runs in its own session, is killed if the process that started it dies,
and is stopped by PID with its children (executors and their Python workers); the temp dir is deleted.

Used by the fault suite (a worker killed mid-apply) and the benchmark (its cluster runs), and by
``python -m spark_standalone`` for a person::

    cluster = SparkCluster()
    master_url = cluster.start(workers=2, cores=1, memory="1g")  # spark://127.0.0.1:<port>
    ...  # spark-submit --master master_url --total-executor-cores 2 --executor-memory 768m ...
    cluster.kill_worker(0)  # SIGKILL worker 0 and its executor (a lost machine)
    cluster.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from pulsar_standalone import free_port, kill_when_parent_dies

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DAEMON_MEMORY = "256m"  # heap of the master and worker daemons themselves (SPARK_DAEMON_MEMORY)


def spark_home() -> Path:
    """The installed pyspark (it holds ``bin/spark-class`` and the jars)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    log_path: Path
    webui_url: str

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class SparkCluster:
    """One master and N workers of a Spark standalone cluster on 127.0.0.1; see the module docstring."""

    host: str = "127.0.0.1"
    start_timeout_s: float = 180.0
    #: Where the daemons' logs go and stay after :meth:`stop` (default: the temp dir, deleted with it).
    log_dir: Path | None = None
    #: Added to every daemon's environment, and so to the executors a worker starts (e.g. an S3 server's
    #: keys and endpoint, ``spark_standalone.s3.S3Server.env``): nothing on any command line.
    env: dict[str, str] = field(default_factory=dict)
    root: Path | None = None
    master_url: str = ""
    webui_url: str = ""
    master: _Daemon | None = None
    workers: list[_Daemon] = field(default_factory=list)

    # ----------------------------------------------------------------- life cycle
    def start(self, workers: int = 2, cores: int = 1, memory: str = "1g") -> str:
        """Start the master and ``workers`` workers (``cores`` cores and ``memory`` for executors each);
        returns the master URL once every worker is ALIVE in the master's view."""
        if self.master is not None:
            raise RuntimeError("this cluster is already started; stop() it first")
        self.root = Path(tempfile.mkdtemp(prefix="spark-cluster-"))
        try:
            port, ui_port = free_port(), free_port()
            self.master_url = f"spark://{self.host}:{port}"
            self.webui_url = f"http://{self.host}:{ui_port}"
            self.master = self._launch(
                "master",
                MASTER_CLASS,
                ["--host", self.host, "--port", str(port), "--webui-port", str(ui_port)],
                self.webui_url,
            )
            self._wait(lambda s: True, "the master's web UI")
            for _ in range(workers):
                self.add_worker(cores=cores, memory=memory, wait=False)
            self._wait(lambda s: s.get("aliveworkers", 0) >= workers, f"{workers} ALIVE workers")
        except BaseException:
            self.stop()
            raise
        return self.master_url

    def add_worker(self, cores: int = 1, memory: str = "1g", *, wait: bool = True) -> int:
        """Start one more worker; returns its index (for :meth:`kill_worker`)."""
        if self.root is None or self.master is None:
            raise RuntimeError("start() the cluster first")
        i = len(self.workers)
        work = self.root / f"worker-{i}"
        work.mkdir(parents=True, exist_ok=True)
        port, ui_port = free_port(), free_port()
        args = [
            "--host", self.host, "--port", str(port), "--webui-port", str(ui_port),
            "--cores", str(cores), "--memory", memory, "--work-dir", str(work), self.master_url,
        ]  # fmt: skip
        self.workers.append(self._launch(f"worker-{i}", WORKER_CLASS, args, f"http://{self.host}:{ui_port}"))
        if wait:
            alive = self.alive_workers() + 1
            self._wait(lambda s: s.get("aliveworkers", 0) >= alive, f"worker {i} ALIVE")
        return len(self.workers) - 1

    def kill_worker(self, index: int) -> list[int]:
        """SIGKILL worker ``index`` and everything it started (executor JVM, Python workers): the machine
        is gone. The tree is frozen first so no child outlives it. Returns the killed PIDs."""
        daemon = self.workers[index]
        procs = _tree(daemon.process.pid)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for p in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.send_signal(sig)
        daemon.process.wait(timeout=30)
        psutil.wait_procs(procs, timeout=30)
        daemon.log.close()
        return [p.pid for p in procs]

    def stop(self) -> None:
        """Stop the workers, then the master, by PID (SIGTERM, then SIGKILL, children included) and
        delete the cluster's temp dir. Idempotent."""
        for daemon in [*reversed(self.workers), *([self.master] if self.master else [])]:
            _stop_tree(daemon.process)
            daemon.log.close()
        self.workers = []
        self.master = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> SparkCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- what tests read
    def status(self) -> dict[str, Any]:
        """The master's ``/json/`` view (workers, their state and cores used, applications)."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def alive_workers(self) -> int:
        return int(self.status().get("aliveworkers", 0))

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self.workers]

    def worker_status(self, index: int) -> dict[str, Any]:
        """Worker ``index``'s ``/json/`` view (its executors with their ids and application ids)."""
        with urllib.request.urlopen(f"{self.workers[index].webui_url}/json/", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def executor_ids(self, index: int) -> list[str]:
        """Ids of the executors worker ``index`` runs now, as the driver names them (``"0"``, ``"1"``)."""
        return [str(e["id"]) for e in self.worker_status(index).get("executors", [])]

    def executor_pids(self, index: int) -> list[int]:
        """PIDs of the executor JVMs worker ``index`` runs now (children of the worker running
        ``CoarseGrainedExecutorBackend``)."""
        pids = []
        for p in _tree(self.workers[index].process.pid)[1:]:
            with contextlib.suppress(psutil.Error):
                if any("CoarseGrainedExecutorBackend" in a for a in p.cmdline()):
                    pids.append(p.pid)
        return pids

    def logs(self) -> dict[str, str]:
        """The last lines of every daemon's log (for assertion messages)."""
        daemons = [*([self.master] if self.master else []), *self.workers]
        return {d.name: d.tail() for d in daemons}

    # ----------------------------------------------------------------- internals
    def _launch(self, name: str, main_class: str, args: list[str], webui_url: str) -> _Daemon:
        assert self.root is not None
        home = spark_home()
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(home),
            SPARK_LOCAL_IP=self.host,
            SPARK_LOG_DIR=str(self._log_dir()),
            SPARK_PID_DIR=str(self.root),
            SPARK_LOCAL_DIRS=str(self.root / "local"),
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            SPARK_NO_DAEMONIZE="1",
        )
        env.update(self.env)
        log_path = self._log_dir() / f"{name}.log"
        log = log_path.open("ab")
        process = subprocess.Popen(
            [str(home / "bin" / "spark-class"), main_class, *args],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=kill_when_parent_dies,
        )
        return _Daemon(name, process, log, log_path, webui_url)

    def _log_dir(self) -> Path:
        assert self.root is not None
        directory = self.log_dir or self.root / "logs"
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            for daemon in [*([self.master] if self.master else []), *self.workers]:
                if not daemon.alive():
                    raise RuntimeError(
                        f"Spark {daemon.name} exited with code {daemon.process.returncode} while starting; "
                        f"its log ({daemon.log_path}) ends:\n{daemon.tail()}"
                    )
            try:
                if ready(self.status()):
                    return
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = str(exc)
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {self.start_timeout_s:.0f} s waiting for {what} ({last})")


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _stop_tree(process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    if process.poll() is not None:
        return
    procs = _tree(process.pid)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=30)
    process.wait(timeout=30)
