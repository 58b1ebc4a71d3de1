"""Commit step: ack the run's final messages, from per-entry counts the tasks that already hold the
messages gathered.

The reader-mode commit acks an entry by id when every message it holds is in the snapshot and final
(:class:`~spark_apps.dlq_replay.pulsar_io.commit.EntryCommitFn`). The read and record tasks count as they
go:

- the snapshot's read tasks write each batch's entries (:func:`entry_rows`: messages read and the
  entry's batch size) to ``runs/<run>/snapshot_entries/``;
- each record task writes its bucket's final messages per entry (:class:`EntryFinals`) to
  ``runs/<run>/commit_parts/part-<bucket>.parquet``.

Both are about one row per entry. :func:`entry_table` merges them (counts summed, as an entry's rows may
be in several batches or buckets), for one partition in its commit task (:func:`commit_in_tasks`). The
consumer-mode commit splits the same table (:class:`ConsumerCommit`) into whole entries, whose every
message it acks as received, and entries that also hold a pending message, whose final ids alone come
from the ledger.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow
    from spark_apps.dlq_replay.run_context import Run

log = logging.getLogger("spark_apps.dlq_replay")

#: The entry columns, from a message id ``ledger:entry:partition:batch_index``.
ENTRY_KEYS = ("dlq_topic", "ledger_id", "entry_id")


def snapshot_entries_schema() -> StructType:
    """What :func:`entry_rows` gives: one row per entry of a batch of snapshot rows."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType(
        [
            StructField("dlq_topic", StringType()),
            StructField("ledger_id", LongType()),
            StructField("entry_id", LongType()),
            StructField("messages", LongType()),
            StructField("batch_size", LongType()),
        ]
    )


def _entry_columns(topics: pa.Array, message_ids: pa.Array) -> dict[str, pa.Array]:
    parts = pc.split_pattern(message_ids, ":")
    return {
        "dlq_topic": topics,
        "ledger_id": pc.cast(pc.list_element(parts, 0), pa.int64()),
        "entry_id": pc.cast(pc.list_element(parts, 1), pa.int64()),
    }


def entry_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Per entry of a batch of snapshot rows: the messages read of it and its batch size."""
    columns = _entry_columns(batch.column("topic"), batch.column("message_id_str"))
    table = pa.table({**columns, "batch_size": pc.cast(batch.column("batch_size"), pa.int64())})
    grouped = table.group_by(list(ENTRY_KEYS), use_threads=False).aggregate(
        [([], "count_all"), ("batch_size", "max")]
    )
    out = grouped.select([*ENTRY_KEYS, "count_all", "batch_size_max"]).rename_columns(
        [*ENTRY_KEYS, "messages", "batch_size"]
    )
    batches = out.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=out.schema)


class EntryFinals:
    """A record task's final messages per entry of its bucket, from its ledger rows."""

    def __init__(self) -> None:
        self._parts: list[pa.Table] = []

    def add(self, ledger: pa.RecordBatch) -> None:
        """Count the final rows of a batch of ledger rows (``dlq_topic``, ``dlq_message_id``, ``final``)."""
        columns = _entry_columns(ledger.column("dlq_topic"), ledger.column("dlq_message_id"))
        final = pc.cast(pc.fill_null(ledger.column("final"), False), pa.int64())
        self._parts.append(_sum_finals(pa.table({**columns, "final_messages": final})))

    def write(self, folder: str, bucket: int) -> None:
        """Write the bucket's counts to ``folder/part-<bucket>.parquet`` (renamed into place)."""
        from spark_apps.dlq_replay.storage import write_table
        from spark_apps.dlq_replay.task_parquet import part_file

        table = _sum_finals(pa.concat_tables(self._parts)) if self._parts else _FINALS.empty_table()
        write_table(table.cast(_FINALS), part_file(folder, bucket))


_FINALS = pa.schema(
    [
        ("dlq_topic", pa.string()),
        ("ledger_id", pa.int64()),
        ("entry_id", pa.int64()),
        ("final_messages", pa.int64()),
    ]
)


def _sum_finals(table: pa.Table) -> pa.Table:
    grouped = table.group_by(list(ENTRY_KEYS), use_threads=False).aggregate([("final_messages", "sum")])
    return grouped.select([*ENTRY_KEYS, "final_messages_sum"]).rename_columns(_FINALS.names)


