"""Normalise: every snapshot row gets the one error-context schema, its template, signature and ids.

Untrusted properties never raise (no convention: ``context_format = none``). A row whose conventions name
different origin topics that ``origin_precedence`` does not settle carries the conflict (``origin_conflict``).
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from pulsar_dlq_consumer.context import (
    CONTEXT_FIELDS,
    OriginClaim,
    canonical_topic,
    conflicting_claims,
    error_context_values,
    origin_claims,
    origin_identity,
    resolve_claims,
)
from spark_apps.dlq_replay.context_columns import (
    INT_LIMITS,
    ORIGIN_CONFLICT,
    REPLAY_COUNT,
    REPLAY_ID,
    context_columns,
    origin_replay_ids,
)
from spark_apps.dlq_replay.lineage import previous_replay_count
from spark_apps.dlq_replay.pulsar_io.source import UNDECODABLE_PROPERTY
from spark_apps.dlq_replay.signatures import error_signatures, message_templates, replay_id

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence


def origin_of(
    properties: dict[str, str], origin_precedence: Sequence[str] = ()
) -> tuple[OriginClaim | None, str | None]:
    """``(claim, conflict)``: the origin claim a message's identity and republish target come from, or
    ``None`` and the conflicting claims as text when ``origin_precedence`` does not settle them."""
    claims = origin_claims(properties)
    conflict = conflicting_claims(claims)
    if not conflict:
        return next((c for c in claims if c.message_id), claims[0] if claims else None), None
    chosen = resolve_claims(claims, origin_precedence)
    return chosen, None if chosen else ", ".join(f"{c.key}={c.topic!r}" for c in conflict)


def row_replay_id(topic: str | None, message_id: str | None, claim: OriginClaim | None) -> str:
    """The replay id of a snapshot row: from its origin claim's topic and message id, else its DLQ ones."""
    identity = origin_identity(claim.topic, claim.message_id) if claim is not None else None
    return replay_id(topic or "", message_id or "", identity)


def replay_ids(batch: pa.RecordBatch, origin_precedence: Sequence[str] = ()) -> list[str]:
    """:func:`row_replay_id` of every row of a batch of snapshot rows, by kernels where they settle the row's
    origin claims, else (and for every row with ``origin_precedence``) by the scalar parser."""
    if origin_precedence:
        ids, scalar = [""] * batch.num_rows, pa.array([True] * batch.num_rows)
    else:
        ids, settled = origin_replay_ids(batch)
        scalar = pc.invert(settled)
    if scalar.true_count:
        rows = _scalar_rows(batch, scalar)
        parsed = (row_replay_id(t, m, origin_of(props, origin_precedence)[0]) for t, m, props in rows)
        ids = [next(parsed) if s else known for known, s in zip(ids, scalar.to_pylist(), strict=True)]
    return ids


def _scalar_rows(batch: pa.RecordBatch, rows: pa.Array) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(topic, message id, properties)`` of the ``rows`` (a mask) of a batch of snapshot rows, the
    properties built from the flat arrays (``to_pylist`` would make a Python tuple per property)."""
    chosen = batch.filter(rows)
    column = chosen.column("properties")
    keys, values, offsets = column.keys.to_pylist(), column.items.to_pylist(), column.offsets.to_pylist()
    dicts = [dict(zip(keys[a:b], values[a:b], strict=True)) for a, b in pairwise(offsets)]
    for i in pc.indices_nonzero(column.is_null()).to_pylist() if column.null_count else ():
        dicts[i] = {}
    topics, ids = chosen.column("topic").to_pylist(), chosen.column("message_id_str").to_pylist()
    return zip(topics, ids, dicts, strict=True)


def normalize_columns(
    batch: pa.RecordBatch, origin_precedence: Sequence[str] = (), known_ids: pa.Array | None = None
) -> dict[str, pa.Array]:
    """The computed columns of the normalised rows (``NORMALIZED_SCHEMA``), :data:`ORIGIN_CONFLICT` and
    ``UNDECODABLE``: by kernels; by the scalar parser where they do not settle (or ``origin_precedence``).
    ``known_ids``: the rows' replay ids as :func:`replay_ids` gave them (the snapshot's files hold them)."""
    columns, settled = context_columns(batch, UNDECODABLE_PROPERTY, known_ids)
    scalar = pa.array([True] * batch.num_rows) if origin_precedence else pc.invert(settled)
    if scalar.true_count:
        _parse_rows(batch, columns, scalar, origin_precedence)
    columns["error_template"] = message_templates(columns["error_message"])
    columns["signature"] = error_signatures(
        columns["error_class"], columns["error_template"], columns["origin_topic"], columns["reason"]
    )
    return columns


def _parse_rows(
    batch: pa.RecordBatch, columns: dict[str, pa.Array], rows: pa.Array, origin_precedence: Sequence[str]
) -> None:
    """Replace the context values of the ``rows`` (a mask) by the parser's (``UNDECODABLE`` is exact)."""
    parsed: list[dict[str, Any]] = []
    for topic, message_id, properties in _scalar_rows(batch, rows):
        fields = dict(zip(CONTEXT_FIELDS, error_context_values(properties), strict=True))
        claim, conflict = origin_of(properties, origin_precedence)
        if (
            origin_precedence
            and claim is not None
            and claim.topic != fields["origin_topic"]
            and canonical_topic(claim.topic) != canonical_topic(fields["origin_topic"])
        ):
            # The playbook's origin_precedence settled a conflict against the parser's precedence.
            fields["origin_topic"], fields["origin_message_id"] = claim.topic, claim.message_id
        for name, limit in INT_LIMITS.items():  # the parser gives no negative number
            if fields[name] is not None and fields[name] > limit:
                fields[name] = None
        fields[REPLAY_ID] = row_replay_id(topic, message_id, claim)
        fields[REPLAY_COUNT] = previous_replay_count(properties)
        fields[ORIGIN_CONFLICT] = conflict
        parsed.append(fields)
    for name in (*CONTEXT_FIELDS[2:], REPLAY_ID, REPLAY_COUNT, ORIGIN_CONFLICT):
        values = pa.array([fields[name] for fields in parsed], columns[name].type)
        columns[name] = pc.replace_with_mask(columns[name], rows, values)
