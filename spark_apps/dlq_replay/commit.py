"""Commit step: ack the final messages by the per-entry counts (:func:`entry_table`) of the read and record
tasks: reader mode by entry id, consumer mode (:class:`ConsumerCommit`) whole entries as received."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_apps.dlq_replay.arrow_util import arrow_frame, in_tasks
from spark_apps.dlq_replay.pulsar_io.commit import (
    COMMIT_RESULT_SCHEMA,
    ENTRIES_COMMIT_INPUT_SCHEMA,
    EntryCommitFn,
    make_commit_fn,
)
from spark_apps.dlq_replay.pulsar_io.errors import WindowError
from spark_apps.dlq_replay.pulsar_io.window import READER_MODE, read_mode_of
from spark_apps.dlq_replay.schemas import arrow_schema, ddl_struct
from spark_apps.dlq_replay.storage import read_table, write_table
from spark_apps.dlq_replay.task_parquet import part_file, part_files

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow
    from spark_apps.dlq_replay.run_context import Run

log = logging.getLogger("spark_apps.dlq_replay")

#: The entry columns, from a message id ``ledger:entry:partition:batch_index``.
ENTRY_KEYS = ("dlq_topic", "ledger_id", "entry_id")
_ENTRY = "dlq_topic string, ledger_id long, entry_id long"
#: What :func:`entry_rows` gives: one row per entry of a batch of snapshot rows.
SNAPSHOT_ENTRIES_SCHEMA = ddl_struct(f"{_ENTRY}, messages long, batch_size long")
_FINALS = arrow_schema(ddl_struct(f"{_ENTRY}, final_messages long"))
_ENTRY_TABLE = arrow_schema(ddl_struct(f"{_ENTRY}, messages long, final_messages long, batch_size long"))
#: An entry's messages and its batch size, from its rows (one per message, or one per batch of rows).
_MESSAGES = (("messages", "sum"), ("batch_size", "max"))


def _entry_columns(topics: pa.Array, message_ids: pa.Array) -> dict[str, pa.Array]:
    parts = pc.split_pattern(message_ids, ":")
    return {
        "dlq_topic": topics,
        "ledger_id": pc.cast(pc.list_element(parts, 0), pa.int64()),
        "entry_id": pc.cast(pc.list_element(parts, 1), pa.int64()),
    }


def _per_entry(table: pa.Table, aggregations: Sequence[tuple[str, str]]) -> pa.Table:
    """``table`` grouped by entry: the entry columns, then each aggregated column under its own name."""
    grouped = table.group_by(list(ENTRY_KEYS), use_threads=False).aggregate(list(aggregations))
    columns = grouped.select([*ENTRY_KEYS, *(f"{name}_{how}" for name, how in aggregations)])
    return columns.rename_columns([*ENTRY_KEYS, *(name for name, _ in aggregations)])


def entry_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Per entry of a batch of snapshot rows: the messages read of it and its batch size."""
    columns = _entry_columns(batch.column("topic"), batch.column("message_id_str"))
    size = pc.cast(batch.column("batch_size"), pa.int64())
    table = pa.table({**columns, "messages": pa.repeat(1, len(batch)), "batch_size": size})
    out = _per_entry(table, _MESSAGES)
    return pa.record_batch([column.combine_chunks() for column in out.columns], schema=out.schema)


def _sum_finals(tables: list[pa.Table]) -> pa.Table:
    if not tables:
        return _FINALS.empty_table()
    return _per_entry(pa.concat_tables(tables), [("final_messages", "sum")])


class EntryFinals:
    """A record task's final messages per entry of its bucket, from its ledger rows."""

    def __init__(self) -> None:
        self._parts: list[pa.Table] = []

    def add(self, ledger: pa.RecordBatch) -> None:
        """Count the final rows of a batch of ledger rows (``dlq_topic``, ``dlq_message_id``, ``final``)."""
        columns = _entry_columns(ledger.column("dlq_topic"), ledger.column("dlq_message_id"))
        final = pc.cast(pc.fill_null(ledger.column("final"), False), pa.int64())
        self._parts.append(_sum_finals([pa.table({**columns, "final_messages": final})]))

    def write(self, folder: str, bucket: int) -> None:
        """Write the bucket's counts to ``folder/part-<bucket>.parquet`` (renamed into place)."""
        write_table(_sum_finals(self._parts).cast(_FINALS), part_file(folder, bucket))


