"""The replay app as a Spark Connect client of a ``spark_connect`` connection's server."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote

from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException

from airflow_provider_dlq.errors import DlqProviderError
from airflow_provider_dlq.operators.process_tree import stop_process_tree
from pulsar_dlq_consumer.replay_options import SUMMARY_PREFIX

if TYPE_CHECKING:
    import logging
    from collections.abc import Mapping, Sequence

    from airflow.sdk.types import Logger

SPARK_REMOTE_ENV = "SPARK_REMOTE"
INIT_CONF_LEN_ENV = "PYSPARK_REMOTE_INIT_CONF_LEN"
INIT_CONF_ENV = "PYSPARK_REMOTE_INIT_CONF_0"
#: Worker variables that would make PySpark start a local server or a classic session instead.
CLEARED_ENV = ("MASTER", "SPARK_LOCAL_REMOTE", INIT_CONF_LEN_ENV)
#: What PySpark's Connect client imports (``pyspark[connect]``): module -> the package providing it.
CLIENT_MODULES = (
    ("pyspark", "pyspark"),
    ("pandas", "pandas"),
    ("pyarrow", "pyarrow"),
    ("grpc", "grpcio"),
    ("grpc_status", "grpcio-status"),
    ("google.rpc", "googleapis-common-protos"),
    ("zstandard", "zstandard"),
)
_URL_SECRET = re.compile(r"\b(token|user_id)=[^;\s'\"&]*")
_REDACTED = "***"


class SparkConnectConfigError(DlqProviderError, ValueError):
    """The Spark connection cannot be used as a Spark Connect server; the message names the fix."""


class SparkConnectClientError(DlqProviderError, AirflowException):
    """The replay's Spark Connect client ended other than with exit code 0."""


@dataclass(frozen=True)
class SparkRemote:
    """A ``spark_connect`` server: ``url`` (with secrets) for ``SPARK_REMOTE`` only; ``address`` for logs."""

    conn_id: str
    address: str
    url: str = field(repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)

    def redact(self, text: str) -> str:
        """``text`` without the connection's token or user id (nor any ``token=``/``user_id=`` value)."""
        for secret in self.secrets:
            text = text.replace(secret, _REDACTED)
        return _URL_SECRET.sub(lambda m: f"{m.group(1)}={_REDACTED}", text)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package (google of google.rpc) is missing
        return False


def _secrets(login: str | None, password: str | None) -> tuple[str, ...]:
    values = {v for raw in (password, login) if raw for v in (raw, quote(raw), quote(raw, safe=""))}
    return tuple(sorted(values, key=len, reverse=True))


