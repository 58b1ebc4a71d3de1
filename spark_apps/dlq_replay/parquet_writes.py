"""How the run writes Parquet: no dictionary encoding for the columns that hold a value per message.

Parquet's writer starts every column with a dictionary: each value is hashed and looked up. A column
whose first page is nearly all distinct values (payloads, message ids) falls back to plain encoding, but
the context properties' values mix a few repeated values (error class, stack) with per-message ones
(origin message id, timestamps), so their dictionary stays and every value of every message is hashed,
compared and, when read back, decoded again. In a 100k replay those hashes were the largest item of the
driver JVM's CPU in decide (Java Flight Recorder: ``Binary.hashCode``, ``Binary.equals``, the dictionary's
hash map). Columns with few distinct values (topics, signatures, outcomes, error classes, stacks, the
properties' keys) keep the dictionary: it keeps the archive and the ledger small and fast to query.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameWriter

#: Parquet column paths (a map's values are ``<column>.key_value.value``) written without a dictionary.
PER_MESSAGE_COLUMNS = (
    "value",
    "out_value",
    "payload",
    "payload_sha256",
    "key",
    "message_id",
    "message_id_str",
    "dlq_message_id",
    "origin_message_id",
    "published_message_id",
    "replay_id",
    "error_message",
    "failed_at",
    "publish_time",
    "event_time",
    "sequence_id",
    "properties.key_value.value",
    "out_properties.key_value.value",
)

#: Writer options: Parquet reads ``parquet.enable.dictionary#<column path>`` from the write's Hadoop
#: configuration, which Spark builds from these options. A path absent from a dataset is ignored.
WRITE_OPTIONS = {f"parquet.enable.dictionary#{column}": "false" for column in PER_MESSAGE_COLUMNS}


def parquet_writer(frame: DataFrame) -> DataFrameWriter:
    """``frame.write`` with :data:`WRITE_OPTIONS`; every Parquet dataset of a run is written through it."""
    return frame.write.options(**WRITE_OPTIONS)
