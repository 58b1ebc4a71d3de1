"""Parquet written by the Python tasks that make the rows (pyarrow), not by Spark's writer.

A ``mapInArrow`` task's output batches cross back to the JVM, become Spark rows and are written by
Spark's Parquet writer. For the decide step that costs more than the decisions themselves: on 300k
messages of the benchmark, the decide job took 20.0 s writing through Spark, 16.3 s with no write at all
(the rows still cross to the JVM), and 9.1 s writing from the Python tasks (``docs/benchmarks.md``,
thirteenth round). So where the dataset's folder is on a local file system (a local path or ``file:``
URI: ``local[N]``, or a cluster whose workers share the mount), each task writes its own file with
pyarrow and sends back one small row of tallies. Other file systems (``s3a://``, ``hdfs://``) keep
Spark's writer: :func:`enabled` says which. The Spark setting ``spark.dlq.replay.taskWrites=false``
(:data:`CONF_TASK_WRITES`) keeps Spark's reads and writes everywhere.

Files match what Spark writes: snappy, no dictionary for the per-message columns
(:data:`~spark_apps.dlq_replay.parquet_writes.PER_MESSAGE_COLUMNS`), row groups of about
:data:`ROW_GROUP_BYTES`. Commit: a task writes ``_tmp-<partition>-<attempt>-<uuid>.parquet`` (readers
skip names starting with ``_``) and renames it to ``part-<partition>.parquet`` once closed, so a retried
task replaces its partition's file and a failed one leaves no visible file. The driver empties the folder
before the job, then removes leftover temporary files and writes ``_SUCCESS``.

A task can also write side datasets from the same batches (:class:`SideOutput`: a few columns derived
from each batch, in a folder of their own, committed with the main file), so a later step reads those
few columns without another pass over the messages.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_apps.dlq_replay.parquet_writes import PER_MESSAGE_COLUMNS
from spark_apps.dlq_replay.storage import local_path

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: Buffered output per task before it is written as one row group (Spark's writer uses 128 MiB; the
#: Python workers' memory counts toward the run's peak, so less here).
ROW_GROUP_BYTES = 8 * 1024 * 1024
_TEMP_PREFIX = "_tmp-"
SUCCESS = "_SUCCESS"

#: One task's tallies: a tuple of integers (or ``None``) per written batch, named by the caller.
Tally = tuple[int | None, ...]


#: Spark setting: ``false`` makes Spark read and write every dataset of the run (default ``true``).
CONF_TASK_WRITES = "spark.dlq.replay.taskWrites"


def supported(path: str) -> bool:
    """True when tasks can write ``path`` themselves: a local path or a ``file:`` URI."""
    return local_path(path) is not None


def enabled(spark: SparkSession, path: str) -> bool:
    """True when the run's tasks write (and read) ``path`` themselves: :func:`supported` and not turned
    off with :data:`CONF_TASK_WRITES`."""
    return supported(path) and str(spark.conf.get(CONF_TASK_WRITES, "true")).strip().lower() != "false"


def part_file(folder: str, partition: int) -> str:
    """The file task ``partition`` of :func:`write_in_tasks` writes in ``folder``."""
    return os.path.join(folder, f"part-{partition:05d}.parquet")


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The Parquet leaf paths of ``schema`` that keep dictionary encoding (all but the per-message
    columns); a map's leaves are ``<name>.key_value.key`` and ``<name>.key_value.value``."""
    import pyarrow as pa

    paths: list[str] = []
    for field in schema:
        if pa.types.is_map(field.type):
            paths += [f"{field.name}.key_value.key", f"{field.name}.key_value.value"]
        else:
            paths.append(field.name)
    return [path for path in paths if path not in PER_MESSAGE_COLUMNS]