def spark_remote(conn_id: str) -> SparkRemote | None:
    """The server of a ``spark_connect`` connection; ``None`` for another type or a missing connection."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.sdk import BaseHook
    from airflow.sdk.log import mask_secret

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    host = (conn.host or "").strip()
    if conn.conn_type != SparkConnectHook.conn_type:
        if host.startswith("sc://"):
            raise SparkConnectConfigError(
                f"Spark connection {conn_id!r} is of type {conn.conn_type!r} but its Host is a Spark "
                "Connect URL (sc://...); make it a connection of type 'spark_connect' (Host: the "
                "server, Port: 15002, Login: user id, Password: token) to run the replay as a Spark Connect "
                "client."
            )
        return None
    if not host:
        raise SparkConnectConfigError(
            f"Spark Connect connection {conn_id!r} has no Host; set it to the server, e.g. "
            "spark-connect.example.com (or sc://spark-connect.example.com), with Port 15002."
        )
    try:
        url = SparkConnectHook(conn_id).get_connection_url()
    except ValueError:
        raise SparkConnectConfigError(
            f"The Host of Spark Connect connection {conn_id!r} must name the server only (HOST or sc://HOST, "
            "the port in Port): no path or ;parameters. Put the token in Password, the user id in Login and "
            "use_ssl in Extra."
        ) from None
    # SparkConnectHook keeps a "/" of the user id or token, and PySpark reads sc://host/;token=a/b as a path.
    for key, value in (("user_id", conn.login), ("token", conn.password)):
        if value and "/" in value:
            url = url.replace(f"{key}={quote(value)}", f"{key}={quote(value, safe='')}", 1)
    remote = SparkRemote(conn_id, url.split("/;", 1)[0].rstrip("/"), url, _secrets(conn.login, conn.password))
    for secret in remote.secrets:
        mask_secret(secret)  # every log line of the task is masked too
    return remote


def check_client_installed(remote: SparkRemote) -> None:
    if missing := [package for module, package in CLIENT_MODULES if not _importable(module)]:
        raise SparkConnectConfigError(
            f"Spark connection {remote.conn_id!r} is a Spark Connect server, but the worker's Python "
            f"({sys.executable}) has no Spark Connect client: {', '.join(missing)} not installed. Install "
            "pyspark[connect] at the server's Spark version in the worker's environment (e.g. "
            "pip install 'pyspark[connect]==4.0.1')."
        )


def init_conf(conf: Mapping[str, object]) -> dict[str, str]:
    """The ``spark.sql.*`` settings of ``conf``: the only ones PySpark's Connect client applies."""
    return {str(k): str(v) for k, v in conf.items() if str(k).startswith("spark.sql.")}


def client_env(
    base: Mapping[str, str],
    extra: Mapping[str, str],
    remote: SparkRemote,
    bundle_zip: str,
    conf: Mapping[str, str],
) -> dict[str, str]:
    """``base`` and ``extra`` with the server URL, the bundle first on ``PYTHONPATH``, ``conf`` to apply."""
    env = {**base, **extra}
    for name in [*CLEARED_ENV, *(n for n in env if n.startswith("PYSPARK_REMOTE_INIT_CONF_"))]:
        env.pop(name, None)
    env[SPARK_REMOTE_ENV] = remote.url
    env["PYTHONPATH"] = os.pathsep.join([bundle_zip, *filter(None, [env.get("PYTHONPATH")])])
    if conf:
        env[INIT_CONF_LEN_ENV] = "1"
        env[INIT_CONF_ENV] = json.dumps(dict(conf), sort_keys=True)
    return env


@dataclass
class ConnectClient:
    """One run of the app as a Spark Connect client: output redacted into the task log, stopped by PID."""

    remote: SparkRemote
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    log: Logger | logging.Logger
    process: subprocess.Popen[str] | None = None
    summary_line: str | None = None
    stopped: bool = False

    def run(self) -> None:
        """Run the client to its end; :class:`SparkConnectClientError` unless it exits 0."""
        self.process = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,  # its own process group: on_kill stops exactly this tree
        )
        assert self.process.stdout is not None  # stdout=PIPE
        with self.process.stdout as output:
            for raw in output:
                line = self.remote.redact(raw.rstrip("\n"))
                if line.strip().startswith(SUMMARY_PREFIX):
                    self.summary_line = line.strip()
                self.log.info("%s", line)
        code = self.process.wait()
        if self.stopped:
            # Checked before the exit code: stop() waits for the client by PID, and when it reaps the
            # process first, wait() here reads exit code 0.
            raise SparkConnectClientError(
                f"The replay's Spark Connect client (pid {self.process.pid}) was stopped before it finished; "
                "re-running the task resumes the same run id."
            )
        if code != 0:
            raise SparkConnectClientError(
                f"The replay app, a Spark Connect client of {self.remote.address}, exited with code {code}; "
                "its error is in the log lines above. Exit code 2 is a usage error (fix the arguments); 1 a "
                "failed run, which a retry resumes; a negative code, the signal that ended it."
            )

    def stop(self) -> None:
        """Stop the client and anything it started, by PID."""
        self.stopped = True
        if self.process is not None and self.process.poll() is None:
            stop_process_tree(self.process.pid, self.log, "the Spark Connect client")
