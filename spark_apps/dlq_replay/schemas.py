"""Column names and Spark/Arrow schemas of each step's output (the stable contract between steps)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import StructType

from spark_apps.dlq_replay.pulsar_io.republish import REPUBLISH_RESULT_SCHEMA
from spark_apps.dlq_replay.pulsar_io.source import SOURCE_SCHEMA, ddl_struct

if TYPE_CHECKING:
    import pyarrow as pa

#: Columns of the snapshot: exactly the ``pulsar`` data source's.
SNAPSHOT_SCHEMA = ddl_struct(SOURCE_SCHEMA)

#: Snapshot columns not carried into the normalised rows: the DLQ position (it becomes ``dlq_topic`` and
#: ``dlq_message_id``) and the entry's ``batch_size``.
_NOT_CARRIED = ("topic", "message_id", "message_id_str", "batch_size")

#: Error-context columns (``CONTEXT_FIELDS`` of the consumer library).
_CONTEXT = ddl_struct(
    "dlq_topic string, dlq_message_id string, origin_topic string, origin_message_id string, "
    "subscription string, delivery_count int, reconsume_times int, reason string, error_class string, "
    "error_message string, error_stack string, failed_at long, consumer string, context_format string"
)
#: ``(name, Spark type)`` of each error-context column.
CONTEXT_COLUMNS = tuple((field.name, field.dataType) for field in _CONTEXT.fields)

#: The normalised rows: the carried columns, the context, then what the normalise step derives
#: (``replay_count``: the REPLAY_COUNT the message carries, null when not a number; ``origin_conflict``:
#: the origin claims when the conventions disagree, else null).
NORMALIZED_SCHEMA = StructType(
    [f for f in SNAPSHOT_SCHEMA.fields if f.name not in _NOT_CARRIED]
    + _CONTEXT.fields
    + ddl_struct(
        "error_template string, signature string, replay_id string, replay_count int, origin_conflict string"
    ).fields
)

#: The decisions: the normalised rows and what decide adds (``replay_producer``: the producer name of a
#: to_republish row, see ProducerSequencer; ``sequence_id``: its sequence id for that producer).
DECIDED_SCHEMA = StructType(
    NORMALIZED_SCHEMA.fields
    + ddl_struct(
        "rule string, action string, outcome string, outcome_reason string, target_topic string, fix string, "
        "fix_error string, archive_payload boolean, out_value binary, out_properties map<string,string>, "
        "replay_producer string, sequence_id long"
    ).fields
)

#: Replay id of a snapshot row, as its read task found it (duplicate marks and decide read it).
REPLAY_ID_MARK = "_rid"

#: The snapshot's files: its rows and their replay ids.
SNAPSHOT_FILE_SCHEMA = StructType(SNAPSHOT_SCHEMA.fields + ddl_struct(f"{REPLAY_ID_MARK} string").fields)

#: What the decide step's scope marks read of every row of the snapshot's files.
IDENTITIES_SCHEMA = ddl_struct(
    f"topic string, message_id_str string, publish_time timestamp, {REPLAY_ID_MARK} string"
)

#: Scope flag column added by the scope step before decide (``in``, ``filtered``, ``already_final``).
SCOPE_COLUMN = "scope"

#: Ledger rows (``run_id`` is the partition column; read with this schema so it stays a string).
#: ``error_template``, ``context_format`` and ``reason`` (the failure reason) are null in rows written
#: before 0.2.0.
LEDGER_SCHEMA = ddl_struct(
    "dlq_topic string, dlq_message_id string, replay_id string, signature string, rule string, "
    "action string, outcome string, final boolean, outcome_reason string, origin_topic string, "
    "target_topic string, published_message_id string, fix string, fix_error string, error_class string, "
    "publish_time timestamp, mode string, recorded_at timestamp, error_template string, "
    "context_format string, reason string, run_id string"
)

#: One send result per message republished (``REPUBLISH_RESULT_SCHEMA`` of the Pulsar I/O layer).
RESULTS_SCHEMA = ddl_struct(REPUBLISH_RESULT_SCHEMA)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark uses for ``schema`` in ``mapInArrow`` (timestamps in UTC microseconds)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")
