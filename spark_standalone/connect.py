"""A Spark Connect server on loopback from the installed pyspark.

pyspark ships ``sbin/start-connect-server.sh``, which hands ``SparkConnectServer`` to ``spark-submit``
through ``spark-daemon.sh`` (a background daemon with a PID file). Here the same submission runs in the
foreground: ``spark-class org.apache.spark.deploy.SparkSubmit --class
org.apache.spark.sql.connect.service.SparkConnectServer``, with its gRPC endpoint bound to 127.0.0.1 on
a free port, the UI off (or on a free port), the venv's Python for its Python workers, and its Spark
settings in a properties file of its private temp dir (never on the command line). The server runs in
its own session, is killed if the process that started it dies, and is stopped by PID with its children
(its Python workers); the temp dir is deleted.

``env`` reaches the server's process and so, on ``local[n]``, its executors and Python workers: this
is how an S3 endpoint and its keys (``spark_standalone.s3.S3Server.env``) reach the tasks without
appearing in any argument. Used by the tests' ``spark_connect`` fixture and by
``python -m spark_standalone connect`` for a person::

    server = ConnectServer()
    url = server.start(master="local[2]", env=s3.env)  # sc://127.0.0.1:<port>
    ...  # spark-submit --remote url ..., or SparkSession.builder.remote(url)
    server.stop()
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pulsar_standalone import free_port, kill_when_parent_dies
from spark_standalone.cluster import spark_home
from spark_standalone.server_process import ServerProcess

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
SUBMIT_CLASS = "org.apache.spark.deploy.SparkSubmit"
#: Set in a process that opened a Spark Connect session through ``pyspark.sql.SparkSession``: the
#: server's own process must not inherit them (it would take itself for a Connect client).
_CLIENT_ENV = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_API_MODE")

#: Run in a child Python: a Connect session answers a trivial query. A child, because a Connect session
#: opened through ``pyspark.sql.SparkSession`` marks its whole process as a Connect client
#: (``SPARK_CONNECT_MODE_ENABLED``), which would turn the caller's later classic sessions into Connect ones.
_READY_CHECK = """
import sys
from pyspark.sql.connect.session import SparkSession
session = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
try:
    count = session.range(3).count()
    app_id = session.conf.get("spark.app.id")
finally:
    session.stop()
assert count == 3, count
print("ready", app_id)
"""


@dataclass
class ConnectServer(ServerProcess):
    """One Spark Connect server on 127.0.0.1; see the module docstring."""

    host: str = "127.0.0.1"
    start_timeout_s: float = 180.0
    #: Where the server's log goes and stays after :meth:`stop` (default: the temp dir, deleted with it).
    log_dir: Path | None = None
    url: str = ""
    port: int = 0
    #: The server's web UI (``""`` when it is off).
    webui_url: str = ""
    #: Seconds :meth:`start` took until the server answered a query.
    started_in_s: float = 0.0
    #: The server's Spark application id (``spark.app.id``): what a Connect client's session reports.
    application_id: str = ""

    # ----------------------------------------------------------------- life cycle
    def start(
        self,
        master: str = "local[2]",
        env: dict[str, str] | None = None,
        conf: dict[str, str] | None = None,
        *,
        ui: bool = False,
        driver_memory: str = "1g",
    ) -> str:
        """Start the server on ``master`` with ``env`` added to its environment and ``conf`` to its Spark
        settings (they win over the defaults here); returns ``sc://127.0.0.1:<port>`` once a Connect
        session ran a query on it. ``ui=True`` serves the web UI on a free port (:attr:`webui_url`)."""
        if self.process is not None:
            raise RuntimeError("this Connect server is already started; stop() it first")
        started = time.monotonic()
        self.root = Path(tempfile.mkdtemp(prefix="spark-connect-"))
        try:
            self.port = free_port()
            self.url = f"sc://{self.host}:{self.port}"
            settings = self._conf(ui, driver_memory)
            settings.update(conf or {})
            properties = self.root / "connect.conf"
            properties.write_text("".join(f"{k} {_escape(v)}\n" for k, v in settings.items()))
            properties.chmod(0o600)
            self._launch(master, properties, env or {})
            self._wait()
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - started
        return self.url

    # ----------------------------------------------------------------- what callers read
    # ----------------------------------------------------------------- internals
    def _conf(self, ui: bool, driver_memory: str) -> dict[str, str]:
        assert self.root is not None
        python = sys.executable
        settings = {
            "spark.driver.memory": driver_memory,
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
            "spark.local.dir": str(self.root / "local"),
            "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={self.root / 'tmp'}",
            "spark.pyspark.python": python,
            "spark.pyspark.driver.python": python,
        }
        (self.root / "local").mkdir()
        (self.root / "tmp").mkdir()
        if ui:
            ui_port = free_port()
            settings["spark.ui.port"] = str(ui_port)
            self.webui_url = f"http://{self.host}:{ui_port}"
        else:
            settings["spark.ui.enabled"] = "false"
            self.webui_url = ""
        return settings

    def _launch(self, master: str, properties: Path, extra_env: dict[str, str]) -> None:
        assert self.root is not None
        home = spark_home()
        env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ENV}
        env.update(
            SPARK_HOME=str(home),
            SPARK_LOCAL_IP=self.host,
            SPARK_LOCAL_DIRS=str(self.root / "local"),
            TMPDIR=str(self.root / "tmp"),  # its Python workers' temp files too
            SPARK_CONNECT_MODE="0",  # as sbin/start-connect-server.sh: the server is a classic app
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
        )
        env.update(extra_env)
        log_dir = self.log_dir or self.root / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / "connect-server.log"
        self._log = self.log_path.open("ab")
        command = [
            str(home / "bin" / "spark-class"), SUBMIT_CLASS, "--class", SERVER_CLASS,
            "--name", "Spark Connect server", "--master", master, "--properties-file", str(properties),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=kill_when_parent_dies,
        )

    def _port_open(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(1)
            return sock.connect_ex((self.host, self.port)) == 0

    def _wait(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last = "the gRPC port is not open yet"
        while time.monotonic() < deadline:
            if not self.alive():
                assert self.process is not None
                raise RuntimeError(
                    f"the Spark Connect server exited with code {self.process.returncode} while starting; "
                    f"its log ({self.log_path}) ends:\n{self.tail()}"
                )
            if self._port_open():
                env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ENV}
                left = max(5.0, deadline - time.monotonic())
                try:
                    check = subprocess.run(
                        [sys.executable, "-c", _READY_CHECK, self.url],
                        capture_output=True, text=True, timeout=left, env=env, check=False,
                    )  # fmt: skip
                except subprocess.TimeoutExpired:
                    last = "a Connect session opened but its query did not finish"
                    break
                if check.returncode == 0:
                    self.application_id = check.stdout.split()[-1]
                    return
                last = f"a Connect session's query failed: {check.stderr.strip()[-2000:]}"
            time.sleep(0.5)
        raise RuntimeError(
            f"timed out after {self.start_timeout_s:.0f} s waiting for the Spark Connect server at "
            f"{self.url} ({last}); its log ({self.log_path}) ends:\n{self.tail()}"
        )


def _escape(value: str) -> str:
    """A value as a Java properties file reads it back (backslashes and line breaks escaped)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")
