"""DlqBacklogTrigger and DlqBacklogSensor: serialize round trip, deferral, event handling, readiness."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from datetime import timedelta

import pytest
from airflow.sdk.exceptions import AirflowSensorTimeout, TaskDeferred

from airflow_provider_dlq.hooks.backlog import (
    BacklogConfigError,
    BacklogReadError,
    TopicBacklog,
    split_topics,
)
from airflow_provider_dlq.hooks.pulsar import PulsarHook
from airflow_provider_dlq.sensors.backlog import DlqBacklogSensor
from airflow_provider_dlq.triggers.backlog import DlqBacklogTrigger, ready_topics, topics_from_backlog

T1 = "persistent://public/default/orders-DLQ"
T2 = "persistent://public/default/pay-DLQ"
CLASSPATH = "airflow_provider_dlq.triggers.backlog.DlqBacklogTrigger"


def backlog(topic, n, source="metrics", age=None, found=True):
    return TopicBacklog(topic, "dlq-replayer", n, source, found, age)


def test_trigger_serialize_mirrors_init_and_round_trips():
    trigger = DlqBacklogTrigger(
        topics=[T1, "acme/orders/*-DLQ"],
        subscription="dlq-replayer",
        pulsar_conn_id="pulsar_prod",
        min_backlog=5,
        min_age_seconds=600,
        poll_interval=30,
        deadline=1_800_000_000.5,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == CLASSPATH
    assert kwargs == {
        "topics": [T1, "acme/orders/*-DLQ"],
        "subscription": "dlq-replayer",
        "pulsar_conn_id": "pulsar_prod",
        "min_backlog": 5,
        "min_age_seconds": 600.0,
        "poll_interval": 30.0,
        "deadline": 1_800_000_000.5,
    }
    assert DlqBacklogTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_sensor_defers_with_a_deadline_by_default():
    sensor = DlqBacklogSensor(
        task_id="wait", topics=f"{T1}, {T2}", min_backlog=2, poll_interval=15, timeout=300, soft_fail=True
    )
    before = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context={})
    trigger = deferred.value.trigger
    assert isinstance(trigger, DlqBacklogTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout == timedelta(seconds=300 + 30 + 60)
    kwargs = trigger.serialize()[1]
    assert kwargs["topics"] == [T1, T2]
    assert kwargs["min_backlog"] == 2
    assert kwargs["poll_interval"] == 15.0
    assert before + 300 <= kwargs["deadline"] <= time.time() + 300


def test_sensor_execute_complete_success_returns_per_topic_backlog():
    sensor = DlqBacklogSensor(task_id="wait", topics=[T1])
    payload = {T1: asdict(backlog(T1, 3)), T2: asdict(backlog(T2, 0))}
    event = {"status": "success", "backlog": payload, "ready": [T1]}
    assert sensor.execute_complete(context={}, event=event) == payload


def test_sensor_timeout_event_raises_sensor_timeout_with_the_last_reading():
    sensor = DlqBacklogSensor(task_id="wait", topics=[T1], min_backlog=10, timeout=60)
    event = {"status": "timeout", "backlog": {T1: asdict(backlog(T1, 3))}, "last_error": None}
    with pytest.raises(AirflowSensorTimeout, match=r"backlog of 10 within 60s.*orders-DLQ': 3"):
        sensor.execute_complete(context={}, event=event)


def test_sensor_timeout_after_failed_read_is_a_failure_not_a_skip():
    sensor = DlqBacklogSensor(task_id="wait", topics=[T1], soft_fail=True)
    event = {"status": "timeout", "backlog": {}, "last_error": "GET http://m/metrics failed: ConnectError"}
    with pytest.raises(BacklogReadError, match="last backlog read failed"):
        sensor.execute_complete(context={}, event=event)


def test_sensor_error_event_is_a_value_error():
    sensor = DlqBacklogSensor(task_id="wait", topics=[T1], soft_fail=True)
    with pytest.raises(ValueError, match="set the extra 'admin_url'"):
        sensor.execute_complete(context={}, event={"status": "error", "message": "set the extra 'admin_url'"})


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"min_backlog": 0}, "min_backlog must be an integer >= 1"),
        ({"min_backlog": True}, "min_backlog must be an integer >= 1"),
        ({"min_age": -1}, "min_age must be a non-negative"),
        ({"poll_interval": 0}, "poll_interval must be a positive"),
    ],
)
def test_sensor_rejects_bad_arguments(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        DlqBacklogSensor(task_id="wait", topics=[T1], **kwargs)


def test_sensor_rejects_poke_interval_and_empty_topics():
    with pytest.raises(TypeError, match="uses poll_interval"):
        DlqBacklogSensor(task_id="wait", topics=[T1], poke_interval=5)
    with pytest.raises(ValueError, match="no DLQ topics given"):
        DlqBacklogSensor(task_id="wait", topics=" , ", deferrable=False).topic_list  # noqa: B018


def test_split_topics():
    assert split_topics(" a, b ,,c") == ["a", "b", "c"]
    assert split_topics(["a", " b "]) == ["a", "b"]


def test_ready_topics_min_backlog_and_min_age():
    items = {T1: backlog(T1, 5, "admin", age=100.0), T2: backlog(T2, 50, "admin", age=10.0)}
    assert ready_topics(items, 1, None) == [T1, T2]
    assert ready_topics(items, 10, None) == [T2]
    assert ready_topics(items, 1, 60) == [T1]
    assert ready_topics(items, 10, 60) == []
    with pytest.raises(BacklogConfigError, match="only the Pulsar admin REST API"):
        ready_topics({T1: backlog(T1, 5)}, 1, 60)
    with pytest.raises(BacklogConfigError, match="only the Pulsar admin REST API"):  # at once, not once full
        ready_topics({T1: backlog(T1, 0)}, 1, 60)


def test_topics_from_backlog_filter():
    value = {T2: asdict(backlog(T2, 2)), T1: asdict(backlog(T1, 0))}
    assert topics_from_backlog(value) == f"{T1},{T2}"
    assert topics_from_backlog(value, 1) == T2
    assert topics_from_backlog(value, 3) == ""
    assert topics_from_backlog(None) == ""


def _run_trigger(trigger):
    async def first_event():
        return await asyncio.wait_for(anext(trigger.run()), timeout=10)

    return asyncio.run(first_event())


def test_trigger_fires_once_backlog_is_ready(monkeypatch):
    readings = iter([{T1: backlog(T1, 0)}, BacklogReadError("flaky"), {T1: backlog(T1, 4)}])

    async def fake(self, topics, subscription):
        item = next(readings)
        if isinstance(item, Exception):
            raise item
        return item

    monkeypatch.setattr(PulsarHook, "aget_backlog", fake)
    event = _run_trigger(DlqBacklogTrigger(topics=[T1], subscription="dlq-replayer", poll_interval=0.01))
    assert event.payload == {"status": "success", "backlog": {T1: asdict(backlog(T1, 4))}, "ready": [T1]}


def test_trigger_times_out_at_its_deadline(monkeypatch):
    async def fake(self, topics, subscription):
        return {T1: backlog(T1, 0)}

    monkeypatch.setattr(PulsarHook, "aget_backlog", fake)
    trigger = DlqBacklogTrigger(topics=[T1], subscription="s", poll_interval=0.05, deadline=time.time() + 0.2)
    event = _run_trigger(trigger)
    expected = {"status": "timeout", "backlog": {T1: asdict(backlog(T1, 0))}, "last_error": None}
    assert event.payload == expected


def test_trigger_reports_a_failed_last_read_and_config_errors(monkeypatch):
    async def failing(self, topics, subscription):
        raise BacklogReadError("GET http://m/metrics failed: ConnectError")

    monkeypatch.setattr(PulsarHook, "aget_backlog", failing)
    trigger = DlqBacklogTrigger(topics=[T1], subscription="s", poll_interval=0.05, deadline=time.time())
    event = _run_trigger(trigger)
    assert event.payload["status"] == "timeout"
    assert "ConnectError" in event.payload["last_error"]

    async def misconfigured(self, topics, subscription):
        raise BacklogConfigError("Connection 'x' has neither extra 'admin_url' nor 'metrics_url'")

    monkeypatch.setattr(PulsarHook, "aget_backlog", misconfigured)
    event = _run_trigger(DlqBacklogTrigger(topics=[T1], subscription="s"))
    assert event.payload == {
        "status": "error",
        "message": "Connection 'x' has neither extra 'admin_url' nor 'metrics_url'",
    }
