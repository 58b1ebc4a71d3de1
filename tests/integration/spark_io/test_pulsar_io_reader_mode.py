"""The reader mode on Apache Pulsar: snapshot through Readers from the frozen cursor, commit by entry id.

Everything runs against the session's Apache Pulsar standalone (default unacked limits, batch-index
acks off, acked messages retained) and local Spark. Backlogs are checked through admin REST.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import pulsar
import pytest
from pulsar_io_helpers import produce
from pyspark.sql import functions as F

from spark_apps.dlq_replay.pulsar_io.admin import PulsarAdmin
from spark_apps.dlq_replay.pulsar_io.commit import (
    COMMIT_RESULT_SCHEMA,
    ENTRY_COMMIT_INPUT_SCHEMA,
    EntryCommitFn,
)
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.pulsar_io.cursor import CursorState
from spark_apps.dlq_replay.pulsar_io.source import register
from spark_apps.dlq_replay.pulsar_io.window import READER_MODE, freeze, windows_to_json

pytestmark = pytest.mark.integration

SUB = "dlq-replayer"
log = logging.getLogger("tests.reader_mode")


def load(spark, conf, windows, **options):
    register(spark)
    opts = {"subscription": SUB, "window": windows_to_json(windows), "idle.timeout.ms": "3000", **options}
    return spark.read.format("pulsar").options(**conf.to_options(), **opts).load()


def backlog(admin: PulsarAdmin, topic: str, sub: str = SUB) -> int:
    """``msgBacklog`` of the subscription (entries, for batched messages), from admin REST."""
    return int(admin.stats(topic)["subscriptions"][sub]["msgBacklog"])


def cursor(admin: PulsarAdmin, topic: str, sub: str = SUB) -> CursorState:
    return CursorState.from_internal_stats(admin.internal_stats(topic), sub, topic=topic)


def entry_of(client: Any, topic: str) -> dict[int, tuple[int, int]]:
    """``i`` property -> ``(ledger, entry)`` of every message of a topic, read with a Reader."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out: dict[int, tuple[int, int]] = {}
    try:
        while reader.has_message_available():
            msg = reader.read_next(10_000)
            out[int(msg.properties()["i"])] = (msg.message_id().ledger_id(), msg.message_id().entry_id())
    finally:
        reader.close()
    return out


def ack_entries(client: Any, admin: PulsarAdmin, topic: str, entries: set[tuple[int, int]]) -> None:
    """Ack whole entries on the subscription by id (as another consumer of it would) and wait for them."""
    consumer = client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=0)
    try:
        for ledger, entry in sorted(entries):
            consumer.acknowledge(pulsar.MessageId(-1, ledger, entry, -1))
        deadline = time.monotonic() + 30
        while not all(cursor(admin, topic).is_acked(e) for e in entries):
            assert time.monotonic() < deadline, "the broker did not record the acks"
            time.sleep(0.2)
    finally:
        consumer.close()


def produce_batches(client: Any, topic: str, count: int, *, per_batch: int) -> None:
    """Send ``count`` messages (property ``i``) in batched entries of exactly ``per_batch`` messages."""
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=per_batch,
        batching_max_publish_delay_ms=60_000,  # a batch is sent when full, never on a timer
        block_if_queue_full=True,
        max_pending_messages=max(count, 1000),
    )
    results: list[Any] = []
    for i in range(count):
        producer.send_async(f"m{i}".encode(), lambda r, _m: results.append(r), properties={"i": str(i)})
    producer.flush()
    producer.close()
    assert results == [pulsar.Result.Ok] * count


def commit_entries(spark, conf, windows, entries):
    """Run the reader-mode commit over ``(topic, ledger, entry, messages, final, batch_size)`` rows
    (a list or a DataFrame), plus a marker row per partition; returns the result row per topic."""
    markers = spark.createDataFrame(
        [(w.topic, None, None, 0, 0, None) for w in windows], ENTRY_COMMIT_INPUT_SCHEMA
    )
    if isinstance(entries, list):
        entries = spark.createDataFrame(entries, ENTRY_COMMIT_INPUT_SCHEMA)
    df = markers.union(entries.toDF(*markers.columns))
    committer = EntryCommitFn(conf, windows, SUB)

    def commit(table):  # one argument: Spark picks the Table -> Table form by arity
        return committer.commit_table(table)

    return {
        r.dlq_topic: r for r in df.groupBy("dlq_topic").applyInArrow(commit, COMMIT_RESULT_SCHEMA).collect()
    }


