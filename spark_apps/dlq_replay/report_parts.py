"""The report's group aggregates and representative messages, gathered by the record tasks.

Aggregating the ledger and the decisions with Spark queries would read every message of the run again.
The record tasks (:mod:`~spark_apps.dlq_replay.record`; in a dry run they write these parts only) each
already hold their bucket's ledger rows and decisions, so each keeps what the report needs of them and
writes it to ``runs/<run>/report_parts/<kind>/part-<bucket>.parquet``:

- ``combos``: per (signature, outcome, action, rule) of the ledger rows, the count, the smallest template,
  error class, origin topic and reason, and the first and last publish time;
- ``formats``: the distinct context formats of each such combination;
- ``samples``: each combination's first :data:`SAMPLE_IDS` messages by
  (publish time, DLQ topic, message id);
- ``reps``: each signature's first :data:`REP_ROWS` decisions by (unscoped, publish time, DLQ topic,
  message id); the properties (and payloads) of the few shown are read from the snapshot by
  :func:`snapshot_messages`;
- ``errors``: each signature's first :data:`SAMPLE_ERRORS`
  distinct error messages (their first 500 characters) by (first publish time, message). How often each
  occurs is not bounded by the groups: :func:`error_counts` counts the few shown in one pass over the
  decisions' columns. A bucket with a message without a publish time (which no Pulsar message lacks)
  writes no such part: Spark's first time ignores nulls, so a part's first rows would not be exact.

Every part is bounded by the number of groups, not of messages, and merges exactly: a sum, a minimum, a
maximum, a union, or the first rows of a union (the first k of all are among the first k of each part).
:func:`read_parts` merges the buckets' parts into the run's groups, samples, representatives and errors.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.arrow_util import group_ids, row_numbers
from spark_apps.dlq_replay.outcomes import UNSCOPED

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    import pyarrow as pa

#: What a group of the report is counted by.
COMBO_KEYS = ("signature", "outcome", "action", "rule")
#: The order of a group's sample message ids.
SAMPLE_ORDER = ("publish_time", "dlq_topic", "dlq_message_id")
#: The order of a signature's representatives: messages the playbook was applied to first.
REP_ORDER = ("unscoped", "publish_time", "dlq_topic", "dlq_message_id")
#: Representatives kept per signature (enough for the payload samples of a report).
REP_ROWS = 2
#: The decisions' columns a representative keeps (its order adds ``unscoped``).
REP_COLUMNS = (
    "signature",
    "dlq_topic",
    "dlq_message_id",
    "error_class",
    "error_message",
    "origin_topic",
    "context_format",
    "outcome",
    "outcome_reason",
    "rule",
    "publish_time",
)
#: Rows gathered before a bucket's parts are reduced (bounds a record task's memory).
REDUCE_ROWS = 16_384
#: Reduced chunks kept before they are merged into one.
MERGE_EVERY = 8
KINDS = ("combos", "formats", "samples", "reps", "errors")
#: The order of a signature's sample errors.
ERROR_ORDER = ("first", "message")
#: A combination's aggregates, from ledger rows (``None``: count the rows) and from earlier aggregates.
_COMBO_NAMES = ("n", "template", "error_class", "origin_topic", "reason", "first", "last")
_COMBO_ROWS: tuple[tuple[str | None, str], ...] = (
    (None, "count_all"),
    ("error_template", "min"),
    ("error_class", "min"),
    ("origin_topic", "min"),
    ("reason", "min"),
    ("publish_time", "min"),
    ("publish_time", "max"),
)
#: The same aggregates merged: counts summed, minima and maxima taken again, by their names.
_COMBO_PARTS: tuple[tuple[str | None, str], ...] = tuple(
    (name, "sum" if function == "count_all" else function)
    for name, (_, function) in zip(_COMBO_NAMES, _COMBO_ROWS, strict=True)
)
_COMBO_COLUMNS = (*COMBO_KEYS, "error_template", "error_class", "origin_topic", "reason", "context_format")

#: Message ids shown per group (its first by publish time).
SAMPLE_IDS = 5
#: Distinct error messages shown per signature, and the characters kept of each.
SAMPLE_ERRORS = 3
ERROR_CHARS = 500


def first_k(table: pa.Table, keys: Sequence[str], order: Sequence[str], k: int) -> pa.Table:
    """The rows of ``table`` among the first ``k`` of their ``keys`` by ``order`` (ascending, nulls
    first, as Spark orders), sorted by keys then order.

    The rows are ranked by an integer group id and the order columns, and only the rows kept are taken
    and sorted by their keys: the strings of the keys are compared for a few rows, not for all."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return table
    group = group_ids([table.column(name) for name in keys])
    ranked = pa.table({"_group": group, **{name: table.column(name) for name in order}})
    indices = _sort_indices(ranked, ["_group", *order])
    sorted_group = group.take(indices)
    n = len(indices)
    starts_here = pa.concat_arrays(
        [pa.array([True]), _array(pc.not_equal(sorted_group.slice(1), sorted_group.slice(0, n - 1)))]
    )
    run = pc.subtract(pc.cumulative_sum(starts_here.cast(pa.int64())), 1)
    position = row_numbers(n)
    start = pc.indices_nonzero(starts_here).take(run).cast(pa.int64())
    kept = table.take(indices.filter(pc.less(pc.subtract(position, start), k)))
    return kept.take(_sort_indices(kept, [*keys, *order]))