def entry_table(snapshot_entries: str, commit_parts: str, topic: str | None = None) -> pa.Table:
    """Per entry of the snapshot (of partition ``topic`` only): messages, final messages and batch size."""
    read = [_of_topic(path, topic) for path in part_files(snapshot_entries)]
    if not read:
        return _ENTRY_TABLE.empty_table()
    finals = _sum_finals([_of_topic(path, topic) for path in part_files(commit_parts)])
    entries = _per_entry(pa.concat_tables(read), _MESSAGES)
    joined = entries.join(finals, list(ENTRY_KEYS), join_type="left outer", use_threads=False)
    columns = {name: joined.column(name) for name in _ENTRY_TABLE.names}
    columns["final_messages"] = pc.fill_null(columns["final_messages"], 0)
    return pa.table(columns).cast(_ENTRY_TABLE)


def _of_topic(path: str, topic: str | None) -> pa.Table:
    table = read_table(path)
    return table if topic is None else table.filter(pc.equal(table.column("dlq_topic"), topic))


def _commit_by_ids(run: Run, windows: Sequence[PartitionWindow]) -> dict[str, int]:
    """Reader mode: one Spark task per partition merges that partition's counts, acks its fully final
    entries by id and verifies them on the cursor; no DLQ read."""
    committer = EntryCommitFn(run.conf, windows, run.options.subscription)  # a bad setting fails here
    entries, parts, topics = run.paths.snapshot_entries, run.paths.commit_parts, [w.topic for w in windows]

    def commit(i: int) -> list[pa.RecordBatch]:
        return committer.commit_table(entry_table(entries, parts, topics[i]), [topics[i]]).to_batches()

    results = in_tasks(run.spark, commit, len(topics), ddl_struct(COMMIT_RESULT_SCHEMA))
    return _sum_rows(results.to_pylist())


class ConsumerCommit:
    """:func:`entry_table` split in the driver for the consumer-mode commit: ``whole`` entries (all read and
    final, inside the window: any message received of them is acked), ``partial`` ones (a final and a
    pending message), the run's ``expected`` final messages (``in_whole`` in whole entries), and the
    ``unread`` messages of partitions without a final one (not read again)."""

    def __init__(self, table: pa.Table, windows: Sequence[PartitionWindow]) -> None:
        ends = {w.topic: w.end_key for w in windows}
        unknown = set(pc.unique(table.column("dlq_topic")).to_pylist()) - set(ends)
        if unknown:
            raise WindowError(
                f"the snapshot holds partitions {sorted(unknown)} that are not in the run's window "
                f"(known: {sorted(ends)}); start a new run"
            )
        final, messages, size = (table.column(c) for c in ("final_messages", "messages", "batch_size"))
        counted = pc.and_(pc.equal(final, messages), pc.equal(messages, pc.fill_null(size, -1)))
        whole = pc.and_(pc.and_(counted, pc.greater(messages, 0)), _inside(table, ends))
        kept = table.filter(whole).select(["dlq_topic", "ledger_id", "entry_id", "batch_size"])
        self.whole = kept.add_column(1, "dlq_message_id", pa.nulls(len(kept), pa.string()))
        has_final = pc.greater(final, 0)
        self.partial = table.select(list(ENTRY_KEYS)).filter(pc.and_(pc.invert(whole), has_final))
        self.expected = int(pc.sum(final).as_py() or 0)
        self.in_whole = int(pc.sum(self.whole.column("batch_size")).as_py() or 0)
        topics = table.column("dlq_topic")
        read_again = pc.is_in(topics, pc.unique(topics.filter(has_final)))  # partitions with a final message
        self.unread = int(pc.sum(messages.filter(pc.invert(read_again))).as_py() or 0)