def entry_table(snapshot_entries: str, commit_parts: str, topic: str | None = None) -> pa.Table:
    """Per entry of the snapshot (of partition ``topic`` only, when given): ``dlq_topic, ledger_id,
    entry_id, messages, final_messages, batch_size`` (:data:`~spark_apps.dlq_replay.pulsar_io.commit.
    ENTRY_COMMIT_INPUT_SCHEMA`), from the read tasks' entries and the record tasks' counts."""
    from spark_apps.dlq_replay.snapshot_files import part_files

    read = [_of_topic(path, topic) for path in part_files(snapshot_entries)]
    if not read:
        return _ENTRY_TABLE.empty_table()
    entries = (
        pa.concat_tables(read)
        .group_by(list(ENTRY_KEYS), use_threads=False)
        .aggregate([("messages", "sum"), ("batch_size", "max")])
    )
    counted = [_of_topic(path, topic) for path in part_files(commit_parts)]
    finals = _sum_finals(pa.concat_tables(counted)) if counted else _FINALS.empty_table()
    joined = entries.join(finals, list(ENTRY_KEYS), join_type="left outer", use_threads=False)
    return pa.table(
        {
            **{name: joined.column(name) for name in ENTRY_KEYS},
            "messages": joined.column("messages_sum"),
            "final_messages": pc.fill_null(joined.column("final_messages"), 0),
            "batch_size": joined.column("batch_size_max"),
        }
    ).cast(_ENTRY_TABLE)


def _of_topic(path: str, topic: str | None) -> pa.Table:
    from spark_apps.dlq_replay.storage import read_table

    table = read_table(path)
    return table if topic is None else table.filter(pc.equal(table.column("dlq_topic"), topic))


_ENTRY_TABLE = pa.schema(
    [
        ("dlq_topic", pa.string()),
        ("ledger_id", pa.int64()),
        ("entry_id", pa.int64()),
        ("messages", pa.int64()),
        ("final_messages", pa.int64()),
        ("batch_size", pa.int64()),
    ]
)


