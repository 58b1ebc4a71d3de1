"""Decide step: scope (filters, already-final ids), playbook match, guards, fixes, producer assignment.

``decide`` marks the ledger's final ids, duplicates and the ``--max-messages`` choice in Spark SQL
(:func:`scope_marks`), then makes one Python pass per row on executors through ``mapInArrow``:
normalise, scope, match the playbook, run fixes (vectorised per Arrow batch) and number each task's
sends (:class:`ProducerSequencer`). No step shuffles the messages themselves.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.lineage import republish_properties
from spark_apps.dlq_replay.normalize import ORIGIN_CONFLICT, PROPERTY_DICTS
from spark_apps.dlq_replay.pulsar_io.source import UNDECODABLE_PROPERTY
from spark_apps.dlq_replay.schemas import (
    CONTEXT_COLUMNS,
    DECIDED_SCHEMA,
    IDENTITIES_SCHEMA,
    REPLAY_ID_MARK,
    SCOPE_COLUMN,
    arrow_schema,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from datetime import datetime

    from pyspark.sql import Column, DataFrame

    from spark_apps.dlq_replay.fixes import FixOutcome, FixRecord
    from spark_apps.dlq_replay.playbook import Playbook
    from spark_apps.dlq_replay.topics import TopicMatcher

SCOPE_IN = "in"
SCOPE_FILTERED = "filtered"
SCOPE_ALREADY_FINAL = "already_final"
SCOPE_DUPLICATE = "duplicate"
SCOPE_REASON_COLUMN = "scope_reason"
#: Columns added by :func:`scope_marks`: a mark (``already_final``, ``duplicate`` or ``chosen``, null
#: for the rest) and its reason.
_MARK, _MARK_REASON = "_mark", "_mark_reason"
_CHOSEN = "chosen"
_RID = REPLAY_ID_MARK
#: Marked rows up to this many are broadcast to the join with the snapshot (no shuffle of payloads).
BROADCAST_MARKS = 200_000


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
    #: Approved action per signature (``--group-actions``): overrides the playbook for those groups.
    group_actions: dict[str, str] | None = None


# --------------------------------------------------------------------------- scope


def filter_reason(
    filters: Filters, signature: str | None, error_class: str | None, publish_time: datetime | None
) -> str | None:
    """The first filter a message fails, or ``None`` when it passes them all."""
    if filters.signatures is not None and signature not in filters.signatures:
        return "not selected by --signatures"
    if filters.error_class is not None:
        name = filters.error_class
        if error_class is None or not (error_class == name or error_class.endswith("." + name)):
            return "not selected by --error-class"
    if filters.since is not None and (publish_time is None or publish_time < filters.since):
        return "published before --since"
    if filters.until is not None and (publish_time is None or publish_time >= filters.until):
        return "published at or after --until"
    return None


def replay_id_column() -> Column:
    """The DLQ-identity :func:`~spark_apps.dlq_replay.signatures.replay_id` of a snapshot row (no origin
    identity), in Spark SQL."""
    from pyspark.sql import functions as F

    material = F.concat(F.col("topic"), F.lit("\x1f"), F.col("message_id_str"))
    return F.substring(F.sha2(material, 256), 1, 32)


def identity_rows(
    batch: pa.RecordBatch, origin_precedence: Sequence[str] = (), replay_ids: Sequence[str] | None = None
) -> pa.RecordBatch:
    """:data:`~spark_apps.dlq_replay.schemas.IDENTITIES_SCHEMA` of a batch of snapshot rows (or of their
    :func:`~spark_apps.dlq_replay.normalize.origin_columns`): what :func:`scope_marks` needs of every
    row. ``replay_ids``: already computed, else computed from the origin properties."""
    if replay_ids is None:
        from spark_apps.dlq_replay.normalize import replay_ids as origin_replay_ids

        replay_ids = origin_replay_ids(batch, origin_precedence)
    return pa.RecordBatch.from_arrays(
        [
            batch.column("topic"),
            batch.column("message_id_str"),
            batch.column("publish_time"),
            pa.array(replay_ids, pa.string()),
        ],
        names=["topic", "message_id_str", "publish_time", _RID],
    )


def _identities(snapshot: DataFrame, filters: Filters, origin_precedence: tuple[str, ...]) -> DataFrame:
    """One light row per snapshot row (no payload): ``topic, message_id_str, publish_time, _rid`` and,
    with ``--max-messages``, ``selected`` (passes the other filters)."""
    from pyspark.sql import functions as F

    from spark_apps.dlq_replay.arrow_compat import map_in_arrow

    limited = filters.max_messages is not None

    def ids(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from spark_apps.dlq_replay.normalize import normalize_columns

        for batch in batches:
            if not limited:  # the replay ids only need the origin
                yield identity_rows(batch, origin_precedence)
                continue
            # The filters of --max-messages need the whole context.
            columns = normalize_columns(batch, origin_precedence)
            rows = identity_rows(batch, replay_ids=columns["replay_id"])
            times = _publish_times(batch, filters)
            selected = [
                filter_reason(filters, sig, cls, ts) is None
                for sig, cls, ts in zip(columns["signature"], columns["error_class"], times, strict=True)
            ]
            yield rows.append_column("selected", pa.array(selected, pa.bool_()))

    if limited:
        light = snapshot.select(
            "topic", "message_id_str", "publish_time", "properties", F.lit(None).cast("binary").alias("value")
        )
    else:
        from spark_apps.dlq_replay.normalize import origin_columns

        light = snapshot.select(*origin_columns(), "publish_time")
    from pyspark.sql.types import BooleanType, StructField, StructType

    selected = [StructField("selected", BooleanType())] if limited else []
    return map_in_arrow(light, ids, StructType(IDENTITIES_SCHEMA.fields + selected))


def _join_marks(snapshot: DataFrame, marked: DataFrame, count: int) -> DataFrame:
    """The snapshot joined with its marked rows (broadcast when at most :data:`BROADCAST_MARKS`)."""
    from pyspark.sql import functions as F

    marks = F.broadcast(marked) if count <= BROADCAST_MARKS else marked
    return snapshot.join(marks, ["topic", "message_id_str"], "left")


def scope_marks(
    snapshot: DataFrame,
    filters: Filters,
    final_ids: DataFrame | None,
    origin_precedence: tuple[str, ...] = (),
    reviewed_ids: DataFrame | None = None,
    identities: DataFrame | None = None,
) -> tuple[DataFrame, int]:
    """``(rows, count)``: ``topic, message_id_str`` and the mark columns of the snapshot rows the decide
    step must not treat as new (persisted, so computed once):

    * ``already_final``: this DLQ message is final in the ledger of an earlier run (``final_ids``:
      ``replay_id, dlq_topic, dlq_message_id, run_id`` of earlier runs' final rows);
    * ``duplicate``: another copy of the same original (same replay id, see
      :func:`~spark_apps.dlq_replay.signatures.replay_id`) is final in an earlier run, or is in this
      snapshot and wins: the oldest publish time, then DLQ topic, then message id. The choice depends
      only on the snapshot, so it is the same when a run is resumed;
    * ``filtered``: with ``reviewed_ids`` (one column ``replay_id``, the scope of the run a reviewer
      approved, ``--window-from``), every row whose replay id is not among them;
    * ``chosen``: among the first ``max_messages`` rows that are neither and pass the filters, by
      (publish time, DLQ topic, replay id).

    The marks are computed on payload-free rows (:func:`identity_rows`: ``identities`` when the
    snapshot's read tasks wrote them, else computed here from the snapshot); only the marked rows are
    joined back to the snapshot.
    """
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if identities is not None and filters.max_messages is None:
        ids = identities
    else:
        ids = _identities(snapshot, filters, origin_precedence)
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
    else:
        ids = ids.withColumn("_reviewed", F.lit(True))
    order = Window.partitionBy(_RID).orderBy("publish_time", "topic", "message_id_str")
    ids = ids.withColumn("_rank", F.row_number().over(order)).withColumn(
        "_first", F.first(F.struct("topic", "message_id_str")).over(order)
    )
    already = F.col("_self_run").isNotNull()
    other = F.col("_other").isNotNull()
    beaten = F.col("_rank") > 1
    unreviewed = F.col("_reviewed").isNull()
    marks = ids.select(
        "topic",
        "message_id_str",
        "publish_time",
        _RID,
        *(["selected"] if filters.max_messages is not None else []),
        F.when(already, F.lit(SCOPE_ALREADY_FINAL))
        .when(unreviewed, F.lit(SCOPE_FILTERED))
        .when(other | beaten, F.lit(SCOPE_DUPLICATE))
        .alias(_MARK),
        F.when(already, F.concat(F.lit("final in the ledger of run "), F.col("_self_run")))
        .when(unreviewed, F.lit("not in the scope of the reviewed run (--window-from)"))
        .when(
            other,
            F.concat(
                F.lit("another copy of the same original ("),
                F.col("_other.dlq_topic"),
                F.lit(" "),
                F.col("_other.dlq_message_id"),
                F.lit(") is final in the ledger of run "),
                F.col("_other.run_id"),
            ),
        )
        .when(
            beaten,
            F.concat(
                F.lit("another copy of the same original ("),
                F.col("_first.topic"),
                F.lit(" "),
                F.col("_first.message_id_str"),
                F.lit(") is in this run and was published first"),
            ),
        )
        .alias(_MARK_REASON),
    )
    if filters.max_messages is not None:
        chosen = (
            marks.filter(F.col(_MARK).isNull() & F.col("selected"))
            .orderBy("publish_time", "topic", _RID)
            .limit(int(filters.max_messages))
            .select("topic", "message_id_str", F.lit(_CHOSEN).alias("_chosen"))
        )
        marks = marks.join(chosen, ["topic", "message_id_str"], "left").withColumn(
            _MARK, F.coalesce(F.col(_MARK), F.col("_chosen"))
        )
    marked = marks.filter(F.col(_MARK).isNotNull()).select("topic", "message_id_str", _MARK, _MARK_REASON)
    marked = marked.persist(StorageLevel.MEMORY_AND_DISK)  # computed once, counted, joined
    return marked, marked.count()


def add_scope_columns(batch: pa.RecordBatch, columns: dict[str, list[Any]], filters: Filters) -> None:
    """Add ``scope`` and ``scope_reason`` to ``columns``, the batch's
    :func:`~spark_apps.dlq_replay.normalize.normalize_columns`, from the marks of
    :func:`scope_marks` and the filters."""
    marks = batch.column(_MARK).to_pylist()
    mark_reasons = batch.column(_MARK_REASON).to_pylist()
    times = _publish_times(batch, filters)
    limited = filters.max_messages is not None
    scopes: list[str] = []
    reasons: list[str | None] = []
    for i, mark in enumerate(marks):
        reason = None
        if mark in (SCOPE_ALREADY_FINAL, SCOPE_DUPLICATE, SCOPE_FILTERED):
            scope, reason = mark, mark_reasons[i]
        else:
            reason = filter_reason(filters, columns["signature"][i], columns["error_class"][i], times[i])
            if reason is None and limited and mark != _CHOSEN:
                reason = "beyond --max-messages"
            scope = SCOPE_FILTERED if reason else SCOPE_IN
        scopes.append(scope)
        reasons.append(reason)
    columns[SCOPE_COLUMN], columns[SCOPE_REASON_COLUMN] = scopes, reasons


def _publish_times(batch: pa.RecordBatch, filters: Filters) -> list[Any]:
    """Publish times as Python values, converted only when a time filter needs them."""
    if filters.since is None and filters.until is None:
        return [None] * batch.num_rows
    return batch.column("publish_time").to_pylist()


# --------------------------------------------------------------------------- decide (executors)


@dataclass(slots=True)
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

    def __init__(self, batch: pa.RecordBatch, known: dict[str, list[Any]] | None = None) -> None:
        super().__init__(known or {})
        self.batch = batch

    def properties(self, i: int) -> dict[str, str]:
        """Row ``i``'s properties as a new dict."""
        if PROPERTY_DICTS in self:
            return dict(self[PROPERTY_DICTS][i])
        return dict(self["properties"][i] or [])

    def __missing__(self, name: str) -> list[Any]:
        values: list[Any] = self.batch.column(name).to_pylist()
        self[name] = values
        return values


class _Memo:
    """Per-batch memos of what repeats across the rows of one batch (topics, rules)."""

    def __init__(self, playbook: Playbook, settings: DecideSettings) -> None:
        self.playbook = playbook
        self.settings = settings
        rules = playbook.rules
        # A rule that looks at properties sees per-message values: no memo then.
        self.cache_rules = not any(rule.properties for rule in rules)
        self.match_on_message = any(rule.error_message is not None for rule in rules)
        self.rules: dict[tuple[Any, ...], Any] = {}
        self.targets: dict[str | None, tuple[str | None, str | None]] = {}
        self.payload_off: dict[tuple[str | None, str | None], bool] = {}
        self.approvals: dict[tuple[str, str | None], Any] = {}

    def rule(self, cols: _Columns, i: int) -> Any:
        message = cols["error_message"][i]
        if self.cache_rules:
            key = (
                cols["signature"][i],
                cols["error_class"][i],
                message if self.match_on_message else None,
                cols["origin_topic"][i],
                cols["context_format"][i],
            )
            if key in self.rules:
                return self.rules[key]
        from spark_apps.dlq_replay.playbook import MatchInput

        found = self.playbook.first_match(
            MatchInput(
                signature=cols["signature"][i],
                error_class=cols["error_class"][i],
                error_message=message,
                origin_topic=cols["origin_topic"][i],
                context_format=cols["context_format"][i],
                properties=cols.properties(i),
            )
        )
        if self.cache_rules:
            self.rules[key] = found
        return found

    def approved_rule(self, cols: _Columns, i: int, rule: Any) -> Any:
        """``rule``, or the rule of the group's approved action when ``--group-actions`` names it."""
        actions = self.settings.group_actions
        action = actions.get(cols["signature"][i]) if actions else None
        if action is None:
            return rule
        key = (action, None if rule is None else rule.name)
        found = self.approvals.get(key)
        if found is None:
            from spark_apps.dlq_replay.group_actions import override_rule

            found = self.approvals[key] = override_rule(action, rule)
        return found

    def target(self, origin: str | None) -> tuple[str | None, str | None]:
        """``(target topic, refusal reason or None)`` for republishing to ``origin``."""
        found = self.targets.get(origin)
        if found is None:
            found = self.targets[origin] = _republish_target(origin, self.settings)
        return found

    def archive_payload(self, rule_says: bool | None, cols: _Columns, i: int) -> bool:
        """Archive the payload? Not when the topic is payload-off, else the rule, else the run default."""
        key = (cols["dlq_topic"][i], cols["origin_topic"][i])
        off = self.payload_off.get(key)
        if off is None:
            off = self.payload_off[key] = self.playbook.payload_off(*key)
        if off:
            return False
        return self.settings.archive_payload if rule_says is None else rule_says


#: Outcome of a rule's action (republish is decided by :func:`_decide_republish`).
_RULE_OUTCOMES = {oc.SKIP: oc.SKIPPED, oc.DROP: oc.DROPPED, oc.ARCHIVE: oc.ARCHIVED}
#: Longest piece of a message (a topic, a property value) quoted in an outcome reason.
_QUOTE_CHARS = 120
_NO_CONVENTION = (
    "no known DLQ property convention: none of REAL_TOPIC, ORIGIN_MESSAGE_ID, RECONSUMETIMES, "
    "RETRY_TOPIC, __dlq.errors.*, __connect.errors.*, kafka_dlt-* is set"
)


def _quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 4] + "...'"


def _parked(cols: _Columns, i: int) -> tuple[str, str | None] | None:
    """``(outcome, reason)`` of a row that is not matched against the playbook, else ``None``: out of
    scope (already final, duplicate, filtered), or parked with a precise reason (malformed context,
    conflicting origins)."""
    scope = cols[SCOPE_COLUMN][i]
    if scope == SCOPE_ALREADY_FINAL:
        return oc.ALREADY_FINAL, cols[SCOPE_REASON_COLUMN][i] or "final in the ledger of an earlier run"
    if scope == SCOPE_DUPLICATE:
        return oc.DUPLICATE, cols[SCOPE_REASON_COLUMN][i]
    if scope == SCOPE_FILTERED:
        return oc.FILTERED, cols[SCOPE_REASON_COLUMN][i]
    properties = cols[PROPERTY_DICTS][i] if PROPERTY_DICTS in cols else dict(cols["properties"][i] or [])
    if UNDECODABLE_PROPERTY in properties:
        return oc.MALFORMED, (
            "message properties or key are not valid UTF-8, so the error context cannot be read; "
            "inspect the message with a client that shows raw bytes"
        )
    if cols["context_format"][i] == "none":
        return oc.MALFORMED, _NO_CONVENTION
    if cols["replay_count"][i] is None:
        return oc.MALFORMED, (
            f"REPLAY_COUNT property {_quote(properties.get('REPLAY_COUNT'))} is not a non-negative integer"
        )
    conflicts = cols[ORIGIN_CONFLICT][i]
    if conflicts:
        return oc.ORIGIN_CONFLICT, (
            f"the error context names different origin topics: {conflicts}; add `origin_precedence` to "
            "the playbook to say which property wins"
        )
    return None


def decide_batch(
    batch: pa.RecordBatch,
    playbook: Playbook,
    settings: DecideSettings,
    sequencer: ProducerSequencer | None = None,
    columns: dict[str, list[Any]] | None = None,
) -> pa.RecordBatch:
    """Decide every row of one Arrow batch of scoped rows (pure function; see :data:`DECIDED_SCHEMA`).

    Without a ``sequencer`` the producer columns stay null. ``columns``: this batch's
    :func:`~spark_apps.dlq_replay.normalize.normalize_columns` (and :func:`add_scope_columns`), reused
    instead of converted again; the scope then need not be in ``batch``.
    """
    from spark_apps.dlq_replay.fixes import load_fix, run_fix

    cols = _Columns(batch, columns)
    memo = _Memo(playbook, settings)
    rows = [_Row(i) for i in range(batch.num_rows)]
    pending_fixes: dict[str | None, list[tuple[_Row, Any]]] = {}
    for row in rows:
        i = row.index
        parked = _parked(cols, i)
        if parked is not None:
            row.outcome, row.reason = parked
            continue
        rule = memo.approved_rule(cols, i, memo.rule(cols, i))
        if rule is None:
            row.action, row.outcome, row.reason = oc.SKIP, oc.SKIPPED, "no playbook rule matched"
            continue
        row.rule, row.action = rule.name, rule.action
        if rule.action == oc.REPUBLISH:
            _decide_republish(row, rule, cols["replay_count"][i], cols["origin_topic"][i], settings, memo)
            if row.outcome is None:
                pending_fixes.setdefault(rule.fix, []).append((row, rule))
            continue
        row.outcome = _RULE_OUTCOMES[rule.action]
        row.reason = rule.reason or f"rule {rule.name!r} says {rule.action}"
        if rule.action == oc.ARCHIVE:
            row.archive_payload = memo.archive_payload(rule.archive_payload, cols, i)
    for row in rows:
        if row.outcome == oc.LOOP_GUARDED:
            row.archive_payload = memo.archive_payload(None, cols, row.index)
    for row, rule in pending_fixes.pop(None, []):
        row.outcome, row.reason = oc.TO_REPUBLISH, f"rule {rule.name!r} says republish"
        row.send_original = True
        row.out_properties = _lineage(cols.properties(row.index), row, rule, cols, settings)
    for fix_ref, entries in pending_fixes.items():
        records = _fix_records(cols, [row.index for row, _ in entries])
        timeout = entries[0][1].fix_timeout_seconds
        function = load_fix(fix_ref) if fix_ref else None
        results: list[FixOutcome] = run_fix(function, records, timeout_s=timeout)
        for (row, rule), record, result in zip(entries, records, results, strict=True):
            _apply_fix_outcome(row, rule, record, result, cols, settings)
            if row.outcome == oc.ARCHIVED:
                row.archive_payload = memo.archive_payload(None, cols, row.index)
    return _to_batch(batch, rows, sequencer)


def _lineage(
    properties: dict[str, str], row: _Row, rule: Any, cols: _Columns, settings: DecideSettings
) -> dict[str, str]:
    i = row.index
    return republish_properties(
        properties,
        replay_id=cols["replay_id"][i],
        run_id=settings.run_id,
        previous_count=int(cols["replay_count"][i]),
        dlq_topic=cols["dlq_topic"][i],
        fix_label=rule.fix_label,
    )


def _republish_target(origin: str | None, settings: DecideSettings) -> tuple[str | None, str | None]:
    from spark_apps.dlq_replay.topics import republish_target

    if not origin:
        return None, "the error context names no origin topic"
    target = republish_target(origin)
    if target is None:
        return None, f"origin topic {_quote(origin)} is not a valid topic name"
    if settings.allowlist is None:
        return target, "no --origin-allowlist given: nothing may be republished"
    if not settings.allowlist.matches(target):
        return target, f"origin topic {_quote(target)} is not in --origin-allowlist"
    return target, None


def _decide_republish(
    row: _Row, rule: Any, count: int, origin: str | None, settings: DecideSettings, memo: _Memo
) -> None:
    row.fix = rule.fix_label or None
    if count >= settings.max_replays:
        row.outcome = oc.LOOP_GUARDED
        row.reason = f"loop guard: REPLAY_COUNT {count} >= --max-replays {settings.max_replays}"
        return
    if settings.mode == oc.ARCHIVE_ONLY:
        row.outcome, row.reason = oc.SKIPPED, "republish is disabled in archive-only mode"
        return
    row.target, refused = memo.target(origin)
    if refused is not None:
        row.outcome, row.reason = oc.ORIGIN_REFUSED, refused


def _fix_records(cols: _Columns, indices: list[int]) -> list[FixRecord]:
    """Rows ``indices`` as the records a fix receives, in order."""
    from spark_apps.dlq_replay.fixes import FixRecord

    names = [name for name, _ in CONTEXT_COLUMNS]
    contexts = zip(*([cols[name][i] for i in indices] for name in names), strict=True)
    payloads, keys, ordering_keys = cols["value"], cols["key"], cols["ordering_key"]
    event_times, signatures = cols["event_time"], cols["signature"]
    dlq_topics, dlq_ids = cols["dlq_topic"], cols["dlq_message_id"]
    return [
        FixRecord(
            payload=payloads[i] or b"",
            key=keys[i],
            ordering_key=ordering_keys[i],
            properties=cols.properties(i),
            event_time=event_times[i],
            context=dict(zip(names, context, strict=True)),
            signature=signatures[i],
            dlq_topic=dlq_topics[i],
            dlq_message_id=dlq_ids[i],
        )
        for i, context in zip(indices, contexts, strict=True)
    ]


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


#: Decided column -> :class:`_Row` field, for :func:`_to_batch` (which turns ``out_value`` and
#: ``send_original`` into the ``out_value`` column).
_ROW_COLUMNS = {
    "rule": "rule",
    "action": "action",
    "outcome": "outcome",
    "outcome_reason": "reason",
    "target_topic": "target",
    "fix": "fix",
    "fix_error": "fix_error",
    "archive_payload": "archive_payload",
    "out_properties": "out_properties",  # dicts: pyarrow builds map arrays from them
    "out_value": "out_value",
    "send_original": "send_original",
}
_ROW_VALUES = attrgetter(*_ROW_COLUMNS.values())


def _to_batch(batch: pa.RecordBatch, rows: list[_Row], sequencer: ProducerSequencer | None) -> pa.RecordBatch:
    import pyarrow.compute as pc

    schema = arrow_schema(DECIDED_SCHEMA)
    n = len(rows)
    # One pass over the rows: a tuple of values per field.
    by_row = zip(*map(_ROW_VALUES, rows), strict=True)
    decided: dict[str, Sequence[Any]] = (
        dict(zip(_ROW_COLUMNS, by_row, strict=True)) if rows else dict.fromkeys(_ROW_COLUMNS, ())
    )
    send_original = pa.array(decided.pop("send_original"), pa.bool_())
    out_values = decided.pop("out_value")
    outcomes, targets = decided["outcome"], decided["target_topic"]
    original = batch.column("value")
    no_value = pa.nulls(n, original.type)
    archive = pa.array([outcome in oc.ARCHIVE_OUTCOMES for outcome in outcomes], pa.bool_())
    computed: dict[str, pa.Array] = {
        # Payloads stay in Arrow: the original where it is sent unchanged, else the fix's output.
        "out_value": pc.if_else(send_original, original, pa.array(out_values, original.type)),
        # The original payload, properties and stack are kept only where the archive needs them.
        "value": pc.if_else(archive, original, no_value),
    }
    for name in ("properties", "error_stack"):
        column = batch.column(name)
        computed[name] = pc.if_else(archive, column, pa.nulls(n, column.type))
    if sequencer is not None:
        computed["replay_producer"], computed["sequence_id"] = sequencer.assign(outcomes, targets)
    decided["replay_producer"] = decided["sequence_id"] = [None] * n
    arrays = []
    for field in schema:
        if field.name in computed:
            arrays.append(computed[field.name].cast(field.type))
        elif field.name in decided:
            arrays.append(pa.array(decided[field.name], type=field.type))
        else:
            arrays.append(batch.column(field.name).cast(field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def decide(
    snapshot: DataFrame,
    playbook: Playbook,
    settings: DecideSettings,
    producers_per_target: int,
    filters: Filters | None = None,
    final_ids: DataFrame | None = None,
    reviewed_ids: DataFrame | None = None,
    identities: DataFrame | None = None,
) -> DataFrame:
    """Snapshot rows -> decided rows (:data:`DECIDED_SCHEMA`): one outcome per row, fixes applied.

    A light pass over the payload-free rows finds the replay ids and marks already-final and duplicate
    messages and the ``--max-messages`` choice (:func:`scope_marks`; ``final_ids`` as described
    there; ``identities``: its rows, when the snapshot's read tasks wrote them); then one Python pass per
    row: normalise, scope, decide. Runs in at most
    ``producers_per_target`` tasks; task ``b`` sends to each target through producer bucket ``b`` (see
    :class:`ProducerSequencer`).
    """
    from spark_apps.dlq_replay.arrow_compat import map_in_arrow

    return map_in_arrow(
        *decide_tasks(
            snapshot,
            playbook,
            settings,
            producers_per_target,
            filters,
            final_ids,
            reviewed_ids,
            identities=identities,
        ),
        DECIDED_SCHEMA,
    )


def decide_tasks(
    snapshot: DataFrame,
    playbook: Playbook,
    settings: DecideSettings,
    producers_per_target: int,
    filters: Filters | None = None,
    final_ids: DataFrame | None = None,
    reviewed_ids: DataFrame | None = None,
    snapshot_dir: str | None = None,
    batch_rows: int = 10_000,
    identities: DataFrame | None = None,
) -> tuple[DataFrame, Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]]:
    """:func:`decide` as its input frame (one partition per producer bucket) and the function each task
    runs over its Arrow batches, giving :data:`DECIDED_SCHEMA` batches: for a caller that writes the
    decisions from the tasks (:mod:`~spark_apps.dlq_replay.task_parquet`).

    ``snapshot_dir``: the local folder of a snapshot its read tasks wrote. With at most
    :data:`~spark_apps.dlq_replay.snapshot_files.DRIVER_MARKS` marked rows, the tasks then read their
    share of its row groups themselves, in batches of ``batch_rows`` (:mod:`~spark_apps.dlq_replay.
    snapshot_files`); otherwise Spark reads the snapshot and joins the marks. ``identities``: the
    snapshot's :func:`identity_rows`, when its read tasks wrote them (see :func:`scope_marks`)."""
    from spark_apps.dlq_replay.snapshot_files import DRIVER_MARKS, bucket_batches, row_group_units

    chosen_filters = filters or Filters()
    precedence = playbook.origin_precedence
    n = max(1, producers_per_target)
    marked, count = scope_marks(snapshot, chosen_filters, final_ids, precedence, reviewed_ids, identities)
    units: list[tuple[str, int]] | None = None
    marks: dict[tuple[str, str], tuple[str, str | None]] = {}
    if snapshot_dir is not None and count <= DRIVER_MARKS:
        units = row_group_units(snapshot_dir)
        marks = {(r[0], r[1]): (r[2], r[3]) for r in marked.collect()} if count else {}
        frame = snapshot.sparkSession.range(n, numPartitions=n)
    else:
        frame = _buckets(_join_marks(snapshot, marked, count), n)
    snapshot_columns = [field.name for field in snapshot.schema.fields]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from spark_apps.dlq_replay.normalize import normalize_batch, normalize_columns

        context = TaskContext.get()
        bucket = context.partitionId() if context else 0
        sequencer = ProducerSequencer(settings.run_id, bucket)
        if units is not None:  # the input is this bucket's id: read its share of the snapshot's files
            batches = bucket_batches(
                units, bucket, n, snapshot_columns, marks, (_MARK, _MARK_REASON), batch_rows
            )
        for batch in batches:
            columns = normalize_columns(batch, precedence)
            add_scope_columns(batch, columns, chosen_filters)
            yield decide_batch(normalize_batch(batch, columns), playbook, settings, sequencer, columns)

    return frame, run


def _buckets(df: DataFrame, n: int) -> DataFrame:
    """``df`` in exactly ``n`` partitions, one per producer bucket: merged without a shuffle when there
    are more (a large snapshot), spread round-robin when there are fewer (a small one)."""
    return df.coalesce(n) if df.rdd.getNumPartitions() >= n else df.repartition(n)


# --------------------------------------------------------------------------- producers (executors)


def run_hash(run_id: str) -> str:
    return hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:12]


class ProducerSequencer:
    """Names the producer of each ``to_republish`` row of one decide task and numbers its sends.

    ``dlq-replay-<hash(run_id)>-<hash(target)>-<bucket>``, where ``bucket`` is the decide task, with
    sequence ids 0, 1, 2 ... per producer in the task's row order. The decisions are persisted before
    anything is sent, so a retried apply sends the same (producer, sequence) pairs: exact under Pulsar
    broker deduplication. One task per bucket means one producer name is never numbered twice.
    """

    def __init__(self, run_id: str, bucket: int) -> None:
        self.prefix = f"dlq-replay-{run_hash(run_id)}-"
        self.suffix = f"-{bucket}"
        self.names: dict[str, str] = {}
        self.next_seq: dict[str, int] = {}

    def assign(
        self, outcomes: Sequence[str | None], targets: Sequence[str | None]
    ) -> tuple[pa.Array, pa.Array]:
        names: list[str | None] = []
        seqs: list[int | None] = []
        for outcome, target in zip(outcomes, targets, strict=True):
            if outcome != oc.TO_REPUBLISH or target is None:
                names.append(None)
                seqs.append(None)
                continue
            name = self.names.get(target)
            if name is None:
                digest = hashlib.sha256(target.encode("utf-8")).hexdigest()[:8]
                name = self.names[target] = f"{self.prefix}{digest}{self.suffix}"
            seq = self.next_seq.get(name, 0)
            self.next_seq[name] = seq + 1
            names.append(name)
            seqs.append(seq)
        return pa.array(names, pa.string()), pa.array(seqs, pa.int64())