def _inside(table: pa.Table, ends: dict[str, Any]) -> Any:
    """Whether each entry lies entirely inside its partition's window (at or before the end)."""
    ledger, entry, size = (table.column(c) for c in ("ledger_id", "entry_id", "batch_size"))
    topics = table.column("dlq_topic")
    inside: Any = pa.repeat(False, len(table))
    for topic, end in ends.items():
        if end is None:
            continue
        end_ledger, end_entry, _, end_batch = end
        same_ledger = pc.equal(ledger, end_ledger)
        before = pc.or_(pc.less(ledger, end_ledger), pc.and_(same_ledger, pc.less(entry, end_entry)))
        at_end = pc.and_(same_ledger, pc.equal(entry, end_entry))
        if end_batch >= 0:  # the end names a message of a batch: the entry's last one must be inside
            at_end = pc.and_(at_end, pc.less_equal(pc.subtract(size, 1), end_batch))
        inside = pc.or_(inside, pc.and_(pc.equal(topics, topic), pc.or_(before, at_end)))
    return pc.fill_null(inside, False)


def run_commit(run: Run, windows: list[PartitionWindow]) -> None:
    """Ack the final messages (reader mode by entry id, consumer mode by reading the window again)."""
    resumed = "commit" in run.state.steps  # an earlier attempt may already have acked some of them
    if not run.step("commit"):
        return
    started = time.monotonic()
    mode = read_mode_of(windows)
    by_ids = mode == READER_MODE
    totals = _commit_by_ids(run, windows) if by_ids else _commit_by_consumers(run, windows, resumed)
    if unacked := totals["unacked_final"]:
        log.warning("commit: %d final messages could not be acked; they stay pending", unacked)
    snapshot_reads = int(run.state.info("snapshot").get("dlq_reads", 0))
    run.done("commit", started, read_mode=mode, **commit_info(totals, snapshot_reads))


def commit_info(totals: dict[str, int], snapshot_reads: int) -> dict[str, Any]:
    """The commit's counts as ``state.json`` records them (all zero for ``totals={}``: an empty window)."""
    names = (*_TOTAL_COLUMNS, "acked_by_earlier_attempts", "final_in_whole_entries")
    info: dict[str, Any] = {name: totals.get(name, 0) for name in names}
    info["left_pending_seen"], commit_reads = info.pop("left_pending"), info.pop("messages_read")
    reads = snapshot_reads + commit_reads
    info.update(dlq_reads_snapshot=snapshot_reads, dlq_reads_commit=commit_reads)
    info["reads_per_message"] = round(reads / snapshot_reads, 3) if snapshot_reads else 0.0
    return info


#: The commit results' counts: every column but ``dlq_topic``.
_TOTAL_COLUMNS = tuple(part.split()[0] for part in COMMIT_RESULT_SCHEMA.split(", ")[1:])


def _sum_rows(rows: Iterable[Any]) -> dict[str, int]:
    return {name: sum(int(row[name] or 0) for row in rows) for name in _TOTAL_COLUMNS}


def _commit_by_consumers(run: Run, windows: list[PartitionWindow], resumed: bool) -> dict[str, int]:
    """Consumer mode: read the window again and ack the final messages of whole entries; those of an entry
    with a pending message stay pending (the broker removes a batch only whole)."""
    split = ConsumerCommit(entry_table(run.paths.snapshot_entries, run.paths.commit_parts), windows)
    log.info(
        "step commit: %d final messages, %d in %d whole entries, the rest in %d entries with a pending "
        "message (left pending with them)",
        split.expected,
        split.in_whole,
        len(split.whole),
        len(split.partial),
    )
    totals = {**dict.fromkeys(_TOTAL_COLUMNS, 0), "final_in_whole_entries": split.in_whole}
    if len(split.whole):
        final = arrow_frame(run.spark, split.whole, ENTRIES_COMMIT_INPUT_SCHEMA)
        fn = make_commit_fn(run.conf, windows, run.options.subscription, run.options.idle_timeout_ms)
        grouped = final.repartition(max(1, len(windows)), "dlq_topic").groupBy("dlq_topic")
        totals.update(_sum_rows(grouped.applyInArrow(fn, COMMIT_RESULT_SCHEMA).collect()))
    # A first attempt's final messages not acked now were missed and stay pending for the next run; in a
    # resumed commit, those not received were acked by the killed attempt (one run holds the subscription)
    # and count as acked. Partitions without a final message are not read: their messages stay pending.
    missed = max(0, split.in_whole - totals["acked"])
    totals.update(acked_by_earlier_attempts=missed if resumed else 0, unacked_final=0 if resumed else missed)
    totals["acked"] += totals["acked_by_earlier_attempts"]
    totals["left_pending"] += split.unread
    totals["final_in_partial_entries"] += split.expected - split.in_whole
    return totals
