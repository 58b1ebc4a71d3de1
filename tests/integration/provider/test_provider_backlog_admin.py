"""Backlog from Apache Pulsar's admin REST API: hook, triggers and sensor against the session broker.

``msgBacklog`` counts *entries*, and a batch is one entry: the provider counts the messages
(``analyzeBacklog``) so ``backlog`` is what a user expects, and reports the entries beside it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid

import pendulum
import pulsar
import pytest
from airflow.sdk import DAG

from airflow_provider_dlq.hooks.pulsar import PulsarHook
from airflow_provider_dlq.sensors.backlog import DlqBacklogSensor
from airflow_provider_dlq.triggers.backlog import DlqBacklogTrigger, as_xcom
from airflow_provider_dlq.triggers.backlog_event import REASON_MIN_BACKLOG, DlqBacklogEventTrigger

pytestmark = [pytest.mark.integration, pytest.mark.real_pulsar]

SUB = "dlq-replayer"
START = pendulum.datetime(2024, 1, 1, tz="UTC")
LOG = logging.getLogger(__name__)


@pytest.fixture
def admin_conn(pulsar_broker, monkeypatch):
    """``pulsar_default`` with the session broker's admin URL (the backlog source users should choose)."""
    conn = {
        "conn_type": "pulsar",
        "host": pulsar_broker.service_url,
        "extra": {"admin_url": pulsar_broker.admin_url},
    }
    monkeypatch.setenv("AIRFLOW_CONN_PULSAR_DEFAULT", json.dumps(conn))
    return conn


@pytest.fixture
def namespace(pulsar_broker):
    """A fresh namespace under the ``acme`` tenant, so globs see only this test's topics."""
    name = f"acme/bl-{uuid.uuid4().hex[:8]}"
    pulsar_broker.admin().create_namespace(name)
    return name


def subscribe(client, topic):
    client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared).close()


def produce(client, topic, count, *, batched, prefix="m"):
    """Send ``count`` messages; a batched producer packs up to 10 per entry."""
    options = (
        {"batching_enabled": True, "batching_max_messages": 10, "batching_max_publish_delay_ms": 50}
        if batched
        else {"batching_enabled": False}
    )
    producer = client.create_producer(
        topic, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution, **options
    )
    for i in range(count):
        producer.send_async(f"{prefix}-{i}".encode(), None, partition_key=f"k{i}")
    producer.flush()
    producer.close()


def raw_entries(broker, topic, partitioned=False):
    """What the broker itself says: ``msgBacklog`` of the subscription (entries)."""
    path = topic.replace("persistent://", "/admin/v2/persistent/", 1)
    stats = broker.admin().get(f"{path}/partitioned-stats" if partitioned else f"{path}/stats")
    return stats["subscriptions"][SUB]["msgBacklog"]


def test_hook_counts_messages_for_batched_and_unbatched_producers(
    admin_conn, pulsar_broker, pulsar_client, namespace
):
    plain = f"persistent://{namespace}/plain-DLQ"
    batched = f"persistent://{namespace}/batched-DLQ"
    empty = f"persistent://{namespace}/empty-DLQ"
    for topic in (plain, batched, empty):
        subscribe(pulsar_client, topic)
    produce(pulsar_client, plain, 7, batched=False)
    produce(pulsar_client, batched, 25, batched=True)
    # The replayer takes 3 messages of the unbatched topic and acks them.
    consumer = pulsar_client.subscribe(plain, SUB, consumer_type=pulsar.ConsumerType.Shared)
    for _ in range(3):
        consumer.acknowledge(consumer.receive(timeout_millis=5000))
    consumer.close()

    hook = PulsarHook()
    backlog = hook.get_backlog([plain, batched, empty, f"{namespace}/never-created-DLQ"], SUB)

    entries = raw_entries(pulsar_broker, batched)
    LOG.info("batched topic: 25 messages in %d entries (msgBacklog)", entries)
    print(
        f"\nbatched producer: 25 messages, broker msgBacklog = {entries} entries; hook backlog = "
        f"{backlog[batched].backlog} (exact={backlog[batched].exact})"
    )
    assert entries < 25  # the broker counts batches, not messages ...
    b = backlog[batched]
    assert (b.backlog, b.entries, b.exact, b.found, b.source) == (
        25,
        entries,
        True,
        True,
        "admin",
    )  # ... we count
    p = backlog[plain]
    assert (p.backlog, p.entries, p.exact) == (4, 4, True)
    assert raw_entries(pulsar_broker, plain) == 4
    assert 0 <= p.oldest_age_seconds < 120
    e = backlog[empty]
    assert (e.backlog, e.entries, e.exact, e.found, e.oldest_age_seconds) == (0, 0, True, True, None)
    missing = backlog[f"persistent://{namespace}/never-created-DLQ"]
    assert (missing.backlog, missing.found) == (0, False)
    json.dumps(as_xcom(backlog))  # XCom-safe


