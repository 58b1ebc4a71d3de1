"""The report's group aggregates and representative messages the record tasks gather (``docs/replay-app.md``).
Each part is bounded by the groups and merges exactly (a sum, minimum, maximum, or the first rows of a union:
the first k of all are among the first k of each part)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType

from spark_apps.dlq_replay.arrow_util import group_ids, in_tasks
from spark_apps.dlq_replay.outcomes import UNSCOPED
from spark_apps.dlq_replay.pulsar_io.source import ddl_struct
from spark_apps.dlq_replay.schemas import SNAPSHOT_SCHEMA, arrow_schema
from spark_apps.dlq_replay.storage import join, open_parquet, read_table, write_table
from spark_apps.dlq_replay.task_parquet import part_file, part_files

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from datetime import datetime

    from pyspark.sql import SparkSession

#: What a group of the report is counted by.
COMBO_KEYS = ("signature", "outcome", "action", "rule", "context_format")
#: The decisions' columns a representative keeps (its order adds ``unscoped``).
_REP_MESSAGE = ("signature", "dlq_topic", "dlq_message_id", "error_class", "error_message", "origin_topic")
REP_COLUMNS = (*_REP_MESSAGE, "context_format", "outcome", "outcome_reason", "rule", "publish_time")
#: Rows gathered before a bucket's parts are reduced (bounds a record task's memory).
REDUCE_ROWS = 16_384
#: Reduced chunks kept before they are merged into one.
MERGE_EVERY = 8
KINDS = ("combos", "samples", "reps", "errors")
#: Message ids shown per group, representatives kept per signature (enough for its payload samples),
#: distinct error messages shown per signature and the characters kept of each.
SAMPLE_IDS = 5
REP_ROWS = 2
SAMPLE_ERRORS = 3
ERROR_CHARS = 500
#: The parts that keep each signature's first rows: by which order, how many.
_FIRST = {
    "samples": (("publish_time", "dlq_topic", "dlq_message_id"), SAMPLE_IDS),
    "reps": (("unscoped", "publish_time", "dlq_topic", "dlq_message_id"), REP_ROWS),
    "errors": (("first", "message"), SAMPLE_ERRORS),
}
_MINIMA = ("template", "error_class", "origin_topic", "reason", "first")
#: A combination's aggregates of its ledger rows (``n`` of each is 1), merged by the same functions.
_COMBO_AGGREGATES = (("n", "sum"), *((name, "min") for name in _MINIMA), ("last", "max"))
_ERRORS = ["signature", "message", "first"]
_COMBO_COLUMNS = (*COMBO_KEYS, "error_template", "error_class", "origin_topic", "reason")


def first_k(table: pa.Table, keys: Sequence[str], order: Sequence[str], k: int) -> pa.Table:
    """The first ``k`` rows per ``keys`` by ``order`` (ascending, nulls first as in Spark), sorted by both."""
    if table.num_rows == 0:
        return table
    group = group_ids([table.column(name) for name in keys])
    ranked = pa.table({"_group": group, **{name: table.column(name) for name in order}})
    indices = _sort_indices(ranked, ["_group", *order])
    sorted_group = group.take(indices).to_numpy()
    starts = np.flatnonzero(np.r_[True, sorted_group[1:] != sorted_group[:-1]])  # each group's first row
    rank = np.arange(len(indices)) - np.repeat(starts, np.diff(starts, append=len(indices)))
    kept = table.take(indices.filter(pa.array(rank < k)))
    return kept.take(_sort_indices(kept, [*keys, *order]))


def _sort_indices(table: pa.Table, names: Sequence[str]) -> pa.Array:
    """Indices sorting ``table`` by ``names`` ascending, nulls first (per key from pyarrow 25 on)."""
    if int(pa.__version__.split(".")[0]) >= 25:
        return pc.sort_indices(table, sort_keys=[(name, "ascending", "at_start") for name in names])
    ascending = [(name, "ascending") for name in names]
    return pc.sort_indices(table, sort_keys=ascending, null_placement="at_start")


def merge(kind: str, tables: Sequence[pa.Table]) -> pa.Table:
    """One table of ``kind`` from several (of one bucket's chunks, or of every bucket)."""
    table = pa.concat_tables(tables, promote_options="permissive")
    if kind == "combos":
        grouped = table.group_by(list(COMBO_KEYS), use_threads=False).aggregate(list(_COMBO_AGGREGATES))
        return grouped.rename_columns({f"{name}_{function}": name for name, function in _COMBO_AGGREGATES})
    if kind == "errors":  # each message at its earliest time, null first (skipping nulls would not merge)
        first = ("first", "min", pc.ScalarAggregateOptions(skip_nulls=False))
        earliest = table.group_by(["signature", "message"], use_threads=False).aggregate([first])
        table = earliest.rename_columns(_ERRORS)
    order, k = _FIRST[kind]
    return first_k(table, ["signature"], order, k)


@dataclass
class BucketParts:
    """A record task's parts for its bucket, reduced every :data:`REDUCE_ROWS` rows."""

    bucket: int
    folder: str  # where the parts are written (:meth:`write`)
    parts: dict[str, list[pa.Table]] = field(init=False, default_factory=lambda: {kind: [] for kind in KINDS})
    _ledger: list[pa.RecordBatch] = field(init=False, default_factory=list)
    _decided: list[pa.RecordBatch] = field(init=False, default_factory=list)
    _pending: int = field(init=False, default=0)

    def add(self, ledger: pa.RecordBatch, decided: pa.RecordBatch) -> None:
        """Take a batch of ledger rows and the decisions they were made from (the file's next rows)."""
        self._ledger.append(ledger.select([*_COMBO_COLUMNS, "dlq_topic", "dlq_message_id", "publish_time"]))
        outcome = decided.column("outcome")
        unscoped = pc.if_else(
            pc.is_null(outcome), pa.scalar(None, pa.bool_()), pc.is_in(outcome, pa.array(sorted(UNSCOPED)))
        )
        columns = [decided.column(name) for name in REP_COLUMNS]
        cut = REP_COLUMNS.index("error_message")  # as the report shows them
        columns[cut] = pc.utf8_slice_codeunits(columns[cut], 0, ERROR_CHARS)
        arrays = [*columns, unscoped.cast(pa.int32())]
        self._decided.append(pa.RecordBatch.from_arrays(arrays, [*REP_COLUMNS, "unscoped"]))
        self._pending += decided.num_rows
        if self._pending >= REDUCE_ROWS:
            self._reduce()

    def _reduce(self) -> None:
        if not self._pending:
            return
        ledger = pa.Table.from_batches(self._ledger)
        decided = pa.Table.from_batches(self._decided)
        self._ledger, self._decided, self._pending = [], [], 0
        rows = {name: ledger[name] for name in _COMBO_COLUMNS}
        rows["template"] = rows.pop("error_template")
        times = ledger["publish_time"]
        rows.update(n=pa.repeat(1, ledger.num_rows), first=times, last=times)
        errors = decided.filter(pc.is_valid(decided.column("error_message")))
        fresh = {
            "combos": pa.table(rows),
            "samples": ledger.select(["signature", *_FIRST["samples"][0]]),
            "reps": decided,
            "errors": errors.select(["signature", "error_message", "publish_time"]).rename_columns(_ERRORS),
        }
        for kind, table in fresh.items():  # each part is bounded by the groups, however many rows come
            tables = [*self.parts[kind], merge(kind, [table])]
            self.parts[kind] = [merge(kind, tables)] if len(tables) >= MERGE_EVERY else tables

    def write(self) -> None:
        """Write each part, merged, to ``folder/<kind>/part-<bucket>.parquet`` after the last rows."""
        self._reduce()
        for kind, tables in self.parts.items():
            if tables:
                write_table(merge(kind, tables), part_file(join(self.folder, kind), self.bucket))


@dataclass(frozen=True)
class ReportParts:
    """The buckets' parts merged, as :func:`read_parts` returns them."""

    combos: list[dict[str, Any]]
    samples: dict[str, list[str]]
    reps: list[dict[str, Any]]
    errors: dict[str, list[str]] = field(default_factory=dict)  # in the report's order


def iso(value: datetime | None) -> str | None:
    """A publish time as the report's Spark aggregation formats it (UTC, milliseconds, ``Z``)."""
    return None if value is None else value.astimezone(UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def read_parts(folder: str) -> ReportParts:
    """Merge every bucket's parts in ``folder`` (written by :meth:`BucketParts.write`)."""
    files = {kind: part_files(join(folder, kind)) for kind in KINDS}
    merged = {
        kind: merge(kind, [read_table(path) for path in paths]).to_pylist() if paths else []
        for kind, paths in files.items()
    }
    for row in merged["combos"]:
        row.update(first_seen=iso(row.pop("first")), last_seen=iso(row.pop("last")))
    listed: dict[str, dict[str, list[str]]] = {"samples": {}, "errors": {}}
    for kind, column in (("samples", "dlq_message_id"), ("errors", "message")):
        for row in merged[kind]:  # sorted by signature, then order
            listed[kind].setdefault(row["signature"], []).append(row[column])
    return ReportParts(merged["combos"], listed["samples"], merged["reps"], listed["errors"])


def snapshot_messages(
    spark: SparkSession, snapshot_dir: str, keys: Sequence[tuple[str, str]], with_payload: bool
) -> dict[tuple[str, str], Any]:
    """The snapshot messages ``keys`` (and their payloads ``with_payload``), read in one Python task."""
    if not keys:
        return {}
    columns = ["topic", "message_id_str", "properties"] + (["value"] if with_payload else [])
    schema = StructType([SNAPSHOT_SCHEMA[name] for name in columns])
    rows = in_tasks(spark, partial(snapshot_rows, snapshot_dir, tuple(keys), columns), 1, schema).to_pylist()
    return {(row["topic"], row["message_id_str"]): row for row in rows}


def snapshot_rows(
    snapshot_dir: str, keys: Sequence[tuple[str, str]], columns: list[str], _task: int = 0
) -> Iterator[pa.RecordBatch]:
    """The snapshot rows ``keys`` by row group, stopping once all are found (representatives come early)."""
    wanted = {f"{topic}\x1f{message_id}" for topic, message_id in keys}
    value_set = pa.array(sorted(wanted), pa.string())
    found: set[str] = set()
    for path in part_files(snapshot_dir):
        source = open_parquet(path)
        for group in range(source.metadata.num_row_groups):
            keyed = source.read_row_group(group, columns=["topic", "message_id_str"])
            key = pc.binary_join_element_wise(keyed["topic"], keyed["message_id_str"], "\x1f")
            rows = pc.indices_nonzero(pc.is_in(key, value_set=value_set))
            if len(rows) == 0:
                continue
            yield from source.read_row_group(group, columns=columns).take(rows).to_batches()
            found.update(key.take(rows).to_pylist())
            if len(found) == len(wanted):
                return


#: A count of :func:`error_count_rows`: of a message text (``fix`` false) or of a fix error.
COUNT_SCHEMA = ddl_struct("fix boolean, signature string, text string, n long")


def error_count_rows(
    files: Sequence[str], wanted: dict[str, list[str]], signatures: Sequence[str], task: int
) -> Iterator[pa.RecordBatch]:
    """Counts of the messages ``wanted`` and the fix errors of ``signatures`` in decisions ``files[task]``."""
    texts = [f"{sig}\x1f{message}" for sig, messages in wanted.items() for message in messages]
    keys = pa.array(texts, pa.string())  # typed: an empty list would make a null array
    shown = pa.array(sorted(signatures), pa.string())
    counts: dict[bool, Counter[tuple[str, str]]] = {False: Counter(), True: Counter()}
    columns = ["signature", "error_message", "fix_error"]
    for batch in open_parquet(files[task]).iter_batches(columns=columns, use_threads=False):
        signature = batch.column("signature")
        message = pc.utf8_slice_codeunits(batch.column("error_message"), 0, ERROR_CHARS)
        fix = pc.utf8_slice_codeunits(batch.column("fix_error"), 0, ERROR_CHARS)
        key = pc.binary_join_element_wise(signature, message, "\x1f")
        _tally(counts[False], key.filter(pc.is_in(key, value_set=keys)))
        key = pc.binary_join_element_wise(signature, fix, "\x1f")
        _tally(counts[True], key.filter(pc.is_in(signature, value_set=shown)))
    rows = [
        {"fix": fix, "signature": sig, "text": text, "n": n}
        for fix, counted in counts.items()
        for (sig, text), n in counted.items()
    ]
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema(COUNT_SCHEMA))


def _tally(counts: Counter[tuple[str, str]], keys: pa.Array) -> None:
    for row in pc.value_counts(keys.drop_null()).to_pylist():
        sig, _, text = row["values"].partition("\x1f")
        counts[(sig, text)] += row["counts"]
