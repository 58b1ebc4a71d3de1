"""The run's ledger rows written by one Python task per producer bucket, moved into the ledger by record.

Spark's way (:func:`~spark_apps.dlq_replay.apply.with_publish_results`, then
:func:`~spark_apps.dlq_replay.ledger.write_ledger`) reads every decision and every send result, joins them
on the replay id with a sort-merge join (both sides shuffled and sorted) and writes the rows through
Spark's writer. Where the decide tasks wrote one decisions file per producer bucket and the send tasks one
results file per bucket and wave (:mod:`~spark_apps.dlq_replay.task_sends`), the results of bucket ``b``
are those of the rows of ``part-<b>`` and nothing else. So record task ``b`` reads its bucket's results
(four small columns), looks each row to republish up in them by replay id, and writes the ledger rows of
its decisions file: no shuffle, no sort. The rows go to ``runs/<run>/ledger_staged/`` and are moved to
``ledger/run_id=<run>/`` (:func:`publish_staged`), replacing an earlier attempt's partition as Spark's
dynamic overwrite does. The files hold what Spark's writer would write: the same columns in the same order,
INT96 timestamps, the partition folder named as Spark names it.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import logging
import os
import shutil
from typing import TYPE_CHECKING

from pyspark.sql.types import StructType

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.schemas import LEDGER_SCHEMA, arrow_schema

if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import datetime

    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger("spark_apps.dlq_replay")

#: The columns of a ledger file (``run_id`` is its folder), in Spark's order.
LEDGER_FILE_SCHEMA = StructType([field for field in LEDGER_SCHEMA.fields if field.name != "run_id"])
#: The send results' columns the ledger needs.
_RESULT_COLUMNS = ["replay_id", "published", "published_message_id", "error"]
#: Ledger columns computed here, not copied from the decisions.
_DERIVED = frozenset({"final", "published_message_id", "mode", "recorded_at"})


@functools.cache
def _file_schema() -> pa.Schema:
    return arrow_schema(LEDGER_FILE_SCHEMA)


def decided_columns() -> list[str]:
    """The decisions' columns a ledger row copies (the outcome and its reason are rewritten)."""
    return [name for name in LEDGER_FILE_SCHEMA.names if name not in _DERIVED]


def bucket_results(results_dir: str, bucket: int) -> pa.RecordBatch | None:
    """The send results of producer bucket ``bucket``: its file in every wave folder of ``results_dir``
    (``None`` when no wave sent anything from it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_apps.dlq_replay.task_parquet import part_file

    files = sorted(glob.glob(part_file(os.path.join(glob.escape(results_dir), "wave=*"), bucket)))
    if not files:
        return None
    table = pa.concat_tables([pq.read_table(f, columns=_RESULT_COLUMNS, use_threads=False) for f in files])
    return pa.RecordBatch.from_arrays(
        [table.column(c).combine_chunks() for c in _RESULT_COLUMNS], _RESULT_COLUMNS
    )


def result_positions(decided: pa.Table | pa.RecordBatch, results: pa.RecordBatch | None) -> pa.Array | None:
    """For each row of ``decided`` (``replay_id`` and ``outcome``), the position of its send result in
    ``results``: null for a row not to republish or without a result; ``None`` when there are no
    results. One hash lookup for a whole bucket (one per batch would hash the results again each time)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if results is None or results.num_rows == 0:
        return None
    n = decided.num_rows
    sending = pc.fill_null(pc.equal(decided.column("outcome"), oc.TO_REPUBLISH), False)
    ids = pc.if_else(sending, decided.column("replay_id"), pa.nulls(n, pa.string()))
    found = pc.index_in(ids, value_set=results.column("replay_id"), skip_nulls=True)
    return found.combine_chunks() if isinstance(found, pa.ChunkedArray) else found