def test_reader_snapshot_skips_acked_holes_and_retained_messages(
    spark, pulsar_broker, pulsar_client, topic_factory
):
    """A subscription with an acked prefix and acked holes, the acked messages still stored (retention):
    the snapshot holds exactly the pending rest, once each."""
    conf = PulsarConf(pulsar_broker.service_url, admin_url=pulsar_broker.admin_url)
    admin = PulsarAdmin(conf)
    single, batched = topic_factory("rm-single-DLQ"), topic_factory("rm-batched-DLQ")
    freeze(conf, [single, batched], SUB)  # creates the subscription
    produce(pulsar_client, single, 3_000, batched=False)
    produce_batches(pulsar_client, batched, 2_000, per_batch=500)
    # Acks: the first 200 (the mark-delete moves), every 7th later one (holes), a run of 1,200 (a gap
    # long enough to start a new Reader after it) on the single topic; the first batch on the batched one.
    single_acked = {i for i in range(3_000) if i < 200 or i % 7 == 0 or 1_000 <= i < 2_200}
    singles = entry_of(pulsar_client, single)
    ack_entries(pulsar_client, admin, single, {singles[i] for i in single_acked})
    batches = entry_of(pulsar_client, batched)
    assert len(set(batches.values())) == 4
    ack_entries(pulsar_client, admin, batched, {batches[0]})
    assert backlog(admin, single) == 3_000 - len(single_acked)
    assert backlog(admin, batched) == 3

    frozen = freeze(conf, [single, batched], SUB)
    assert frozen.read_mode == READER_MODE, frozen.reason
    produce(pulsar_client, single, 40, batched=False, start=3_000, late=True)  # after the freeze
    by_topic = {w.topic: w for w in frozen.windows}
    assert by_topic[single].pending_entries == 3_000 - len(single_acked)
    assert len(by_topic[single].pending) > 200  # the holes split the pending entries into many ranges
    assert by_topic[batched].pending_entries == 3

    rows = load(spark, conf, frozen.windows, parallelism="3", **{"reader.min.entries": "100"}).collect()
    got = Counter((r.topic, int(r.properties["i"])) for r in rows)
    assert max(got.values()) == 1  # every message once
    assert {i for t, i in got if t == single} == set(range(3_000)) - single_acked
    assert {i for t, i in got if t == batched} == set(range(500, 2_000))
    assert {r.batch_size for r in rows if r.topic == single} == {1}
    assert {r.batch_size for r in rows if r.topic == batched} == {500}
    assert not any(bytes(r.value).startswith(b"late|") for r in rows)

    # The consumer mode reads the same set through Shared consumers (the embedded broker's mode).
    consumer_windows = [w.__class__(w.topic, w.partition, w.end_message_id) for w in frozen.windows]
    same = load(spark, conf, consumer_windows).select("topic", "message_id_str").collect()
    assert {(r.topic, r.message_id_str) for r in same} == {(r.topic, r.message_id_str) for r in rows}


def test_60k_pending_messages_on_one_partition_with_default_unacked_limits(
    spark, pulsar_broker, pulsar_client, topic_factory, tmp_path
):
    """A Shared consumer stops at maxUnackedMessagesPerConsumer (50,000); Readers read all 60,000."""
    conf = PulsarConf(pulsar_broker.service_url, admin_url=pulsar_broker.admin_url)
    admin = PulsarAdmin(conf)
    topic = topic_factory("rm-60k-DLQ")
    freeze(conf, topic, SUB)
    started = time.monotonic()
    produce(pulsar_client, topic, 60_000, batched=False)
    produced_s = time.monotonic() - started
    frozen = freeze(conf, topic, SUB)
    assert frozen.read_mode == READER_MODE
    assert frozen.windows[0].pending_entries == 60_000

    # The old design: the snapshot holds the window unacked on a Shared consumer. The broker stops
    # dispatching at 50,000 unacked messages, so that read can never see the rest of the window.
    consumer_windows = [w.__class__(w.topic, w.partition, w.end_message_id) for w in frozen.windows]
    started = time.monotonic()
    stalled = load(spark, conf, consumer_windows, **{"idle.timeout.ms": "2000"}).count()
    consumer_s = time.monotonic() - started
    assert 50_000 <= stalled < 60_000

    started = time.monotonic()
    snapshot = str(tmp_path / "snapshot")
    load(spark, conf, frozen.windows, parallelism="2").write.parquet(snapshot)  # as the replay's snapshot
    reader_s = time.monotonic() - started
    df = spark.read.parquet(snapshot)
    rows = df.select("message_id_str", "properties", "batch_size").collect()
    assert len(rows) == 60_000
    assert len({r.message_id_str for r in rows}) == 60_000
    assert {int(r.properties["i"]) for r in rows} == set(range(60_000))
    assert backlog(admin, topic) == 60_000  # reading acked nothing

    started = time.monotonic()
    ids = F.split("message_id_str", ":")
    entries = df.select(
        "topic",
        ids[0].cast("long"),
        ids[1].cast("long"),
        F.lit(1),
        F.lit(1),
        F.col("batch_size").cast("long"),
    )
    result = commit_entries(spark, conf, frozen.windows, entries)[topic]
    commit_s = time.monotonic() - started
    assert (result.acked, result.entries_acked, result.unacked_final, result.messages_read) == (
        60_000,
        60_000,
        0,
        0,
    )
    assert backlog(admin, topic) == 0
    log.warning(
        "60k figures: produce %.1fs, consumer-mode read %d in %.1fs (stalled), reader-mode read 60000 in "
        "%.1fs (written as Parquet), commit of 60000 entries verified on the cursor in %.1fs",
        produced_s,
        stalled,
        consumer_s,
        reader_s,
        commit_s,
    )


