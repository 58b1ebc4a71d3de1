"""``spark.read.format("pulsar")`` on Apache Pulsar (reader and consumer modes), the embedded broker
(consumer mode, chosen by its missing admin REST) and local Spark."""

from __future__ import annotations

import time

import pulsar
import pytest
from pulsar_io_helpers import EVENT_BASE_MS, expected_message, produce

from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError, WindowError
from spark_apps.dlq_replay.pulsar_io.source import SOURCE_SCHEMA, ddl_struct, register
from spark_apps.dlq_replay.pulsar_io.window import (
    CONSUMER_MODE,
    READER_MODE,
    freeze,
    read_mode_of,
    windows_to_json,
)

pytestmark = pytest.mark.integration

SUB = "dlq-replayer"


def load(spark, conf, **options):
    register(spark)
    return spark.read.format("pulsar").options(**conf.to_options(), subscription=SUB, **options).load()


@pytest.mark.parametrize("mode", [READER_MODE, CONSUMER_MODE])
def test_reads_20k_messages_of_two_topics_exactly_without_acking(
    spark, pulsar_broker, pulsar_client, topic_factory, mode
):
    admin_url = pulsar_broker.admin_url if mode == READER_MODE else None
    conf = PulsarConf(pulsar_broker.service_url, admin_url=admin_url)
    batched, single = topic_factory("src-batched-DLQ"), topic_factory("src-single-DLQ")
    freeze(conf, [batched, single], SUB)  # creates the subscription before anything is produced
    produce(pulsar_client, batched, 12_000, batched=True)
    produce(pulsar_client, single, 8_000, batched=False)
    windows = freeze(conf, f"{batched},{single}", SUB).windows
    assert [(w.topic, w.partition) for w in windows] == [(batched, -1), (single, -1)]
    assert read_mode_of(windows) == mode
    produce(pulsar_client, batched, 50, late=True, start=12_000)  # after the freeze: must not be read
    produce(pulsar_client, single, 50, late=True, start=8_000)

    started = time.monotonic()
    df = load(spark, conf, window=windows_to_json(windows))
    rows = df.collect()
    elapsed = time.monotonic() - started
    print(f"read {len(rows)} rows in {elapsed:.2f}s")

    assert df.schema.simpleString() == spark.createDataFrame([], SOURCE_SCHEMA).schema.simpleString()
    assert df.schema.simpleString() == ddl_struct(SOURCE_SCHEMA).simpleString()
    assert len(rows) == 20_000
    assert sum(r.topic == batched for r in rows) == 12_000
    assert sum(r.topic == single for r in rows) == 8_000
    assert len({(r.topic, r.message_id_str) for r in rows}) == 20_000
    assert not any(bytes(r.value).startswith(b"late|") for r in rows)
    seen = set()
    for r in rows:
        i = int(r.properties["i"])
        seen.add((r.topic, i))
        m = expected_message(r.topic, i)
        assert bytes(r.value) == m["value"]
        assert r.key == m["key"]
        assert r.ordering_key == m["ordering_key"]
        assert r.properties == m["properties"]
        if m["event_ms"] is None:
            assert r.event_time is None
        else:
            assert int(r.event_time.timestamp() * 1000) == m["event_ms"] >= EVENT_BASE_MS
        assert r.publish_time is not None
        assert r.producer_name
        assert r.partition == -1
        assert r.redelivery_count >= 0
        mid = pulsar.MessageId.deserialize(bytes(r.message_id))
        assert f"{mid.ledger_id()}:{mid.entry_id()}:-1:{mid.batch_index()}" == r.message_id_str
    assert len(seen) == 20_000
    assert any(r.message_id_str.endswith(":-1") for r in rows if r.topic == single)
    assert all(not r.message_id_str.endswith(":-1") for r in rows if r.topic == batched)

    assert {r.batch_size for r in rows if r.topic == single} == {1}
    assert all(r.batch_size > int(r.message_id_str.split(":")[3]) for r in rows if r.topic == batched)
    # Nothing was acked: a second read (two consumers or shares per partition) gives the same rows.
    again = load(spark, conf, window=windows_to_json(windows), parallelism="2")
    ids_again = {
        (r.topic, r.message_id_str) for r in again.select("topic", "message_id_str").distinct().collect()
    }
    assert ids_again == {(r.topic, r.message_id_str) for r in rows}

    # Without a window option the reader freezes its own, which now includes the late messages.
    fresh = load(spark, conf, topics=single).filter("value IS NOT NULL")
    assert fresh.count() == 8_050