def _sort_indices(table: pa.Table, names: Sequence[str]) -> pa.Array:
    """Indices sorting ``table`` by ``names`` ascending, nulls first (per key from pyarrow 25, which
    deprecates the option for all keys)."""
    import pyarrow.compute as pc

    if _nulls_per_key():
        indices = pc.sort_indices(table, sort_keys=[(name, "ascending", "at_start") for name in names])
    else:
        ascending = [(name, "ascending") for name in names]
        indices = pc.sort_indices(table, sort_keys=ascending, null_placement="at_start")
    return _array(indices)


@functools.cache
def _nulls_per_key() -> bool:
    import pyarrow as pa

    return int(pa.__version__.split(".")[0]) >= 25


def _array(values: Any) -> pa.Array:
    import pyarrow as pa

    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _reduce_combos(table: pa.Table, counted: bool) -> pa.Table:
    """Per combination: ``n`` (its rows, or the sum of ``n`` when ``counted``), the smallest template,
    error class, origin topic and reason, the ``first`` and ``last`` publish time."""
    sources = _COMBO_PARTS if counted else _COMBO_ROWS
    aggregations: list[Any] = [(([] if source is None else source), function) for source, function in sources]
    grouped = table.group_by(list(COMBO_KEYS), use_threads=False).aggregate(aggregations)
    produced = ["count_all" if source is None else f"{source}_{function}" for source, function in sources]
    return grouped.select([*produced, *COMBO_KEYS]).rename_columns([*_COMBO_NAMES, *COMBO_KEYS])


def _distinct(table: pa.Table) -> pa.Table:
    keys = list(table.column_names)
    return table.group_by(keys, use_threads=False).aggregate([])


@dataclass
class BucketParts:
    """A record task's parts for its bucket, reduced every :data:`REDUCE_ROWS` rows."""

    bucket: int
    folder: str  # where the parts are written (:func:`write_parts`)

    def __post_init__(self) -> None:
        self._ledger: list[pa.RecordBatch] = []
        self._decided: list[pa.RecordBatch] = []
        self._pending = 0
        self.parts: dict[str, list[pa.Table]] = {kind: [] for kind in KINDS}
        self.untimed_errors = False  # a message without a publish time: no errors part (see above)

    def add(self, ledger: pa.RecordBatch, decided: pa.RecordBatch) -> None:
        """Take a batch of ledger rows and the decisions they were made from (the file's next rows)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        self._ledger.append(ledger.select([*_COMBO_COLUMNS, "dlq_topic", "dlq_message_id", "publish_time"]))
        outcome = decided.column("outcome")
        unscoped = pc.if_else(
            pc.is_null(outcome), pa.scalar(None, pa.bool_()), pc.is_in(outcome, pa.array(sorted(UNSCOPED)))
        )
        columns = [decided.column(name) for name in REP_COLUMNS]
        arrays = [*columns, unscoped.cast(pa.int32())]
        self._decided.append(pa.RecordBatch.from_arrays(arrays, [*REP_COLUMNS, "unscoped"]))
        self._pending += decided.num_rows
        if self._pending >= REDUCE_ROWS:
            self._reduce()

    def _reduce(self) -> None:
        import pyarrow as pa

        if not self._pending:
            return

        ledger = pa.Table.from_batches(self._ledger)
        decided = pa.Table.from_batches(self._decided)
        self._ledger, self._decided, self._pending = [], [], 0
        self.parts["combos"].append(_reduce_combos(ledger, counted=False))
        self.parts["formats"].append(_distinct(ledger.select([*COMBO_KEYS, "context_format"])))
        samples = ledger.select([*COMBO_KEYS, *SAMPLE_ORDER])
        self.parts["samples"].append(first_k(samples, COMBO_KEYS, SAMPLE_ORDER, SAMPLE_IDS))
        self.parts["reps"].append(first_k(decided, ["signature"], REP_ORDER, REP_ROWS))
        messages = _messages(decided)
        self.untimed_errors = self.untimed_errors or messages.column("first").null_count > 0
        if not self.untimed_errors:
            self.parts["errors"].append(_first_errors(messages))
        for kind, tables in self.parts.items():
            if len(tables) >= MERGE_EVERY:  # bounded by the groups, however many rows the bucket has
                self.parts[kind] = [merge(kind, tables)]

    def tables(self) -> dict[str, pa.Table]:
        """Each part of the bucket, merged."""
        self._reduce()
        if self.untimed_errors:
            self.parts["errors"] = []
        return {kind: merge(kind, tables) for kind, tables in self.parts.items() if tables}

    def write(self) -> None:
        """Write the bucket's parts (once its last rows were added)."""
        tables = self.tables()
        if self.untimed_errors:  # an earlier attempt's errors part of this bucket must not be merged
            from spark_apps.dlq_replay.storage import delete, join
            from spark_apps.dlq_replay.task_parquet import part_file

            delete(part_file(join(self.folder, "errors"), self.bucket))
        write_parts(self.folder, self.bucket, tables)


