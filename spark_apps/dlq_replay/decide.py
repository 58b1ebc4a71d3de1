"""Decide step: scope marks in Spark SQL, then per Arrow batch of each decide task: normalise, scope, match
the playbook (once per group of equal rows), run the fixes and number the sends (:class:`ProducerSequencer`).
No step shuffles the messages themselves."""

from __future__ import annotations

import hashlib
import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pulsar_dlq_consumer.context import canonical_topic
from pulsar_dlq_consumer.replay_lock import run_hash
from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.arrow_util import each_id, group_ids, return_free_memory
from spark_apps.dlq_replay.context_columns import ORIGIN_CONFLICT, UNDECODABLE
from spark_apps.dlq_replay.fixes import FixOutcome, FixRecord, load_fix, run_fix
from spark_apps.dlq_replay.group_actions import override_rule
from spark_apps.dlq_replay.lineage import lineage_maps
from spark_apps.dlq_replay.normalize import normalize_columns
from spark_apps.dlq_replay.playbook import MatchInput, Playbook
from spark_apps.dlq_replay.schemas import (
    CONTEXT_COLUMNS,
    DECIDED_SCHEMA,
    IDENTITIES_SCHEMA,
    REPLAY_ID_MARK,
    SCOPE_COLUMN,
    arrow_schema,
)
from spark_apps.dlq_replay.scope import (
    MARK,
    MARK_REASON,
    MARKS_SCHEMA,
    SCOPE_IN,
    SCOPE_REASON_COLUMN,
    Filters,
    add_scope_columns,
    repeated_ids,
    scope_marks,
)
from spark_apps.dlq_replay.task_parquet import Marks, bucket_batches, read_frame, row_group_units, write_frame

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from datetime import datetime

    from pyspark.sql import DataFrame

    from spark_apps.dlq_replay.run_context import Run
    from spark_apps.dlq_replay.topics import TopicMatcher


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


@dataclass(slots=True)
class _Row:
    """One group's decision, its fields named as the decided columns (:data:`_FIELDS`)."""

    outcome: str | None = None
    outcome_reason: str | None = None
    rule: str | None = None
    action: str | None = None
    target_topic: str | None = None
    fix: str | None = None
    fix_error: str | None = None
    archive_payload: bool | None = None  # kept only where the row ends archived
    pending: Any = None  # the republish rule whose fix is still to run on the row
    quotes_row: bool = False  # the reason quotes the row's own values (its mark's, its REPLAY_COUNT)


class _Columns(dict[str, list[Any]]):
    """Columns of one Arrow batch, and of the arrays computed beside it, as Python lists, each converted
    on first use. Also the :class:`~spark_apps.dlq_replay.fixes.RecordSource` of the batch's records."""

    def __init__(self, batch: pa.RecordBatch, arrays: dict[str, pa.Array]) -> None:
        super().__init__()
        self.batch, self.arrays = batch, arrays

    def array(self, name: str) -> pa.Array:
        return self.arrays[name] if name in self.arrays else self.batch.column(name)

    def properties(self, i: int) -> dict[str, str]:
        return dict(self.batch.column("properties")[i].as_py() or [])

    def field(self, name: str, i: int) -> Any:
        if name == "properties":
            return self.properties(i)
        if name == "context":
            return {name: self[name][i] for name, _ in CONTEXT_COLUMNS}
        return self[name][i]

    def __missing__(self, name: str) -> list[Any]:
        self[name] = values = self.array(name).to_pylist()
        return values


#: Decided column (a :class:`_Row` field of the same name) -> Arrow type.
_TEXTS = ("rule", "action", "outcome", "outcome_reason", "target_topic", "fix", "fix_error")
_FIELDS: dict[str, pa.DataType] = {**dict.fromkeys(_TEXTS, pa.string()), "archive_payload": pa.bool_()}
#: Outcome of a rule's action (republish is decided by :func:`_decide_republish`).
_RULE_OUTCOMES = {oc.SKIP: oc.SKIPPED, oc.DROP: oc.DROPPED, oc.ARCHIVE: oc.ARCHIVED}
_ARCHIVE_OUTCOMES = pa.array(sorted(oc.ARCHIVE_OUTCOMES), pa.string())
#: The columns of a :class:`~spark_apps.dlq_replay.playbook.MatchInput` of the same names (the message last).
_MATCH_COLUMNS = ("signature", "error_class", "origin_topic", "context_format", "error_message")
#: What a decision reads of a row besides the match columns (the message only when a rule matches on it).
_DECISION_INPUTS = (SCOPE_COLUMN, UNDECODABLE, ORIGIN_CONFLICT, "replay_count", "dlq_topic")
#: Longest piece of a message (a topic, a property value) quoted in an outcome reason.
_QUOTE_CHARS = 120
_UNDECODABLE_REASON = (
    "message properties or key are not valid UTF-8, so the error context cannot be read; "
    "inspect the message with a client that shows raw bytes"
)
_CONFLICT = (
    "the error context names different origin topics: {}; add `origin_precedence` to the playbook to say "
    "which property wins"
)
_NO_CONVENTION = (
    "no known DLQ property convention: none of REAL_TOPIC, ORIGIN_MESSAGE_ID, RECONSUMETIMES, "
    "RETRY_TOPIC, __dlq.errors.*, __connect.errors.*, kafka_dlt-* is set"
)


