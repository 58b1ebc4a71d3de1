"""Record step: each bucket's ledger rows, its send results applied, staged then moved into the ledger
(``docs/replay-app.md``)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay import storage
from spark_apps.dlq_replay.arrow_util import each_id
from spark_apps.dlq_replay.canary import HALTED_REASON, halted_groups
from spark_apps.dlq_replay.commit import EntryFinals
from spark_apps.dlq_replay.report_parts import REP_COLUMNS, BucketParts
from spark_apps.dlq_replay.schemas import LEDGER_SCHEMA, arrow_schema
from spark_apps.dlq_replay.task_parquet import SUCCESS, part_file, partition_folder, row_tally, write_in_tasks

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import SparkSession

    from spark_apps.dlq_replay.run_context import Run

log = logging.getLogger("spark_apps.dlq_replay")

#: The columns of a ledger file (``run_id`` is its folder), in Spark's order.
LEDGER_FILE_SCHEMA = StructType([field for field in LEDGER_SCHEMA.fields if field.name != "run_id"])
_FILE_SCHEMA = arrow_schema(LEDGER_FILE_SCHEMA)
#: The send results' columns the ledger needs.
_RESULT_COLUMNS = ["row", "published", "published_message_id", "error"]
#: Ledger columns computed here, not copied from the decisions.
_DERIVED = frozenset({"final", "published_message_id", "mode", "recorded_at"})
#: The decisions' columns a ledger row copies (the outcome and its reason are rewritten).
DECIDED_COLUMNS = [name for name in LEDGER_FILE_SCHEMA.names if name not in _DERIVED]


def bucket_results(results_dir: str, bucket: int) -> pa.RecordBatch | None:
    """The send results of producer bucket ``bucket`` from every wave, in wave order (``None``: none)."""
    names = [name for name in storage.list_names(results_dir) if name.startswith("wave=")]
    waves = sorted(int(name.removeprefix("wave=")) for name in names)
    paths = [part_file(storage.join(results_dir, f"wave={wave}"), bucket) for wave in waves]
    if not (paths := [path for path in paths if storage.exists(path)]):
        return None
    table = pa.concat_tables([storage.read_table(path, columns=_RESULT_COLUMNS) for path in paths])
    columns = [table.column(name).combine_chunks() for name in _RESULT_COLUMNS]
    return pa.RecordBatch.from_arrays(columns, _RESULT_COLUMNS)


def result_positions(results: pa.RecordBatch, rows: int) -> pa.Array:
    """Each decisions row's position in ``results`` (null: not sent; a row is sent in one wave at most)."""
    at = np.full(rows, -1, np.int64)
    at[results.column("row").to_numpy()] = np.arange(results.num_rows)
    return pa.array(at, pa.int64(), mask=at < 0)


