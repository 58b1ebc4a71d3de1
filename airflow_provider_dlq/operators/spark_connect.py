"""``DlqReplayOperator`` as a Spark Connect client: the replay app's driver run by the worker's Python
against the server of a ``spark_connect`` connection (the Apache Spark provider's ``SparkConnectHook``).

The command is ``python dlq_replay_main.py <the app's arguments>``, the same arguments as under
spark-submit, with the bundle on ``PYTHONPATH`` (the app ships it to the server itself) and the server's
URL in ``SPARK_REMOTE``, where PySpark's ``SparkSession.builder`` finds it. The URL carries the
connection's token and user id, so it is never put on the command line, in a log line or in XCom; no
JVM is started on the worker. ``conf``'s ``spark.sql.*`` settings reach the session as spark-submit
``--remote`` hands them to its driver (``PYSPARK_REMOTE_INIT_CONF_*``, which PySpark's Connect client
reads); PySpark's client applies no other key.
"""

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

from airflow.sdk.exceptions import AirflowException

from airflow_provider_dlq.errors import DlqProviderError
from airflow_provider_dlq.operators.process_tree import stop_process_tree
from pulsar_dlq_consumer.replay_options import SUMMARY_PREFIX

if TYPE_CHECKING:
    import logging
    from collections.abc import Callable, Mapping, Sequence

    from airflow.sdk.types import Logger

#: The Apache Spark provider's connection type of a Spark Connect server (``SparkConnectHook.conn_type``).
CONNECT_CONN_TYPE = "spark_connect"
#: Where PySpark's ``SparkSession.builder`` reads the server's URL.
SPARK_REMOTE_ENV = "SPARK_REMOTE"
#: Where PySpark's Connect client reads the session's initial settings (spark-submit ``--remote`` sets
#: them for its driver; only ``spark.sql.*`` keys are applied).
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
    """The Spark Connect server of a ``spark_connect`` connection. ``url`` (with the token and user id)
    goes to the client's ``SPARK_REMOTE`` only; ``address`` is what logs show."""

    conn_id: str
    address: str
    url: str = field(repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)

    def redact(self, text: str) -> str:
        """``text`` without the connection's token or user id (nor any ``token=``/``user_id=`` value)."""
        for secret in self.secrets:
            text = text.replace(secret, _REDACTED)
        return _URL_SECRET.sub(lambda m: f"{m.group(1)}={_REDACTED}", text)


