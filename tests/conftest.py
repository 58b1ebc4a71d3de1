"""Session-scoped real parts: the embedded Pulsar broker, one local[2] SparkSession, Airflow on SQLite.

Environment defaults are set here, before anything imports Airflow or Spark, so ``pytest`` works the
same whether started by ``scripts/test.sh`` or by hand from the venv.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_dlq.embedded_broker import EmbeddedBroker

REPO_ROOT = Path(__file__).resolve().parent.parent

# Airflow reads AIRFLOW_HOME at import time: give the test session a throwaway home and SQLite DB.
_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="dlq-test-airflow-"))
os.environ["AIRFLOW_HOME"] = str(_AIRFLOW_HOME)
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}"
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO_ROOT / "dags")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
_venv_bin = str(Path(sys.executable).parent)
if _venv_bin not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _venv_bin + os.pathsep + os.environ.get("PATH", "")


_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave with pytest's own exit status once everything is reported.

    pulsar-client can abort the interpreter during shutdown when a Python logger is attached
    (apache/pulsar-client-python#256), which would turn a green run into exit code 134.
    """
    if _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``real_pulsar`` tests, with the reason, unless a full Apache Pulsar is configured."""
    if os.environ.get("PULSAR_SERVICE_URL"):
        return
    reason = (
        "needs a full Apache Pulsar (delayed delivery, admin REST, broker dedup): "
        "set PULSAR_SERVICE_URL and PULSAR_ADMIN_URL, e.g. against docker/compose.yaml"
    )
    for item in items:
        if "real_pulsar" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


# --------------------------------------------------------------------------- broker


@pytest.fixture(scope="session")
def pulsar_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """One embedded pulsar-lite broker for the session, stopped by PID at teardown."""
    from airflow_provider_dlq.embedded_broker import start_embedded_broker

    broker = start_embedded_broker(tmp_path_factory.mktemp("pulsar-lite"))
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def pulsar_service_url(pulsar_broker: EmbeddedBroker) -> str:
    return pulsar_broker.service_url


@pytest.fixture(scope="session")
def pulsar_client(pulsar_broker: EmbeddedBroker) -> Iterator[Any]:
    """A ``pulsar.Client`` on the session broker, logging to Python logging."""
    import pulsar

    client = pulsar.Client(
        pulsar_broker.service_url, logger=logging.getLogger("pulsar.test"), operation_timeout_seconds=10
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
def real_pulsar_url() -> str:
    """Service URL of a full Apache Pulsar (tests using it carry the ``real_pulsar`` marker)."""
    return os.environ["PULSAR_SERVICE_URL"]


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


# --------------------------------------------------------------------------- airflow


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """Migrate a throwaway SQLite metadata DB once per session; returns AIRFLOW_HOME."""
    from airflow.utils import db

    db.initdb()
    return _AIRFLOW_HOME