class TaskFile:
    """One task's Parquet file in ``folder``: batches buffered into row groups, renamed into place by
    :meth:`commit` (see the module docstring)."""

    def __init__(self, folder: str, partition: int, attempt: int, schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        self.schema = schema
        self.final = part_file(folder, partition)
        temp = f"{_TEMP_PREFIX}{partition:05d}-{attempt}-{uuid.uuid4().hex}.parquet"
        self.temp = os.path.join(folder, temp)
        self._writer = pq.ParquetWriter(
            self.temp, schema, compression="snappy", use_dictionary=dictionary_columns(schema)
        )
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Add ``batch`` (its columns in :attr:`schema`'s order; extra columns are left out)."""
        if batch.num_rows == 0:
            return
        batch = batch.select(self.schema.names)
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._pending:
            table = pa.Table.from_batches(self._pending, self.schema)
            self._writer.write_table(table, row_group_size=table.num_rows)
            self._pending, self._pending_bytes = [], 0

    def commit(self) -> None:
        """Write what is buffered, close the file and move it to its final name."""
        self._flush()
        self._writer.close()
        os.replace(self.temp, self.final)

    def discard(self) -> None:
        """Close and delete the temporary file (the task failed)."""
        try:
            self._writer.close()
        finally:
            if os.path.exists(self.temp):
                os.remove(self.temp)


@dataclass(frozen=True)
class SideOutput:
    """A second dataset the tasks of :func:`write_in_tasks` write at ``path``: ``rows`` of every output
    batch, with ``schema``'s columns."""

    path: str
    schema: StructType
    rows: Callable[[pa.RecordBatch], pa.RecordBatch]


def _empty_folder(path: str) -> str:
    folder = local_path(path)
    if folder is None:
        raise ValueError(f"write_in_tasks needs a local path or file: URI, got {path!r}; use Spark's writer")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    return folder


def _seal(folder: str) -> None:
    for name in os.listdir(folder):
        if name.startswith(_TEMP_PREFIX):  # a failed attempt's file, if its task could not remove it
            os.remove(os.path.join(folder, name))
    with open(os.path.join(folder, SUCCESS), "w"):
        pass


def write_in_tasks(
    frame: DataFrame,
    transform: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    schema: StructType,
    path: str,
    tally: Callable[[pa.RecordBatch], Tally],
    tally_names: Sequence[str],
    sides: Sequence[SideOutput] = (),
) -> list[Tally]:
    """Run ``transform`` over ``frame``'s partitions as ``mapInArrow`` would and write its output rows
    (``schema``'s columns; others are tallied but not written) to the Parquet dataset ``path``, and each
    of ``sides`` to its own, all of which must be :func:`supported`. Returns ``tally`` of every written
    batch; nothing else reaches the JVM."""
    from spark_apps.dlq_replay.arrow_compat import map_in_arrow
    from spark_apps.dlq_replay.schemas import arrow_schema

    folders = [_empty_folder(path), *(_empty_folder(side.path) for side in sides)]
    schemas = [arrow_schema(schema), *(arrow_schema(side.schema) for side in sides)]
    derive = [lambda batch: batch, *(side.rows for side in sides)]
    names = list(tally_names)

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt = (context.partitionId(), context.attemptNumber()) if context else (0, 0)
        outs: list[TaskFile] = []
        tallies: list[Tally] = []
        try:
            for folder, file_schema in zip(folders, schemas, strict=True):
                outs.append(TaskFile(folder, partition, attempt, file_schema))
            for batch in transform(batches):
                tallies.append(tally(batch))
                for out, rows in zip(outs, derive, strict=True):
                    out.write(rows(batch))
            for out in outs:
                out.commit()
        except BaseException:
            for out in outs:
                out.discard()
            raise
        finally:
            # Python workers are reused by later steps: hand the freed Arrow buffers back to the system,
            # or the workers keep them until the run ends (they count toward its peak memory).
            pa.default_memory_pool().release_unused()
        columns = list(zip(*tallies, strict=True)) if tallies else [() for _ in names]
        yield pa.RecordBatch.from_arrays([pa.array(c, pa.int64()) for c in columns], names=names)

    rows = map_in_arrow(frame, task, ", ".join(f"{name} long" for name in names)).collect()
    for folder in folders:
        _seal(folder)
    return [tuple(row) for row in rows]