def _quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 4] + "...'"


def _parked(cols: _Columns, i: int) -> tuple[str, str | None, bool] | None:
    """``(outcome, reason, quotes the row)`` of a row out of scope or parked, else ``None``."""
    scope = cols[SCOPE_COLUMN][i]
    if scope != SCOPE_IN:
        return scope, cols[SCOPE_REASON_COLUMN][i], True
    if cols[UNDECODABLE][i]:
        return oc.MALFORMED, _UNDECODABLE_REASON, False
    if cols["context_format"][i] == "none":
        return oc.MALFORMED, _NO_CONVENTION, False
    if cols["replay_count"][i] is None:
        raw = cols.properties(i).get("REPLAY_COUNT")
        return oc.MALFORMED, f"REPLAY_COUNT property {_quote(raw)} is not a non-negative integer", True
    conflicts = cols[ORIGIN_CONFLICT][i]
    if conflicts:
        return oc.ORIGIN_CONFLICT, _CONFLICT.format(conflicts), False
    return None


def decide_batch(
    batch: pa.RecordBatch,
    playbook: Playbook,
    settings: DecideSettings,
    sequencer: ProducerSequencer | None = None,
    columns: dict[str, pa.Array] | None = None,
) -> pa.RecordBatch:
    """Decide every row of one Arrow batch of scoped rows (:data:`DECIDED_SCHEMA`), reading ``columns`` (its
    normalised and scope columns) before ``batch``; without a ``sequencer`` the producer columns stay null."""
    cols = _Columns(batch, columns or {})
    codes, firsts = _decision_groups(cols, playbook)
    decided = _Decisions(cols, [_decide_row(cols, playbook, settings, i) for i in firsts], codes)
    decided.run_fixes()
    return _to_batch(decided, sequencer, settings.run_id)


def _decide_row(cols: _Columns, playbook: Playbook, settings: DecideSettings, i: int) -> _Row:
    """Row ``i``'s decision, a fix left pending (``outcome`` ``None``, ``pending`` the rule)."""
    row = _Row()
    parked = _parked(cols, i)
    if parked is not None:
        row.outcome, row.outcome_reason, row.quotes_row = parked
        return row
    values = {name: cols[name][i] for name in _MATCH_COLUMNS}
    rule = playbook.first_match(MatchInput(**values, properties=cols.properties(i)))
    approved = (settings.group_actions or {}).get(cols["signature"][i])
    rule = rule if approved is None else override_rule(approved, rule)
    if rule is None:
        row.action, row.outcome, row.outcome_reason = oc.SKIP, oc.SKIPPED, "no playbook rule matched"
        return row
    row.rule, row.action = rule.name, rule.action
    wanted = settings.archive_payload if rule.archive_payload is None else rule.archive_payload
    row.archive_payload = wanted and not playbook.payload_off(cols["dlq_topic"][i], cols["origin_topic"][i])
    if rule.action == oc.REPUBLISH:
        _decide_republish(row, rule, cols["replay_count"][i], cols["origin_topic"][i], settings)
    else:
        row.outcome = _RULE_OUTCOMES[rule.action]
        row.outcome_reason = rule.reason or f"rule {rule.name!r} says {rule.action}"
    return row


