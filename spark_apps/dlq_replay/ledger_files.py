"""The run's ledger rows written by one Python task per producer bucket, moved into the ledger by record.

Spark's way (:func:`~spark_apps.dlq_replay.apply.with_publish_results`, then
:func:`~spark_apps.dlq_replay.ledger.write_ledger`) reads every decision and every send result, joins them
on the replay id with a sort-merge join (both sides shuffled and sorted) and writes the rows through
Spark's writer. Where the decide tasks wrote one decisions file per producer bucket and the send tasks one
results file per bucket and wave (:mod:`~spark_apps.dlq_replay.task_sends`), the results of bucket ``b``
are those of the rows of ``part-<b>``, in that file's order wave by wave. So record task ``b`` reads its
bucket's results (four small columns), finds each row's result by counting (:class:`ResultPositions`,
checked against the replay ids) and writes the ledger rows of its decisions file: no shuffle, no sort,
no hash table. The rows go to ``runs/<run>/ledger_staged/`` and are moved to
``ledger/run_id=<run>/`` (:func:`publish_staged`), replacing an earlier attempt's partition as Spark's
dynamic overwrite does. The files hold what Spark's writer would write: the same columns in the same order,
INT96 timestamps, the partition folder named as Spark names it.
"""

from __future__ import annotations

import functools
import logging
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


def _sending(decided: pa.RecordBatch | pa.Table) -> pa.Array:
    """True for the rows to republish (the ones with a send result)."""
    import pyarrow.compute as pc

    return pc.fill_null(pc.equal(decided.column("outcome"), oc.TO_REPUBLISH), False)


@functools.cache
def _file_schema() -> pa.Schema:
    return arrow_schema(LEDGER_FILE_SCHEMA)


def decided_columns() -> list[str]:
    """The decisions' columns a ledger row copies (the outcome and its reason are rewritten)."""
    return [name for name in LEDGER_FILE_SCHEMA.names if name not in _DERIVED]


def bucket_results(results_dir: str, bucket: int) -> tuple[pa.RecordBatch, dict[int, tuple[int, int]]] | None:
    """The send results of producer bucket ``bucket``, its file of every wave folder of ``results_dir``
    one after another in wave order, and each wave's ``(start, end)`` rows in them (``None`` when no wave
    sent anything from it)."""
    import pyarrow as pa

    from spark_apps.dlq_replay import storage
    from spark_apps.dlq_replay.task_parquet import part_file

    waves = []
    for name in storage.list_names(results_dir):
        path = part_file(storage.join(results_dir, name), bucket)
        if name.startswith("wave=") and storage.exists(path):
            waves.append((int(name[len("wave=") :]), path))
    waves.sort()
    if not waves:
        return None
    tables = [storage.read_table(path, columns=_RESULT_COLUMNS) for _, path in waves]
    ranges: dict[int, tuple[int, int]] = {}
    start = 0
    for (wave, _), table in zip(waves, tables, strict=True):
        ranges[wave] = (start, start + table.num_rows)
        start += table.num_rows
    table = pa.concat_tables(tables)
    columns = [table.column(name).combine_chunks() for name in _RESULT_COLUMNS]
    return pa.RecordBatch.from_arrays(columns, _RESULT_COLUMNS), ranges


class ResultPositions:
    """Each decision's position in its bucket's send results, found by counting, not hashing.

    Wave ``w``'s results of bucket ``b`` are the rows of decide's file ``b`` to republish whose sequence
    id is in ``[w * wave_size, (w + 1) * wave_size)``, one each, in file order
    (:func:`~spark_apps.dlq_replay.task_sends.wave_rows`). So, reading that file in order, the k-th such
    row of wave ``w`` has the k-th result of that wave. Every position is checked against the replay ids;
    from the first batch that does not match (a wave without results, or results in another order), the
    rest of the bucket is looked up by hash (:func:`result_positions`). Nothing but the results is held.
    """

    def __init__(self, results: pa.RecordBatch, waves: dict[int, tuple[int, int]], wave_size: int) -> None:
        self.results, self.waves, self.wave_size = results, waves, wave_size
        self.seen = dict.fromkeys(waves, 0)
        self.hashed = False

    def of(self, decided: pa.RecordBatch) -> pa.Array:
        """The positions of a batch of decisions (the next rows of the file); null: no result."""
        if not self.hashed:
            positions = self._counted(decided)
            if positions is not None:
                return positions
            self.hashed = True
        positions = result_positions(decided, self.results)
        assert positions is not None  # self.results holds rows
        return positions

    def _counted(self, decided: pa.RecordBatch) -> pa.Array | None:
        import pyarrow as pa
        import pyarrow.compute as pc

        sending = _sending(decided)
        wave = pc.divide(decided.column("sequence_id"), self.wave_size)  # integer division
        positions = pa.nulls(decided.num_rows, pa.int64())
        for w in pc.unique(pc.filter(wave, sending)).to_pylist():
            if w not in self.waves:
                return None
            mine = pc.fill_null(pc.and_(sending, pc.equal(wave, w)), False)
            rank = pc.cumulative_sum(mine.cast(pa.int64()))  # 1 for the wave's first row here; last: count
            count = int(rank[-1].as_py())
            start, end = self.waves[w]
            first = start + self.seen[w]
            if first + count > end:
                return None
            positions = pc.if_else(mine, pc.add(rank, first - 1), positions)
            self.seen[w] += count
        same = pc.equal(self.results.column("replay_id").take(positions), decided.column("replay_id"))
        if not pc.all(pc.fill_null(pc.or_kleene(pc.invert(sending), same), False)).as_py():
            return None
        return positions


