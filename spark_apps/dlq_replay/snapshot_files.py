"""The decide tasks read the snapshot's files themselves (pyarrow): task ``b`` of ``n`` reads row groups
``b, b + n, ...`` and adds each row's scope mark (:class:`Marks`); no JVM scan, join or shuffle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_apps.dlq_replay import storage

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    import pyarrow as pa


def part_files(folder: str) -> list[str]:
    """The ``part-*.parquet`` files in ``folder``, in name order."""
    names = [n for n in storage.list_names(folder) if n.startswith("part-") and n.endswith(".parquet")]
    return [storage.join(folder, name) for name in names]


def row_group_units(folder: str) -> list[tuple[str, int]]:
    """``(file, row group)`` of every row group of the ``part-*.parquet`` files in ``folder``, in order."""
    units: list[tuple[str, int]] = []
    for path in part_files(folder):
        units += [(path, group) for group in range(storage.open_parquet(path).metadata.num_row_groups)]
    return units


class Marks:
    """The scope marks read once per task, indexed by ``topic`` and message id."""

    def __init__(self, table: pa.Table) -> None:
        from spark_apps.dlq_replay.arrow_util import SortedKeys

        self.values = table.select([2, 3]).combine_chunks()
        self.keys = SortedKeys(_keys(table))

    @classmethod
    def read(cls, folder: str) -> Marks:
        import pyarrow as pa

        tables = [storage.read_table(path) for path in part_files(folder)]
        return cls(pa.concat_tables(tables) if tables else _no_marks())

    def columns(self, batch: pa.RecordBatch) -> list[pa.Array]:
        """The mark and reason of each row of ``batch`` (null where it has none)."""
        at = self.keys.positions(_keys(batch))
        return [self.values.column(i).take(at).combine_chunks() for i in (0, 1)]


def _keys(rows: pa.Table | pa.RecordBatch) -> pa.Array:
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(rows.column("topic"), rows.column("message_id_str"), "\x1f")


def _no_marks() -> pa.Table:
    import pyarrow as pa

    return pa.table({name: pa.array([], pa.string()) for name in ("topic", "message_id_str", "m", "r")})


def bucket_batches(
    units: Sequence[tuple[str, int]],
    bucket: int,
    buckets: int,
    columns: Sequence[str],
    marks: Marks | None,
    mark_names: tuple[str, str],
    batch_rows: int,
) -> Iterator[pa.RecordBatch]:
    """Bucket ``bucket``'s share of ``units`` (every ``buckets``-th row group) with the mark columns."""
    by_file: dict[str, list[int]] = {}
    for path, group in units[bucket::buckets]:
        by_file.setdefault(path, []).append(group)
    for path, groups in by_file.items():
        source = storage.open_parquet(path)
        # One decoding thread: the task shares the cores with the others, and each thread's allocator
        # keeps memory of its own (about 25 MiB more per worker with threads).
        batches = source.iter_batches(
            batch_size=batch_rows, row_groups=groups, columns=list(columns), use_threads=False
        )
        for batch in batches:
            yield with_marks(batch, marks, mark_names)


def with_marks(batch: pa.RecordBatch, marks: Marks | None, names: tuple[str, str]) -> pa.RecordBatch:
    """``batch`` plus its rows' mark and reason columns (``names``; all null without ``marks``)."""
    import pyarrow as pa

    columns = marks.columns(batch) if marks else [pa.nulls(batch.num_rows, pa.string())] * 2
    return pa.RecordBatch.from_arrays([*batch.columns, *columns], names=[*batch.schema.names, *names])