def _decide_republish(row: _Row, rule: Any, count: int, origin: str | None, settings: DecideSettings) -> None:
    """A republish rule's decision: loop guard, archive-only mode, origin checks, then republish or a fix."""
    row.fix = rule.fix_label or None
    if count >= settings.max_replays:
        row.outcome = oc.LOOP_GUARDED
        row.outcome_reason = f"loop guard: REPLAY_COUNT {count} >= --max-replays {settings.max_replays}"
        return
    if settings.mode == oc.ARCHIVE_ONLY:
        row.outcome, row.outcome_reason = oc.SKIPPED, "republish is disabled in archive-only mode"
        return
    # The partitioned topic, not one partition, so the producer routes by key again.
    row.target_topic = target = canonical_topic(origin)
    if not origin:
        refused = "the error context names no origin topic"
    elif target is None:
        refused = f"origin topic {_quote(origin)} is not a valid topic name"
    elif settings.allowlist is None:
        refused = "no --origin-allowlist given: nothing may be republished"
    elif not settings.allowlist.matches(target):
        refused = f"origin topic {_quote(target)} is not in --origin-allowlist"
    elif rule.fix is not None:
        row.pending = rule
        return
    else:
        row.outcome, row.outcome_reason = oc.TO_REPUBLISH, f"rule {rule.name!r} says republish"
        return
    row.outcome, row.outcome_reason = oc.ORIGIN_REFUSED, refused


def _decision_groups(cols: _Columns, playbook: Playbook) -> tuple[pa.Array, list[int]]:
    """``(group of each row, first row of each group)``: rows equal in every column a decision reads (the
    message when a rule matches on it, the value of each property a rule matches on) share a group."""
    rules = playbook.rules
    inputs = [cols.array(name) for name in (*_DECISION_INPUTS, *_MATCH_COLUMNS[:-1])]
    if any(rule.error_message is not None for rule in rules):
        inputs.append(cols.array("error_message"))
    properties = cols.batch.column("properties")
    keys = dict.fromkeys(condition.key for rule in rules for condition in rule.properties)
    inputs += [pc.map_lookup(properties, key, "last") for key in keys]  # the value a dict of them keeps
    codes = group_ids(inputs)  # numbered 0, 1, ... in the order of their first rows
    return codes, np.unique(codes.to_numpy(), return_index=True)[1].tolist()


class _Decisions:
    """The decided columns of one batch: each group's decision spread to its rows, then the per-row
    parts (the reasons that quote a row's own values, the fixes' outcomes) put in."""

    def __init__(self, cols: _Columns, rows: list[_Row], codes: pa.Array) -> None:
        self.cols, self.rows, self.codes = cols, rows, codes
        self.columns: dict[str, pa.Array] = {
            name: pa.array([getattr(row, name) for row in rows], dtype).take(codes)
            for name, dtype in _FIELDS.items()
        }
        self.out_values: pa.Array = pa.nulls(cols.batch.num_rows, pa.binary())
        self.fix_properties: pa.Array | None = None  # the properties a fix gave (null: none given)
        quoting = [g for g, row in enumerate(rows) if row.quotes_row]
        if quoting:  # reasons that quote a row's own values (its mark's, its REPLAY_COUNT)
            mask = pc.is_in(codes, value_set=pa.array(quoting, pa.int64()))
            reasons = [_parked(cols, i) for i in pc.indices_nonzero(mask).to_pylist()]
            self._put("outcome_reason", mask, [parked[1] if parked else None for parked in reasons])

    def _put(self, name: str, mask: pa.Array, values: list[Any]) -> None:
        column = self.columns[name]
        self.columns[name] = pc.replace_with_mask(column, mask, pa.array(values, column.type))

    def run_fixes(self) -> None:
        """Run each pending fix on its rows (one call per fix and time limit) and put the outcomes in."""
        by_fix: dict[tuple[str, float], list[int]] = {}
        for g, row in enumerate(self.rows):
            if row.pending is not None:
                by_fix.setdefault((row.pending.fix, row.pending.fix_timeout_seconds), []).append(g)
        cols = self.cols
        given: list[list[tuple[str, str]] | None] = [None] * cols.batch.num_rows
        for (fix_ref, timeout_s), groups in by_fix.items():
            mask = pc.is_in(self.codes, value_set=pa.array(groups, pa.int64()))
            indices = pc.indices_nonzero(mask)
            rules = [self.rows[g].pending for g in self.codes.take(indices).to_pylist()]
            indices = indices.to_pylist()
            records = [FixRecord.lazy(cols, i, cols["value"][i] or b"") for i in indices]
            results = run_fix(load_fix(fix_ref), records, timeout_s=timeout_s)
            updates = [_fix_outcome(rule, result) for rule, result in zip(rules, results, strict=True)]
            for k, name in enumerate(("outcome", "outcome_reason", "fix_error")):
                self._put(name, mask, [update[k] for update in updates])
            fixed = [result.payload if result.ok else None for result in results]
            self.out_values = pc.replace_with_mask(self.out_values, mask, pa.array(fixed, pa.binary()))
            for i, result in zip(indices, results, strict=True):
                if result.ok and result.properties is not None:
                    given[i] = list(result.properties.items())
        if any(p is not None for p in given):
            self.fix_properties = pa.array(given, cols.batch.column("properties").type)