def ledger_batch(
    decided: pa.RecordBatch,
    results: pa.RecordBatch | None,
    positions: pa.Array | None,
    mode: str,
    recorded_at: datetime,
    halted: tuple[str, ...] = (),
) -> pa.RecordBatch:
    """The ledger rows of a batch of decisions, with their send results (at ``positions``) applied."""
    n = decided.num_rows
    to_send = pc.fill_null(pc.equal(decided.column("outcome"), oc.TO_REPUBLISH), False)
    sending = pa.repeat(False, n) if mode == oc.DRY_RUN else to_send
    if results is None or positions is None:
        published = pa.nulls(n, pa.bool_())
        message_id = error = pa.nulls(n, pa.string())
    else:  # the columns after ``row``
        published, message_id, error = (results.column(name).take(positions) for name in _RESULT_COLUMNS[1:])
    ok = pc.and_(sending, pc.fill_null(published, False))
    held = pa.repeat(False, n)
    if halted:  # unsent rows of a halted group
        unsent = pc.and_(sending, pc.is_null(published))
        held = pc.and_(unsent, pc.is_in(decided.column("signature"), pa.array(halted)))
    failed = pc.and_(pc.and_(sending, pc.invert(ok)), pc.invert(held))
    outcomes = (oc.REPUBLISHED, oc.CANARY_FAILED, oc.PUBLISH_FAILED, decided.column("outcome"))
    new_outcome = pc.case_when(pc.make_struct(ok, held, sending), *outcomes)
    failure = pc.binary_join_element_wise("publish failed: ", pc.fill_null(error, "no send result"), "")
    reason = pc.case_when(
        pc.make_struct(failed, held), failure, HALTED_REASON, decided.column("outcome_reason")
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
    columns = [derived[name] if name in derived else decided.column(name) for name in _FILE_SCHEMA.names]
    return pa.RecordBatch.from_arrays(columns, schema=_FILE_SCHEMA)


@dataclass(frozen=True)
class RecordTask:
    """A bucket's ledger rows, report parts (``parts_dir``) and final messages per entry (``commit_dir``)."""

    decisions: str
    results: str
    parts_dir: str
    commit_dir: str
    mode: str
    recorded_at: datetime
    batch_rows: int
    halted: tuple[str, ...] = ()

    def bucket(self, bucket: int) -> Iterator[pa.RecordBatch]:
        path = part_file(self.decisions, bucket)
        if not storage.exists(path):
            return  # no decisions in this bucket
        source = storage.open_parquet(path)
        sent = bucket_results(self.results, bucket)
        at = None if sent is None else result_positions(sent, source.metadata.num_rows)
        recorded = self.mode != oc.DRY_RUN  # a dry run's ledger rows only make the report's parts
        parts, finals = BucketParts(bucket, self.parts_dir), EntryFinals() if recorded else None
        columns = list(dict.fromkeys([*DECIDED_COLUMNS, "sequence_id", *REP_COLUMNS]))
        start = 0
        for rows in source.iter_batches(batch_size=self.batch_rows, columns=columns, use_threads=False):
            mine = None if at is None else at.slice(start, rows.num_rows)
            start += rows.num_rows
            ledger = ledger_batch(rows, sent, mine, self.mode, self.recorded_at, self.halted)
            parts.add(ledger, rows)
            if finals is not None:
                finals.add(ledger)
                yield ledger
        parts.write()
        if finals is not None:
            finals.write(self.commit_dir, bucket)


def record_in_tasks(spark: SparkSession, task: RecordTask, buckets: int, staged_path: str) -> int:
    """Write the ledger rows of every decisions file to ``staged_path``, one task per bucket; the rows."""
    storage.delete(task.parts_dir)  # every bucket writes its parts and counts again
    storage.delete(task.commit_dir)
    storage.make_dirs(task.commit_dir)
    frame = spark.range(buckets, numPartitions=buckets)
    tallies = write_in_tasks(
        frame, each_id(task.bucket), LEDGER_FILE_SCHEMA, staged_path, row_tally, ("n",), int96_timestamps=True
    )
    return sum(t[0] or 0 for t in tallies)


def publish_staged(staged: str, ledger_root: str, run_id: str) -> bool:
    """Move the staged ledger files to this run's partition, replacing an earlier attempt's; False: none."""
    if not storage.list_names(staged):
        return False
    storage.delete(storage.join(staged, SUCCESS))  # the ledger root holds the one marker, as Spark leaves it
    storage.move_tree(staged, storage.join(ledger_root, partition_folder("run_id", run_id)))
    storage.write_bytes(storage.join(ledger_root, SUCCESS), b"")
    log.info("step record: ledger partition moved from %s", staged)
    return True


def run_record(run: Run) -> None:
    """Write the run's ledger rows (a dry run writes the report's parts only)."""
    if run.step("record"):
        started = time.monotonic()
        recorded_at = datetime.now(UTC)
        dry_run = run.options.mode == oc.DRY_RUN
        run.progress.count_files(run.paths.ledger_staged)
        task = RecordTask(
            run.paths.decisions,
            run.paths.republish_results,
            run.paths.report_parts,
            run.paths.commit_parts,
            run.options.mode,
            recorded_at,
            run.batch_rows,
            halted=() if dry_run else tuple(halted_groups(run)),
        )
        buckets = int(run.state.info("decide").get("producers_per_target") or run.buckets)
        record_in_tasks(run.spark, task, buckets, run.paths.ledger_staged)
        if dry_run:
            run.done("record", started)
            return
        publish_staged(run.paths.ledger_staged, run.paths.ledger, run.options.run_id)
        run.done("record", started, recorded_at=recorded_at.isoformat())
