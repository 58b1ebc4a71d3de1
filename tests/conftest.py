"""Session-scoped real parts: Apache Pulsar standalone, one local[2] SparkSession, Airflow on SQLite.

The embedded pulsar-lite broker is a separate fixture (``lite_broker``) for its own smoke suite.

Environment defaults are set here, before anything imports Airflow or Spark, so ``pytest`` works the
same whether started by ``scripts/test.sh`` or by hand from the venv.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_dlq.embedded_broker import EmbeddedBroker
    from pulsar_standalone import StandaloneBroker
    from spark_standalone import ConnectServer, S3Server

REPO_ROOT = Path(__file__).resolve().parent.parent

# One temp dir for the session, removed when it ends (pytest_unconfigure): this process's and its
# children's temp files (TMPDIR: pytest's tmp_path, bundles, Spark's Python side, the standalone
# cluster's and Connect server's roots) and the java.io.tmpdir of the Spark JVMs the tests start (the
# drivers' spark-*/blockmgr-*/artifacts-* dirs and unpacked native codecs, liblz4*/snappy*; the
# standalone daemons'). A test that gives a JVM its own java.io.tmpdir later on the command line wins.
_SESSION_TMP = Path(tempfile.mkdtemp(prefix="dlq-test-session-")).resolve()
os.environ["TMPDIR"] = str(_SESSION_TMP)
tempfile.tempdir = str(_SESSION_TMP)
_JAVA_TMP = f"-Djava.io.tmpdir={_SESSION_TMP}"

# Airflow reads AIRFLOW_HOME at import time: give the test session a throwaway home and SQLite DB.
_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="dlq-test-airflow-"))
os.environ["AIRFLOW_HOME"] = str(_AIRFLOW_HOME)
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}"
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO_ROOT / "dags")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# The session's JVMs (brokers, Spark drivers and daemons) are short-lived and see little data: with the
# C1-only JIT a broker starts in about half the CPU time. The benchmark (python -m bench) keeps the default.
for _jvm_options in ("PULSAR_EXTRA_OPTS", "SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ.setdefault(_jvm_options, "-XX:TieredStopAtLevel=1")
for _jvm_options in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ[_jvm_options] = f"{os.environ[_jvm_options]} {_JAVA_TMP}".strip()
_venv_bin = str(Path(sys.executable).parent)
if _venv_bin not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _venv_bin + os.pathsep + os.environ.get("PATH", "")


_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the session's temp dir (its Airflow home among it), then leave with pytest's own exit status
    once everything is reported (the session fixtures, brokers and Spark included, are torn down by now).

    pulsar-client can abort the interpreter during shutdown when a Python logger is attached
    (apache/pulsar-client-python#256), which would turn a green run into exit code 134.
    """
    import shutil

    shutil.rmtree(_AIRFLOW_HOME, ignore_errors=True)  # the session's throwaway Airflow home
    shutil.rmtree(_SESSION_TMP, ignore_errors=True)
    if _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])


#: Tenants/namespaces the integration tests use besides public/default (Apache Pulsar, unlike the
#: embedded broker, creates no tenant or namespace on first use).
TEST_NAMESPACES = (
    "acme/orders",
    "acme/sales",
    "acme/eu",
    "acme/pay",
    "acme/dlq",
    "acme/payments",
    "acme/ns",
    "acme/shop",
    "acme/a",
    "bench/orders",
    "other/a",
)

_BROKERS: list[Any] = []


def pytest_report_header(config: pytest.Config) -> list[str]:
    from pulsar_standalone import PULSAR_VERSION

    return [
        f"broker: Apache Pulsar {PULSAR_VERSION} standalone (session fixture); pulsar-lite in its smoke suite"
    ]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """State which broker the session ran on: version, JDK, start time and memory."""
    for line in _BROKERS:
        terminalreporter.write_line(line)


# --------------------------------------------------------------------------- brokers


