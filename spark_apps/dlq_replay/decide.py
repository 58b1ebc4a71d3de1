"""Decide step: scope (filters, already-final ids), playbook match, guards, fixes, producer assignment.

``apply_scope`` and ``assign_producers`` are Spark SQL; ``decide`` runs :func:`decide_batch` on executors
through ``mapInArrow`` (playbook matching and fixes are Python, vectorised per Arrow batch).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.schemas import CONTEXT_COLUMNS, DECIDED_SCHEMA, SCOPE_COLUMN, arrow_schema

if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import datetime

    from pyspark.sql import Column, DataFrame

    from spark_apps.dlq_replay.fixes import FixOutcome, FixRecord
    from spark_apps.dlq_replay.playbook import Playbook
    from spark_apps.dlq_replay.topics import TopicMatcher

SCOPE_IN = "in"
SCOPE_FILTERED = "filtered"
SCOPE_ALREADY_FINAL = "already_final"
SCOPE_REASON_COLUMN = "scope_reason"


@dataclass(frozen=True)
class Filters:
    """Selective replay: only matching messages are decided on; the others are ``filtered``."""

    signatures: tuple[str, ...] | None = None
    error_class: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    max_messages: int | None = None


@dataclass(frozen=True)
class DecideSettings:
    """Run-level policy the decide step needs on executors (picklable)."""

    run_id: str
    mode: str
    max_replays: int = 3
    allowlist: TopicMatcher | None = None
    archive_payload: bool = True


# --------------------------------------------------------------------------- scope (Spark SQL)


def _filter_reason(filters: Filters) -> Column:
    """A column naming the first filter a row fails, or null when it passes them all."""
    from pyspark.sql import functions as F

    reason: Column = F.lit(None).cast("string")
    checks: list[tuple[Column, str]] = []
    if filters.signatures is not None:
        checks.append((F.col("signature").isin(list(filters.signatures)), "not selected by --signatures"))
    if filters.error_class is not None:
        name = filters.error_class
        cond = (F.col("error_class") == F.lit(name)) | F.col("error_class").endswith("." + name)
        checks.append((F.coalesce(cond, F.lit(False)), "not selected by --error-class"))
    if filters.since is not None:
        checks.append((F.col("publish_time") >= F.lit(filters.since), "published before --since"))
    if filters.until is not None:
        checks.append((F.col("publish_time") < F.lit(filters.until), "published at or after --until"))
    for cond, text in reversed(checks):
        reason = F.when(~F.coalesce(cond, F.lit(False)), F.lit(text)).otherwise(reason)
    return reason


def apply_scope(normalized: DataFrame, filters: Filters, final_ids: DataFrame | None) -> DataFrame:
    """Add ``scope`` (in / filtered / already_final) and ``scope_reason`` to normalised rows.

    ``final_ids`` holds one column ``replay_id`` of messages already final in the ledger of any earlier
    run: they are ``already_final`` whatever the filters say. ``max_messages`` keeps the first N in-scope
    rows by (publish_time, dlq_topic, replay_id) and marks the rest ``filtered``.
    """
    from pyspark.sql import functions as F

    df = normalized
    if final_ids is not None:
        marked = final_ids.select("replay_id").distinct().withColumn("_final", F.lit(True))
        df = df.join(marked, on="replay_id", how="left")
    else:
        df = df.withColumn("_final", F.lit(None).cast("boolean"))
    reason = _filter_reason(filters)
    df = df.withColumn(SCOPE_REASON_COLUMN, F.when(F.col("_final").isNull(), reason)).withColumn(
        SCOPE_COLUMN,
        F.when(F.col("_final"), F.lit(SCOPE_ALREADY_FINAL))
        .when(F.col(SCOPE_REASON_COLUMN).isNotNull(), F.lit(SCOPE_FILTERED))
        .otherwise(F.lit(SCOPE_IN)),
    )
    df = df.drop("_final")
    if filters.max_messages is not None:
        chosen = (
            df.filter(F.col(SCOPE_COLUMN) == SCOPE_IN)
            .select("replay_id", "publish_time", "dlq_topic")
            .orderBy("publish_time", "dlq_topic", "replay_id")
            .limit(filters.max_messages)
            .select("replay_id", F.lit(True).alias("_chosen"))
        )
        df = df.join(chosen, on="replay_id", how="left")
        over = (F.col(SCOPE_COLUMN) == SCOPE_IN) & F.col("_chosen").isNull()
        df = (
            df.withColumn(
                SCOPE_REASON_COLUMN,
                F.when(over, F.lit("beyond --max-messages")).otherwise(F.col(SCOPE_REASON_COLUMN)),
            )
            .withColumn(SCOPE_COLUMN, F.when(over, F.lit(SCOPE_FILTERED)).otherwise(F.col(SCOPE_COLUMN)))
            .drop("_chosen")
        )
    return df


# --------------------------------------------------------------------------- decide (executors)


@dataclass
class _Row:
    index: int
    outcome: str | None = None
    reason: str | None = None
    rule: str | None = None
    action: str | None = None
    target: str | None = None
    fix: str | None = None
    fix_error: str | None = None
    archive_payload: bool | None = None
    out_value: bytes | None = None
    out_properties: dict[str, str] | None = None
    send_original: bool = False  # republish the original payload (no fix): taken from Arrow, not Python


class _Columns(dict[str, list[Any]]):
    """Columns of one Arrow batch as Python lists, each converted on first use."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        super().__init__()
        self.batch = batch

    def __missing__(self, name: str) -> list[Any]:
        values: list[Any] = self.batch.column(name).to_pylist()
        self[name] = values
        return values


