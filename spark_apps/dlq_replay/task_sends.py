"""Sends read straight from the decide tasks' own files: no shuffle, no sort, no copy of the rows to send.

The decide step runs one task per producer bucket, and task ``b`` names every producer it numbers
``...-b`` and gives each its sequence ids in row order (:class:`~spark_apps.dlq_replay.decide.
ProducerSequencer`). When those tasks write their decisions themselves
(:mod:`~spark_apps.dlq_replay.task_parquet`), ``part-<b>.parquet`` holds all of bucket ``b``'s rows in
that order: every producer's rows in one file, sequence ids ascending. So send task ``b`` reads its
file with pyarrow, keeps the rows to republish of the wave's sequence range (row groups outside it are
skipped by their statistics), and sends them in file order, which is each producer's sequence order.
Spark's own path (:func:`~spark_apps.dlq_replay.apply.send_rows`) gets the same order with a
shuffle by producer and a sort, and with several waves a copy of the rows partitioned by wave.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_apps.dlq_replay import outcomes as oc

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

#: Decided column -> republish input column (``REPUBLISH_INPUT_COLUMNS``), in that order.
SEND_COLUMNS = {
    "replay_id": "replay_id",
    "target_topic": "target_topic",
    "replay_producer": "producer_name",
    "sequence_id": "sequence_id",
    "out_value": "value",
    "key": "key",
    "ordering_key": "ordering_key",
    "event_time": "event_time",
    "out_properties": "properties",
}
_READ = [*SEND_COLUMNS, "outcome"]


def wave_rows(path: str, lo: int, hi: int, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The rows to republish of the decisions file ``path`` whose sequence id is in ``[lo, hi)``, in
    file order, with the republish input columns, in batches of about ``batch_rows``."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    groups = _row_groups(source.metadata, lo, hi)
    if not groups:
        return
    pending: list[pa.RecordBatch] = []
    held = 0
    # One decoding thread, as in snapshot_files.bucket_batches (less memory kept per worker).
    batches = source.iter_batches(batch_size=batch_rows, row_groups=groups, columns=_READ, use_threads=False)
    for batch in batches:
        seq = batch.column("sequence_id")
        keep = pc.and_(
            pc.equal(batch.column("outcome"), oc.TO_REPUBLISH),
            pc.and_(pc.greater_equal(seq, lo), pc.less(seq, hi)),
        )
        rows = batch.filter(keep)
        if rows.num_rows:
            pending.append(rows)
            held += rows.num_rows
        if held >= batch_rows:
            yield _renamed(pending)
            pending, held = [], 0
    if pending:
        yield _renamed(pending)


def _row_groups(meta: pq.FileMetaData, lo: int, hi: int) -> list[int]:
    """The row groups whose ``sequence_id`` statistics may hold a value in ``[lo, hi)``."""
    groups: list[int] = []
    leaf = [meta.schema.column(i).path for i in range(meta.num_columns)].index("sequence_id")
    for group in range(meta.num_row_groups):
        columns = meta.row_group(group)
        stats = columns.column(leaf).statistics
        if stats is not None:
            if stats.has_min_max and (stats.max < lo or stats.min >= hi):
                continue  # no sequence id of this wave here
            if not stats.has_min_max and stats.has_null_count and stats.null_count == columns.num_rows:
                continue  # every sequence id null: nothing to republish here
        groups.append(group)
    return groups


def _renamed(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    import pyarrow as pa

    table = pa.Table.from_batches(batches).select(list(SEND_COLUMNS)).combine_chunks()
    merged = table.to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], table.schema)
    return pa.RecordBatch.from_arrays(merged.columns, names=list(SEND_COLUMNS.values()))


def send_wave(
    spark: SparkSession,
    decisions_dir: str,
    buckets: int,
    sequence_range: tuple[int, int],
    conf: PulsarConf,
    results_path: str,
    *,
    batch_rows: int,
    rate_limit_per_s: float | None = None,
) -> int:
    """Send one wave from the decide tasks' files, one Spark task per bucket, and write the results
    (``REPUBLISH_RESULT_SCHEMA``) to ``results_path`` from the tasks; returns the rows sent."""
    from pyspark.sql.types import StructType

    from spark_apps.dlq_replay import task_parquet
    from spark_apps.dlq_replay.pulsar_io.republish import REPUBLISH_RESULT_SCHEMA
    from spark_apps.dlq_replay.storage import local_path

    folder = local_path(decisions_dir)
    if folder is None:
        raise ValueError(f"send_wave reads a local decisions folder, got {decisions_dir!r}")
    lo, hi = sequence_range
    per_task = rate_limit_per_s / max(1, buckets) if rate_limit_per_s else None

    def send(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from spark_apps.dlq_replay.pulsar_io.republish import republish_batches

        for batch in batches:
            for bucket in batch.column(0).to_pylist():
                rows = wave_rows(task_parquet.part_file(folder, bucket), lo, hi, batch_rows)
                yield from republish_batches(rows, conf=conf, rate_limit_per_s=per_task)

    schema = StructType.fromDDL(REPUBLISH_RESULT_SCHEMA)
    assert isinstance(schema, StructType)
    frame = spark.range(buckets, numPartitions=buckets)
    tallies = task_parquet.write_in_tasks(frame, send, schema, results_path, task_parquet.row_tally, ("n",))
    return sum(t[0] or 0 for t in tallies)
