"""The archive, written by the decide tasks to ``runs/<run>/archive_staged/dlq_topic=<topic>/`` and moved
by apply to ``archive/dlq_topic=<topic>/date=<date>/run_id=<run>/`` (:func:`publish_staged`)."""

from __future__ import annotations

import hashlib
import logging
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructField, StructType, TimestampType

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.schemas import CONTEXT_COLUMNS, DECIDED_SCHEMA, arrow_schema, ddl_struct
from spark_apps.dlq_replay.storage import join, list_names, move_tree
from spark_apps.dlq_replay.task_parquet import SideOutput, partition_folder

if TYPE_CHECKING:
    from datetime import datetime

log = logging.getLogger("spark_apps.dlq_replay")

#: Archive file column -> the decided column it is copied from, in the archive's order.
COPIED_COLUMNS = {
    **{name: name for name, _ in CONTEXT_COLUMNS if name != "dlq_topic"},
    **{name: name for name in ("replay_id", "signature", "error_template", "rule", "outcome")},
    "archive_reason": "outcome_reason",
    **{name: name for name in ("fix", "fix_error", "key", "ordering_key", "properties")},
}
_DECIDED = {field.name: field.dataType for field in DECIDED_SCHEMA.fields}

_ADDED = ddl_struct("payload binary, payload_sha256 string, payload_archived boolean, publish_time timestamp")
#: The columns of an archive file (the partition columns are its folders), as Spark's writer stores them.
ARCHIVE_FILE_SCHEMA = StructType(
    [StructField(name, _DECIDED[source]) for name, source in COPIED_COLUMNS.items()]
    + [*_ADDED.fields, StructField("event_time", TimestampType())]
    + [StructField("archived_at", TimestampType(), nullable=False)]
)
#: :data:`ARCHIVE_FILE_SCHEMA` in Arrow, with ``dlq_topic`` (the folder it is written to) last.
_BATCH_SCHEMA = arrow_schema(ARCHIVE_FILE_SCHEMA).append(pa.field("dlq_topic", pa.string()))


def archive_batch(batch: pa.RecordBatch, archived_at: datetime) -> pa.RecordBatch:
    """The archived rows of a batch of decisions (:data:`ARCHIVE_FILE_SCHEMA`'s columns and ``dlq_topic``)."""
    rows = batch.filter(pc.is_in(batch.column("outcome"), pa.array(sorted(oc.ARCHIVE_OUTCOMES))))
    n = rows.num_rows
    value = rows.column("value")
    keep = rows.column("archive_payload")
    digests = [None if v is None else hashlib.sha256(v).hexdigest() for v in value.to_pylist()]
    columns = [rows.column(source) for source in COPIED_COLUMNS.values()] + [
        pc.if_else(pc.fill_null(keep, False), value, pa.nulls(n, value.type)),
        pa.array(digests, pa.string()),
        keep,
        rows.column("publish_time"),
        rows.column("event_time"),
        pa.repeat(pa.scalar(archived_at, pa.timestamp("us", tz="UTC")), n),
        rows.column("dlq_topic"),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_BATCH_SCHEMA)


def staged_output(path: str, archived_at: datetime) -> SideOutput:
    """The decide tasks' side dataset of archived rows at ``path``, one folder per DLQ topic."""
    rows = partial(archive_batch, archived_at=archived_at)
    return SideOutput(path, ARCHIVE_FILE_SCHEMA, rows, partition_by="dlq_topic", int96_timestamps=True)


def publish_staged(staged: str, archive_root: str, date: str, run_id: str) -> int:
    """Move each staged topic folder to its archive partition (again: finishes an interrupted call)."""
    tail = join(partition_folder("date", date), partition_folder("run_id", run_id))
    topics = [name for name in list_names(staged) if name.startswith("dlq_topic=")]  # not _SUCCESS
    for name in topics:
        move_tree(join(staged, name), join(archive_root, name, tail))  # this run's partition
    log.info("step apply: %d archive partition(s) moved from %s to %s", len(topics), staged, archive_root)
    return len(topics)
