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
few columns without another pass over the messages. A side dataset can be partitioned by a column, in
folders named as Spark names them (:func:`partition_folder`).

Progress: Spark's live metrics count the tally rows these tasks send back, not the messages they write,
so every task also keeps ``_progress-<partition>`` in the main folder up to date (the rows it has written,
every :data:`PROGRESS_EVERY_S` and when it ends); :func:`rows_written` sums them for the step's progress
lines. Readers skip them like every name starting with ``_``; once the job ends their sum goes into
``_SUCCESS`` (``rows=<n>``) and they are removed, so the folder holds what Spark's writer leaves.
"""

from __future__ import annotations

import os
import shutil
import time
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
#: With a row group key (:class:`SideOutput`), a row group ends where the key changes once it holds
#: this much; rows whose keys alternate faster still make row groups of at least this size.
KEYED_GROUP_MIN_BYTES = 1024 * 1024
_TEMP_PREFIX = "_tmp-"
SUCCESS = "_SUCCESS"
_PROGRESS_PREFIX = "_progress-"
#: How often a task records the rows it has written so far.
PROGRESS_EVERY_S = 2.0

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

    def __init__(
        self,
        folder: str,
        partition: int,
        attempt: int,
        schema: pa.Schema,
        *,
        int96_timestamps: bool = False,
        group_key: Callable[[pa.RecordBatch], pa.Array] | None = None,
    ) -> None:
        import pyarrow.parquet as pq

        self.schema = schema
        self.group_key = group_key
        self._last_key: object = None
        self.final = part_file(folder, partition)
        temp = f"{_TEMP_PREFIX}{partition:05d}-{attempt}-{uuid.uuid4().hex}.parquet"
        self.temp = os.path.join(folder, temp)
        self._writer = pq.ParquetWriter(
            self.temp,
            schema,
            compression="snappy",
            use_dictionary=dictionary_columns(schema),
            use_deprecated_int96_timestamps=int96_timestamps,
        )
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0.0

    def write(self, batch: pa.RecordBatch) -> None:
        """Add ``batch`` (its columns in :attr:`schema`'s order; extra columns are left out)."""
        n = batch.num_rows
        if n == 0:
            return
        cuts = self._key_changes(self.group_key(batch)) if self.group_key is not None else []
        batch = batch.select(self.schema.names)
        if not cuts:
            self._add(batch, batch.nbytes)
            return
        row_bytes = batch.nbytes / n
        start = 0
        for cut in cuts:
            if self._pending_bytes + (cut - start) * row_bytes >= KEYED_GROUP_MIN_BYTES:
                if cut > start:
                    self._add(batch.slice(start, cut - start), (cut - start) * row_bytes)
                self._flush()
                start = cut
        if start < n:
            rest = batch.slice(start)
            if start:  # the rows left pending as a copy: the whole batch is not held until they are written
                from spark_apps.dlq_replay.arrow_util import row_numbers

                rest = rest.take(row_numbers(n - start))
            self._add(rest, (n - start) * row_bytes)

    def _add(self, batch: pa.RecordBatch, size: float) -> None:
        self._pending.append(batch)
        self._pending_bytes += size
        if self._pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _key_changes(self, keys: pa.Array) -> list[int]:
        """The rows where the row group key changes (a null key is the row before's), this batch's
        first row included when it differs from the last written row's."""
        import pyarrow.compute as pc

        keys = pc.fill_null_forward(keys)
        valid = keys.is_valid()
        if not valid.true_count:
            return []
        first = pc.index(valid, True).as_py()  # rows before it continue the last written key
        cuts = [first] if self._last_key is not None and keys[first].as_py() != self._last_key else []
        tail = keys.slice(first)
        if len(tail) > 1:
            changed = pc.not_equal(tail.slice(1), tail.slice(0, len(tail) - 1))
            cuts += [first + 1 + i for i in pc.indices_nonzero(changed).to_pylist()]
        self._last_key = keys[len(keys) - 1].as_py()
        return cuts

    def _flush(self) -> None:
        import pyarrow as pa

        if self._pending:
            table = pa.Table.from_batches(self._pending, self.schema)
            self._writer.write_table(table, row_group_size=table.num_rows)
            self._pending, self._pending_bytes = [], 0.0

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


#: The folder name Spark gives a null or empty partition value.
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: The characters Spark escapes in a partition folder name (besides the control characters): ``%XX``.
_ESCAPED = frozenset("\"#%'*/:=?\\\x7f{[]^")


def partition_folder(column: str, value: str | None) -> str:
    """``<column>=<value>`` as Spark's partitioned writer names the folder (and its reader decodes it)."""
    if not value:
        return f"{column}={DEFAULT_PARTITION}"
    escaped = "".join(f"%{ord(c):02X}" if c in _ESCAPED or "\x01" <= c <= "\x1f" else c for c in value)
    return f"{column}={escaped}"


@dataclass(frozen=True)
class SideOutput:
    """A second dataset the tasks of :func:`write_in_tasks` write at ``path``: ``rows`` of every output
    batch, with ``schema``'s columns. With ``partition_by`` (a string column of ``rows`` that is not in
    ``schema``), each task writes one file per value of that column, in :func:`partition_folder`.
    ``int96_timestamps`` stores timestamps as Spark's own writer does by default. ``row_groups_by``: a
    key of each of ``rows``' rows (an array; null = the row before's key); a row group then ends where
    the key changes, once it holds :data:`KEYED_GROUP_MIN_BYTES`, so a reader that wants one key's
    rows skips the other row groups by their statistics."""

    path: str
    schema: StructType
    rows: Callable[[pa.RecordBatch], pa.RecordBatch]
    partition_by: str | None = None
    int96_timestamps: bool = False
    row_groups_by: Callable[[pa.RecordBatch], pa.Array] | None = None


class PartitionedTaskFiles:
    """One task's files of a side dataset partitioned by a column: a :class:`TaskFile` per value."""

    def __init__(
        self, folder: str, column: str, partition: int, attempt: int, schema: pa.Schema, int96: bool
    ) -> None:
        self.folder, self.column = folder, column
        self.partition, self.attempt = partition, attempt
        self.schema, self.int96 = schema, int96
        self.files: dict[str | None, TaskFile] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        import pyarrow.compute as pc

        if batch.num_rows == 0:
            return
        values = batch.column(self.column)
        for value in pc.unique(values).to_pylist():
            rows = batch.filter(pc.is_null(values) if value is None else pc.equal(values, value))
            self._file(value).write(rows)

    def _file(self, value: str | None) -> TaskFile:
        out = self.files.get(value)
        if out is None:
            folder = os.path.join(self.folder, partition_folder(self.column, value))
            os.makedirs(folder, exist_ok=True)
            out = TaskFile(folder, self.partition, self.attempt, self.schema, int96_timestamps=self.int96)
            self.files[value] = out
        return out

    def commit(self) -> None:
        for out in self.files.values():
            out.commit()

    def discard(self) -> None:
        for out in self.files.values():
            out.discard()


def _open(
    output: SideOutput, folder: str, schema: pa.Schema, partition: int, attempt: int
) -> TaskFile | PartitionedTaskFiles:
    """Task ``partition``'s file (or files, one per value of ``partition_by``) of ``output``."""
    int96, column, key = output.int96_timestamps, output.partition_by, output.row_groups_by
    if column is None:
        return TaskFile(folder, partition, attempt, schema, int96_timestamps=int96, group_key=key)
    return PartitionedTaskFiles(folder, column, partition, attempt, schema, int96)


def row_tally(batch: pa.RecordBatch) -> tuple[int]:
    """The tally of a task that only counts the rows it writes (``tally_names=("n",)``)."""
    return (batch.num_rows,)


def move_into_place(staged: str, target: str) -> None:
    """Replace the folder ``target`` with ``staged`` (a rename on one file system), as Spark's dynamic
    partition overwrite replaces a partition."""
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.move(staged, target)


def _record_rows(folder: str, partition: int, rows: int) -> None:
    """Replace task ``partition``'s progress file in ``folder`` with ``rows`` (never fails the task)."""
    path = os.path.join(folder, f"{_PROGRESS_PREFIX}{partition:05d}")
    temp = f"{path}.{uuid.uuid4().hex}"
    try:
        with open(temp, "w") as out:
            out.write(str(rows))
        os.replace(temp, path)
    except OSError:
        pass


def rows_written(path: str) -> int | None:
    """The rows the tasks of :func:`write_in_tasks` have written to ``path`` so far (a retried task counts
    from its new start; a finished job's total), or ``None`` when none has recorded any yet."""
    folder = local_path(path)
    if folder is None:
        return None
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    total: int | None = None
    for name in names:
        if name.startswith(_PROGRESS_PREFIX) and "." not in name:
            rows = _read_int(os.path.join(folder, name), "")
            if rows is not None:
                total = rows + (total or 0)
    if total is None and SUCCESS in names:
        total = _read_int(os.path.join(folder, SUCCESS), "rows=")
    return total


def _read_int(path: str, prefix: str) -> int | None:
    try:
        with open(path) as source:
            text = source.read().strip()
    except OSError:
        return None
    if not text.startswith(prefix) or not text[len(prefix) :].isdigit():
        return None
    return int(text[len(prefix) :])


def _empty_folder(path: str) -> str:
    folder = local_path(path)
    if folder is None:
        raise ValueError(f"write_in_tasks needs a local path or file: URI, got {path!r}; use Spark's writer")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    return folder


def _seal(folder: str) -> None:
    rows = rows_written(folder)
    for parent, _, names in os.walk(folder):  # partition folders of a partitioned side dataset too
        for name in names:
            # a failed attempt's file, if its task could not remove it; the tasks' progress records
            if name.startswith((_TEMP_PREFIX, _PROGRESS_PREFIX)):
                os.remove(os.path.join(parent, name))
    with open(os.path.join(folder, SUCCESS), "w") as marker:
        if rows is not None:
            marker.write(f"rows={rows}\n")


class TaskWrites:
    """The task of :func:`write_in_tasks`, picklable, so a process of the run's own can run it too
    (:mod:`~spark_apps.dlq_replay.held_reads`): creating it empties the ``outputs``' folders (the first,
    :func:`main_output`, gets the rows themselves), :meth:`run` is one task, :meth:`seal` ends the job."""

    def __init__(
        self,
        transform: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
        outputs: Sequence[SideOutput],
        tally: Callable[[pa.RecordBatch], Tally],
        tally_names: Sequence[str],
    ) -> None:
        from spark_apps.dlq_replay.schemas import arrow_schema

        self.transform = transform
        self.outputs = list(outputs)  # the main dataset first
        self.folders = [_empty_folder(output.path) for output in self.outputs]
        self.schemas = [arrow_schema(output.schema) for output in self.outputs]
        self.tally = tally
        self.names = list(tally_names)

    def run(self, batches: Iterator[pa.RecordBatch], partition: int, attempt: int) -> pa.RecordBatch:
        """Task ``partition``: write ``transform(batches)``; returns its tallies, one row per batch."""
        import pyarrow as pa

        outs: list[TaskFile | PartitionedTaskFiles] = []
        tallies: list[Tally] = []
        outputs, folders = self.outputs, self.folders
        try:
            for output, folder, file_schema in zip(outputs, folders, self.schemas, strict=True):
                outs.append(_open(output, folder, file_schema, partition, attempt))
            written, recorded = 0, time.monotonic()
            for batch in self.transform(batches):
                tallies.append(self.tally(batch))
                for out, output in zip(outs, outputs, strict=True):
                    out.write(output.rows(batch))
                written += batch.num_rows
                if time.monotonic() - recorded >= PROGRESS_EVERY_S:
                    _record_rows(folders[0], partition, written)
                    recorded = time.monotonic()
            for out in outs:
                out.commit()
            _record_rows(folders[0], partition, written)
        except BaseException:
            for out in outs:
                out.discard()
            raise
        finally:
            # Python workers are reused by later steps: hand the freed Arrow buffers back to the system,
            # or the workers keep them until the run ends (they count toward its peak memory).
            pa.default_memory_pool().release_unused()
        columns = list(zip(*tallies, strict=True)) if tallies else [() for _ in self.names]
        return pa.RecordBatch.from_arrays([pa.array(c, pa.int64()) for c in columns], names=self.names)

    def spark_task(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """:meth:`run` as a ``mapInArrow`` function (the partition and attempt from the task context)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt = (context.partitionId(), context.attemptNumber()) if context else (0, 0)
        yield self.run(batches, partition, attempt)

    def in_spark(self, frame: DataFrame) -> list[Tally]:
        """Run the tasks as a ``mapInArrow`` over ``frame``'s partitions; their tallies."""
        from spark_apps.dlq_replay.arrow_compat import map_in_arrow

        schema = ", ".join(f"{name} long" for name in self.names)
        return [tuple(row) for row in map_in_arrow(frame, self.spark_task, schema).collect()]

    def seal(self) -> None:
        """End the job: leftover temporary and progress files removed, ``_SUCCESS`` written."""
        for folder in self.folders:
            _seal(folder)


def main_output(
    path: str,
    schema: StructType,
    *,
    int96_timestamps: bool = False,
    row_groups_by: Callable[[pa.RecordBatch], pa.Array] | None = None,
) -> SideOutput:
    """The dataset of :func:`write_in_tasks`'s own output rows, as the first of a :class:`TaskWrites`'s
    outputs (``schema``'s columns of every batch; ``row_groups_by`` as in :class:`SideOutput`)."""
    return SideOutput(
        path, schema, _whole_batch, int96_timestamps=int96_timestamps, row_groups_by=row_groups_by
    )


def _whole_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def write_in_tasks(
    frame: DataFrame,
    transform: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    schema: StructType,
    path: str,
    tally: Callable[[pa.RecordBatch], Tally],
    tally_names: Sequence[str],
    sides: Sequence[SideOutput] = (),
    *,
    int96_timestamps: bool = False,
    row_groups_by: Callable[[pa.RecordBatch], pa.Array] | None = None,
) -> list[Tally]:
    """Run ``transform`` over ``frame``'s partitions as ``mapInArrow`` would and write its output rows
    (``schema``'s columns; others are tallied but not written) to the Parquet dataset ``path``, and each
    of ``sides`` to its own, all of which must be :func:`supported`. Returns ``tally`` of every written
    batch; nothing else reaches the JVM. ``int96_timestamps``: the main dataset's timestamps as Spark's own
    writer stores them by default; ``row_groups_by``: its row groups' key (:class:`SideOutput`)."""
    main = main_output(path, schema, int96_timestamps=int96_timestamps, row_groups_by=row_groups_by)
    writes = TaskWrites(transform, [main, *sides], tally, tally_names)
    tallies = writes.in_spark(frame)
    writes.seal()
    return tallies
