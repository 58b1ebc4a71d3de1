"""Republish through ``mapInArrow`` against the embedded broker: every send confirmed, metadata kept."""

from __future__ import annotations

import datetime as dt
import time
from functools import partial

import pulsar
import pyarrow as pa
import pytest
from pulsar_io_helpers import drain, wait_for_deduplication

from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.pulsar_io.errors import RepublishError
from spark_apps.dlq_replay.pulsar_io.ids import message_id_key
from spark_apps.dlq_replay.pulsar_io.republish import (
    REPUBLISH_INPUT_COLUMNS,
    REPUBLISH_INPUT_SCHEMA,
    REPUBLISH_RESULT_SCHEMA,
    republish_batches,
)
from spark_apps.dlq_replay.pulsar_io.source import ddl_struct
from spark_apps.dlq_replay.schemas import arrow_schema

pytestmark = pytest.mark.integration

EVENT0 = dt.datetime(2024, 3, 1, 8, 30, tzinfo=dt.UTC)
INPUT_SCHEMA = arrow_schema(ddl_struct(REPUBLISH_INPUT_SCHEMA))


def rows_for(target: str, producer: str, count: int) -> list[tuple]:
    rows = []
    for seq in range(count):
        rows.append(
            (
                f"{producer}-r{seq}",
                target,
                producer,
                seq,
                f"payload {producer} {seq}".encode(),
                f"key-{seq % 7}" if seq % 2 == 0 else None,
                f"ok-{seq % 3}" if seq % 3 == 0 else None,
                EVENT0 + dt.timedelta(milliseconds=seq) if seq % 4 else None,
                {"seq": str(seq), "REPLAY_ID": f"{producer}-r{seq}", "REPLAY_COUNT": "1"},
                seq,
            )
        )
    return rows


def test_republish_keeps_metadata_and_order_and_confirms_every_send(
    spark, pulsar_broker, pulsar_client, topic_factory
):
    conf = PulsarConf(pulsar_broker.service_url)
    orders, payments = topic_factory("rp-orders"), topic_factory("rp-payments")
    for t in (orders, payments):  # subscriptions first, so every republished message is kept
        pulsar_client.subscribe(
            t,
            "check",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
        ).close()
    producers = {
        "dlq-replay-run1-orders-0": orders,
        "dlq-replay-run1-orders-1": orders,
        "dlq-replay-run1-payments-0": payments,
    }
    data = [r for name, target in producers.items() for r in rows_for(target, name, 1_000)]
    df = (
        spark.createDataFrame(data, REPUBLISH_INPUT_SCHEMA)
        .repartition(2, "producer_name")
        .sortWithinPartitions("producer_name", "sequence_id")
    )
    results = df.mapInArrow(partial(republish_batches, conf=conf), REPUBLISH_RESULT_SCHEMA).collect()

    assert len(results) == 3_000
    assert all(r.published and r.error is None for r in results), [r for r in results if not r.published][:3]
    assert len({r.replay_id for r in results}) == 3_000
    assert all(message_id_key(r.published_message_id)[0] >= 0 for r in results)

    by_replay = {r[0]: r for r in data}
    published_ids = {r.replay_id: r.published_message_id for r in results}
    for target, expected_count in ((orders, 2_000), (payments, 1_000)):
        got = drain(pulsar_client, target, "check")
        assert len(got) == expected_count
        for msg in got:  # each row's receipt is its own message's id
            mid = msg.message_id()
            stored = f"{mid.ledger_id()}:{mid.entry_id()}:{mid.partition()}:{mid.batch_index()}"
            assert published_ids[msg.properties()["REPLAY_ID"]] == stored
        last_seq: dict[str, int] = {}
        for msg in sorted(
            got,
            key=lambda m: (
                m.message_id().ledger_id(),
                m.message_id().entry_id(),
                m.message_id().batch_index(),
            ),
        ):
            props = msg.properties()
            row = by_replay[props["REPLAY_ID"]]
            assert msg.producer_name() == row[2]
            assert msg.data() == row[4]
            assert (msg.partition_key() or None) == row[5]
            ordering = msg.ordering_key()
            ordering = ordering.decode() if isinstance(ordering, bytes) else ordering
            assert (ordering or None) == row[6]
            expected_event = int(row[7].timestamp() * 1000) if row[7] else 0
            assert msg.event_timestamp() == expected_event
            assert props == row[8]
            seq = int(props["seq"])
            assert seq > last_seq.get(row[2], -1), "per-producer order must follow sequence ids"
            last_seq[row[2]] = seq


