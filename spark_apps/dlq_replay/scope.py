"""Scope of the decide step: which snapshot rows it decides on, and why the others are out of scope."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StructField, StructType

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.arrow_util import in_tasks, key_hashes, local_frame
from spark_apps.dlq_replay.normalize import normalize_columns
from spark_apps.dlq_replay.schemas import IDENTITIES_SCHEMA, REPLAY_ID_MARK, SCOPE_COLUMN, ddl_struct
from spark_apps.dlq_replay.storage import open_parquet
from spark_apps.dlq_replay.task_parquet import part_files

if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import datetime

    from pyspark.sql import DataFrame, SparkSession

#: Scope of a row in the decide step: ``in``, or the outcome it is out of scope with.
SCOPE_IN = "in"
SCOPE_REASON_COLUMN = "scope_reason"
#: Columns added by :func:`scope_marks`: a mark (``already_final``, ``duplicate`` or ``chosen``, null
#: for the rest) and its reason.
MARK, MARK_REASON = "_mark", "_mark_reason"
#: The marked rows the decide step writes for its tasks (:func:`scope_marks`).
_MARKED = ("topic", "message_id_str", MARK, MARK_REASON)
_MARKS_DDL = ", ".join(f"{name} string" for name in _MARKED)
MARKS_SCHEMA = ddl_struct(_MARKS_DDL)
_CHOSEN = "chosen"
_OUT_OF_SCOPE = pa.array([oc.ALREADY_FINAL, oc.DUPLICATE, oc.FILTERED], pa.string())
_RID = REPLAY_ID_MARK
_FIRST_TYPE = "struct<topic:string,message_id_str:string>"
_COPY_FINAL = "another copy of the same original (%s %s) is final in the ledger of run %s"
_COPY_FIRST = "another copy of the same original (%s %s) is in this run and was published first"
#: At most this many replay ids carried by more than one snapshot row reach the driver and are ranked by
#: themselves; more, and the scope marks rank every row.
REPEATED_LIMIT = 10_000
_REPEATED_SCHEMA = ddl_struct(f"{_RID} string, more boolean")


@dataclass(frozen=True)
class Filters:
    """Selective replay: only matching messages are decided on; the others are ``filtered``."""

    signatures: tuple[str, ...] | None = None
    error_class: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    max_messages: int | None = None


def filter_reasons(filters: Filters, columns: dict[str, pa.Array], times: pa.Array) -> pa.Array:
    """The first filter each message fails (null if none), by signature, error class and publish ``times``."""
    failed: list[tuple[Any, str]] = []
    if filters.signatures is not None:
        chosen = pc.is_in(columns["signature"], value_set=pa.array(filters.signatures, pa.string()))
        failed.append((pc.invert(chosen), "not among the groups chosen for this run (--signatures)"))
    if filters.error_class is not None:
        name, classes = filters.error_class, columns["error_class"]
        chosen = pc.or_(pc.equal(classes, name), pc.ends_with(classes, "." + name))
        failed.append((pc.invert(pc.fill_null(chosen, False)), "not selected by --error-class"))
    if filters.since is not None:
        early = pc.less(times, pa.scalar(filters.since, times.type))
        failed.append((pc.fill_null(early, True), "published before --since"))
    if filters.until is not None:
        late = pc.greater_equal(times, pa.scalar(filters.until, times.type))
        failed.append((pc.fill_null(late, True), "published at or after --until"))
    reasons = pa.nulls(len(times), pa.string())
    for fails, reason in reversed(failed):  # the first filter failed names the reason
        reasons = pc.if_else(fails, pa.scalar(reason), reasons)
    return reasons


def _chosen_identities(snapshot: DataFrame, filters: Filters, precedence: tuple[str, ...]) -> DataFrame:
    """One payload-free identity row per snapshot row and whether it passes the filters (``selected``), from
    which ``--max-messages`` chooses."""

    def ids(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            columns = normalize_columns(batch, precedence)  # the filters need the whole context
            rows = batch.select(["topic", "message_id_str", "publish_time"])
            rows = rows.append_column(_RID, columns["replay_id"])
            reasons = filter_reasons(filters, columns, batch.column("publish_time"))
            yield rows.append_column("selected", reasons.is_null())

    light = snapshot.select("topic", "message_id_str", "publish_time", "properties")
    selected = StructField("selected", BooleanType())
    return light.mapInArrow(ids, StructType([*IDENTITIES_SCHEMA.fields, selected]))


def scope_marks(
    snapshot: DataFrame,
    filters: Filters,
    final_ids: DataFrame | None,
    origin_precedence: tuple[str, ...] = (),
    reviewed_ids: DataFrame | None = None,
    identities: DataFrame | None = None,
    repeated: set[str] | None = None,
) -> tuple[DataFrame, int]:
    """``(rows, count)``: ``topic, message_id_str`` and the mark of the snapshot rows the decide step must
    not treat as new (persisted), from payload-free identity rows: ``already_final`` (in ``final_ids``),
    ``duplicate`` (``docs/reliability.md``), ``filtered`` (not in ``reviewed_ids``) or ``chosen`` (among
    the first ``max_messages``), from ``identities`` (the snapshot's files) unless ``max_messages`` is set.
    With ``repeated`` known (:func:`repeated_ids`), only those are ranked."""
    if filters.max_messages is not None or identities is None:
        ids, repeated = _chosen_identities(snapshot, filters, origin_precedence), None
    else:
        ids = identities
    if repeated is not None and not repeated and final_ids is None and reviewed_ids is None:
        return local_frame(snapshot.sparkSession, [], _MARKS_DDL), 0  # no job, no Python worker
    if final_ids is not None:
        self_final = final_ids.groupBy(
            F.col("dlq_topic").alias("topic"), F.col("dlq_message_id").alias("message_id_str")
        ).agg(F.min("run_id").alias("_self_run"))
        other_final = final_ids.groupBy(F.col("replay_id").alias(_RID)).agg(
            F.min(F.struct("run_id", "dlq_topic", "dlq_message_id")).alias("_other")
        )
        ids = ids.join(self_final, ["topic", "message_id_str"], "left").join(other_final, _RID, "left")
    else:
        ids = ids.withColumn("_self_run", F.lit(None).cast("string")).withColumn(
            "_other", F.lit(None).cast("struct<run_id:string,dlq_topic:string,dlq_message_id:string>")
        )
    if reviewed_ids is not None:
        reviewed = reviewed_ids.select(F.col("replay_id").alias(_RID)).distinct()
        ids = ids.join(reviewed.withColumn("_reviewed", F.lit(True)), _RID, "left")
    ids = _ranked(ids, repeated)
    already = F.col("_self_run").isNotNull()
    other = F.col("_other").isNotNull()
    beaten = F.col("_rank") > 1
    unreviewed = F.col("_reviewed").isNull() if reviewed_ids is not None else F.lit(False)
    marks = ids.select(
        "topic",
        "message_id_str",
        "publish_time",
        _RID,
        *(["selected"] if filters.max_messages is not None else []),
        F.when(already, F.lit(oc.ALREADY_FINAL))
        .when(unreviewed, F.lit(oc.FILTERED))
        .when(other | beaten, F.lit(oc.DUPLICATE))
        .alias(MARK),
        F.when(already, F.concat(F.lit("final in the ledger of run "), F.col("_self_run")))
        .when(unreviewed, F.lit("not in the scope of the reviewed run (--window-from)"))
        .when(
            other, F.format_string(_COPY_FINAL, "_other.dlq_topic", "_other.dlq_message_id", "_other.run_id")
        )
        .when(beaten, F.format_string(_COPY_FIRST, "_first.topic", "_first.message_id_str"))
        .alias(MARK_REASON),
    )
    if filters.max_messages is not None:
        chosen = (
            marks.filter(F.col(MARK).isNull() & F.col("selected"))
            .orderBy("publish_time", "topic", _RID)
            .limit(int(filters.max_messages))
            .select("topic", "message_id_str", F.lit(_CHOSEN).alias("_chosen"))
        )
        marks = marks.join(chosen, ["topic", "message_id_str"], "left").withColumn(
            MARK, F.coalesce(F.col(MARK), F.col("_chosen"))
        )
    marked = marks.filter(F.col(MARK).isNotNull()).select(*_MARKED)
    marked = marked.persist(StorageLevel.MEMORY_AND_DISK)  # computed once, counted, joined
    return marked, marked.count()


def repeated_ids(spark: SparkSession, folder: str, tasks: int) -> set[str] | None:
    """The replay ids more than one row of the files at ``folder`` (the snapshot's) carries, ``None`` when
    more than :data:`REPEATED_LIMIT`; ``tasks`` Python tasks each count a share of the ids' hashes (no
    shuffle)."""
    task = _RepeatedIds(folder, max(1, tasks), REPEATED_LIMIT)
    rows = in_tasks(spark, lambda share: [task.repeated(share)], task.tasks, _REPEATED_SCHEMA).to_pylist()
    if any(row["more"] for row in rows):
        return None
    found = {row[_RID] for row in rows}
    return None if len(found) > task.limit else found


@dataclass(frozen=True)
class _RepeatedIds:
    """The work of the tasks of :func:`repeated_ids` (task ``k``: share ``k`` of the hashes)."""

    folder: str
    tasks: int
    limit: int

    def _ids(self, share: int) -> Iterator[tuple[pa.Array, np.ndarray]]:
        """The non-null ids of every file whose hash is this share's, batch by batch, hashed."""
        for path in part_files(self.folder):
            source = open_parquet(path)
            for batch in source.iter_batches(batch_size=65_536, columns=[_RID], use_threads=False):
                ids = batch.column(0).drop_null()
                hashes = key_hashes(ids)
                mine = hashes % np.uint64(self.tasks) == share
                yield ids.filter(mine), hashes[mine]

    def repeated(self, share: int) -> pa.RecordBatch:
        """This share's ids held twice (one ``more`` row instead when their hashes exceed the limit)."""
        hashes, counts = np.unique(
            np.concatenate([np.array([], np.uint64), *(h for _, h in self._ids(share))]), return_counts=True
        )
        twice = hashes[counts > 1]
        if len(twice) > self.limit:
            return pa.RecordBatch.from_pydict({_RID: [None], "more": [True]})
        held: list[str] = []
        if len(twice):
            copies = pa.chunked_array(
                [ids.filter(np.isin(h, twice)) for ids, h in self._ids(share)], pa.string()
            )
            counted = pc.value_counts(copies)
            held = counted.field("values").filter(pc.greater(counted.field("counts"), 1)).to_pylist()
        return pa.RecordBatch.from_pydict({_RID: pa.array(held, pa.string()), "more": [False] * len(held)})


def _ranked(ids: DataFrame, repeated: set[str] | None) -> DataFrame:
    """``ids`` plus ``_rank`` (1 for an original's first copy) and ``_first`` (that copy's ids); with
    ``repeated`` known, only those replay ids are ranked."""
    order = Window.partitionBy(_RID).orderBy("publish_time", "topic", "message_id_str")
    rank, first = F.row_number().over(order), F.first(F.struct("topic", "message_id_str")).over(order)
    if repeated is None:
        return ids.withColumn("_rank", rank).withColumn("_first", first)
    if not repeated:
        return ids.withColumn("_rank", F.lit(1)).withColumn("_first", F.lit(None).cast(_FIRST_TYPE))
    copies = ids.filter(F.col(_RID).isin(sorted(repeated)))
    ranked = copies.select("topic", "message_id_str", rank.alias("_rank"), first.alias("_first"))
    return ids.join(F.broadcast(ranked), ["topic", "message_id_str"], "left").withColumn(
        "_rank", F.coalesce(F.col("_rank"), F.lit(1))
    )


def add_scope_columns(batch: pa.RecordBatch, columns: dict[str, pa.Array], filters: Filters) -> None:
    """Add ``scope`` and ``scope_reason`` to the batch's ``columns`` from its marks and the filters."""
    marks, mark_reasons = batch.column(MARK), batch.column(MARK_REASON)
    marked = pc.fill_null(pc.is_in(marks, value_set=_OUT_OF_SCOPE), False)
    reasons = filter_reasons(filters, columns, batch.column("publish_time"))
    if filters.max_messages is not None:  # passed the filters but not chosen among the first
        beyond = pc.and_(reasons.is_null(), pc.invert(pc.fill_null(pc.equal(marks, _CHOSEN), False)))
        reasons = pc.if_else(beyond, pa.scalar("beyond --max-messages"), reasons)
    in_scope = pc.if_else(reasons.is_null(), pa.scalar(SCOPE_IN), pa.scalar(oc.FILTERED))
    columns[SCOPE_COLUMN] = pc.if_else(marked, marks, in_scope)
    columns[SCOPE_REASON_COLUMN] = pc.if_else(marked, mark_reasons, reasons)
