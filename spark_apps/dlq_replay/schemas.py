"""Column names and Spark/Arrow schemas of each step's output (the stable contract between steps)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

if TYPE_CHECKING:
    import pyarrow as pa

_PROPS = MapType(StringType(), StringType())

#: Columns of the snapshot (exactly the ``pulsar`` data source schema).
SNAPSHOT_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("message_id", BinaryType()),
        StructField("message_id_str", StringType()),
        StructField("key", StringType()),
        StructField("ordering_key", StringType()),
        StructField("value", BinaryType()),
        StructField("properties", _PROPS),
        StructField("publish_time", TimestampType()),
        StructField("event_time", TimestampType()),
        StructField("redelivery_count", IntegerType()),
        StructField("producer_name", StringType()),
        StructField("batch_size", IntegerType()),  # messages in the message's entry (1 when not batched)
    ]
)

#: Message columns carried from the snapshot into the normalised rows.
CARRIED_COLUMNS: tuple[str, ...] = (
    "partition",
    "key",
    "ordering_key",
    "value",
    "properties",
    "publish_time",
    "event_time",
    "redelivery_count",
    "producer_name",
)

#: Error-context columns (``CONTEXT_FIELDS`` of the consumer library) with their Spark types.
CONTEXT_COLUMNS: tuple[tuple[str, object], ...] = (
    ("dlq_topic", StringType()),
    ("dlq_message_id", StringType()),
    ("origin_topic", StringType()),
    ("origin_message_id", StringType()),
    ("subscription", StringType()),
    ("delivery_count", IntegerType()),
    ("reconsume_times", IntegerType()),
    ("reason", StringType()),
    ("error_class", StringType()),
    ("error_message", StringType()),
    ("error_stack", StringType()),
    ("failed_at", LongType()),
    ("consumer", StringType()),
    ("context_format", StringType()),
)

#: Columns the normalise step adds after the context.
DERIVED_COLUMNS: tuple[tuple[str, object], ...] = (
    ("error_template", StringType()),
    ("signature", StringType()),
    ("replay_id", StringType()),
    ("replay_count", IntegerType()),  # REPLAY_COUNT the message carries; null when not a number
    ("origin_conflict", StringType()),  # the origin claims when the conventions disagree, else null
)


def _fields(columns: tuple[tuple[str, object], ...]) -> list[StructField]:
    return [StructField(name, dtype) for name, dtype in columns]  # type: ignore[arg-type]


NORMALIZED_SCHEMA = StructType(
    [f for f in SNAPSHOT_SCHEMA.fields if f.name in CARRIED_COLUMNS]
    + _fields(CONTEXT_COLUMNS)
    + _fields(DERIVED_COLUMNS)
)

#: Columns the decide step adds.
DECISION_COLUMNS: tuple[tuple[str, object], ...] = (
    ("rule", StringType()),
    ("action", StringType()),
    ("outcome", StringType()),
    ("outcome_reason", StringType()),
    ("target_topic", StringType()),
    ("fix", StringType()),
    ("fix_error", StringType()),
    ("archive_payload", BooleanType()),
    ("out_value", BinaryType()),
    ("out_properties", _PROPS),
    ("replay_producer", StringType()),  # producer name of a to_republish row (see ProducerSequencer)
    ("sequence_id", LongType()),  # its sequence id for that producer
)

DECIDED_SCHEMA = StructType(NORMALIZED_SCHEMA.fields + _fields(DECISION_COLUMNS))

#: Replay id of a snapshot row in the decide step's scope marks (not a column of any dataset but this).
REPLAY_ID_MARK = "_rid"

#: What the decide step's scope marks need of every snapshot row (written beside the snapshot by its
#: read tasks on a local output root: ``snapshot_identities/``).
IDENTITIES_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("message_id_str", StringType()),
        StructField("publish_time", TimestampType()),
        StructField(REPLAY_ID_MARK, StringType()),
    ]
)

#: Scope flag column added by the scope step before decide (``in``, ``filtered``, ``already_final``).
SCOPE_COLUMN = "scope"

#: Ledger rows (``run_id`` is the partition column; read with this schema so it stays a string).
LEDGER_SCHEMA = StructType(
    [
        StructField("dlq_topic", StringType()),
        StructField("dlq_message_id", StringType()),
        StructField("replay_id", StringType()),
        StructField("signature", StringType()),
        StructField("rule", StringType()),
        StructField("action", StringType()),
        StructField("outcome", StringType()),
        StructField("final", BooleanType()),
        StructField("outcome_reason", StringType()),
        StructField("origin_topic", StringType()),
        StructField("target_topic", StringType()),
        StructField("published_message_id", StringType()),
        StructField("fix", StringType()),
        StructField("fix_error", StringType()),
        StructField("error_class", StringType()),
        StructField("publish_time", TimestampType()),
        StructField("mode", StringType()),
        StructField("recorded_at", TimestampType()),
        StructField("error_template", StringType()),  # null in rows written before 0.2.0
        StructField("context_format", StringType()),  # null in rows written before 0.2.0
        StructField("reason", StringType()),  # failure reason; null in rows written before 0.2.0
        StructField("run_id", StringType()),
    ]
)

#: One send result per message republished (``REPUBLISH_RESULT_SCHEMA`` of the Pulsar I/O layer).
RESULTS_SCHEMA = StructType(
    [
        StructField("replay_id", StringType()),
        StructField("published", BooleanType()),
        StructField("published_message_id", StringType()),
        StructField("error", StringType()),
    ]
)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark uses for ``schema`` in ``mapInArrow`` (timestamps in UTC microseconds)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")
