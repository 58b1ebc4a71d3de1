"""Every Parquet dataset of a run, written and read by the run's Python tasks (pyarrow), on any store; the
JVM never opens the output root. Files and their names: ``docs/replay-app.md`` (one data plane)."""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark import TaskContext

from spark_apps.dlq_replay import storage
from spark_apps.dlq_replay.arrow_util import (
    SortedKeys,
    local_frame,
    rare_collections,
    row_numbers,
    use_jemalloc_pool,
)
from spark_apps.dlq_replay.schemas import arrow_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: Parquet column paths (a map's values are ``<column>.key_value.value``) written without a dictionary.
PER_MESSAGE_COLUMNS = (
    "value",
    "out_value",
    "payload",
    "payload_sha256",
    "key",
    "message_id",
    "message_id_str",
    "dlq_message_id",
    "origin_message_id",
    "published_message_id",
    "replay_id",
    "error_message",
    "failed_at",
    "publish_time",
    "event_time",
    "sequence_id",
    "properties.key_value.value",
    "out_properties.key_value.value",
)

#: Output a task buffers into one row group (less than Spark's 128 MiB: it counts toward the run's peak).
ROW_GROUP_BYTES = 8 * 1024 * 1024
#: With a row group key (:class:`SideOutput`), a row group ends where the key changes once this big.
KEYED_GROUP_MIN_BYTES = 1024 * 1024
_TEMP_PREFIX = "_tmp-"
SUCCESS = "_SUCCESS"
_PROGRESS_PREFIX = "_progress-"
#: How often a task records the rows it has written so far.
PROGRESS_EVERY_S = 2.0

#: One task's tallies: a tuple of integers (or ``None``) per written batch, named by the caller.
Tally = tuple[int | None, ...]


def part_file(folder: str, partition: int) -> str:
    """The file task ``partition`` of :func:`write_in_tasks` writes in ``folder``."""
    return storage.join(folder, f"part-{partition:05d}.parquet")


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The Parquet leaf paths of ``schema`` that keep dictionary encoding (all but the per-message ones)."""
    paths: list[str] = []
    for field in schema:
        if pa.types.is_map(field.type):
            paths += [f"{field.name}.key_value.key", f"{field.name}.key_value.value"]
        else:
            paths.append(field.name)
    return [path for path in paths if path not in PER_MESSAGE_COLUMNS]


def statistics_columns(schema: pa.Schema) -> list[str]:
    """The columns of ``schema`` whose Parquet statistics are written: the fixed-width ones (a wave's
    ``sequence_id`` bounds); min and max of texts and payloads cost a seventh of a write, read by none."""
    fixed = (pa.types.is_integer, pa.types.is_timestamp, pa.types.is_boolean, pa.types.is_floating)
    return [field.name for field in schema if any(kind(field.type) for kind in fixed)]


class TaskFile:
    """One task's Parquet file in ``folder``: batches buffered into row groups, moved into place by commit."""

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
        self.schema = schema
        self.group_key = group_key
        self._last_key: object = None
        self.final = part_file(folder, partition)
        temp = f"{_TEMP_PREFIX}{partition:05d}-{attempt}-{uuid.uuid4().hex}.parquet"
        self.temp = storage.join(folder, temp)
        fs, inner = storage.writable(self.temp)
        self._writer = pq.ParquetWriter(
            inner,
            schema,
            filesystem=fs,
            compression="snappy",
            use_dictionary=dictionary_columns(schema),
            write_statistics=statistics_columns(schema),
            use_deprecated_int96_timestamps=int96_timestamps,
        )
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0.0

    def write(self, batch: pa.RecordBatch) -> None:
        """Add ``batch``'s columns of :attr:`schema`, cast to its types (Spark's rows can be looser typed)."""
        n = batch.num_rows
        if n == 0:
            return
        cuts = self._key_changes(self.group_key(batch)) if self.group_key is not None else []
        batch = batch.select(self.schema.names).cast(self.schema)
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
                rest = rest.take(row_numbers(n - start))
            self._add(rest, (n - start) * row_bytes)

    def _add(self, batch: pa.RecordBatch, size: float) -> None:
        self._pending.append(batch)
        self._pending_bytes += size
        if self._pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _key_changes(self, keys: pa.Array) -> list[int]:
        """The rows where the row group key changes (a null key continues the row before's)."""
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
        if self._pending:
            table = pa.Table.from_batches(self._pending, self.schema)
            self._writer.write_table(table, row_group_size=table.num_rows)
            self._pending, self._pending_bytes = [], 0.0

    def commit(self) -> None:
        self._flush()
        self._writer.close()
        storage.move(self.temp, self.final)

    def discard(self) -> None:
        try:
            self._writer.close()
        finally:
            storage.delete(self.temp)


#: The characters Spark escapes in a partition folder name (besides the control characters): ``%XX``.
_ESCAPED = frozenset("\"#%'*/:=?\\\x7f{[]^")


def partition_folder(column: str, value: str | None) -> str:
    """``<column>=<value>`` as Spark's partitioned writer names the folder (and its reader decodes it)."""
    escaped = "".join(f"%{ord(c):02X}" if c in _ESCAPED or "\x01" <= c <= "\x1f" else c for c in value or "")
    return f"{column}={escaped or '__HIVE_DEFAULT_PARTITION__'}"  # Spark's name for a null or empty value


@dataclass(frozen=True)
class SideOutput:
    """A dataset :func:`write_in_tasks` writes at ``path`` from ``rows(batch)`` (``None``: the task's own
    rows), one folder per value of ``partition_by``, a row group per key of ``row_groups_by``."""

    path: str
    schema: StructType
    rows: Callable[[pa.RecordBatch], pa.RecordBatch] | None = None
    partition_by: str | None = None
    int96_timestamps: bool = False
    row_groups_by: Callable[[pa.RecordBatch], pa.Array] | None = None

    def open(self, schema: pa.Schema, partition: int, attempt: int, value: str | None = None) -> TaskFile:
        """Task ``partition``'s file (in the folder of ``value`` when partitioned)."""
        folder = self.path
        if self.partition_by is not None:
            folder = storage.join(folder, partition_folder(self.partition_by, value))
        int96, key = self.int96_timestamps, self.row_groups_by
        return TaskFile(folder, partition, attempt, schema, int96_timestamps=int96, group_key=key)


def row_tally(batch: pa.RecordBatch) -> tuple[int]:
    """The tally of a task that only counts the rows it writes (``tally_names=("n",)``)."""
    return (batch.num_rows,)


def _record_rows(folder: str, partition: int, rows: int) -> None:
    with contextlib.suppress(OSError):
        storage.write_bytes(storage.join(folder, f"{_PROGRESS_PREFIX}{partition:05d}"), str(rows).encode())


def rows_written(path: str) -> int | None:
    """The rows the tasks have written to ``path`` so far (a finished job's total), ``None`` before any."""
    try:
        names = storage.list_names(path)
    except OSError:
        return None
    progress = [n for n in names if n.startswith(_PROGRESS_PREFIX) and "." not in n]
    counts = [c for c in (_read_int(storage.join(path, n), "") for n in progress) if c is not None]
    if counts:
        return sum(counts)
    return _read_int(storage.join(path, SUCCESS), "rows=") if SUCCESS in names else None


def _read_int(path: str, prefix: str) -> int | None:
    try:
        text = (storage.read_bytes(path) or b"").decode().strip()
    except OSError:
        return None
    value = text.removeprefix(prefix)
    return int(value) if text.startswith(prefix) and value.isdigit() else None


#: A task's open files by (output, partition value).
_Files = dict[tuple[int, str | None], TaskFile]


@dataclass(frozen=True)
class _TaskWrites:
    """One task of :func:`write_in_tasks`: writes ``transform(batches)`` to ``outputs``; yields tallies."""

    transform: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
    outputs: Sequence[SideOutput]
    schemas: Sequence[pa.Schema]
    tally: Callable[[pa.RecordBatch], Tally]
    names: Sequence[str]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        use_jemalloc_pool()
        context = TaskContext.get()
        partition, attempt = (context.partitionId(), context.attemptNumber()) if context else (0, 0)
        files: _Files = {}
        tallies: list[Tally] = []
        folder = self.outputs[0].path
        with rare_collections():
            try:
                for i, output in enumerate(self.outputs):
                    if output.partition_by is None:  # a task without rows leaves an empty file
                        files[i, None] = output.open(self.schemas[i], partition, attempt)
                written, recorded = 0, time.monotonic()
                for batch in self.transform(batches):
                    tallies.append(self.tally(batch))
                    self._write(batch, files, partition, attempt)
                    written += batch.num_rows
                    if time.monotonic() - recorded >= PROGRESS_EVERY_S:
                        _record_rows(folder, partition, written)
                        recorded = time.monotonic()
                for out in files.values():
                    out.commit()
                _record_rows(folder, partition, written)
            except BaseException:
                for out in files.values():  # each file opened so far
                    out.discard()
                raise
            finally:
                # Python workers are reused by later steps: hand the freed Arrow buffers back to the system.
                pa.default_memory_pool().release_unused()
        columns = list(zip(*tallies, strict=True)) if tallies else [() for _ in self.names]
        yield pa.RecordBatch.from_arrays([pa.array(c, pa.int64()) for c in columns], names=list(self.names))

    def _write(self, batch: pa.RecordBatch, files: _Files, partition: int, attempt: int) -> None:
        for i, output in enumerate(self.outputs):
            rows = batch if output.rows is None else output.rows(batch)
            if output.partition_by is None:
                files[i, None].write(rows)
                continue
            values = rows.column(output.partition_by)
            for value in pc.unique(values).to_pylist():
                if (i, value) not in files:
                    files[i, value] = output.open(self.schemas[i], partition, attempt, value)
                chosen = pc.is_null(values) if value is None else pc.equal(values, value)
                files[i, value].write(rows.filter(chosen))


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
    """Run ``transform`` over ``frame``'s partitions (as ``mapInArrow``), write its rows to ``path`` and
    ``sides`` to theirs (emptied first, ``_SUCCESS`` at the end); returns ``tally`` of every batch."""
    main = SideOutput(path, schema, int96_timestamps=int96_timestamps, row_groups_by=row_groups_by)
    outputs = [main, *sides]
    for output in outputs:
        storage.delete(output.path)
        storage.make_dirs(output.path)
    task = _TaskWrites(transform, outputs, [arrow_schema(o.schema) for o in outputs], tally, tally_names)
    tally_schema = ", ".join(f"{name} long" for name in tally_names)
    tallies = [tuple(row) for row in frame.mapInArrow(task, tally_schema).collect()]
    for folder in (output.path for output in outputs):
        rows = rows_written(folder)
        for file in storage.list_files(folder):  # partition folders of a side dataset too
            if file.rsplit("/", 1)[-1].startswith((_TEMP_PREFIX, _PROGRESS_PREFIX)):
                storage.delete(file)
        storage.write_bytes(storage.join(folder, SUCCESS), b"" if rows is None else f"rows={rows}\n".encode())
    return tallies


def data_files(path: str) -> list[str]:
    """The data files of the dataset at ``path`` (names starting with ``_`` or ``.`` skipped)."""
    root = path.rstrip("/")
    return [
        f
        for f in storage.list_files(root)
        if not any(part.startswith(("_", ".")) for part in f[len(root) + 1 :].split("/"))
    ]


@dataclass(frozen=True)
class _ReadFiles:
    """The task of :func:`read_frame`: each input row names a file; its rows come out in ``schema``."""

    root: str
    schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.dataset as ds

        use_jemalloc_pool()
        fs, root = storage.filesystem(self.root)
        strings = pa.schema([field for field in self.schema if field.type == pa.string()])
        hive = ds.partitioning(strings, flavor="hive")  # column=value, decoded as Spark names them
        for batch in batches:
            files = [storage.filesystem(path)[1] for path in batch.column(0).to_pylist()]
            data = ds.dataset(files, self.schema, "parquet", fs, partitioning=hive, partition_base_dir=root)
            yield from data.to_batches(batch_size=65_536, use_threads=False)


def read_frame(spark: SparkSession, path: str, schema: StructType) -> DataFrame:
    """The dataset at ``path`` with ``schema``, read by Python tasks (``column=value`` folders fill in)."""
    files = data_files(path)
    if not files:
        return spark.createDataFrame([], schema)
    paths = local_frame(spark, [(f,) for f in files], "path string")
    return paths.mapInArrow(_ReadFiles(path.rstrip("/"), arrow_schema(schema)), schema)


def write_frame(frame: DataFrame, path: str, schema: StructType) -> int:
    """Write ``frame``'s rows (``schema``'s columns) to ``path`` from its tasks; returns the rows written."""
    return sum(t[0] or 0 for t in write_in_tasks(frame, iter, schema, path, row_tally, ("n",)))


def part_files(folder: str) -> list[str]:
    """The ``part-*.parquet`` files in ``folder``, in name order."""
    names = [n for n in storage.list_names(folder) if n.startswith("part-") and n.endswith(".parquet")]
    return [storage.join(folder, name) for name in names]


def row_group_units(folder: str) -> list[tuple[str, int]]:
    """``(file, row group)`` of every row group of the ``part-*.parquet`` files in ``folder``, in order."""
    files = part_files(folder)
    return [(f, group) for f in files for group in range(storage.open_parquet(f).metadata.num_row_groups)]


class Marks:
    """The scope marks read once per task, indexed by ``topic`` and message id."""

    def __init__(self, table: pa.Table) -> None:
        self.values = table.select([2, 3]).combine_chunks()
        self.keys = SortedKeys(_keys(table))

    @classmethod
    def read(cls, folder: str) -> Marks:
        return cls(pa.concat_tables([storage.read_table(path) for path in part_files(folder)]))

    def columns(self, batch: pa.RecordBatch) -> list[pa.Array]:
        """The mark and reason of each row of ``batch`` (null where it has none)."""
        at = self.keys.positions(_keys(batch))
        return [self.values.column(i).take(at).combine_chunks() for i in (0, 1)]


def _keys(rows: pa.Table | pa.RecordBatch) -> pa.Array:
    return pc.binary_join_element_wise(rows.column("topic"), rows.column("message_id_str"), "\x1f")


def bucket_batches(
    units: Sequence[tuple[str, int]],
    bucket: int,
    buckets: int,
    columns: Sequence[str],
    marks: Marks | None,
    names: tuple[str, str],
    batch_rows: int,
) -> Iterator[pa.RecordBatch]:
    """Bucket ``bucket``'s share of ``units`` (every ``buckets``-th row group) with the mark columns."""
    by_file: dict[str, list[int]] = {}
    for path, group in units[bucket::buckets]:
        by_file.setdefault(path, []).append(group)
    for path, groups in by_file.items():
        # One decoding thread: each thread's allocator keeps memory of its own (about 25 MiB per worker).
        batches = storage.open_parquet(path).iter_batches(
            batch_size=batch_rows, row_groups=groups, columns=list(columns), use_threads=False
        )
        for batch in batches:  # with the mark and reason columns (all null without ``marks``)
            added = marks.columns(batch) if marks else [pa.nulls(batch.num_rows, pa.string())] * 2
            yield pa.RecordBatch.from_arrays([*batch.columns, *added], names=[*batch.schema.names, *names])