def merge(kind: str, tables: Sequence[pa.Table]) -> pa.Table:
    """One table of ``kind`` from several (of one bucket's chunks, or of every bucket)."""
    import pyarrow as pa

    table = pa.concat_tables(tables, promote_options="permissive")
    if kind == "combos":
        return _reduce_combos(table, counted=True)
    if kind == "formats":
        return _distinct(table)
    if kind == "samples":
        return first_k(table, COMBO_KEYS, SAMPLE_ORDER, SAMPLE_IDS)
    if kind == "errors":
        return _first_errors(table)
    return first_k(table, ["signature"], REP_ORDER, REP_ROWS)


def _messages(decided: pa.Table) -> pa.Table:
    """``signature, message, first`` of the decisions with an error message (cut as the report cuts
    it), one row each."""
    import pyarrow.compute as pc

    rows = decided.filter(pc.is_valid(decided.column("error_message")))
    message = pc.utf8_slice_codeunits(rows.column("error_message"), 0, ERROR_CHARS)
    return (
        rows.select(["signature"])
        .append_column("message", message)
        .append_column("first", rows.column("publish_time"))
    )


def _first_errors(table: pa.Table) -> pa.Table:
    """Per signature, its first distinct messages by (first publish time, message): each message's
    earliest time first, then the first rows. Exact when merged, for rows that all have a time: a
    message among the first of all is among the first of the part that holds its earliest time."""

    earliest = table.group_by(["signature", "message"], use_threads=False).aggregate([("first", "min")])
    distinct = earliest.rename_columns(["signature", "message", "first"])
    return first_k(distinct, ["signature"], ERROR_ORDER, SAMPLE_ERRORS)


def clear_parts(folder: str) -> None:
    """Empty ``folder`` of an earlier attempt's parts (every bucket writes its parts again)."""
    from spark_apps.dlq_replay.storage import delete, join, make_dirs

    delete(folder)
    for kind in KINDS:
        make_dirs(join(folder, kind))


def write_parts(folder: str, bucket: int, tables: dict[str, pa.Table]) -> None:
    """Write a bucket's parts to ``folder/<kind>/part-<bucket>.parquet`` (each renamed into place)."""
    from spark_apps.dlq_replay.storage import join, write_table
    from spark_apps.dlq_replay.task_parquet import part_file

    for kind, table in tables.items():
        write_table(table, part_file(join(folder, kind), bucket))


@dataclass(frozen=True)
class ReportParts:
    """The buckets' parts merged: the run's groups (``combos``), each signature's sample message ids,
    representatives and sample errors."""

    combos: list[dict[str, Any]]
    samples: dict[str, list[str]]
    reps: list[dict[str, Any]]
    #: Each signature's sample error messages, in the report's order (``None``: a bucket held a message
    #: without a publish time, so the report counts them with a Spark query).
    errors: dict[str, list[str]] | None = None


def iso(value: datetime | None) -> str | None:
    """A publish time as the report's Spark aggregation formats it (UTC, milliseconds, ``Z``)."""
    if value is None:
        return None
    value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def read_parts(folder: str) -> ReportParts:
    """Merge every bucket's parts in ``folder`` (written by :func:`write_parts`)."""
    from spark_apps.dlq_replay.storage import exists, join, read_table

    merged: dict[str, list[dict[str, Any]]] = {}
    for kind in KINDS:
        tables = [read_table(path) for path in _parquet_files(join(folder, kind))]
        merged[kind] = merge(kind, tables).to_pylist() if tables else []
    errors: dict[str, list[str]] | None = None
    kept = [len(_parquet_files(join(folder, kind))) for kind in ("errors", "combos")]
    if exists(join(folder, "errors")) and kept[0] == kept[1]:  # every bucket kept its errors
        errors = {}
        for row in merged["errors"]:  # sorted by signature, then order
            errors.setdefault(row["signature"], []).append(row["message"])
    key = COMBO_KEYS
    formats: dict[tuple[Any, ...], list[str]] = {}
    for row in merged["formats"]:
        if row["context_format"] is not None:
            formats.setdefault(tuple(row[k] for k in key), []).append(row["context_format"])
    combos = []
    for row in merged["combos"]:
        combo = {k: row[k] for k in (*key, "n", "template", "error_class", "origin_topic", "reason")}
        combo["context_formats"] = sorted(formats.get(tuple(row[k] for k in key), []))
        combo["first_seen"], combo["last_seen"] = iso(row["first"]), iso(row["last"])
        combos.append(combo)
    firsts: dict[str, list[dict[str, Any]]] = {}
    for row in merged["samples"]:  # sorted by combination, then order: re-sorted per signature below
        firsts.setdefault(row["signature"], []).append(row)
    samples = {
        sig: [row["dlq_message_id"] for row in sorted(rows, key=_sample_key)[:SAMPLE_IDS]]
        for sig, rows in firsts.items()
    }
    reps = []
    for row in merged["reps"]:
        message = row["error_message"]
        reps.append({**row, "error_message": None if message is None else message[:ERROR_CHARS]})
    return ReportParts(combos, samples, reps, errors)