def test_commit_acks_a_batched_entry_only_once_all_its_messages_are_final(
    spark, pulsar_broker, pulsar_client, topic_factory
):
    conf = PulsarConf(pulsar_broker.service_url, admin_url=pulsar_broker.admin_url)
    admin = PulsarAdmin(conf)
    topic = topic_factory("rm-batch-commit-DLQ")
    freeze(conf, topic, SUB)
    produce_batches(pulsar_client, topic, 50, per_batch=5)  # 10 entries of 5 messages
    frozen = freeze(conf, topic, SUB)
    windows = frozen.windows
    rows = load(spark, conf, windows).select("message_id_str", "batch_size").collect()
    assert len(rows) == 50
    per_entry = Counter(tuple(map(int, r.message_id_str.split(":")[:2])) for r in rows)
    assert len(per_entry) == 10
    assert set(per_entry.values()) == {5}
    assert {r.batch_size for r in rows} == {5}
    entries = sorted(per_entry)

    # Run 1: entries 0-5 fully final, entries 6-7 with 3 of 5 final, entries 8-9 with none final.
    final_count = {e: 5 if k < 6 else 3 if k < 8 else 0 for k, e in enumerate(entries)}
    first = [(topic, e[0], e[1], 5, final_count[e], 5) for e in entries]
    result = commit_entries(spark, conf, windows, first)[topic]
    assert (result.acked, result.entries_acked, result.final_in_partial_entries, result.left_pending) == (
        30,
        6,
        6,
        14,
    )
    assert (result.unacked_final, result.beyond_window, result.messages_read) == (0, 0, 0)
    state = cursor(admin, topic)
    assert [state.is_acked(e) for e in entries] == [True] * 6 + [False] * 4
    assert backlog(admin, topic) == 4  # entries: the partly final ones stay pending whole

    # A commit resumed after a kill finds the acks on the cursor and counts them again, sending nothing.
    again = commit_entries(spark, conf, windows, first)[topic]
    assert (again.acked, again.entries_acked, again.final_in_partial_entries) == (30, 6, 6)

    # Run 2 re-reads the pending entries (the cursor moved), and now the rest of entry 6 is final.
    frozen2 = freeze(conf, topic, SUB)
    assert frozen2.windows[0].pending_entries == 4
    rows2 = load(spark, conf, frozen2.windows).select("message_id_str").collect()
    assert len(rows2) == 20  # whole entries, earlier-final messages included (already_final in the ledger)
    second = [(topic, e[0], e[1], 5, 5 if e == entries[6] else final_count[e], 5) for e in entries[6:]]
    result2 = commit_entries(spark, conf, frozen2.windows, second)[topic]
    assert (result2.acked, result2.entries_acked, result2.final_in_partial_entries, result2.left_pending) == (
        5,
        1,
        3,
        12,
    )
    assert backlog(admin, topic) == 3

    # An entry whose snapshot rows do not cover the whole batch is never acked, even if all are final.
    short = [(topic, entries[7][0], entries[7][1], 4, 4, 5)]
    assert commit_entries(spark, conf, frozen2.windows, short)[topic].acked == 0
    assert not cursor(admin, topic).is_acked(entries[7])


def test_partitioned_dlq_of_4_partitions_reads_every_partition_and_counts_beyond_the_window(
    spark, pulsar_broker, pulsar_client, topic_factory
):
    conf = PulsarConf(pulsar_broker.service_url, admin_url=pulsar_broker.admin_url)
    admin = PulsarAdmin(conf)
    topic = topic_factory("rm-part4-DLQ")
    pulsar_broker.admin().create_partitioned_topic(topic, 4)
    freeze(conf, topic, SUB)
    produce(pulsar_client, topic, 4_000, batched=True)
    frozen = freeze(conf, topic, SUB)
    assert frozen.read_mode == READER_MODE
    assert [w.partition for w in frozen.windows] == [0, 1, 2, 3]
    rows = (
        load(spark, conf, frozen.windows)
        .select("topic", "partition", "message_id_str", "batch_size")
        .collect()
    )
    assert len(rows) == 4_000
    assert len({(r.topic, r.message_id_str) for r in rows}) == 4_000
    assert {r.partition for r in rows} == {0, 1, 2, 3}
    assert all(r.message_id_str.split(":")[2] == str(r.partition) for r in rows)
    produce(pulsar_client, topic, 100, batched=False, start=4_000, late=True)  # beyond every window end

    per_entry = Counter((r.topic, *map(int, r.message_id_str.split(":")[:2])) for r in rows)
    sizes = {(r.topic, *map(int, r.message_id_str.split(":")[:2])): r.batch_size for r in rows}
    entries = [(t, led, ent, n, n, sizes[(t, led, ent)]) for (t, led, ent), n in per_entry.items()]
    result = commit_entries(spark, conf, frozen.windows, entries)
    assert sum(r.acked for r in result.values()) == 4_000
    late = {w.topic: backlog(admin, w.topic) for w in frozen.windows}
    assert sum(late.values()) == 100  # only the late messages (not batched: one entry each) remain
    assert {t: r.beyond_window for t, r in result.items()} == late
