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
)

from spark_apps.dlq_replay.pulsar_io.source import SOURCE_SCHEMA, ddl_struct

if TYPE_CHECKING:
    import pyarrow as pa

_PROPS = MapType(StringType(), StringType())

#: Columns of the snapshot: exactly the ``pulsar`` data source's.
SNAPSHOT_SCHEMA = ddl_struct(SOURCE_SCHEMA)

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
RESULTS_SCHEMA = ddl_struct("replay_id string, published boolean, published_message_id string, error string")


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark uses for ``schema`` in ``mapInArrow`` (timestamps in UTC microseconds)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")