def _sample_key(row: dict[str, Any]) -> tuple[tuple[int, Any], ...]:
    return tuple((0, "") if row[name] is None else (1, row[name]) for name in SAMPLE_ORDER)


def snapshot_messages(
    snapshot_dir: str, keys: Sequence[tuple[str, str]], with_payload: bool
) -> dict[tuple[str, str], Any]:
    """``topic``, ``message_id_str`` and ``properties`` (and ``value`` with ``with_payload``) of the
    snapshot messages ``keys`` (topic, message id), read with pyarrow one row group at a time: the ids of
    each, then the wanted rows' columns. Stops once every key is found (representatives are a group's
    first messages, near the start of the files)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from spark_apps.dlq_replay.storage import open_parquet

    wanted = set(keys)
    if not wanted:
        return {}
    topics = pa.array(sorted({topic for topic, _ in wanted}), pa.string())
    ids = pa.array(sorted({message_id for _, message_id in wanted}), pa.string())
    columns = ["topic", "message_id_str", "properties"] + (["value"] if with_payload else [])
    found: dict[tuple[str, str], Any] = {}
    for path in _parquet_files(snapshot_dir):
        source = open_parquet(path)
        for group in range(source.metadata.num_row_groups):
            keyed = source.read_row_group(group, columns=["topic", "message_id_str"])
            hit = pc.and_(pc.is_in(keyed["message_id_str"], ids), pc.is_in(keyed["topic"], topics))
            rows = pc.indices_nonzero(pc.fill_null(hit, False))
            if len(rows) == 0:
                continue
            for row in source.read_row_group(group, columns=columns).take(rows).to_pylist():
                key = (row["topic"], row["message_id_str"])
                if key in wanted:
                    found[key] = row
            if len(found) == len(wanted):
                return found
    return found


def _parquet_files(folder: str) -> list[str]:
    """The data files of a Parquet dataset folder (written by tasks or by Spark), in name order."""
    from spark_apps.dlq_replay.task_parquet import data_files

    return [path for path in data_files(folder) if path.endswith(".parquet")]


def error_counts(decisions_dir: str, wanted: dict[str, list[str]]) -> tuple[dict[tuple[str, str], int], int]:
    """``(counts, fix errors)``: how many decisions of each signature in ``wanted`` have each of its
    messages (their first 500 characters), and how many of those signatures' decisions have a fix error;
    one pass over the decide tasks' files of ``decisions_dir``, a batch at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from spark_apps.dlq_replay.snapshot_files import part_files
    from spark_apps.dlq_replay.storage import open_parquet

    keys = pa.array([f"{sig}\x1f{message}" for sig, messages in wanted.items() for message in messages])
    signatures = pa.array(sorted(wanted), pa.string())
    counts: dict[tuple[str, str], int] = {}
    fixed = 0
    columns = ["signature", "error_message", "fix_error"]
    for path in part_files(decisions_dir):
        for batch in open_parquet(path).iter_batches(batch_size=65_536, columns=columns, use_threads=False):
            shown = pc.fill_null(pc.is_in(batch.column("signature"), value_set=signatures), False)
            fixed += pc.and_(shown, pc.is_valid(batch.column("fix_error"))).true_count
            message = pc.utf8_slice_codeunits(batch.column("error_message"), 0, ERROR_CHARS)
            key = pc.binary_join_element_wise(batch.column("signature"), message, "\x1f")
            hits = key.filter(pc.fill_null(pc.is_in(key, value_set=keys), False))
            for row in pc.value_counts(hits).to_pylist():
                sig, _, text = row["values"].partition("\x1f")
                counts[(sig, text)] = counts.get((sig, text), 0) + row["counts"]
    return counts, fixed