def test_window_end_already_acked_stops_on_idle_timeout(spark, pulsar_broker, pulsar_client, topic_factory):
    conf = PulsarConf(pulsar_broker.service_url)
    topic = topic_factory("src-acked-end-DLQ")
    freeze(conf, topic, SUB)
    produce(pulsar_client, topic, 100, batched=False)
    consumer = pulsar_client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
    for _ in range(100):
        msg = consumer.receive(timeout_millis=5000)
        if int(msg.properties()["i"]) >= 90:
            consumer.acknowledge(msg)  # the last 10, including the window end, are gone
    consumer.close()
    windows = freeze(conf, topic, SUB).windows
    started = time.monotonic()
    rows = load(spark, conf, window=windows_to_json(windows), **{"idle.timeout.ms": "800"}).collect()
    assert sorted(int(r.properties["i"]) for r in rows) == list(range(90))
    assert time.monotonic() - started < 30


def test_empty_topic_gives_an_empty_window_and_no_rows(spark, pulsar_broker, topic_factory):
    conf = PulsarConf(pulsar_broker.service_url)
    topic = topic_factory("src-empty-DLQ")
    windows = freeze(conf, topic, SUB).windows
    assert windows[0].end_message_id is None
    assert load(spark, conf, window=windows_to_json(windows)).count() == 0


@pytest.fixture(scope="module")
def partitioned_broker(tmp_path_factory):
    from airflow_provider_dlq.embedded_broker import start_embedded_broker

    broker = start_embedded_broker(tmp_path_factory.mktemp("pulsar-lite-partitioned"), default_partitions=2)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.mark.embedded
def test_partitioned_topic_expands_and_a_broker_that_cannot_address_partitions_is_refused(
    partitioned_broker, topic_factory
):
    """pulsar-lite's default_partitions makes every partition partitioned again: say so clearly."""
    import logging

    conf = PulsarConf(partitioned_broker.service_url)
    topic = topic_factory("src-part-DLQ")
    client = pulsar.Client(partitioned_broker.service_url, logger=logging.getLogger("pulsar.test"))
    try:
        assert client.get_topic_partitions(topic) == [f"{topic}-partition-0", f"{topic}-partition-1"]
    finally:
        client.close()
    with pytest.raises(WindowError, match=r"cannot be read on its own.*Apache Pulsar"):
        freeze(conf, topic, SUB)


def test_partitioned_topic_reads_every_partition_on_apache_pulsar_in_the_consumer_mode(
    spark, pulsar_broker, pulsar_client, topic_factory
):
    """Without an admin URL Apache Pulsar is read through Shared consumers, each partition on its own."""
    topic = topic_factory("src-partitioned-DLQ")
    pulsar_broker.admin().create_partitioned_topic(topic, 3)
    conf = PulsarConf(pulsar_broker.service_url)
    sub = f"dlq-replayer-{time.time_ns()}"
    freeze(conf, topic, sub)
    produce(pulsar_client, topic, 2_000)
    windows = freeze(conf, topic, sub).windows
    assert len(windows) == 3
    assert all(w.partition >= 0 for w in windows)
    assert read_mode_of(windows) == CONSUMER_MODE
    register(spark)
    df = spark.read.format("pulsar").options(
        **conf.to_options(), subscription=sub, window=windows_to_json(windows)
    )
    rows = df.load().collect()
    assert len(rows) == 2_000
    assert {r.partition for r in rows} == {w.partition for w in windows if w.end_message_id}


@pytest.mark.embedded
def test_an_admin_url_that_is_not_pulsar_admin_rest_falls_back_to_the_consumer_mode(
    spark, lite_broker, topic_factory
):
    """The embedded broker answers HTTP, but not the admin REST: its capability picks the consumer mode."""
    import logging

    topic = topic_factory("src-lite-DLQ")
    conf = PulsarConf(lite_broker.service_url, admin_url=lite_broker.metrics_url.rsplit("/", 1)[0])
    assert freeze(conf, topic, SUB).read_mode == CONSUMER_MODE
    client = pulsar.Client(lite_broker.service_url, logger=logging.getLogger("pulsar.test"))
    try:
        produce(client, topic, 300, batched=True)
    finally:
        client.close()
    frozen = freeze(conf, topic, SUB)
    assert frozen.read_mode == CONSUMER_MODE
    assert "not Apache Pulsar's admin REST" in frozen.reason
    rows = load(spark, conf, window=windows_to_json(frozen.windows)).collect()
    assert sorted(int(r.properties["i"]) for r in rows) == list(range(300))
    # An admin URL nobody answers on is a configuration error, found before anything is read.
    dead = PulsarConf(lite_broker.service_url, admin_url="http://127.0.0.1:9")
    with pytest.raises(PulsarConfigError, match="cannot reach the Pulsar admin REST"):
        freeze(dead, topic, SUB)


def test_a_user_schema_and_missing_options_fail_with_the_fix(spark, pulsar_broker):
    register(spark)

    def reader():
        return spark.read.format("pulsar").option("service.url", pulsar_broker.service_url)

    with pytest.raises(Exception, match="fixed schema"):
        reader().schema("value binary").option("topics", "x").option("subscription", "s").load().collect()
    with pytest.raises(Exception, match="'subscription' is required"):
        reader().option("topics", "x").load().collect()
