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