@dataclass(frozen=True)
class _ExternalBroker:
    """A broker this session did not start (see :func:`apache_pulsar`)."""

    service_url: str
    admin_url: str

    @property
    def metrics_url(self) -> str:
        return f"{self.admin_url}/metrics/"

    def admin(self) -> _ExternalBroker:
        """Read-only admin REST access (``get``), as ``StandaloneBroker.admin()`` offers (no auth)."""
        return self

    def get(self, path: str, *, timeout: float = 10.0) -> Any:
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.admin_url}{path}", timeout=timeout) as response:
            return json.loads(response.read())


def session_pulsar_version() -> str:
    """The Apache Pulsar release of the session broker: ``DLQ_TEST_PULSAR_VERSION``, else the newest tested
    (the suite runs in full on it; ``tests/integration/matrix/test_matrix_lts.py`` runs the stated subset
    on the 4.0 LTS release)."""
    from pulsar_standalone import PULSAR_NEWEST_VERSION

    return os.environ.get("DLQ_TEST_PULSAR_VERSION") or PULSAR_NEWEST_VERSION


@pytest.fixture
def http_server() -> Iterator[Callable[[type[BaseHTTPRequestHandler]], str]]:
    """Starts a loopback HTTP server for a handler class and gives its base URL; stopped after the test."""
    servers: list[ThreadingHTTPServer] = []

    def start(handler: type[BaseHTTPRequestHandler]) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def apache_pulsar() -> Iterator[StandaloneBroker]:
    """Apache Pulsar standalone for the whole session (free loopback ports, stopped by PID, data deleted).

    With ``DLQ_TEST_PULSAR_SERVICE_URL`` and ``DLQ_TEST_PULSAR_ADMIN_URL`` set, the tests use that broker
    instead (it is not started or stopped here): the wheel tests run the library's tests in a fresh venv
    against the calling session's broker.
    """
    if os.environ.get("DLQ_TEST_PULSAR_SERVICE_URL"):
        external = _ExternalBroker(
            service_url=os.environ["DLQ_TEST_PULSAR_SERVICE_URL"],
            admin_url=os.environ["DLQ_TEST_PULSAR_ADMIN_URL"],
        )
        _BROKERS.append(f"broker of the calling session: {external.service_url}")
        yield external  # type: ignore[misc]
        return
    from pulsar_standalone import start_standalone

    broker = start_standalone(namespaces=TEST_NAMESPACES, version=session_pulsar_version())
    _BROKERS.append(f"session broker at start: {broker.describe()}")
    try:
        yield broker
    finally:
        rss = broker.rss_bytes()
        _BROKERS.append(
            f"session broker at end: RSS {rss / 2**20 if rss else 0:.0f} MiB; stopped pid {broker.pid}, "
            f"data dir removed"
        )
        if disk_full := broker.disk_full():  # why writes failed with "Not enough non-faulty bookies"
            _BROKERS.append(f"session broker's bookie turned read-only, its disk full: {disk_full}")
        broker.stop()


@pytest.fixture(scope="session")
def pulsar_broker(apache_pulsar: StandaloneBroker) -> StandaloneBroker:
    """The broker integration tests run on: Apache Pulsar itself."""
    return apache_pulsar


@pytest.fixture(scope="session")
def lite_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """The embedded pulsar-lite broker (the demo's zero-setup default), for its smoke suite only."""
    from airflow_provider_dlq.embedded_broker import start_embedded_broker

    broker = start_embedded_broker(tmp_path_factory.mktemp("pulsar-lite"))
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def pulsar_service_url(pulsar_broker: StandaloneBroker) -> str:
    return pulsar_broker.service_url


@pytest.fixture(scope="session")
def pulsar_admin_url(pulsar_broker: StandaloneBroker) -> str:
    return pulsar_broker.admin_url


@pytest.fixture(scope="session")
def pulsar_client(pulsar_broker: StandaloneBroker) -> Iterator[Any]:
    """A ``pulsar.Client`` on the session broker, logging to Python logging."""
    import pulsar

    client = pulsar.Client(
        pulsar_broker.service_url, logger=logging.getLogger("pulsar.test"), operation_timeout_seconds=30
    )
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def topic_factory() -> Callable[[str], str]:
    """Make fresh, unique topic names so tests never see each other's messages."""

    def make(name: str = "t", namespace: str = "public/default") -> str:
        return f"persistent://{namespace}/{name}-{uuid.uuid4().hex[:10]}"

    return make


