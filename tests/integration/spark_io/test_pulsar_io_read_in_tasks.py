"""``read_tasks`` (the replay's snapshot read) returns exactly the rows of ``spark.read.format("pulsar")``
over the same frozen window, on Apache Pulsar in both read modes, with several readers per partition."""

from __future__ import annotations

import pytest
from pulsar_io_helpers import produce

from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.pulsar_io.source import (
    SOURCE_COLUMNS,
    SOURCE_SCHEMA,
    ddl_struct,
    read_tasks,
    register,
)
from spark_apps.dlq_replay.pulsar_io.window import (
    CONSUMER_MODE,
    READER_MODE,
    freeze,
    read_mode_of,
    windows_to_json,
)

pytestmark = pytest.mark.integration

SUB = "dlq-replayer"


def read_in_tasks(spark, options, mark_entries=False):
    """The rows the tasks of :func:`read_tasks` read, as the snapshot step runs them."""
    frame, read, schema = read_tasks(spark, options, mark_entries)
    return frame.mapInArrow(read, schema)


def rows(df) -> list[tuple]:
    """Every column of every row, in a stable order (properties as sorted items)."""
    out = []
    for r in df.collect():
        values = [r[c] for c in SOURCE_COLUMNS]
        values[SOURCE_COLUMNS.index("properties")] = tuple(sorted(r.properties.items()))
        values[SOURCE_COLUMNS.index("message_id")] = bytes(r.message_id)
        values[SOURCE_COLUMNS.index("value")] = bytes(r.value)
        out.append(tuple(values))
    return sorted(out, key=lambda t: (t[0], t[3]))


@pytest.mark.parametrize("mode", [READER_MODE, CONSUMER_MODE])
def test_read_in_tasks_gives_the_data_source_rows(spark, pulsar_broker, pulsar_client, topic_factory, mode):
    admin_url = pulsar_broker.admin_url if mode == READER_MODE else None
    conf = PulsarConf(pulsar_broker.service_url, admin_url=admin_url)
    partitioned, single = topic_factory("tasks-part-DLQ"), topic_factory("tasks-single-DLQ")
    pulsar_broker.admin().create_partitioned_topic(partitioned, 2)
    freeze(conf, [partitioned, single], SUB)  # the subscription exists before anything is produced
    produce(pulsar_client, partitioned, 3_000, batched=True)
    produce(pulsar_client, single, 1_000, batched=False)
    windows = freeze(conf, f"{partitioned},{single}", SUB).windows
    assert read_mode_of(windows) == mode
    produce(pulsar_client, single, 20, late=True, start=1_000)  # after the freeze: read by neither
    options = {
        **conf.to_options(),
        "subscription": SUB,
        "window": windows_to_json(windows),
        "parallelism": "2",
        "idle.timeout.ms": "3000",
    }

    df = read_in_tasks(spark, options)
    in_tasks = rows(df)
    register(spark)
    source_df = spark.read.format("pulsar").options(**options).load()
    by_source = rows(source_df)

    assert df.schema.simpleString() == ddl_struct(SOURCE_SCHEMA).simpleString()
    assert df.rdd.getNumPartitions() == source_df.rdd.getNumPartitions() >= 3  # one task per input partition
    # Consumer mode with 2 consumers per partition can hand one message to both: the replay drops such
    # duplicates by id; compare the distinct rows there.
    if mode == CONSUMER_MODE:
        in_tasks, by_source = sorted(set(in_tasks)), sorted(set(by_source))
    assert len(in_tasks) == 4_000
    assert in_tasks == by_source
    assert not any(r[SOURCE_COLUMNS.index("value")].startswith(b"late|") for r in in_tasks)


def test_entry_marks_count_the_entries_read(spark, pulsar_broker, pulsar_client, topic_factory):
    """With ``mark_entries`` (reader mode, two readers per partition): the same rows plus ENTRY_FIRST,
    whose sum is the number of distinct entries read, batched messages sharing their entry."""
    from pyspark.sql import functions as F

    from spark_apps.dlq_replay.pulsar_io.source import ENTRY_FIRST

    conf = PulsarConf(pulsar_broker.service_url, admin_url=pulsar_broker.admin_url)
    batched, single = topic_factory("marks-batched-DLQ"), topic_factory("marks-single-DLQ")
    freeze(conf, [batched, single], SUB)
    produce(pulsar_client, batched, 2_000, batched=True)
    produce(pulsar_client, single, 300, batched=False)
    windows = freeze(conf, f"{batched},{single}", SUB).windows
    assert read_mode_of(windows) == READER_MODE
    options = {
        **conf.to_options(),
        "subscription": SUB,
        "window": windows_to_json(windows),
        "parallelism": "2",
        "idle.timeout.ms": "3000",
    }

    marked = read_in_tasks(spark, options, mark_entries=True)
    assert marked.columns == [*SOURCE_COLUMNS, ENTRY_FIRST]
    assert rows(marked.drop(ENTRY_FIRST)) == rows(read_in_tasks(spark, options))
    ids = F.split("message_id_str", ":")
    got = marked.select(
        F.sum(F.col(ENTRY_FIRST).cast("long")).alias("marked"),
        F.count_distinct("topic", ids[0], ids[1]).alias("entries"),
        F.count(F.lit(1)).alias("n"),
    ).first()
    assert got is not None
    assert got["n"] == 2_300
    assert got["marked"] == got["entries"] == sum(w.pending_entries for w in windows)
    assert 300 < got["entries"] < 2_300  # the batched topic's 2,000 messages came in fewer entries
