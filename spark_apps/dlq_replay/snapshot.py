"""Snapshot step: read the window in Spark tasks that write the snapshot's Parquet files themselves, with each
row's replay id (decide's duplicate marks and normalising read it), and beside it each batch's entries (the
commit's counts)."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa

from spark_apps.dlq_replay import task_parquet
from spark_apps.dlq_replay.commit import SNAPSHOT_ENTRIES_SCHEMA, entry_rows
from spark_apps.dlq_replay.normalize import replay_ids
from spark_apps.dlq_replay.pulsar_io.source import ENTRY_FIRST, read_tasks
from spark_apps.dlq_replay.pulsar_io.window import READER_MODE, read_mode_of, windows_to_json
from spark_apps.dlq_replay.schemas import REPLAY_ID_MARK, SNAPSHOT_FILE_SCHEMA, SNAPSHOT_SCHEMA
from spark_apps.dlq_replay.task_parquet import read_frame

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from pyspark.sql import DataFrame

    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow
    from spark_apps.dlq_replay.run_context import Run

log = logging.getLogger("spark_apps.dlq_replay")


def run_snapshot(run: Run, windows: list[PartitionWindow]) -> DataFrame:
    """Read the window in Spark tasks that write the snapshot (its rows' replay ids too) and its entries."""
    if run.step("snapshot"):
        started = time.monotonic()
        mode = read_mode_of(windows)
        # Readers split a partition's pending entries into shares, by default enough to keep every core busy;
        # consumer mode reads each partition with one consumer, which drops a redelivered copy by its id.
        parallelism = 1
        if mode == READER_MODE:
            busy = max(1, sum(1 for w in windows if w.pending))
            parallelism = run.options.parallelism or max(1, -(-run.buckets // busy))
        source_options = {
            **run.conf.to_options(),
            "topics": ",".join(run.options.topics),
            "subscription": run.options.subscription,
            "window": windows_to_json(windows),
            "parallelism": str(parallelism),
            "idle.timeout.ms": str(run.options.idle_timeout_ms),
        }
        frame, read_task, _ = read_tasks(run.spark, source_options, mark_entries=True)
        run.progress.count_files(run.paths.snapshot)
        sides = [task_parquet.SideOutput(run.paths.snapshot_entries, SNAPSHOT_ENTRIES_SCHEMA, entry_rows)]
        read = partial(with_replay_ids, read_task, run.playbook.origin_precedence)
        tallies = task_parquet.write_in_tasks(
            frame, read, SNAPSHOT_FILE_SCHEMA, run.paths.snapshot, _entries_tally, ("n", "entries"), sides
        )
        count = sum(t[0] or 0 for t in tallies)
        info = dict(read_mode=mode, readers_per_partition=parallelism)
        if mode == READER_MODE:
            entries = sum(t[1] or 0 for t in tallies)
            planned = sum(w.pending_entries for w in windows)
            info.update(pending_entries=planned, entries_read=entries, unread_entries=planned - entries)
            if planned != entries:
                log.warning(
                    "step snapshot: %d of %d pending entries not read; they stay pending for the next run",
                    planned - entries,
                    planned,
                )
        run.done("snapshot", started, messages=count, dlq_reads=count, **info)
    return read_frame(run.spark, run.paths.snapshot, SNAPSHOT_SCHEMA)


def with_replay_ids(
    read: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    origin_precedence: Sequence[str],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The batches ``read`` gives, each row with its replay id (:data:`REPLAY_ID_MARK`)."""
    for batch in read(batches):
        yield batch.append_column(REPLAY_ID_MARK, pa.array(replay_ids(batch, origin_precedence), pa.string()))


def _entries_tally(batch: pa.RecordBatch) -> tuple[int, int]:
    """``(rows, entries)`` of a batch of snapshot rows marked with their entries' first rows."""
    return batch.num_rows, batch.column(ENTRY_FIRST).true_count