def test_a_resent_batch_is_confirmed_and_dropped_by_the_deduplicating_broker(
    pulsar_broker, pulsar_client, topic_factory
):
    conf = PulsarConf(pulsar_broker.service_url)
    target = topic_factory("rp-resent")
    drain(pulsar_client, target, "check", timeout_ms=10)  # creates the subscription
    wait_for_deduplication(pulsar_broker.admin_url, target)  # or the first copies go unrecorded
    batch = pa.RecordBatch.from_pylist(
        [
            dict(zip(REPUBLISH_INPUT_COLUMNS, row, strict=True))
            for row in rows_for(target, "dlq-replay-resent-0", 300)
        ],
        schema=INPUT_SCHEMA,
    )

    first = pa.Table.from_batches(
        list(republish_batches(iter([batch.slice(0, 200), batch.slice(200)]), conf=conf))
    )
    again = pa.Table.from_batches(list(republish_batches(iter([batch]), conf=conf)))

    for out in (first, again):
        assert out.column("replay_id").to_pylist() == batch.column("replay_id").to_pylist()
        assert out.column("published").to_pylist() == [True] * 300
        assert out.column("error").null_count == 300
    assert all(message_id_key(i)[0] >= 0 for i in first.column("published_message_id").to_pylist())
    # the broker dropped every copy (same producer name and sequence ids): ledger -1
    assert {message_id_key(i)[0] for i in again.column("published_message_id").to_pylist()} == {-1}
    assert len(drain(pulsar_client, target, "check")) == 300


def test_unsendable_rows_are_reported_not_raised(pulsar_broker, pulsar_client, topic_factory):
    conf = PulsarConf(pulsar_broker.service_url)
    good = topic_factory("rp-good")
    drain(pulsar_client, good, "check", timeout_ms=10)  # creates the subscription
    batch = pa.RecordBatch.from_pylist(
        [
            {
                "replay_id": "a",
                "target_topic": good,
                "producer_name": "p-good",
                "sequence_id": 0,
                "value": b"a",
            },
            {
                "replay_id": "b",
                "target_topic": "persistent://only-two/parts",
                "producer_name": "p-bad",
                "sequence_id": 0,
                "value": b"b",
            },
            {
                "replay_id": "c",
                "target_topic": good,
                "producer_name": "p-good",
                "sequence_id": 1,
                "value": None,
            },
            {
                "replay_id": "d",
                "target_topic": "persistent://only-two/parts",
                "producer_name": "p-bad",
                "sequence_id": 1,
                "value": b"d",
            },
        ],
        schema=INPUT_SCHEMA,
    )
    out = pa.Table.from_batches(list(republish_batches(iter([batch]), conf=conf))).to_pylist()
    by_id = {r["replay_id"]: r for r in out}
    assert by_id["a"]["published"] is True
    assert by_id["a"]["published_message_id"]
    assert by_id["b"]["published"] is False
    assert "cannot create producer 'p-bad'" in by_id["b"]["error"]
    assert by_id["d"]["published"] is False
    assert "not sent" in by_id["d"]["error"]
    assert by_id["c"]["published"] is False
    assert "lacks" in by_id["c"]["error"]
    assert [m.data() for m in drain(pulsar_client, good, "check")] == [b"a"]


def test_one_producer_name_for_two_targets_is_a_pipeline_error(pulsar_broker, topic_factory):
    conf = PulsarConf(pulsar_broker.service_url)
    a, b = topic_factory("rp-a"), topic_factory("rp-b")
    batch = pa.RecordBatch.from_pylist(
        [
            {
                "replay_id": "1",
                "target_topic": a,
                "producer_name": "same",
                "sequence_id": 0,
                "value": b"x",
                "key": None,
                "ordering_key": None,
                "event_time": None,
                "properties": None,
                "row": 0,
            },
            {
                "replay_id": "2",
                "target_topic": b,
                "producer_name": "same",
                "sequence_id": 1,
                "value": b"y",
                "key": None,
                "ordering_key": None,
                "event_time": None,
                "properties": None,
                "row": 1,
            },
        ]
    )
    with pytest.raises(RepublishError, match="used for two target topics"):
        list(republish_batches(iter([batch]), conf=conf))


def test_missing_columns_and_rate_limit(pulsar_broker, pulsar_client, topic_factory):
    conf = PulsarConf(pulsar_broker.service_url)
    with pytest.raises(RepublishError, match="lacks columns"):
        list(republish_batches(iter([pa.RecordBatch.from_pylist([{"replay_id": "x"}])]), conf=conf))
    target = topic_factory("rp-rate")
    drain(pulsar_client, target, "check", timeout_ms=10)
    rows = [
        {
            "replay_id": str(i),
            "target_topic": target,
            "producer_name": "rate",
            "sequence_id": i,
            "value": b"v",
            "key": None,
            "ordering_key": None,
            "event_time": None,
            "properties": None,
            "row": i,
        }
        for i in range(60)
    ]
    started = time.monotonic()
    out = list(republish_batches(iter([pa.RecordBatch.from_pylist(rows)]), conf=conf, rate_limit_per_s=100))
    assert time.monotonic() - started >= 0.55
    assert sum(b.column("published").to_pylist().count(True) for b in out) == 60
    assert len(drain(pulsar_client, target, "check")) == 60
