"""DlqBacklogSensor in real Airflow (``dag.test()``) against Apache Pulsar's Prometheus metrics.

The admin REST source (exact message counts) is proven in ``test_provider_backlog_admin.py``.
"""

from __future__ import annotations

import json
import threading

import pendulum
import pulsar
import pytest
from airflow.sdk import DAG

from airflow_provider_dlq.hooks.pulsar import PulsarHook
from airflow_provider_dlq.sensors.backlog import DlqBacklogSensor

pytestmark = pytest.mark.integration

SUB = "dlq-replayer"
START = pendulum.datetime(2024, 1, 1, tz="UTC")


def create_subscription(client, topic):
    consumer = client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
    consumer.close()


def produce_later(client, topic, count, delay):
    producer = client.create_producer(topic)

    def send():
        for i in range(count):
            producer.send(f"failed-{i}".encode(), properties={"REAL_TOPIC": "persistent://public/default/o"})
        producer.flush()

    timer = threading.Timer(delay, send)
    timer.start()
    return timer, producer


def test_hook_test_connection_against_the_broker(pulsar_conn):
    ok, message = PulsarHook().test_connection()
    assert ok, message
    assert "metrics endpoint ok" in message


def test_sensor_finishes_when_backlog_appears_deferred_and_poke(
    run_dag, pulsar_conn, pulsar_client, topic_factory
):
    dlq = topic_factory("orders-DLQ")
    quiet = topic_factory("quiet-DLQ")
    create_subscription(pulsar_client, dlq)
    create_subscription(pulsar_client, quiet)
    with DAG("test_sensor_backlog_appears", schedule=None, start_date=START, catchup=False) as dag:
        deferred = DlqBacklogSensor(
            task_id="deferred",
            topics=[dlq, quiet],
            min_backlog=3,
            poll_interval=1,
            timeout=90,
            soft_fail=True,
        )
        poke = DlqBacklogSensor(
            task_id="poke", topics=f"{dlq},{quiet}", poll_interval=1, timeout=60, deferrable=False
        )
        deferred >> poke
    timer, producer = produce_later(pulsar_client, dlq, count=4, delay=2.0)
    try:
        result = run_dag(dag)
    finally:
        timer.join()
        producer.close()
    assert result.states == {"deferred": "success", "poke": "success"}, result
    for task_id in ("deferred", "poke"):
        backlog = result.xcoms[task_id]
        assert backlog[dlq]["backlog"] == 4
        assert backlog[dlq]["source"] == "metrics"
        assert backlog[quiet] == {
            "topic": quiet,
            "subscription": SUB,
            "backlog": 0,
            "source": "metrics",
            "found": True,
            "oldest_age_seconds": None,
            "entries": None,
            "exact": False,  # the gauge counts entries: a batch counts once
        }
        json.dumps(backlog)  # plain JSON in XCom


def test_sensor_soft_fails_to_skipped_when_nothing_is_pending(
    run_dag, pulsar_conn, pulsar_client, topic_factory
):
    dlq = topic_factory("empty-DLQ")
    create_subscription(pulsar_client, dlq)
    with DAG("test_sensor_soft_fail", schedule=None, start_date=START, catchup=False) as dag:
        wait = DlqBacklogSensor(task_id="wait", topics=[dlq], poll_interval=1, timeout=4, soft_fail=True)
        downstream = DlqBacklogSensor(task_id="downstream", topics=[dlq], poll_interval=1, deferrable=False)
        wait >> downstream
    result = run_dag(dag)
    assert result.states == {"wait": "skipped", "downstream": "skipped"}, result
    assert result.state == "success"


def test_unreadable_backlog_fails_even_with_soft_fail(run_dag, pulsar_broker, monkeypatch, topic_factory):
    conn = {
        "conn_type": "pulsar",
        "host": pulsar_broker.service_url,
        "extra": {"metrics_url": "http://127.0.0.1:9/metrics"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_PULSAR_BROKEN", json.dumps(conn))
    with DAG("test_sensor_unreadable", schedule=None, start_date=START, catchup=False) as dag:
        DlqBacklogSensor(
            task_id="wait",
            topics=[topic_factory("x-DLQ")],
            pulsar_conn_id="pulsar_broken",
            poll_interval=1,
            timeout=2,
            soft_fail=True,
        )
    result = run_dag(dag)
    assert result.states == {"wait": "failed"}, result
