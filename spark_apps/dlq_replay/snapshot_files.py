"""The decide tasks read the snapshot's files themselves (pyarrow), when the read tasks wrote them.

Through Spark, the decide pass's input is a Parquet scan in the JVM, a join with the scope marks and
every row turned into Arrow for the Python workers: JVM work on every message before any decision. When
the snapshot was written by its read tasks (:mod:`~spark_apps.dlq_replay.task_parquet`) and the marks
are few enough to hand to every task (:data:`DRIVER_MARKS`), decide task ``b`` instead reads row groups
``b, b + n, b + 2n ...`` of the snapshot's files with pyarrow and looks each row's mark up in a dict.
Every snapshot row is in exactly one row group, so each task gets a share of about the same size, and
its rows come in file order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    import pyarrow as pa

#: At most this many marked rows (already final, duplicate, filtered, chosen) go to the decide tasks
#: as a dict; more, and the decide pass joins them in Spark.
DRIVER_MARKS = 50_000
#: At most this many replay ids carried by more than one snapshot row are ranked in Spark by themselves;
#: more, and the scope marks rank every row (see :func:`repeated_values`).
DRIVER_REPEATED = 10_000


def part_files(folder: str) -> list[str]:
    """The ``part-*.parquet`` files in ``folder``, in name order."""
    from spark_apps.dlq_replay import storage

    names = [n for n in storage.list_names(folder) if n.startswith("part-") and n.endswith(".parquet")]
    return [storage.join(folder, name) for name in names]


def row_group_units(folder: str) -> list[tuple[str, int]]:
    """``(file, row group)`` of every row group of the ``part-*.parquet`` files in ``folder``, in order."""
    from spark_apps.dlq_replay.storage import open_parquet

    units: list[tuple[str, int]] = []
    for path in part_files(folder):
        units += [(path, group) for group in range(open_parquet(path).metadata.num_row_groups)]
    return units


def repeated_values(folder: str, column: str, limit: int = DRIVER_REPEATED) -> set[str] | None:
    """The values of string ``column`` (replay ids: hex digests) that more than one row of the
    ``part-*.parquet`` files in ``folder`` holds, or ``None`` when there are more than ``limit`` of them.

    Found in the driver with little memory (about 50 bytes a row): the values' first 16 bytes are sorted
    and compared with their neighbours, and only the values whose prefix repeats are read again whole.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    chunks = [_prefixes(batch.column(0)) for batch in _column_batches(folder, column)]
    prefixes = pa.concat_arrays(chunks) if chunks else pa.array([], pa.binary())
    del chunks
    ordered = prefixes.take(pc.sort_indices(prefixes))
    del prefixes
    same = pc.equal(ordered.slice(0, max(0, len(ordered) - 1)), ordered.slice(1))
    if not same.true_count:
        return set()
    shared = pc.unique(ordered.slice(1).filter(same))
    if len(shared) > limit:
        return None
    counts: dict[str, int] = {}
    for batch in _column_batches(folder, column):
        values = batch.column(0)
        for value in values.filter(pc.is_in(_prefixes(values), value_set=shared)).to_pylist():
            counts[value] = counts.get(value, 0) + 1
    repeated = {value for value, count in counts.items() if value is not None and count > 1}
    return repeated if len(repeated) <= limit else None


def _column_batches(folder: str, column: str) -> Iterator[pa.RecordBatch]:
    from spark_apps.dlq_replay.storage import open_parquet

    for path in part_files(folder):
        source = open_parquet(path)
        yield from source.iter_batches(batch_size=65_536, columns=[column], use_threads=False)


def _prefixes(values: pa.Array) -> pa.Array:
    """The first 16 bytes of each string (as binary; a shorter string whole)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.binary_slice(values.cast(pa.binary()), 0, 16)


def bucket_batches(
    units: Sequence[tuple[str, int]],
    bucket: int,
    buckets: int,
    columns: Sequence[str],
    marks: Mapping[tuple[str, str], tuple[str, str | None]],
    mark_names: tuple[str, str],
    batch_rows: int,
) -> Iterator[pa.RecordBatch]:
    """Bucket ``bucket``'s share of ``units`` (every ``buckets``-th row group), as batches of at most
    ``batch_rows`` rows of ``columns`` plus the two mark columns ``mark_names`` (null where unmarked)."""
    from spark_apps.dlq_replay.storage import open_parquet

    by_file: dict[str, list[int]] = {}
    for path, group in units[bucket::buckets]:
        by_file.setdefault(path, []).append(group)
    for path, groups in by_file.items():
        source = open_parquet(path)
        # One decoding thread: the task shares the cores with the others, and each thread's allocator
        # keeps memory of its own (about 25 MiB more per worker with threads).
        batches = source.iter_batches(
            batch_size=batch_rows, row_groups=groups, columns=list(columns), use_threads=False
        )
        for batch in batches:
            yield with_marks(batch, marks, mark_names)


def with_marks(
    batch: pa.RecordBatch, marks: Mapping[tuple[str, str], tuple[str, str | None]], names: tuple[str, str]
) -> pa.RecordBatch:
    """``batch`` plus its rows' mark and reason columns (``names``), looked up by topic and message id."""
    import pyarrow as pa

    n = batch.num_rows
    if not marks:
        mark, reason = pa.nulls(n, pa.string()), pa.nulls(n, pa.string())
    else:
        keys = zip(batch.column("topic").to_pylist(), batch.column("message_id_str").to_pylist(), strict=True)
        found = [marks.get(key) for key in keys]
        mark = pa.array([f[0] if f else None for f in found], pa.string())
        reason = pa.array([f[1] if f else None for f in found], pa.string())
    return pa.RecordBatch.from_arrays([*batch.columns, mark, reason], names=[*batch.schema.names, *names])
