"""End to end: real DLQs (filled by the consumer library) -> the example DAGs (Airflow) -> Spark -> broker.

* ``dlq_nightly_replay``: the sensor sees the backlog, the first replay try is killed mid-run, the retry
  resumes the same run id; fixed messages reach the origin exactly once, poison ones are archived, the
  DLQ is drained, the summary is in XCom and in an asset event.
* ``dlq_backfill`` in dry-run: a report and nothing else (no approval asked); the DLQ keeps every message.
* ``on_kill`` stops spark-submit and its whole process tree.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pulsar
import pyarrow.parquet as pq
import pytest

from pulsar_dlq_consumer import DeadLetterPolicy, DlqConsumer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAGS = Path(__file__).resolve().parents[3] / "dags"
SUB = "dlq-replayer"
PLAYBOOK = """\
version: 1
rules:
  - name: retry-timeouts
    match: {error_class: TimeoutError}
    action: republish
  - name: archive-bad-orders
    match: {error_class: ValueError}
    action: archive
"""


def fill_dlq(client, origin: str, timeouts: int, bad: int) -> DlqConsumer:
    """An 'orders' service that terms every order: ``timeouts`` TimeoutErrors, ``bad`` ValueErrors.

    Returns the service's consumer (still open: replayed orders arrive on it later).
    """
    service = DlqConsumer(
        client,
        origin,
        "orders-service",
        dead_letter_policy=DeadLetterPolicy(initial_subscription_name=SUB),
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = client.create_producer(origin)
    for i in range(timeouts + bad):
        producer.send(json.dumps({"order": i}).encode(), partition_key=f"order-{i}", properties={"n": str(i)})
    producer.close()
    for _ in range(timeouts + bad):
        msg = service.receive(timeout_millis=10_000)
        n = int(msg.properties()["n"])
        error = (
            TimeoutError(f"payment service timed out after {n}s")
            if n < timeouts
            else ValueError(f"order {n} has no customer id")
        )
        service.term(msg, error)
    service.flush()
    return service


def drain(consumer, timeout_ms: int = 3000) -> list:
    """Receive (and ack) until nothing arrives for ``timeout_ms``."""
    got = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            return got
        got.append(msg)
        consumer.acknowledge(msg)


def pending_on(client, topic: str, subscription: str = SUB) -> int:
    """Messages still pending on a subscription (received, never acked, consumer closed)."""
    consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared)
    count = 0
    try:
        while True:
            consumer.receive(timeout_millis=3000)
            count += 1
    except pulsar.Timeout:
        return count
    finally:
        consumer.close()


def spark_processes(marker: str = "dlq_replay_main.py") -> list:
    import psutil

    procs = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if any(marker in part for part in proc.cmdline()):
                procs.append(proc)
        except psutil.Error:
            continue
    return procs


def is_python_driver(proc) -> bool:
    import psutil

    try:
        return "python" in Path(proc.cmdline()[0]).name
    except (psutil.Error, IndexError):
        return False


def kill_tree(procs) -> None:
    import psutil

    everything = list(procs)
    for proc in procs:
        try:
            everything += proc.children(recursive=True)
        except psutil.Error:
            continue
    for proc in everything:
        try:
            proc.kill()
        except psutil.Error:
            continue


def kill_first_attempt_after_plan(out: Path, stop: threading.Event, killed: list) -> threading.Thread:
    """Simulate a crashed worker: once the run's plan step is complete, SIGKILL spark-submit's tree."""

    def watch():
        while not stop.is_set():
            for state_file in out.glob("runs/*/state.json"):
                try:
                    state = json.loads(state_file.read_text())
                except (OSError, ValueError):
                    continue
                if state.get("steps", {}).get("plan", {}).get("status") == "complete":
                    procs = spark_processes()
                    if procs:
                        kill_tree(procs)
                        killed.append(state["run_id"])
                        return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def dag_env(monkeypatch, tmp_path, pulsar_conn, spark_conn):
    """Variables and scheduling knobs of the example DAGs, as environment (read at parse/run time)."""
    out = tmp_path / "out"
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(PLAYBOOK)
    monkeypatch.setenv("AIRFLOW_VAR_DLQ_OUTPUT_DIR", str(out))
    monkeypatch.setenv("AIRFLOW_VAR_DLQ_PLAYBOOK", str(playbook))
    monkeypatch.setenv("DLQ_SENSOR_POLL_SECONDS", "1")
    monkeypatch.setenv("DLQ_SENSOR_TIMEOUT_SECONDS", "120")
    monkeypatch.setenv("DLQ_REPLAY_RETRIES", "1")
    monkeypatch.setenv("DLQ_REPLAY_RETRY_DELAY_SECONDS", "0")
    return SimpleNamespace(out=out, playbook=playbook, monkeypatch=monkeypatch)


def load_dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / f"{dag_id}.py"))
    assert bag.import_errors == {}
    return bag.dags[dag_id]


def asset_events(name: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.name == name)
        ).all()
        return [dict(row.extra or {}) for row in rows]


def test_nightly_replay_end_to_end_with_a_killed_first_try(run_dag, dag_env, pulsar_client, topic_factory):
    from airflow_provider_dlq.operators.replay_cli import default_run_id

    origin = topic_factory("orders")
    service = fill_dlq(pulsar_client, origin, timeouts=5, bad=3)
    dlq = service.dead_letter_topic
    dag_env.monkeypatch.setenv("AIRFLOW_VAR_DLQ_TOPICS", dlq)
    dag_env.monkeypatch.setenv("AIRFLOW_VAR_DLQ_ORIGIN_ALLOWLIST", origin)
    dag_env.monkeypatch.setenv("AIRFLOW_VAR_DLQ_NIGHTLY_MODE", "replay")  # going live (dry-run by default)
    dag = load_dag("dlq_nightly_replay")

    stop, killed = threading.Event(), []
    watcher = kill_first_attempt_after_plan(dag_env.out, stop, killed)
    try:
        result = run_dag(dag)
    finally:
        stop.set()
        watcher.join(timeout=5)

    assert result.states == {
        "check_configuration": "success",
        "wait_for_dlq_backlog": "success",
        "replay": "success",
        "report": "success",
    }, result
    run_id = default_run_id("dlq_nightly_replay", "replay", result.run_id)
    assert killed == [run_id], "the first try was not killed mid-run"
    assert result.try_numbers["replay"] == 2
    backlog = result.xcoms["wait_for_dlq_backlog"]
    assert backlog[dlq]["backlog"] == 8

    summary = result.xcoms["replay"]
    assert summary["run_id"] == run_id
    assert summary["mode"] == "replay"
    assert summary["totals"]["republished"] == 5
    assert summary["totals"]["archived"] == 3
    assert summary["totals"]["left_pending"] == 0
    state = json.loads((dag_env.out / "runs" / run_id / "state.json").read_text())
    assert state["attempts"] == 2, "the retry did not resume the killed run"

    # On the broker: every fixed order arrived once at the origin service; the DLQ is drained.
    replayed = drain(service.consumer)
    assert len(replayed) == 5
    assert {m.properties()["REPLAY_RUN_ID"] for m in replayed} == {run_id}
    assert len({m.properties()["REPLAY_ID"] for m in replayed}) == 5
    assert sorted(json.loads(m.data())["order"] for m in replayed) == [0, 1, 2, 3, 4]
    assert pending_on(pulsar_client, dlq) == 0

    # In the archive and the ledger.
    archive = pq.read_table(summary["paths"]["archive"]).to_pylist()
    assert sorted(r["dlq_topic"] for r in archive) == [dlq] * 3
    assert Path(summary["paths"]["report_json"]).is_file()
    assert Path(summary["paths"]["report_html"]).is_file()

    # The report task printed the per-group summary; the asset event carries the run's summary.
    assert "republished=5" in result.xcoms["report"]
    assert "archived=3" in result.xcoms["report"]
    events = [e for e in asset_events("dlq_replay_reports") if e.get("run_id") == run_id]
    assert events
    assert events[-1]["totals"]["republished"] == 5

    # The task's extra link leads to the provider's report endpoint for this task instance.
    from airflow_provider_dlq.operators.links import report_endpoint

    assert link_xcom(result.run_id, "dlq_nightly_replay", "replay", "DlqReplayReportLink") == report_endpoint(
        "dlq_nightly_replay", result.run_id, "replay"
    )
    service.close()


def test_unconfigured_nightly_run_is_skipped_and_touches_nothing(
    run_dag, dag_env, pulsar_client, topic_factory
):
    """Unpausing the scheduled DAG with no Variables set: the run is skipped before it waits or replays."""
    origin = topic_factory("orders")
    service = fill_dlq(pulsar_client, origin, timeouts=2, bad=0)
    result = run_dag(load_dag("dlq_nightly_replay"))
    assert result.states == {
        "check_configuration": "skipped",
        "wait_for_dlq_backlog": "skipped",
        "replay": "skipped",
        "report": "skipped",
    }, result
    assert not dag_env.out.exists()
    assert pending_on(pulsar_client, service.dead_letter_topic) == 2
    service.close()


def link_xcom(run_id: str, dag_id: str, task_id: str, link_class: str):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(run_id=run_id, dag_ids=dag_id, task_ids=task_id, key=f"_link_{link_class}")
        ).first()
        return None if row is None else XComModel.deserialize_value(row)


def test_backfill_dry_run_reports_and_changes_nothing(run_dag, dag_env, pulsar_client, topic_factory):
    origin = topic_factory("orders")
    service = fill_dlq(pulsar_client, origin, timeouts=2, bad=2)
    dlq = service.dead_letter_topic
    dag = load_dag("dlq_backfill")
    conf = {"topics": [dlq], "playbook": str(dag_env.playbook), "origin_allowlist": origin}
    result = run_dag(dag, run_conf=conf)

    # dry-run mode stops after the report: no approval is asked, no replay runs.
    assert result.states == {
        "dry_run": "success",
        "report": "success",
        "wants_replay": "success",
        "approve": "skipped",
        "replay": "skipped",
        "replay_report": "skipped",
    }, result
    assert result.try_numbers["dry_run"] == 1
    summary = result.xcoms["dry_run"]
    assert summary["mode"] == "dry-run"
    assert summary["totals"]["snapshot"] == 4
    assert summary["totals"]["acked"] == 0
    assert summary["totals"]["left_pending"] == 4
    assert {g["action"] for g in summary["groups"]} == {"republish", "archive"}
    assert drain(service.consumer) == []  # nothing republished
    assert pending_on(pulsar_client, dlq) == 4  # nothing acked
    service.close()


def test_on_kill_stops_spark_submit_and_its_children(
    pulsar_conn, spark_conn, pulsar_client, topic_factory, tmp_path
):
    import psutil
    from airflow.sdk.exceptions import AirflowException

    from airflow_provider_dlq.operators.replay import DlqReplayOperator

    origin = topic_factory("orders")
    service = fill_dlq(pulsar_client, origin, timeouts=1, bad=0)
    op = DlqReplayOperator(
        task_id="replay", topics=service.dead_letter_topic, output_dir=str(tmp_path / "out")
    )
    ti = SimpleNamespace(dag_id="kill_test", task_id="replay", run_id="manual__kill", map_index=-1)
    errors: list[BaseException] = []

    def run():
        try:
            op.execute({"ti": ti, "outlet_events": None})
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 240
    tree: list = []
    while time.monotonic() < deadline:
        tree = spark_processes()
        if any(is_python_driver(proc) for proc in tree):  # the JVM has started the app's Python driver
            break
        time.sleep(0.2)
    assert any(is_python_driver(proc) for proc in tree), "spark-submit did not start its Python driver"
    op.on_kill()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert errors
    assert isinstance(errors[0], AirflowException)
    for proc in tree:
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    service.close()