def decide_batch(batch: pa.RecordBatch, playbook: Playbook, settings: DecideSettings) -> pa.RecordBatch:
    """Decide every row of one Arrow batch of scoped rows (pure function; see :data:`DECIDED_SCHEMA`)."""
    from spark_apps.dlq_replay.fixes import load_fix, run_fix
    from spark_apps.dlq_replay.playbook import MatchInput
    from spark_apps.dlq_replay.topics import republish_target

    cols = _Columns(batch)
    rows = [_Row(i) for i in range(batch.num_rows)]
    pending_fixes: dict[str | None, list[tuple[_Row, Any]]] = {}
    for row in rows:
        i = row.index
        scope = cols[SCOPE_COLUMN][i]
        if scope == SCOPE_ALREADY_FINAL:
            row.outcome, row.reason = oc.ALREADY_FINAL, "final in the ledger of an earlier run"
            continue
        if scope == SCOPE_FILTERED:
            row.outcome, row.reason = oc.FILTERED, cols[SCOPE_REASON_COLUMN][i]
            continue
        if cols["context_format"][i] == "none":
            row.outcome = oc.MALFORMED
            row.reason = "error context could not be parsed (no known DLQ property convention)"
            continue
        count = cols["replay_count"][i]
        if count is None:
            row.outcome, row.reason = oc.MALFORMED, "REPLAY_COUNT property is not a non-negative integer"
            continue
        properties = dict(cols["properties"][i] or [])
        rule = playbook.first_match(
            MatchInput(
                signature=cols["signature"][i],
                error_class=cols["error_class"][i],
                error_message=cols["error_message"][i],
                origin_topic=cols["origin_topic"][i],
                context_format=cols["context_format"][i],
                properties=properties,
            )
        )
        if rule is None:
            row.action, row.outcome, row.reason = oc.SKIP, oc.SKIPPED, "no playbook rule matched"
            continue
        row.rule, row.action = rule.name, rule.action
        if rule.action == oc.SKIP:
            row.outcome, row.reason = oc.SKIPPED, rule.reason or f"rule {rule.name!r} says skip"
        elif rule.action == oc.DROP:
            row.outcome, row.reason = oc.DROPPED, rule.reason or f"rule {rule.name!r} says drop"
        elif rule.action == oc.ARCHIVE:
            row.outcome, row.reason = oc.ARCHIVED, rule.reason or f"rule {rule.name!r} says archive"
            row.archive_payload = _archive_payload(rule.archive_payload, playbook, cols, i, settings)
        else:
            _decide_republish(row, rule, count, cols["origin_topic"][i], settings, republish_target)
            if row.outcome is None:
                pending_fixes.setdefault(rule.fix, []).append((row, rule))
    for row in rows:
        if row.outcome == oc.LOOP_GUARDED:
            row.archive_payload = _archive_payload(None, playbook, cols, row.index, settings)
    for row, rule in pending_fixes.pop(None, []):
        row.outcome, row.reason = oc.TO_REPUBLISH, f"rule {rule.name!r} says republish"
        row.send_original = True
        row.out_properties = _lineage(dict(cols["properties"][row.index] or []), row, rule, cols, settings)
    for fix_ref, entries in pending_fixes.items():
        records = [_fix_record(cols, row.index) for row, _ in entries]
        results: list[FixOutcome] = run_fix(load_fix(fix_ref) if fix_ref else None, records)
        for (row, rule), record, result in zip(entries, records, results, strict=True):
            _apply_fix_outcome(row, rule, record, result, cols, settings)
            if row.outcome == oc.ARCHIVED:
                row.archive_payload = _archive_payload(None, playbook, cols, row.index, settings)
    return _to_batch(batch, rows)