def test_partitions_are_summed_and_globs_expand_in_a_tenant_namespace(
    admin_conn, pulsar_broker, pulsar_client, namespace
):
    parted = f"persistent://{namespace}/orders-DLQ"
    single = f"persistent://{namespace}/payments-DLQ"
    other = f"persistent://{namespace}/orders"  # not a DLQ: the glob must leave it out
    assert pulsar_broker.admin().create_partitioned_topic(parted, 4)
    for topic in (parted, single, other):
        subscribe(pulsar_client, topic)
    produce(pulsar_client, parted, 40, batched=True)
    produce(pulsar_client, single, 3, batched=False)
    produce(pulsar_client, other, 5, batched=False)

    glob = f"persistent://{namespace}/*-DLQ"
    backlog = PulsarHook().get_backlog([glob], SUB)
    assert sorted(backlog) == [parted, single]
    entries = raw_entries(pulsar_broker, parted, partitioned=True)
    per_partition = [raw_entries(pulsar_broker, f"{parted}-partition-{i}") for i in range(4)]
    print(
        f"\npartitioned (4) batched: 40 messages, msgBacklog per partition {per_partition} "
        f"(sum {entries}); hook backlog = {backlog[parted].backlog}"
    )
    assert sum(per_partition) == entries < 40
    assert all(n > 0 for n in per_partition)  # round robin: every partition holds some
    assert (backlog[parted].backlog, backlog[parted].entries, backlog[parted].exact) == (40, entries, True)
    assert (backlog[single].backlog, backlog[single].exact) == (3, True)

    # The trigger reads the same through the async client and fires once a topic is ready.
    trigger = DlqBacklogTrigger(topics=[glob], subscription=SUB, min_backlog=40, poll_interval=1)

    async def first_event():
        return await asyncio.wait_for(anext(trigger.run()), timeout=60)

    event = asyncio.run(first_event()).payload
    assert event["status"] == "success"
    assert event["ready"] == [parted]  # 40 messages, though only `entries` entries
    assert event["backlog"][parted]["backlog"] == 40
    assert event["backlog"][parted]["entries"] == entries
    assert event["backlog"][single]["backlog"] == 3


def test_event_trigger_fires_once_on_the_summed_backlog_and_consumes_nothing(
    admin_conn, pulsar_client, namespace
):
    """The ``pulsar`` scheme's trigger (outside a watcher, so its state is kept in memory): the messages
    summed over a glob fire the watch once; the same backlog stays quiet and is still all pending."""
    topics = [f"persistent://{namespace}/a-DLQ", f"persistent://{namespace}/b-DLQ"]
    for topic in topics:
        subscribe(pulsar_client, topic)
    produce(pulsar_client, topics[0], 2, batched=False)
    produce(pulsar_client, topics[1], 3, batched=True)
    glob = f"persistent://{namespace}/*-DLQ"
    trigger = DlqBacklogEventTrigger(topics=[glob], min_backlog=5, poll_interval=0.5)

    async def watch():
        events = trigger.run()
        try:
            first = await asyncio.wait_for(anext(events), timeout=60)
            with pytest.raises(TimeoutError):  # disarmed: the same backlog never fires again
                await asyncio.wait_for(anext(events), timeout=3)
        finally:
            await events.aclose()
        return first.payload

    payload = asyncio.run(watch())
    assert (payload["reason"], payload["backlog"], payload["new_backlog"]) == (REASON_MIN_BACKLOG, 5, 5)
    assert {t: item["backlog"] for t, item in payload["topics"].items()} == {topics[0]: 2, topics[1]: 3}
    assert {t: b.backlog for t, b in PulsarHook().get_backlog([glob], SUB).items()} == {
        topics[0]: 2,
        topics[1]: 3,
    }


def test_sensor_defers_and_completes_on_the_admin_backlog(
    run_dag, admin_conn, pulsar_client, namespace, monkeypatch
):
    dlq = f"persistent://{namespace}/late-DLQ"
    subscribe(pulsar_client, dlq)
    readings: list[int] = []
    events: list[dict] = []
    first_read = threading.Event()
    real_read, real_complete = PulsarHook.aget_backlog, DlqBacklogSensor.execute_complete

    async def observed_read(self, topics, subscription):
        result = await real_read(self, topics, subscription)
        readings.append(result[dlq].backlog)
        first_read.set()
        return result

    def observed_complete(self, context, event=None):
        events.append(event)
        return real_complete(self, context, event)

    # Observers only: the real trigger and sensor run, and these record what they saw.
    monkeypatch.setattr(PulsarHook, "aget_backlog", observed_read)
    monkeypatch.setattr(DlqBacklogSensor, "execute_complete", observed_complete)
    with DAG("test_sensor_admin_backlog", schedule=None, start_date=START, catchup=False) as dag:
        wait = DlqBacklogSensor(
            task_id="wait", topics=[dlq], min_backlog=12, min_age=1, poll_interval=1, timeout=120
        )
        check = DlqBacklogSensor(
            task_id="check", topics=f"{namespace}/*-DLQ", poll_interval=1, timeout=30, deferrable=False
        )
        wait >> check

    def produce_once_deferred() -> None:
        if first_read.wait(timeout=120):  # the trigger has read an empty backlog: now the DLQ fills
            produce(pulsar_client, dlq, 12, batched=True)

    producer = threading.Thread(target=produce_once_deferred)
    producer.start()
    try:
        result = run_dag(dag)
    finally:
        first_read.set()
        producer.join()
    print(f"\nbacklog readings of the deferred sensor's trigger (1 s apart): {readings}")
    LOG.info("backlog readings of the deferred sensor's trigger: %s", readings)
    assert result.states == {"wait": "success", "check": "success"}, result
    # It deferred: the trigger polled (nothing, then 12 messages at least 1 s old) and the task resumed.
    assert readings[0] == 0
    assert readings[-1] == 12
    assert len(events) == 1
    assert events[0]["status"] == "success"
    assert events[0]["ready"] == [dlq]
    for task_id in ("wait", "check"):
        item = result.xcoms[task_id][dlq]
        assert (item["backlog"], item["exact"], item["source"], item["found"]) == (12, True, "admin", True)
        assert item["entries"] < 12  # batched: fewer entries than messages
    assert result.xcoms["wait"][dlq]["oldest_age_seconds"] >= 1.0