@pytest.fixture
def real_pulsar_url(pulsar_broker: StandaloneBroker) -> str:
    """Service URL of Apache Pulsar (tests using it carry the ``real_pulsar`` marker; they always run)."""
    return pulsar_broker.service_url


# --------------------------------------------------------------------------- spark


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local[2] SparkSession for the whole test session."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("airflow-provider-dlq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    try:
        yield session
    finally:
        session.stop()
        # py4j logs "Closing down clientserver connection" from __del__ after pytest closed its streams.
        logging.getLogger("py4j").setLevel(logging.WARNING)


# --------------------------------------------------------------------------- object storage, Spark Connect


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on loopback for the session (``spark_standalone.s3``), stopped by PID.

    ``.endpoint`` is its URL, ``.env`` the AWS variables a client process needs (test keys, region,
    ``AWS_ENDPOINT_URL_S3``), ``.bucket(name)`` creates a bucket, ``.client()`` is a boto3 client. The
    variables are not set in this process: pass ``.env`` to the processes that need it.
    """
    from spark_standalone import S3Server

    server = S3Server()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def spark_connect_server(s3_server: S3Server) -> Iterator[ConnectServer]:
    """A Spark Connect server on ``local[2]`` for the session (``spark_standalone.connect``), stopped by PID;
    its tasks have the S3 server's environment, so they read and write ``s3://`` on it."""
    from spark_standalone import ConnectServer

    server = ConnectServer()
    conf = {"spark.sql.shuffle.partitions": "4", "spark.sql.session.timeZone": "UTC"}
    server.start(master="local[2]", env=s3_server.env, conf=conf)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def spark_connect(spark_connect_server: ConnectServer) -> str:
    """The ``sc://127.0.0.1:<port>`` URL of the session's Spark Connect server (see
    :func:`spark_connect_server`)."""
    return spark_connect_server.url


# --------------------------------------------------------------------------- airflow


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """Migrate a throwaway SQLite metadata DB once per session; returns AIRFLOW_HOME."""
    from airflow.utils import db

    db.initdb()
    return _AIRFLOW_HOME


# --------------------------------------------------------------------------- real Airflow stack + browser


#: The session's Airflow stack while it runs, and the id of the last collected test that uses it.
_STACKS: list[Any] = []
_LAST_STACK_TEST: list[str] = []


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[Any]) -> None:
    users = [item.nodeid for item in items if "airflow_stack" in getattr(item, "fixturenames", ())]
    _LAST_STACK_TEST[:] = users[-1:]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the Airflow stack once the last test using it is torn down (its module fixtures too): its
    scheduler, DAG processor and triggerer would otherwise keep polling for the rest of the session."""
    if _STACKS and [item.nodeid] == _LAST_STACK_TEST:
        _STACKS.pop().stop()


@pytest.fixture(scope="session")
def airflow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Airflow (api-server, scheduler, dag-processor, triggerer) on loopback for the session, stopped
    after the last test that uses it.

    Its DAGs folder starts with the repository's ``dags/``; a test may add DAG files to
    ``airflow_stack.env["AIRFLOW__CORE__DAGS_FOLDER"]`` (parsed within seconds). Create connections and
    Variables through its REST API (``airflow_stack.api``), as a user would.
    """
    import shutil

    from airflow_stack import start_airflow_stack

    dags = tmp_path_factory.mktemp("stack-dags")
    for path in (REPO_ROOT / "dags").glob("*.py"):
        shutil.copy(path, dags / path.name)
    # The connection form's Test button is off by default in Airflow 3.
    stack = start_airflow_stack(dags, extra_env={"AIRFLOW__CORE__TEST_CONNECTION": "Enabled"})
    _STACKS.append(stack)
    try:
        yield stack
    finally:
        if _STACKS:
            _STACKS.pop().stop()


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium (Playwright ``Browser``), closed after the test."""
    from browser import open_browser

    with open_browser() as launched:
        yield launched