def result_positions(decided: pa.Table | pa.RecordBatch, results: pa.RecordBatch | None) -> pa.Array | None:
    """For each row of ``decided`` (``replay_id`` and ``outcome``), the position of its send result in
    ``results`` by a hash lookup of its replay id: null for a row not to republish or without a result;
    ``None`` when there are no results."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if results is None or results.num_rows == 0:
        return None
    ids = pc.if_else(_sending(decided), decided.column("replay_id"), pa.nulls(decided.num_rows, pa.string()))
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
    sending = _sending(decided)
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
    wave_size: int,
    parts_dir: str | None = None,
    commit_dir: str | None = None,
) -> int:
    """Write the ledger rows of every decisions file of ``decisions_dir`` (one per producer bucket) to
    ``staged_path``, one Spark task per bucket, with the send results of ``results_dir`` (waves of
    ``wave_size`` sequence ids per producer) applied; returns the rows written. With ``parts_dir``, each
    task also writes its bucket's report parts there (:mod:`~spark_apps.dlq_replay.report_parts`), and
    with ``commit_dir`` its final messages per entry (:mod:`~spark_apps.dlq_replay.commit_parts`)."""
    from spark_apps.dlq_replay import commit_parts, storage, task_parquet
    from spark_apps.dlq_replay.report_parts import REP_COLUMNS, BucketParts, clear_parts

    decisions, results = decisions_dir, results_dir
    parts_folder = parts_dir
    if parts_folder is not None:
        clear_parts(parts_folder)
    commit_folder = commit_dir
    if commit_folder is not None:
        commit_parts.clear(commit_folder)
    columns = list(dict.fromkeys([*decided_columns(), "sequence_id", *(REP_COLUMNS if parts_folder else ())]))

    def record(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for bucket in batch.column(0).to_pylist():
                path = task_parquet.part_file(decisions, bucket)
                if not storage.exists(path):
                    continue  # no decisions in this bucket
                found = bucket_results(results, bucket)
                sent = None if found is None else found[0]
                positions = None if found is None else ResultPositions(found[0], found[1], wave_size)
                source = storage.open_parquet(path)
                parts = None if parts_folder is None else BucketParts(bucket, parts_folder)
                finals = None if commit_folder is None else commit_parts.EntryFinals()
                for rows in source.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
                    mine = None if positions is None else positions.of(rows)
                    ledger = ledger_batch(rows, sent, mine, mode, recorded_at)
                    if parts is not None:
                        parts.add(ledger, rows)
                    if finals is not None:
                        finals.add(ledger)
                    yield ledger
                if parts is not None:
                    parts.write()
                if finals is not None and commit_folder is not None:
                    finals.write(commit_folder, bucket)

    frame = spark.range(buckets, numPartitions=buckets)
    tallies = task_parquet.write_in_tasks(
        frame, record, LEDGER_FILE_SCHEMA, staged_path, task_parquet.row_tally, ("n",), int96_timestamps=True
    )
    return sum(t[0] or 0 for t in tallies)


def publish_staged(staged: str, ledger_root: str, run_id: str) -> bool:
    """Move the staged ledger files to this run's partition of ``ledger_root``, replacing an earlier
    attempt's as Spark's dynamic overwrite does; ``False`` when nothing is staged."""
    from spark_apps.dlq_replay import storage
    from spark_apps.dlq_replay.task_parquet import SUCCESS, move_into_place, partition_folder

    if not storage.list_names(staged):
        return False
    storage.delete(storage.join(staged, SUCCESS))  # the ledger root holds the one marker, as Spark leaves it
    move_into_place(staged, storage.join(ledger_root, partition_folder("run_id", run_id)))
    storage.write_bytes(storage.join(ledger_root, SUCCESS), b"")
    log.info("step record: ledger partition moved from %s", staged)
    return True