def commit_in_tasks(
    spark: SparkSession,
    snapshot_entries: str,
    commit_parts: str,
    conf: PulsarConf,
    windows: Sequence[PartitionWindow],
    subscription: str,
) -> list[dict[str, Any]]:
    """Commit the run's entries, one Spark task per partition of the window: the task merges that
    partition's counts (:func:`entry_table`), acks its fully final entries and verifies them on the cursor
    (:class:`~spark_apps.dlq_replay.pulsar_io.commit.EntryCommitFn`). One result row per partition."""
    from spark_apps.dlq_replay.arrow_compat import local_frame, map_in_arrow
    from spark_apps.dlq_replay.pulsar_io.commit import COMMIT_RESULT_SCHEMA, EntryCommitFn

    committer = EntryCommitFn(conf, windows, subscription)  # a bad setting fails here, before any task
    topics = [w.topic for w in windows]

    def commit(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for topic in batch.column(0).to_pylist():
                table = entry_table(snapshot_entries, commit_parts, topic)
                yield from committer.commit_table(table, [topic]).to_batches()

    frame = local_frame(spark, [(topic,) for topic in topics], "dlq_topic string").repartition(
        max(1, len(topics))
    )
    return [row.asDict() for row in map_in_arrow(frame, commit, COMMIT_RESULT_SCHEMA).collect()]


class ConsumerCommit:
    """What the consumer-mode commit needs of :func:`entry_table`, split in the driver.

    ``whole``: the entries every message of which the snapshot read and the run made final, inside the
    window, as :data:`~spark_apps.dlq_replay.pulsar_io.commit.ENTRIES_COMMIT_INPUT_SCHEMA` rows: the commit
    acks any message it receives of them, with no id to look up. ``partial``: the entries holding a final
    message and one that is not (``dlq_topic, ledger_id, entry_id``): only their final ids come from the
    ledger. ``expected``: the run's final messages (``in_whole`` of them in whole entries); ``unread``:
    the messages of partitions without a final one (not read again: they stay pending).
    """

    def __init__(self, table: pa.Table, windows: Sequence[PartitionWindow]) -> None:
        from spark_apps.dlq_replay.pulsar_io.errors import WindowError

        ends = {w.topic: w.end_key for w in windows}
        unknown = set(pc.unique(table.column("dlq_topic")).to_pylist()) - set(ends)
        if unknown:
            raise WindowError(
                f"the snapshot holds partitions {sorted(unknown)} that are not in the run's window "
                f"(known: {sorted(ends)}); start a new run"
            )
        final, messages, size = (table.column(c) for c in ("final_messages", "messages", "batch_size"))
        counted = pc.and_(
            pc.and_(pc.equal(final, messages), pc.equal(messages, pc.fill_null(size, -1))),
            pc.greater(messages, 0),
        )
        whole = pc.and_(counted, _inside(table, ends))
        self.whole = pa.table(
            {
                "dlq_topic": table.column("dlq_topic"),
                "dlq_message_id": pa.nulls(len(table), pa.string()),
                "ledger_id": table.column("ledger_id"),
                "entry_id": table.column("entry_id"),
                "batch_size": size,
            }
        ).filter(whole)
        partial = pc.and_(pc.invert(whole), pc.greater(final, 0))
        self.partial = table.select(list(ENTRY_KEYS)).filter(partial)
        self.expected = int(pc.sum(final).as_py() or 0)
        self.in_whole = int(pc.sum(self.whole.column("batch_size")).as_py() or 0)
        per_topic = table.group_by("dlq_topic", use_threads=False).aggregate(
            [("final_messages", "sum"), ("messages", "sum")]
        )
        none_final = pc.equal(per_topic.column("final_messages_sum"), 0)
        self.unread = int(pc.sum(per_topic.column("messages_sum").filter(none_final)).as_py() or 0)


def _inside(table: pa.Table, ends: dict[str, Any]) -> Any:
    """Whether each entry lies entirely inside its partition's window (at or before the end)."""
    ledger, entry, size = (table.column(c) for c in ("ledger_id", "entry_id", "batch_size"))
    topics = table.column("dlq_topic")
    inside: Any = pa.repeat(False, len(table))
    for topic, end in ends.items():
        if end is None:
            continue
        end_ledger, end_entry, _, end_batch = end
        before = pc.or_(
            pc.less(ledger, end_ledger), pc.and_(pc.equal(ledger, end_ledger), pc.less(entry, end_entry))
        )
        at_end = pc.and_(pc.equal(ledger, end_ledger), pc.equal(entry, end_entry))
        if end_batch >= 0:  # the end names a message of a batch: the entry's last one must be inside
            at_end = pc.and_(at_end, pc.less_equal(pc.subtract(size, 1), end_batch))
        inside = pc.or_(inside, pc.and_(pc.equal(topics, topic), pc.or_(before, at_end)))
    return pc.fill_null(inside, False)


def run_commit(run: Run, windows: list[PartitionWindow]) -> None:
    """Ack the final messages: reader mode by entry id in one task per partition, consumer mode by reading
    the window again; what cannot be acked stays pending for the next run."""
    from spark_apps.dlq_replay.pulsar_io.window import READER_MODE, read_mode_of

    resumed = "commit" in run.state.steps  # an earlier attempt may already have acked some of them
    if not run.step("commit"):
        return
    started = time.monotonic()
    mode = read_mode_of(windows)
    if mode == READER_MODE:
        totals = _commit_entries(run, windows)
    else:
        totals = _commit_by_consumers(run, windows, resumed)
    if totals["unacked_final"]:
        log.warning(
            "commit: %d final messages could not be acked; they stay pending", totals["unacked_final"]
        )
    snapshot_reads = int(run.state.info("snapshot").get("dlq_reads", 0))
    reads = snapshot_reads + totals["messages_read"]
    run.done(
        "commit",
        started,
        read_mode=mode,
        acked=totals["acked"],
        acked_by_earlier_attempts=totals.get("acked_by_earlier_attempts", 0),
        left_pending_seen=totals["left_pending"],
        beyond_window=totals["beyond_window"],
        unacked_final=totals["unacked_final"],
        final_in_partial_entries=totals["final_in_partial_entries"],
        entries_acked=totals["entries_acked"],
        final_in_whole_entries=totals.get("final_in_whole_entries", 0),
        dlq_reads_snapshot=snapshot_reads,
        dlq_reads_commit=totals["messages_read"],
        reads_per_message=round(reads / snapshot_reads, 3) if snapshot_reads else 0.0,
    )


_TOTAL_COLUMNS = (
    "acked",
    "left_pending",
    "beyond_window",
    "final_in_partial_entries",
    "unacked_final",
    "entries_acked",
    "messages_read",
)


def _sum_rows(rows: DataFrame) -> dict[str, int]:
    totals = dict.fromkeys(_TOTAL_COLUMNS, 0)
    for row in rows.collect():  # one row per DLQ partition
        for name in _TOTAL_COLUMNS:
            totals[name] += int(row[name] or 0)
    return totals


def _commit_entries(run: Run, windows: list[PartitionWindow]) -> dict[str, int]:
    """Reader mode: ack the snapshot's fully final entries by id, verified on the cursor; no DLQ read
    (one task per partition, from the read and record tasks' counts)."""
    paths = run.paths
    results = commit_in_tasks(
        run.spark, paths.snapshot_entries, paths.commit_parts, run.conf, windows, run.options.subscription
    )
    return {name: sum(int(row[name] or 0) for row in results) for name in _TOTAL_COLUMNS}


def _counted_entries(run: Run) -> pa.Table:
    """Per entry of the snapshot, its messages and final messages, as the record tasks counted them
    (:func:`~spark_apps.dlq_replay.commit.entry_table`)."""
    return entry_table(run.paths.snapshot_entries, run.paths.commit_parts)


def _commit_by_consumers(run: Run, windows: list[PartitionWindow], resumed: bool) -> dict[str, int]:
    """Consumer mode: read the window again and ack the final messages from the receiving consumer."""
    from spark_apps.dlq_replay.arrow_compat import apply_in_arrow
    from spark_apps.dlq_replay.pulsar_io.commit import COMMIT_RESULT_SCHEMA, make_commit_fn

    final, expected, unread, in_whole, in_partial = _final_by_entries(run, windows, _counted_entries(run))
    totals = dict.fromkeys(_TOTAL_COLUMNS, 0)
    totals["final_in_whole_entries"] = in_whole
    if final is not None:
        fn = make_commit_fn(run.conf, windows, run.options.subscription, run.options.idle_timeout_ms)
        grouped = final.repartition(max(1, len(windows)), "dlq_topic").groupBy("dlq_topic")

        def commit_group(table: pa.Table) -> pa.Table:
            return fn(table)

        totals.update(_sum_rows(apply_in_arrow(grouped, commit_group, COMMIT_RESULT_SCHEMA)))
    # Every final message of a first commit attempt was pending (the snapshot read it unacked): any not
    # acked now was missed (e.g. a broker stall) and stays pending until the next run acks it. In a
    # resumed commit, final messages not received were acked by the killed attempt (one run at a time
    # holds the subscription): they count as acked too, so the total is exact across attempts.
    # Partitions without a final message are not read: all their messages of this run stay pending.
    acked_this_attempt = totals["acked"]
    totals["acked_by_earlier_attempts"] = max(0, expected - acked_this_attempt) if resumed else 0
    totals["acked"] = acked_this_attempt + totals["acked_by_earlier_attempts"]
    totals["left_pending"] += unread
    totals["final_in_partial_entries"] += in_partial
    totals["unacked_final"] = 0 if resumed else max(0, expected - acked_this_attempt)
    return totals


class _Finals(NamedTuple):
    """The consumer-mode commit's input: the final messages to ack (None: there are none), how many, the
    messages of partitions without a final one, how many final messages make up whole entries, and how
    many are left pending because their entry holds a pending one."""

    frame: DataFrame | None
    expected: int
    unread: int
    in_whole_entries: int
    in_partial_entries: int = 0


def _final_by_entries(run: Run, windows: list[PartitionWindow], table: pa.Table) -> _Finals:
    """The final messages as whole entries (from the tasks' counts, in the driver), as
    :data:`~.pulsar_io.commit.ENTRIES_COMMIT_INPUT_SCHEMA` rows. The final messages of entries that also
    hold a pending one are not sent: without batch-index acks the broker removes a batch only whole, so
    they stay pending with their entry, counted in ``final_in_partial_entries``."""
    from spark_apps.dlq_replay.arrow_compat import arrow_frame
    from spark_apps.dlq_replay.pulsar_io.commit import ENTRIES_COMMIT_INPUT_SCHEMA

    split = ConsumerCommit(table, windows)
    final = arrow_frame(run.spark, split.whole, ENTRIES_COMMIT_INPUT_SCHEMA) if len(split.whole) else None
    log.info(
        "step commit: %d final messages, %d in %d whole entries, the rest in %d entries with a pending "
        "message (left pending with them)",
        split.expected,
        split.in_whole,
        len(split.whole),
        len(split.partial),
    )
    return _Finals(final, split.in_whole, split.unread, split.in_whole, split.expected - split.in_whole)
