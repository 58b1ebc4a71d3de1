"""Snapshot step: read the window in Spark tasks that write the snapshot's Parquet files themselves, beside
it each batch's entries (the commit's counts) and the rows' replay identities (decide's duplicate marks)."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING

from spark_apps.dlq_replay import task_parquet
from spark_apps.dlq_replay.commit import SNAPSHOT_ENTRIES_SCHEMA, entry_rows
from spark_apps.dlq_replay.pulsar_io.source import ENTRY_FIRST, read_tasks
from spark_apps.dlq_replay.pulsar_io.window import READER_MODE, read_mode_of, windows_to_json
from spark_apps.dlq_replay.schemas import IDENTITIES_SCHEMA, SNAPSHOT_SCHEMA
from spark_apps.dlq_replay.scope import identity_rows
from spark_apps.dlq_replay.task_parquet import read_frame

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow
    from spark_apps.dlq_replay.run_context import Run

log = logging.getLogger("spark_apps.dlq_replay")


def run_snapshot(run: Run, windows: list[PartitionWindow]) -> DataFrame:
    """Read the window in Spark tasks that write the snapshot (and its entries and identities) themselves."""
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
        with_identities = run.options.max_messages is None
        run.progress.count_files(run.paths.snapshot)
        sides = [task_parquet.SideOutput(run.paths.snapshot_entries, SNAPSHOT_ENTRIES_SCHEMA, entry_rows)]
        if with_identities:  # decide's duplicate marks read these few columns
            identities = partial(identity_rows, origin_precedence=run.playbook.origin_precedence)
            sides.append(task_parquet.SideOutput(run.paths.identities, IDENTITIES_SCHEMA, identities))
        tallies = task_parquet.write_in_tasks(
            frame, read_task, SNAPSHOT_SCHEMA, run.paths.snapshot, _entries_tally, ("n", "entries"), sides
        )
        count = sum(t[0] or 0 for t in tallies)
        info = dict(read_mode=mode, readers_per_partition=parallelism, identities_written=with_identities)
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


def _entries_tally(batch: pa.RecordBatch) -> tuple[int, int]:
    """``(rows, entries)`` of a batch of snapshot rows marked with their entries' first rows."""
    return batch.num_rows, batch.column(ENTRY_FIRST).true_count


def identities_dir(run: Run) -> str | None:
    """Where the snapshot's read tasks wrote its rows' identities, or ``None`` (not written)."""
    return run.paths.identities if run.state.info("snapshot").get("identities_written") else None