def _lineage(
    properties: dict[str, str], row: _Row, rule: Any, cols: _Columns, settings: DecideSettings
) -> dict[str, str]:
    from spark_apps.dlq_replay.lineage import republish_properties

    i = row.index
    return republish_properties(
        properties,
        replay_id=cols["replay_id"][i],
        run_id=settings.run_id,
        previous_count=int(cols["replay_count"][i]),
        dlq_topic=cols["dlq_topic"][i],
        fix_label=rule.fix_label,
    )


def _archive_payload(
    rule_says: bool | None, playbook: Playbook, cols: _Columns, i: int, settings: DecideSettings
) -> bool:
    """Archive the payload itself? No when the topic is payload-off, else the rule, else the run default."""
    if playbook.payload_off(cols["dlq_topic"][i], cols["origin_topic"][i]):
        return False
    return settings.archive_payload if rule_says is None else rule_says


def _decide_republish(
    row: _Row, rule: Any, count: int, origin: str | None, settings: DecideSettings, republish_target: Any
) -> None:
    row.fix = rule.fix_label or None
    if count >= settings.max_replays:
        row.outcome = oc.LOOP_GUARDED
        row.reason = f"loop guard: REPLAY_COUNT {count} >= --max-replays {settings.max_replays}"
        return
    if settings.mode == oc.ARCHIVE_ONLY:
        row.outcome, row.reason = oc.SKIPPED, "republish is disabled in archive-only mode"
        return
    target = republish_target(origin)
    row.target = target
    if target is None:
        row.outcome, row.reason = oc.ORIGIN_REFUSED, "the error context names no valid origin topic"
        return
    if settings.allowlist is None:
        row.outcome, row.reason = oc.ORIGIN_REFUSED, "no --origin-allowlist given: nothing may be republished"
        return
    if not settings.allowlist.matches(target):
        row.outcome, row.reason = oc.ORIGIN_REFUSED, "origin topic is not in --origin-allowlist"


def _fix_record(cols: _Columns, i: int) -> FixRecord:
    from spark_apps.dlq_replay.fixes import FixRecord

    context = {name: cols[name][i] for name, _ in CONTEXT_COLUMNS}
    return FixRecord(
        payload=cols.batch.column("value")[i].as_py() or b"",
        key=cols["key"][i],
        ordering_key=cols["ordering_key"][i],
        properties=dict(cols["properties"][i] or []),
        event_time=cols["event_time"][i],
        context=context,
        signature=cols["signature"][i],
        dlq_topic=cols["dlq_topic"][i],
        dlq_message_id=cols["dlq_message_id"][i],
    )


def _apply_fix_outcome(
    row: _Row,
    rule: Any,
    record: FixRecord,
    result: FixOutcome,
    cols: _Columns,
    settings: DecideSettings,
) -> None:
    if result.ok:
        row.outcome, row.reason = oc.TO_REPUBLISH, f"rule {rule.name!r} says republish"
        row.out_value = result.payload
        row.out_properties = _lineage(result.properties or {}, row, rule, cols, settings)
        return
    row.fix_error = result.error
    if result.malformed:
        row.outcome, row.reason = oc.MALFORMED, f"fix {rule.fix} found the record malformed"
    elif rule.on_fix_error == oc.ON_FIX_ERROR_ARCHIVE:
        row.outcome, row.reason = oc.ARCHIVED, f"fix {rule.fix} failed; rule says on_fix_error: archive"
    else:
        row.outcome, row.reason = oc.FIX_FAILED, f"fix {rule.fix} failed"