def missing_client_packages(find: Callable[[str], object] | None = None) -> list[str]:
    """The ``pyspark[connect]`` packages this Python cannot import (the client runs with it); ``find``
    defaults to ``importlib.util.find_spec``."""
    find = find or importlib.util.find_spec
    missing = []
    for module, package in CLIENT_MODULES:
        try:
            found = find(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(package)
    return missing


def _secrets(login: str | None, password: str | None) -> tuple[str, ...]:
    values = {v for raw in (password, login) if raw for v in (raw, quote(raw), quote(raw, safe=""))}
    return tuple(sorted(values, key=len, reverse=True))


def _slashes_quoted(url: str, login: str | None, password: str | None) -> str:
    """``url`` with a ``/`` in the user id or token percent-encoded: ``SparkConnectHook`` quotes them
    keeping ``/``, and PySpark then reads ``sc://host/;token=a/b`` as a path and refuses the URL."""
    for key, value in (("user_id", login), ("token", password)):
        if value and "/" in value:
            url = url.replace(f"{key}={quote(value)}", f"{key}={quote(value, safe='')}", 1)
    return url


def spark_remote(conn_id: str) -> SparkRemote | None:
    """The Spark Connect server of ``conn_id`` when it is a ``spark_connect`` connection; ``None`` for
    any other type (spark-submit runs the app) or when it does not exist (spark-submit's own default).
    Raises :class:`SparkConnectConfigError` naming the fix."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    host = (conn.host or "").strip()
    if conn.conn_type != CONNECT_CONN_TYPE:
        if host.startswith("sc://"):
            raise SparkConnectConfigError(
                f"Spark connection {conn_id!r} is of type {conn.conn_type!r} but its Host is a Spark "
                f"Connect URL (sc://...); make it a connection of type {CONNECT_CONN_TYPE!r} (Host: the "
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
    url = _slashes_quoted(url, conn.login, conn.password)
    remote = SparkRemote(conn_id, url.split("/;", 1)[0].rstrip("/"), url, _secrets(conn.login, conn.password))
    _mask(remote.secrets)
    return remote


def _mask(secrets: Sequence[str]) -> None:
    """Register the secrets with Airflow's log masker too (every log line of the task is masked)."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older Task SDKs
        return
    for secret in secrets:
        mask_secret(secret)


def check_client_installed(remote: SparkRemote) -> None:
    """Raise :class:`SparkConnectConfigError` naming what to install when ``pyspark[connect]`` is missing."""
    missing = missing_client_packages()
    if missing:
        raise SparkConnectConfigError(
            f"Spark connection {remote.conn_id!r} is a Spark Connect server, but the worker's Python "
            f"({sys.executable}) has no Spark Connect client: {', '.join(missing)} not installed. Install "
            "pyspark[connect] at the server's Spark version in the worker's environment (e.g. "
            "pip install 'pyspark[connect]==4.0.1')."
        )


def client_argv(application: str, app_args: Sequence[str], python: str = sys.executable) -> list[str]:
    """The client's command: the app's main file run by ``python`` with the app's own arguments."""
    return [python, application, *app_args]


def init_conf(conf: Mapping[str, object]) -> dict[str, str]:
    """The ``spark.sql.*`` settings of ``conf``: the ones PySpark's Connect client applies to a session."""
    return {str(k): str(v) for k, v in conf.items() if str(k).startswith("spark.sql.")}


def client_env(
    base: Mapping[str, str],
    extra: Mapping[str, str],
    remote: SparkRemote,
    bundle_zip: str,
    conf: Mapping[str, str],
) -> dict[str, str]:
    """The client's environment: ``base`` (the worker's) with ``extra`` (the operator's), the server's URL
    in ``SPARK_REMOTE``, the bundle first on ``PYTHONPATH`` and ``conf`` as the session's initial
    settings; without the variables that would start a local server or a classic session."""
    env = {**base, **extra}
    for name in [*CLEARED_ENV, *(n for n in env if n.startswith("PYSPARK_REMOTE_INIT_CONF_"))]:
        env.pop(name, None)
    env[SPARK_REMOTE_ENV] = remote.url
    env["PYTHONPATH"] = os.pathsep.join([bundle_zip, *filter(None, [env.get("PYTHONPATH")])])
    if conf:
        env[INIT_CONF_LEN_ENV] = "1"
        env[INIT_CONF_ENV] = json.dumps(dict(conf), sort_keys=True)
    return env


class ConnectClient:
    """One run of the replay app as a Spark Connect client (what ``ReplaySubmitHook`` is to spark-submit):
    :meth:`run` streams its output to the task log (redacted) and returns when it has ended,
    :attr:`summary_line` holds its last ``DLQ_REPLAY_SUMMARY`` line, :meth:`stop` ends it by PID."""

    def __init__(
        self,
        remote: SparkRemote,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        log: Logger | logging.Logger,
    ) -> None:
        self.remote = remote
        self.argv = list(argv)
        self.env = dict(env)
        self.cwd = cwd
        self.log = log
        self.process: subprocess.Popen[str] | None = None
        self.summary_line: str | None = None
        self.stopped = False

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
        output = self.process.stdout
        if output is None:  # pragma: no cover - stdout=PIPE always gives one
            raise SparkConnectClientError("The Spark Connect client started without an output pipe.")
        with output:
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
        if code == 0:
            return
        raise SparkConnectClientError(
            f"The replay app, a Spark Connect client of {self.remote.address}, exited with code {code}; its "
            "error is in the log lines above. Exit code 2 is a usage error (fix the arguments); 1 a failed "
            "run, which a retry resumes; a negative code, the signal that ended it."
        )

    def stop(self) -> int:
        """Stop the client and anything it started, by PID; returns how many processes were signalled."""
        self.stopped = True
        process = self.process
        if process is None or process.poll() is not None:
            return 0
        return stop_process_tree(process.pid, self.log, "the Spark Connect client")


__all__ = [
    "CONNECT_CONN_TYPE",
    "ConnectClient",
    "SparkConnectClientError",
    "SparkConnectConfigError",
    "SparkRemote",
    "check_client_installed",
    "client_argv",
    "client_env",
    "init_conf",
    "missing_client_packages",
    "spark_remote",
]
