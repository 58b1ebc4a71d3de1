"""The consumer-mode commit acks exactly the final messages of the frozen window: the embedded broker's
path (it takes acks only from the consumer that received a message), on pulsar-lite and local Spark.
The reader-mode commit on Apache Pulsar is tested in test_pulsar_io_reader_mode.py."""

from __future__ import annotations

import pytest
from pulsar_io_helpers import drain, produce

from spark_apps.dlq_replay.pulsar_io.commit import (
    COMMIT_INPUT_SCHEMA,
    COMMIT_RESULT_SCHEMA,
    make_commit_fn,
)
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.pulsar_io.ids import message_id_key
from spark_apps.dlq_replay.pulsar_io.source import register
from spark_apps.dlq_replay.pulsar_io.window import freeze, windows_to_json

pytestmark = [pytest.mark.integration, pytest.mark.embedded]

SUB = "dlq-replayer"


@pytest.fixture(scope="module")
def lite_client(lite_broker):
    import logging

    import pulsar

    client = pulsar.Client(lite_broker.service_url, logger=logging.getLogger("pulsar.test"))
    try:
        yield client
    finally:
        client.close()


def snapshot_ids(spark, conf, windows) -> dict[str, set[str]]:
    register(spark)
    df = spark.read.format("pulsar").options(
        **conf.to_options(), subscription=SUB, window=windows_to_json(windows), **{"idle.timeout.ms": "1000"}
    )
    out: dict[str, set[str]] = {}
    for r in df.load().select("topic", "message_id_str").collect():
        out.setdefault(r.topic, set()).add(r.message_id_str)
    return out


def test_commit_acks_exactly_the_final_ids_and_leaves_the_rest(
    spark, lite_broker, lite_client, topic_factory
):
    conf = PulsarConf(lite_broker.service_url)
    topic = topic_factory("commit-DLQ")
    freeze(conf, topic, SUB)
    produce(lite_client, topic, 300, batched=False)
    windows = freeze(conf, topic, SUB).windows
    produce(lite_client, topic, 20, batched=False, start=300, late=True)  # beyond the window

    before = snapshot_ids(spark, conf, windows)[topic]
    assert len(before) == 300
    ordered = sorted(before, key=message_id_key)
    final = set(ordered[::3]) | {ordered[-1]}  # 101 final messages, the window end among them
    final_df = spark.createDataFrame([(topic, i) for i in sorted(final)], COMMIT_INPUT_SCHEMA)
    fn = make_commit_fn(conf, windows, SUB, 1000)
    result = final_df.groupBy("dlq_topic").applyInArrow(fn, COMMIT_RESULT_SCHEMA).collect()
    # The consumer stopped at the window end: it never reached the late messages.
    assert [(r.dlq_topic, r.acked, r.left_pending, r.beyond_window) for r in result] == [(topic, 101, 199, 0)]

    after = snapshot_ids(spark, conf, windows)[topic]
    assert after == before - final
    # The late messages are untouched and wait for the next window.
    pending = drain(lite_client, topic, SUB)
    assert len(pending) == 199 + 20
    assert sum(m.data().startswith(b"late|") for m in pending) == 20

    # Committing the same ids again acks nothing more (they are gone) and keeps the rest. The window
    # end is acked now, so the consumer stops at the first late message, which it leaves pending.
    again = final_df.groupBy("dlq_topic").applyInArrow(fn, COMMIT_RESULT_SCHEMA).collect()
    assert [(r.acked, r.left_pending, r.beyond_window) for r in again] == [(0, 199, 1)]
    assert snapshot_ids(spark, conf, windows)[topic] == before - final


def test_commit_over_two_topics(spark, lite_broker, lite_client, topic_factory):
    conf = PulsarConf(lite_broker.service_url)
    a, b = topic_factory("commit-a-DLQ"), topic_factory("commit-b-DLQ")
    freeze(conf, [a, b], SUB)
    produce(lite_client, a, 50, batched=False)
    produce(lite_client, b, 40, batched=False)
    windows = freeze(conf, [a, b], SUB).windows
    ids = snapshot_ids(spark, conf, windows)
    final = [(a, i) for i in sorted(ids[a])[:10]] + [(b, i) for i in sorted(ids[b])]
    fn = make_commit_fn(conf, windows, SUB, 1000)
    grouped = spark.createDataFrame(final, COMMIT_INPUT_SCHEMA).groupBy("dlq_topic")
    out = grouped.applyInArrow(fn, COMMIT_RESULT_SCHEMA).collect()
    assert sorted((r.dlq_topic, r.acked, r.left_pending) for r in out) == sorted([(a, 10, 40), (b, 40, 0)])
    left = snapshot_ids(spark, conf, windows)
    assert left.get(a) == ids[a] - {i for _, i in final[:10]}
    assert b not in left


def test_partially_final_batch_is_never_lost(spark, lite_broker, lite_client, topic_factory):
    """Without batch-index acks a batch leaves the backlog only when all its messages are acked."""
    conf = PulsarConf(lite_broker.service_url)
    topic = topic_factory("commit-batched-DLQ")
    freeze(conf, topic, SUB)
    produce(lite_client, topic, 200, batched=True)
    windows = freeze(conf, topic, SUB).windows
    ids = snapshot_ids(spark, conf, windows)[topic]
    assert len(ids) == 200
    final = sorted(ids)[:-1]  # all but one message: that one's batch must stay whole
    fn = make_commit_fn(conf, windows, SUB, 1000)
    result = (
        spark.createDataFrame([(topic, i) for i in final], COMMIT_INPUT_SCHEMA)
        .groupBy("dlq_topic")
        .applyInArrow(fn, COMMIT_RESULT_SCHEMA)
        .collect()
    )
    assert [(r.acked, r.left_pending) for r in result] == [(199, 1)]
    remaining = snapshot_ids(spark, conf, windows)[topic]
    pending_id = (ids - set(final)).pop()
    assert pending_id in remaining  # the non-final message is never acked with its batch
