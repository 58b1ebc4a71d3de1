"""Sends read straight from the decide tasks' files: decide task ``b`` writes ``part-<b>.parquet`` with its
producers' rows, sequence ids ascending, row groups cut at wave blocks (:func:`wave_blocks`); send task
``b`` reads the wave's row groups of that file and sends them in file order (no shuffle, sort or copy)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay import storage
from spark_apps.dlq_replay.arrow_util import each_id, in_tasks
from spark_apps.dlq_replay.pulsar_io.republish import REPUBLISH_INPUT_COLUMNS, republish_batches
from spark_apps.dlq_replay.schemas import RESULTS_SCHEMA, ddl_struct
from spark_apps.dlq_replay.task_parquet import data_files, part_file, part_files, row_tally, write_in_tasks

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

#: Republish input column -> the decided column it is read from, where their names differ.
_SOURCES = {"producer_name": "replay_producer", "value": "out_value", "properties": "out_properties"}
#: Decided column -> republish input column, in ``REPUBLISH_INPUT_COLUMNS``' order (``row``: the row's
#: place in its decisions file, numbered on reading).
SEND_COLUMNS = {_SOURCES.get(name, name): name for name in REPUBLISH_INPUT_COLUMNS}
_READ = [name for name in SEND_COLUMNS if name != "row"] + ["outcome"]
#: Appended to a producer's name for the canary rows it sends first (``docs/canary.md``).
CANARY_SUFFIX = "-canary"


def wave_blocks(size: int) -> Callable[[pa.RecordBatch], pa.Array]:
    """The decisions' row group key: each row's block of ``size`` sequence ids (null: not sent)."""
    return lambda batch: pc.divide(batch.column("sequence_id"), size)  # integer division: ids are >= 0


@dataclass(frozen=True)
class SendFilter:
    """With ``canary``, only the replay ids at ``ids_path`` (by ``<producer>-canary``); else all rows but
    those and the ``halted`` groups'."""

    ids_path: str
    canary: bool
    halted: tuple[str, ...] = ()

    def chooser(self) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
        """The filter of one task (the canary ids read once)."""
        tables = [storage.read_table(f, columns=["replay_id"]) for f in data_files(self.ids_path)]
        ids = pa.chunked_array([c for t in tables for c in t.column(0).chunks], pa.string()).combine_chunks()
        return partial(self._choose, ids=ids)

    def _choose(self, batch: pa.RecordBatch, ids: pa.Array) -> pa.RecordBatch:
        listed = pc.is_in(batch.column("replay_id"), value_set=ids)
        if self.canary:
            chosen = batch.filter(listed)
            producers = pc.binary_join_element_wise(chosen.column("replay_producer"), CANARY_SUFFIX, "")
            at = chosen.schema.get_field_index("replay_producer")
            return chosen.set_column(at, "replay_producer", producers)
        if self.halted:
            listed = pc.or_(listed, pc.is_in(batch.column("signature"), value_set=pa.array(self.halted)))
        return batch.filter(pc.invert(listed))

    @property
    def columns(self) -> list[str]:
        """The decisions' columns the filter reads beyond the sent ones."""
        return ["signature"] if self.halted else []