def _to_batch(batch: pa.RecordBatch, rows: list[_Row]) -> pa.RecordBatch:
    import pyarrow.compute as pc

    schema = arrow_schema(DECIDED_SCHEMA)
    original = batch.column("value")
    no_value = pa.nulls(len(rows), original.type)
    send_original = pa.array([r.send_original for r in rows], pa.bool_())
    archive = pa.array([r.outcome in oc.ARCHIVE_OUTCOMES for r in rows], pa.bool_())
    computed: dict[str, pa.Array] = {
        # Payloads stay in Arrow: the original where it is sent unchanged, else the fix's output.
        "out_value": pc.if_else(
            send_original, original, pa.array([r.out_value for r in rows], original.type)
        ),
        # The original payload is kept only where the archive needs it.
        "value": pc.if_else(archive, original, no_value),
    }
    decided: dict[str, list[Any]] = {
        "rule": [r.rule for r in rows],
        "action": [r.action for r in rows],
        "outcome": [r.outcome for r in rows],
        "outcome_reason": [r.reason for r in rows],
        "target_topic": [r.target for r in rows],
        "fix": [r.fix for r in rows],
        "fix_error": [r.fix_error for r in rows],
        "archive_payload": [r.archive_payload for r in rows],
        "out_properties": [
            list(r.out_properties.items()) if r.out_properties is not None else None for r in rows
        ],
    }
    arrays = []
    for field in schema:
        if field.name in computed:
            arrays.append(computed[field.name].cast(field.type))
        elif field.name in decided:
            arrays.append(pa.array(decided[field.name], type=field.type))
        else:
            arrays.append(batch.column(field.name).cast(field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def decide(scoped: DataFrame, playbook: Playbook, settings: DecideSettings) -> DataFrame:
    """Scoped rows -> decided rows (:data:`DECIDED_SCHEMA`): one outcome per row, fixes applied."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield decide_batch(batch, playbook, settings)

    from spark_apps.dlq_replay.arrow_compat import map_in_arrow

    return map_in_arrow(scoped, run, DECIDED_SCHEMA)


# --------------------------------------------------------------------------- producers (Spark SQL)


def run_hash(run_id: str) -> str:
    return hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:12]


def assign_producers(decided: DataFrame, run_id: str, buckets: int) -> DataFrame:
    """Give each ``to_republish`` row a deterministic ``producer_name`` and ``sequence_id``.

    ``dlq-replay-<hash(run_id)>-<hash(target)>-<bucket>`` with bucket = replay_id mod ``buckets``, and
    sequence ids 0, 1, 2 ... per producer ordered by replay_id. The decisions are persisted, so a retried
    apply sends the same (producer, sequence) pairs: exact under Pulsar broker deduplication.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    to_send = F.col("outcome") == oc.TO_REPUBLISH
    bucket = F.pmod(F.conv(F.substring("replay_id", 1, 8), 16, 10).cast("long"), F.lit(buckets))
    name = F.concat_ws(
        "-",
        F.lit("dlq-replay"),
        F.lit(run_hash(run_id)),
        F.substring(F.sha2(F.col("target_topic"), 256), 1, 8),
        bucket.cast("string"),
    )
    # One pass (the decided rows are computed once): rows that are not sent each form their own
    # window partition (keyed by their unique replay_id), so only producers' rows are numbered together.
    window = Window.partitionBy("_producer_key").orderBy("replay_id")
    return (
        decided.withColumn("replay_producer", F.when(to_send, name))
        .withColumn("_producer_key", F.coalesce(F.col("replay_producer"), F.col("replay_id")))
        .withColumn("sequence_id", F.when(to_send, F.row_number().over(window) - 1).cast("long"))
        .drop("_producer_key")
    )
