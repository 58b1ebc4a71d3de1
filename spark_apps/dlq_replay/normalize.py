"""Normalise step: every snapshot row gets the one error-context schema, its template, signature and ids.

Runs on executors through ``mapInArrow``; the consumer library's :func:`parse_error_context` never raises
on untrusted properties, so no message is dropped: unparseable context gives ``context_format = none``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_apps.dlq_replay.schemas import (
    CARRIED_COLUMNS,
    CONTEXT_COLUMNS,
    DERIVED_COLUMNS,
    NORMALIZED_SCHEMA,
    arrow_schema,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import DataFrame


def normalize_columns(batch: pa.RecordBatch) -> dict[str, list[Any]]:
    """The computed columns of :func:`normalize_batch` as Python lists, plus ``properties`` (as dicts),
    ``topic`` and ``message_id_str``: later Python steps of the same pass reuse them."""
    from pulsar_dlq_consumer.context import parse_error_context
    from spark_apps.dlq_replay.lineage import previous_replay_count
    from spark_apps.dlq_replay.signatures import TemplateCache, error_signature, replay_id

    topics = batch.column("topic").to_pylist()
    ids = batch.column("message_id_str").to_pylist()
    dicts = [dict(pairs) if pairs else {} for pairs in batch.column("properties").to_pylist()]
    context_names = [name for name, _ in CONTEXT_COLUMNS]
    columns: dict[str, list[Any]] = {name: [] for name in context_names}
    for name, _ in DERIVED_COLUMNS:
        columns[name] = []
    appenders = [(columns[name].append, name) for name in context_names]
    templates = TemplateCache()
    add_template, add_signature = columns["error_template"].append, columns["signature"].append
    add_replay_id, add_count = columns["replay_id"].append, columns["replay_count"].append
    for topic, message_id, properties in zip(topics, ids, dicts, strict=True):
        context = parse_error_context(properties, dlq_topic=topic, dlq_message_id=message_id)
        for append, name in appenders:
            append(getattr(context, name))
        template = templates.template(context.error_message)
        add_template(template)
        add_signature(error_signature(context.error_class, template, context.origin_topic))
        add_replay_id(replay_id(topic or "", message_id or ""))
        add_count(previous_replay_count(properties))
    columns["topic"], columns["message_id_str"], columns[PROPERTY_DICTS] = topics, ids, dicts
    return columns


#: Key of the per-row property dicts in :func:`normalize_columns` (not a column of any schema).
PROPERTY_DICTS = "_property_dicts"


def normalize_batch(batch: pa.RecordBatch, columns: dict[str, list[Any]] | None = None) -> pa.RecordBatch:
    """Normalise one Arrow batch of snapshot rows (pure function; see :data:`NORMALIZED_SCHEMA`).

    ``columns`` are this batch's :func:`normalize_columns`, when the caller already has them.
    """
    computed = normalize_columns(batch) if columns is None else columns
    out_schema = arrow_schema(NORMALIZED_SCHEMA)
    arrays: list[pa.Array] = []
    for field in out_schema:
        if field.name in CARRIED_COLUMNS:
            arrays.append(batch.column(field.name).cast(field.type))
        else:
            arrays.append(pa.array(computed[field.name], type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=out_schema)


def _normalize_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield normalize_batch(batch)


def normalize(snapshot: DataFrame) -> DataFrame:
    """Snapshot rows -> normalised rows (:data:`NORMALIZED_SCHEMA`), one output row per input row."""
    from spark_apps.dlq_replay.arrow_compat import map_in_arrow

    return map_in_arrow(snapshot, _normalize_batches, NORMALIZED_SCHEMA)