def _fix_outcome(rule: Any, result: FixOutcome) -> tuple[str, str, str | None]:
    """``(outcome, reason, fix error)`` of a row whose fix gave ``result``."""
    if result.ok:
        return oc.TO_REPUBLISH, f"rule {rule.name!r} says republish", None
    if result.malformed:
        return oc.MALFORMED, f"fix {rule.fix} found the record malformed", result.error
    if rule.on_fix_error == oc.ON_FIX_ERROR_ARCHIVE and not result.aborted:  # a broken fix: kept pending
        return oc.ARCHIVED, f"fix {rule.fix} failed; rule says on_fix_error: archive", result.error
    return oc.FIX_FAILED, f"fix {rule.fix} failed", result.error


def _to_batch(decided: _Decisions, sequencer: ProducerSequencer | None, run_id: str) -> pa.RecordBatch:
    cols, columns = decided.cols, decided.columns
    n = cols.batch.num_rows
    outcomes = columns["outcome"]
    sending = pc.fill_null(pc.equal(outcomes, oc.TO_REPUBLISH), False)
    archive = pc.fill_null(pc.is_in(outcomes, value_set=_ARCHIVE_OUTCOMES), False)
    original, properties = cols.array("value"), cols.array("properties")
    if decided.fix_properties is not None:  # lineage set on the properties a fix gave, else the row's own
        properties = pc.if_else(decided.fix_properties.is_valid(), decided.fix_properties, properties)
    computed: dict[str, pa.Array] = {
        **columns,
        "archive_payload": pc.if_else(archive, columns["archive_payload"], pa.nulls(n, pa.bool_())),
        "out_value": pc.if_else(sending, pc.coalesce(decided.out_values, original), pa.nulls(n, pa.binary())),
        "out_properties": lineage_maps(
            properties,
            sending,
            cols.array("replay_id"),
            run_id,
            cols.array("replay_count"),
            cols.array("dlq_topic"),
            pc.fill_null(columns["fix"], ""),
        ),
        "replay_producer": pa.nulls(n, pa.string()),
        "sequence_id": pa.nulls(n, pa.int64()),
    }
    for name in ("value", "properties", "error_stack"):
        column = cols.array(name)
        computed[name] = pc.if_else(archive, column, pa.nulls(n, column.type))
    if sequencer is not None:
        assigned = sequencer.assign(outcomes.to_pylist(), columns["target_topic"].to_pylist())
        computed["replay_producer"], computed["sequence_id"] = assigned
    schema = arrow_schema(DECIDED_SCHEMA)
    arrays = [(computed[f.name] if f.name in computed else cols.array(f.name)).cast(f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def run_decide(run: Run, snapshot: DataFrame, planned_at: datetime) -> DataFrame:
    """Decide in one Spark task per producer bucket, each reading its share of the snapshot's files and
    writing its decisions (and, unless a dry-run, its archived rows) itself."""
    from pulsar_dlq_consumer.replay_options import DEFAULT_WAVE_SIZE
    from spark_apps.dlq_replay import task_parquet
    from spark_apps.dlq_replay.archive_files import staged_output
    from spark_apps.dlq_replay.group_actions import reviewed_ids
    from spark_apps.dlq_replay.ledger import final_ids, read_ledger
    from spark_apps.dlq_replay.task_sends import wave_blocks

    opts = run.options
    if run.step("decide"):
        started = time.monotonic()
        ledger = read_ledger(run.spark, run.storage, run.paths.ledger)
        allowlist, group_actions = opts.allowlist_matcher(), opts.group_actions
        settings = DecideSettings(
            opts.run_id, opts.mode, opts.max_replays, allowlist, opts.archive_payload, group_actions
        )
        frame, decide_task = decide_tasks(
            snapshot,
            run.playbook,
            settings,
            run.buckets,
            filters=Filters(opts.signatures, opts.error_class, opts.since, opts.until, opts.max_messages),
            final_ids=final_ids(ledger, exclude_run_id=opts.run_id),
            reviewed_ids=reviewed_ids(run),
            snapshot_dir=run.paths.snapshot,
            marks_dir=run.paths.decide_marks,
            batch_rows=run.batch_rows,
        )
        return_free_memory()  # the marks' working memory, before the driver waits out decide and apply
        # The archived rows are staged beside the decisions; apply moves them into the archive.
        sides = [staged_output(run.paths.archive_staged, planned_at)] if opts.mode != oc.DRY_RUN else []
        run.progress.count_files(run.paths.decisions)
        tallies = task_parquet.write_in_tasks(
            frame,
            decide_task,
            DECIDED_SCHEMA,
            run.paths.decisions,
            _sending_tally,
            ("n", "last"),
            sides,
            row_groups_by=wave_blocks(opts.wave_size or DEFAULT_WAVE_SIZE),  # each wave's own row groups
        )
        run.done(
            "decide",
            started,
            to_republish=sum(t[0] or 0 for t in tallies),
            max_sequence_id=max((int(t[1]) for t in tallies if t[1] is not None), default=-1),
            producers_per_target=run.buckets,
        )
    return read_frame(run.spark, run.paths.decisions, DECIDED_SCHEMA)


def _sending_tally(batch: pa.RecordBatch) -> tuple[int, int | None]:
    """``(rows to republish, their highest sequence id or None)`` of a batch of decisions."""
    sending = pc.equal(batch.column("outcome"), oc.TO_REPUBLISH)
    return sending.true_count, pc.max(pc.filter(batch.column("sequence_id"), sending)).as_py()


def decide_tasks(
    snapshot: DataFrame,
    playbook: Playbook,
    settings: DecideSettings,
    producers_per_target: int,
    *,
    snapshot_dir: str,
    marks_dir: str,
    filters: Filters | None = None,
    final_ids: DataFrame | None = None,
    reviewed_ids: DataFrame | None = None,
    batch_rows: int = 10_000,
) -> tuple[DataFrame, Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]]:
    """The decide pass as its input frame (one row per producer bucket) and the function each task runs:
    with the scope marks written to ``marks_dir`` (from the replay ids of the snapshot's files at
    ``snapshot_dir``), task ``b`` decides its share of the snapshot (:data:`DECIDED_SCHEMA`), sending
    through producer ``b``."""
    filters = filters or Filters()
    precedence = playbook.origin_precedence
    n = producers_per_target
    identities = repeated = None
    if filters.max_messages is None:  # else the marks choose the first messages from the whole context
        identities = read_frame(snapshot.sparkSession, snapshot_dir, IDENTITIES_SCHEMA)
        repeated = repeated_ids(snapshot.sparkSession, snapshot_dir, n)
    marked, count = scope_marks(snapshot, filters, final_ids, precedence, reviewed_ids, identities, repeated)
    if count:
        write_frame(marked, marks_dir, MARKS_SCHEMA)
    marked.unpersist()
    units = row_group_units(snapshot_dir)
    names = [*snapshot.columns, REPLAY_ID_MARK]  # the snapshot columns each task reads

    def run(bucket: int) -> Iterator[pa.RecordBatch]:  # the task reads its bucket's share itself
        sequencer = ProducerSequencer(settings.run_id, bucket)
        marks = Marks.read(marks_dir) if count else None
        for batch in bucket_batches(units, bucket, n, names, marks, (MARK, MARK_REASON), batch_rows):
            columns = normalize_columns(batch, precedence, batch.column(REPLAY_ID_MARK))
            add_scope_columns(batch, columns, filters)
            yield decide_batch(batch, playbook, settings, sequencer, columns)

    return snapshot.sparkSession.range(n, numPartitions=n), each_id(run)


class ProducerSequencer:
    """Names the producer of each ``to_republish`` row of one decide task and numbers its sends:
    ``dlq-replay-<hash(run_id)>-<hash(target)>-<bucket>``, ``bucket`` the decide task (so no producer name
    is numbered twice), with sequence ids 0, 1, 2 ... per producer in the task's row order."""

    def __init__(self, run_id: str, bucket: int) -> None:
        self.run, self.bucket = run_hash(run_id), bucket
        self.producers: dict[str, tuple[str, Iterator[int]]] = {}  # per target: name, sequence ids

    def _next(self, target: str) -> tuple[str, int]:
        if target not in self.producers:
            digest = hashlib.sha256(target.encode("utf-8")).hexdigest()[:8]
            self.producers[target] = (f"dlq-replay-{self.run}-{digest}-{self.bucket}", itertools.count())
        name, numbers = self.producers[target]
        return name, next(numbers)

    def assign(self, outcomes: list[str | None], targets: list[str | None]) -> tuple[pa.Array, pa.Array]:
        pairs = [
            self._next(target) if outcome == oc.TO_REPUBLISH and target is not None else (None, None)
            for outcome, target in zip(outcomes, targets, strict=True)
        ]
        names, seqs = zip(*pairs, strict=True) if pairs else ((), ())
        return pa.array(names, pa.string()), pa.array(seqs, pa.int64())
