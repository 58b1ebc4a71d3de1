"""Helpers for running real DAGs (``dag.test()`` on SQLite) against the embedded broker."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest


@dataclass
class DagResult:
    """Outcome of one ``dag.test()`` run."""

    run_id: str
    state: str
    states: dict[str, str]
    try_numbers: dict[str, int]
    xcoms: dict[str, Any] = field(default_factory=dict)


def register_dag(dag: Any) -> None:
    """Serialise a DAG defined in a test module into the metadata DB so ``dag.test()`` can run it."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()  # the bundle row must exist before DAGs reference it
    bag = SimpleNamespace(
        dags={dag.dag_id: dag}, import_errors={}, bundle_path=None, dag_warnings=set(), file_last_changed={}
    )
    sync_bag_to_db(bag, "dags-folder", None)


def _run_dag(dag: Any, **test_kwargs: Any) -> DagResult:
    """Register the DAG, ``dag.test()`` it and collect task states, try numbers and ``return_value`` XComs."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    register_dag(dag)
    dagrun = dag.test(**test_kwargs)
    with create_session() as session:
        tis = dagrun.get_task_instances(session=session)
        states = {ti.task_id: str(ti.state) for ti in tis}
        tries = {ti.task_id: ti.try_number for ti in tis}
        rows = session.scalars(
            XComModel.get_many(run_id=dagrun.run_id, dag_ids=dag.dag_id, key="return_value")
        ).all()
        xcoms = {row.task_id: XComModel.deserialize_value(row) for row in rows}
    return DagResult(dagrun.run_id, str(dagrun.state), states, tries, xcoms)


@pytest.fixture
def run_dag(airflow_db: Any) -> Any:
    """``run_dag(dag, **dag_test_kwargs) -> DagResult`` on the session's SQLite metadata DB."""
    return _run_dag


@pytest.fixture
def pulsar_conn(pulsar_broker, monkeypatch):
    """``pulsar_default`` pointing at the session broker (metrics URL, no admin API: like pulsar-lite)."""
    conn = {
        "conn_type": "pulsar",
        "host": pulsar_broker.service_url,
        "extra": {"metrics_url": pulsar_broker.metrics_url},
    }
    monkeypatch.setenv("AIRFLOW_CONN_PULSAR_DEFAULT", json.dumps(conn))
    return conn


@pytest.fixture
def spark_conn(monkeypatch):
    """``spark_default`` = local[2] (JSON form: the URI form ``spark://local[2]`` falls back to YARN)."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
