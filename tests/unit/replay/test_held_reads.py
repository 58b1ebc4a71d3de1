"""Held reads: the snapshot's read tasks in processes of the run's own (real subprocesses and files; the
read itself is a plain Arrow function here, the broker side is in the embedded-broker tests)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from spark_apps.dlq_replay.errors import HeldReadError
from spark_apps.dlq_replay.held_reads import HeldReads
from spark_apps.dlq_replay.task_parquet import SUCCESS, TaskWrites, main_output, row_tally

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

SCHEMA = StructType([StructField("task", LongType()), StructField("row", LongType())])


def rows_per_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for task in batch.column(0).to_pylist():
            rows = pa.array(range(task + 1), pa.int64())
            yield pa.record_batch([pa.array([task] * len(rows), pa.int64()), rows], names=["task", "row"])


def test_tasks_are_spread_over_the_processes_and_write_the_files_spark_tasks_write(tmp_path: Path) -> None:
    writes = TaskWrites(rows_per_task, [main_output(str(tmp_path / "out"), SCHEMA)], row_tally, ("n",))
    held = HeldReads.start(writes, tasks=3, processes=2)
    try:
        tallies = held.tallies()
    finally:
        held.release()
    writes.seal()
    assert sorted(tallies) == [(1,), (2,), (3,)]
    files = sorted(name for name in os.listdir(tmp_path / "out") if name.startswith("part-"))
    assert files == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    table = pq.read_table(tmp_path / "out" / "part-00002.parquet")
    assert table.column("row").to_pylist() == [0, 1, 2]
    assert (tmp_path / "out" / SUCCESS).read_text() == "rows=6\n"


def test_an_ack_without_held_consumers_acks_nothing_and_ends_the_processes(tmp_path: Path) -> None:
    writes = TaskWrites(rows_per_task, [main_output(str(tmp_path / "out"), SCHEMA)], row_tally, ("n",))
    held = HeldReads.start(writes, tasks=2, processes=2)
    processes = [holder.process for holder in held._processes]
    held.tallies()
    whole = pa.table(
        {
            "dlq_topic": pa.array([], pa.string()),
            "ledger_id": pa.array([], pa.int64()),
            "entry_id": pa.array([], pa.int64()),
        }
    )
    assert held.ack(whole) == (0, 0)
    assert [process.returncode for process in processes] == [0, 0]
    held.release()  # again: nothing left to end


def test_a_failing_read_task_stops_the_run_with_its_error(tmp_path: Path) -> None:
    def broken(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            raise ValueError("option 'window' names no partition")
        yield from ()

    writes = TaskWrites(broken, [main_output(str(tmp_path / "out"), SCHEMA)], row_tally, ("n",))
    held = HeldReads.start(writes, tasks=1, processes=1)
    processes = [holder.process for holder in held._processes]
    with pytest.raises(HeldReadError, match=r"ValueError: option 'window' names no partition.*still pending"):
        held.tallies()
    assert processes[0].returncode == 1
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith("part-")]  # the task's file discarded


def test_a_process_that_dies_before_answering_is_reported(tmp_path: Path) -> None:
    def stuck(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time

        for _ in batches:
            time.sleep(60)
        yield from ()

    writes = TaskWrites(stuck, [main_output(str(tmp_path / "out"), SCHEMA)], row_tally, ("n",))
    held = HeldReads.start(writes, tasks=1, processes=1)
    process = held._processes[0].process
    process.kill()
    with pytest.raises(HeldReadError, match=r"ended with exit code -9 before its read answer"):
        held.tallies()
    assert process.returncode == -9
