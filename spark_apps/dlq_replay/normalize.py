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


def normalize_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Normalise one Arrow batch of snapshot rows (pure function; see :data:`NORMALIZED_SCHEMA`)."""
    from airflow_provider_dlq.dlq_consumer.context import parse_error_context
    from spark_apps.dlq_replay.lineage import previous_replay_count
    from spark_apps.dlq_replay.signatures import TemplateCache, error_signature, replay_id

    out_schema = arrow_schema(NORMALIZED_SCHEMA)
    topics = batch.column("topic").to_pylist()
    ids = batch.column("message_id_str").to_pylist()
    props_col = batch.column("properties").to_pylist()
    context_names = [name for name, _ in CONTEXT_COLUMNS]
    columns: dict[str, list[Any]] = {name: [] for name in context_names}
    for name, _ in DERIVED_COLUMNS:
        columns[name] = []
    templates = TemplateCache()
    for topic, message_id, pairs in zip(topics, ids, props_col, strict=True):
        properties = dict(pairs) if pairs else {}
        context = parse_error_context(properties, dlq_topic=topic, dlq_message_id=message_id)
        for name in context_names:
            columns[name].append(getattr(context, name))
        template = templates.template(context.error_message)
        columns["error_template"].append(template)
        columns["signature"].append(error_signature(context.error_class, template, context.origin_topic))
        columns["replay_id"].append(replay_id(topic or "", message_id or ""))
        columns["replay_count"].append(previous_replay_count(properties))
    arrays: list[pa.Array] = []
    for field in out_schema:
        if field.name in CARRIED_COLUMNS:
            arrays.append(batch.column(field.name).cast(field.type))
        else:
            arrays.append(pa.array(columns[field.name], type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=out_schema)


def _normalize_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield normalize_batch(batch)


def normalize(snapshot: DataFrame) -> DataFrame:
    """Snapshot rows -> normalised rows (:data:`NORMALIZED_SCHEMA`), one output row per input row."""
    from spark_apps.dlq_replay.arrow_compat import map_in_arrow

    return map_in_arrow(snapshot, _normalize_batches, NORMALIZED_SCHEMA)