def wave_rows(
    path: str,
    lo: int,
    hi: int,
    batch_rows: int,
    chosen: Callable[[pa.RecordBatch], pa.RecordBatch] | None = None,
    extra_columns: Sequence[str] = (),
) -> Iterator[pa.RecordBatch]:
    """The rows of ``path`` to republish with a sequence id in ``[lo, hi)``, in file order and numbered, as
    republish input batches of about ``batch_rows`` (``chosen``: a :class:`SendFilter`'s filter)."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in _numbered_batches(path, lo, hi, batch_rows, [*_READ, *extra_columns]):
        rows = _in_wave(batch, lo, hi)
        if chosen is not None:
            rows = chosen(rows)
        if rows.num_rows:
            pending.append(rows)
            held += rows.num_rows
        if held >= batch_rows:
            yield _renamed(pending)
            pending, held = [], 0
    if pending:
        yield _renamed(pending)


def _numbered_batches(
    path: str, lo: int, hi: int, batch_rows: int, columns: list[str]
) -> Iterator[pa.RecordBatch]:
    """The batches of the row groups of ``path`` that may hold the wave ``[lo, hi)``, numbered (``row``)."""
    source = storage.open_parquet(path)
    meta = source.metadata
    sizes = (meta.row_group(group).num_rows for group in range(meta.num_row_groups))
    starts = list(accumulate(sizes, initial=0))
    for group in _row_groups(meta, lo, hi):
        row = starts[group]
        # One decoding thread, as in task_parquet.bucket_batches (less memory kept per worker).
        for batch in source.iter_batches(
            batch_size=batch_rows, row_groups=[group], columns=columns, use_threads=False
        ):
            yield batch.append_column("row", pa.array(np.arange(row, row + batch.num_rows)))
            row += batch.num_rows


def _row_groups(meta: pq.FileMetaData, lo: int, hi: int) -> list[int]:
    """The row groups whose ``sequence_id`` statistics may hold a value in ``[lo, hi)``."""
    groups: list[int] = []
    leaf = meta.schema.names.index("sequence_id")
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


def _in_wave(batch: pa.RecordBatch, lo: int, hi: int) -> pa.RecordBatch:
    """The rows of ``batch`` to republish with a sequence id in ``[lo, hi)`` (no copy when all are)."""
    seq = batch.column("sequence_id")
    keep = pc.equal(batch.column("outcome"), oc.TO_REPUBLISH)
    bounds = pc.min_max(seq)
    lowest, highest = bounds["min"].as_py(), bounds["max"].as_py()
    if seq.null_count or lowest is None or lowest < lo or highest >= hi:  # not every row in the wave
        keep = pc.and_(keep, pc.and_(pc.greater_equal(seq, lo), pc.less(seq, hi)))
    return batch if keep.true_count == batch.num_rows else batch.filter(keep)


def _renamed(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    merged = pa.Table.from_batches(batches).select(list(SEND_COLUMNS)).combine_chunks().to_batches()[0]
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
    only: SendFilter | None = None,
) -> None:
    """Send one wave, one Spark task per bucket, writing the results to ``results_path``."""
    lo, hi = sequence_range
    per_task = rate_limit_per_s / max(1, buckets) if rate_limit_per_s else None

    def send(bucket: int) -> Iterator[pa.RecordBatch]:  # one bucket per task
        chosen = None if only is None else only.chooser()
        extra = [] if only is None else only.columns
        rows = wave_rows(part_file(decisions_dir, bucket), lo, hi, batch_rows, chosen, extra)
        return republish_batches(rows, conf=conf, rate_limit_per_s=per_task)

    frame = spark.range(buckets, numPartitions=buckets)
    write_in_tasks(frame, each_id(send), RESULTS_SCHEMA, results_path, row_tally, ("n",))


def sending_targets(spark: SparkSession, decisions_dir: str) -> set[str]:
    """The target topics of the rows to republish, read by one Python task per decisions file."""
    files = part_files(decisions_dir)

    def targets(index: int) -> Iterator[pa.RecordBatch]:
        yield pa.record_batch([pa.array(list(file_targets(files[index])), pa.string())], ["target_topic"])

    return set(in_tasks(spark, targets, len(files), ddl_struct("target_topic string")).column(0).to_pylist())


def file_targets(path: str) -> set[str]:
    """The target topics of the rows to republish in the decisions file ``path``."""
    targets: set[str] = set()
    columns = ["outcome", "target_topic"]
    source = storage.open_parquet(path, read_dictionary=columns)
    for batch in source.iter_batches(batch_size=65_536, columns=columns, use_threads=False):
        sending = batch.filter(pc.equal(batch.column("outcome"), oc.TO_REPUBLISH))
        targets.update(t for t in pc.unique(sending.column("target_topic")).to_pylist() if t)
    return targets