def ledger_batch(
    decided: pa.RecordBatch,
    results: pa.RecordBatch | None,
    positions: pa.Array | None,
    mode: str,
    recorded_at: datetime,
) -> pa.RecordBatch:
    """The ledger rows (:data:`LEDGER_FILE_SCHEMA`) of a batch of decisions, with the send results of
    their bucket applied as :func:`~spark_apps.dlq_replay.apply.with_publish_results` applies them: a row
    to republish becomes ``republished`` when its result says published, else ``publish_failed`` with
    the reason; only such a row gets a ``published_message_id``. ``positions``: the batch's slice of
    :func:`result_positions`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = decided.num_rows
    outcome = decided.column("outcome")
    sending = pc.fill_null(pc.equal(outcome, oc.TO_REPUBLISH), False)
    if results is None or positions is None:
        published = pa.nulls(n, pa.bool_())
        message_id = error = pa.nulls(n, pa.string())
    else:
        published = results.column("published").take(positions)
        message_id = results.column("published_message_id").take(positions)
        error = results.column("error").take(positions)
    ok = pc.and_(sending, pc.fill_null(published, False))
    failed = pc.and_(sending, pc.invert(ok))
    new_outcome = pc.if_else(
        ok, pa.scalar(oc.REPUBLISHED), pc.if_else(sending, pa.scalar(oc.PUBLISH_FAILED), outcome)
    )
    reason = pc.if_else(
        failed,
        pc.binary_join_element_wise("publish failed: ", pc.fill_null(error, "no send result"), ""),
        decided.column("outcome_reason"),
    )
    is_final = pc.is_in(new_outcome, pa.array(sorted(oc.FINAL_OUTCOMES)))
    final = pc.if_else(pc.is_valid(new_outcome), is_final, None)  # null as Spark's isin gives it
    derived = {
        "outcome": new_outcome,
        "outcome_reason": reason,
        "final": final,
        "published_message_id": pc.if_else(sending, message_id, pa.nulls(n, pa.string())),
        "mode": pa.repeat(pa.scalar(mode), n),
        "recorded_at": pa.repeat(pa.scalar(recorded_at, pa.timestamp("us", tz="UTC")), n),
    }
    schema = _file_schema()
    columns = [derived[name] if name in derived else decided.column(name) for name in schema.names]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def record_in_tasks(
    spark: SparkSession,
    decisions_dir: str,
    results_dir: str,
    buckets: int,
    staged_path: str,
    *,
    mode: str,
    recorded_at: datetime,
    batch_rows: int,
) -> int:
    """Write the ledger rows of every decisions file of ``decisions_dir`` (one per producer bucket) to
    ``staged_path``, one Spark task per bucket; returns the rows written."""
    from spark_apps.dlq_replay import task_parquet
    from spark_apps.dlq_replay.storage import local_path

    decisions, results = local_path(decisions_dir), local_path(results_dir)
    if decisions is None or results is None:
        raise ValueError(f"record_in_tasks reads local folders, got {decisions_dir!r} and {results_dir!r}")
    columns = decided_columns()

    def record(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        for batch in batches:
            for bucket in batch.column(0).to_pylist():
                path = task_parquet.part_file(decisions, bucket)
                if not os.path.exists(path):
                    continue  # no decisions in this bucket
                sent = bucket_results(results, bucket)
                source = pq.ParquetFile(path)
                keys = source.read(columns=["replay_id", "outcome"], use_threads=False)
                positions, offset = result_positions(keys, sent), 0
                for rows in source.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
                    mine = None if positions is None else positions.slice(offset, rows.num_rows)
                    yield ledger_batch(rows, sent, mine, mode, recorded_at)
                    offset += rows.num_rows

    frame = spark.range(buckets, numPartitions=buckets)
    tallies = task_parquet.write_in_tasks(
        frame, record, LEDGER_FILE_SCHEMA, staged_path, _count, ("n",), int96_timestamps=True
    )
    return sum(t[0] or 0 for t in tallies)


def _count(batch: pa.RecordBatch) -> tuple[int]:
    return (batch.num_rows,)


def publish_staged(staged: str, ledger_root: str, run_id: str) -> bool:
    """Move the staged ledger files to this run's partition of ``ledger_root``, replacing an earlier
    attempt's as Spark's dynamic overwrite does; ``False`` when nothing is staged."""
    from spark_apps.dlq_replay.task_parquet import SUCCESS, partition_folder

    if not os.path.isdir(staged):
        return False
    target = os.path.join(ledger_root, partition_folder("run_id", run_id))
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(ledger_root, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):  # the ledger root holds the one marker, as Spark leaves it
        os.remove(os.path.join(staged, SUCCESS))
    shutil.move(staged, target)  # a rename on one file system
    with open(os.path.join(ledger_root, SUCCESS), "w"):
        pass
    log.info("step record: ledger partition moved from %s", staged)
    return True
