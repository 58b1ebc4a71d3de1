"""The error context of a whole Arrow batch at once, with pyarrow kernels instead of a parse per row.

:func:`context_columns` reads the library's convention table (``CONVENTIONS``) with one kernel per kind of
reader (:class:`_Kernels`), so a new convention needs nothing here. The kernels settle the forms writers
send; the caller parses the other rows with the scalar parser: each row gets exactly the scalar result."""

from __future__ import annotations

import hashlib
from functools import reduce
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import IntegerType, LongType

from pulsar_dlq_consumer.context import CONTEXT_FIELDS, MAX_CLAIM_CHARS, canonical_message_id, canonical_topic
from pulsar_dlq_consumer.conventions import (
    CONVENTIONS,
    FIELD_DEFAULTS,
    ORIGIN_CLAIMS,
    ORIGIN_PROPERTY_KEYS,
    PROPERTY_KEYS,
    Choice,
    Const,
    ContextFormat,
    First,
    Joined,
    Number,
    Position,
    Reader,
    Text,
)
from spark_apps.dlq_replay import lineage
from spark_apps.dlq_replay.arrow_util import map_entries, per_distinct, row_numbers
from spark_apps.dlq_replay.schemas import CONTEXT_COLUMNS

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

#: Column of the previous ``REPLAY_COUNT`` (0 when absent, null when not a number).
REPLAY_COUNT = "replay_count"
#: Column of the replay id (:func:`~spark_apps.dlq_replay.signatures.replay_id`).
REPLAY_ID = "replay_id"
#: Column of the origin conflict text (null when the conventions agree).
ORIGIN_CONFLICT = "origin_conflict"
#: Column of the flag: the row carries ``UNDECODABLE_PROPERTY`` (its properties were not UTF-8).
UNDECODABLE = "_undecodable"

#: A plain number where the scalar parser reads one (``read_int``): up to 18 ASCII digits (int64).
_PLAIN_INT = r"^[0-9]{1,18}$"
_PLAIN_COUNT = r"^[0-9]{1,9}$"  # lineage.previous_replay_count's form
#: ``canonical_message_id``'s already-canonical spelling, whole string (RE2 gives the same groups).
_PART = r"0|-?[1-9][0-9]{0,19}"
_PLAIN_MESSAGE_ID = rf"^\(?(?P<l>{_PART})[:,](?P<e>{_PART})(?:[:,](?P<p>{_PART}))?(?:[:,](?P<b>{_PART}))?\)?$"
#: Largest value of each integer context column (its Spark type); a larger one is null, like a bad number.
INT_LIMITS: dict[str, int] = {
    name: 2**31 - 1 if isinstance(dtype, IntegerType) else 2**63 - 1
    for name, dtype in CONTEXT_COLUMNS
    if isinstance(dtype, (IntegerType, LongType))
}
_NULL_TEXT = pa.scalar(None, pa.string())
#: A reader's values for every row (an array, or one scalar for all) and the rows it settles (``None``: all).
_Result = tuple[Any, pa.Array | None]


class _Lookups:
    """The batch's properties as one value column per key read, plus per-row key-class flags."""

    def __init__(self, properties: pa.Array, keys: Sequence[str]) -> None:
        self.n = n = len(properties)
        flat_keys, items, parents, _ = map_entries(properties)
        if properties.null_count:  # a null map is no properties, as the scalar parser reads it
            keep = properties.is_valid().take(parents)
            flat_keys, items, parents = flat_keys.filter(keep), items.filter(keep), parents.filter(keep)
        self._rows, self._parents = row_numbers(n), parents
        encoded = flat_keys.dictionary_encode()
        self._codes, self._unique = encoded.indices, encoded.dictionary.to_pylist()
        self.values: dict[str, pa.Array] = {}
        # Each entry's place in ``keys`` (len(keys): not read) through its key's code, then the entries
        # of each key together: a stable radix sort keeps every key's rows ascending.
        place = {key: j for j, key in enumerate(keys)}
        of_code = np.array([place.get(key, len(keys)) for key in self._unique], np.int16)
        which = of_code[np.asarray(self._codes)] if len(self._codes) else np.zeros(0, np.int16)
        order = np.argsort(which, kind="stable")
        bounds = np.searchsorted(which[order], np.arange(len(keys) + 1))
        empty = pa.nulls(n, pa.string())
        for j, key in enumerate(keys):
            at = pa.array(order[bounds[j] : bounds[j + 1]])
            self.values[key] = self._scatter(parents.take(at), items.take(at), empty)

    def _scatter(self, rows: pa.Array, values: pa.Array, empty: pa.Array) -> pa.Array:
        """``values`` at ``rows`` (ascending; a repeated key's last value wins, as in a dict), else null."""
        if not len(rows):
            return empty
        if len(rows) == self.n and pc.all(pc.equal(rows, self._rows)).as_py():  # one in each row, in order
            return values
        last = pc.not_equal(rows.slice(0, len(rows) - 1), rows.slice(1))
        if last.false_count:
            keep = pa.concat_arrays([last, pa.array([True])])
            rows, values = rows.filter(keep), values.filter(keep)
        return pc.replace_with_mask(empty, pc.is_in(self._rows, value_set=rows), values)

    def has(self, test: Callable[[str], bool]) -> pa.Array:
        """Per row: does any of its keys pass ``test``? (``test`` runs once per distinct key.)"""
        marks = pa.array([test(key) for key in self._unique], pa.bool_())
        rows = self._parents.filter(marks.take(self._codes)) if len(self._codes) else self._parents
        return pc.is_in(self._rows, value_set=rows)


def _text(values: pa.Array) -> pa.Array:
    """The scalar parser's ``read_text``: the value, or null when absent or empty."""
    return pc.if_else(pc.equal(values, ""), _NULL_TEXT, values)


def _int(values: pa.Array, minimum: int = 0, form: str = _PLAIN_INT) -> tuple[pa.Array, pa.Array]:
    """``(numbers, settled)``: ``read_int`` of each plain value (``form``), settled where absent or plain."""
    plain = pc.match_substring_regex(values, form)
    numbers = pc.cast(pc.if_else(plain, values, _NULL_TEXT), pa.int64())
    if minimum:
        numbers = pc.if_else(pc.less(numbers, minimum), pa.scalar(None, pa.int64()), numbers)
    return numbers, pc.or_kleene(pc.is_null(values), plain)


class _Kernels(dict[Reader, _Result]):
    """The table's readers over one batch, each evaluated once (several conventions share readers) by the
    method named after its kind of reader (:mod:`pulsar_dlq_consumer.conventions`)."""

    def __init__(self, look: _Lookups) -> None:
        super().__init__()
        self.by_key = look.values  # each key's value per row

    def __missing__(self, reader: Reader) -> _Result:
        self[reader] = result = getattr(self, f"of_{type(reader).__name__.lower()}")(reader)
        return result

    def of_text(self, reader: Text) -> _Result:
        """Settled where the text is within its bound, if any (the scalar parser cuts the others)."""
        texts = _text(self.by_key[reader.key])
        if reader.max_bytes is None:
            return texts, None
        return texts, pc.fill_null(pc.less_equal(pc.binary_length(texts), reader.max_bytes), True)

    def of_number(self, reader: Number) -> _Result:
        return _int(self.by_key[reader.key], reader.minimum)

    def of_position(self, reader: Position) -> _Result:
        """``"<partition or 0>:<offset>"`` of plain decimals (binary ones are not plain: scalar parser)."""
        partition, partition_ok = _int(self.by_key[reader.partition])
        offset, offset_ok = _int(self.by_key[reader.offset])
        part = pc.cast(pc.fill_null(partition, 0), pa.string())
        position = pc.binary_join_element_wise(part, pc.cast(offset, pa.string()), ":")
        return position, pc.and_(partition_ok, offset_ok)

    def of_const(self, reader: Const) -> _Result:
        return pa.scalar(reader.value), None

    def of_choice(self, reader: Choice) -> _Result:
        texts = _text(self.by_key[reader.key])
        allowed = pc.fill_null(
            pc.is_in(texts, value_set=pa.array(sorted(reader.allowed), pa.string())), False
        )
        return pc.if_else(allowed, texts, pa.scalar(reader.default)), None

    def of_joined(self, reader: Joined) -> _Result:
        first, second = _text(self.by_key[reader.first]), _text(self.by_key[reader.second])
        both = pc.and_(pc.is_valid(first), pc.is_valid(second))
        return pc.if_else(both, pc.binary_join_element_wise(first, second, reader.sep), first), None

    def of_first(self, reader: First) -> _Result:
        results = [self[each] for each in reader.readers]
        settled = [ok for _, ok in results if ok is not None]
        return pc.coalesce(*(values for values, _ in results)), reduce(pc.and_, settled) if settled else None


def _formats(look: _Lookups) -> pa.Array:
    """``detect_format`` of every row: the first convention of the table whose keys it carries."""
    conditions = [
        reduce(pc.and_, [look.has(c.marks), *(look.has(key.__eq__) for key in sorted(c.requires))])
        for c in CONVENTIONS
    ]
    names = [convention.format.value for convention in CONVENTIONS]
    struct = pc.make_struct(*conditions, field_names=names)
    return pc.case_when(struct, *(pa.scalar(name) for name in names), pa.scalar(ContextFormat.NONE.value))


def _field(fmt: pa.Array, kernels: _Kernels, name: str, settled: list[pa.Array]) -> pa.Array:
    """One field of ``error_context_values`` per row by its convention's reader (adds to ``settled``)."""
    cases: dict[str, Any] = {}
    for convention in CONVENTIONS:
        reader = convention.fields.get(name)
        if reader is not None:
            values, ok = kernels[reader]
            cases[convention.format.value] = values
            if ok is not None:
                settled.append(pc.or_(pc.not_equal(fmt, convention.format.value), ok))
    out_type = next(iter(cases.values())).type
    conditions = pc.make_struct(*(pc.equal(fmt, name) for name in cases), field_names=list(cases))
    column = pc.case_when(conditions, *(pc.cast(v, out_type) for v in cases.values()))
    return column if FIELD_DEFAULTS.get(name) is None else pc.fill_null(column, FIELD_DEFAULTS[name])


def _claim_key(topic: str | None) -> str | None:
    """What ``conflicting_claims`` compares of a claimed topic (null: no claim)."""
    return None if topic is None else canonical_topic(topic) or f"\x00{topic}"


def _origin(look: _Lookups, kernels: _Kernels) -> tuple[pa.Array, pa.Array, pa.Array]:
    """``(topic, message id, settled)`` of the claim each row's identity comes from (``origin_of`` for
    claims that agree); rows whose claims disagree are not settled."""
    settled: list[pa.Array] = []
    claims: list[tuple[pa.Array, pa.Array]] = []  # per claim of the table: topic and message id per row
    for claim in ORIGIN_CLAIMS:
        topic = _text(look.values[claim.topic_key])
        claimed = pc.is_valid(topic)
        settled.append(pc.fill_null(pc.less_equal(pc.utf8_length(topic), MAX_CLAIM_CHARS), True))
        message_id, ok = kernels[claim.message_id]
        if ok is not None:
            settled.append(pc.or_(pc.invert(claimed), ok))
        claims.append((topic, pc.if_else(claimed, message_id, _NULL_TEXT)))
    keys = [per_distinct(topic, _claim_key, pa.string()) for topic, _ in claims]
    first_key = pc.coalesce(*keys)
    settled += [pc.fill_null(pc.equal(key, first_key), True) for key in keys]  # the claims agree
    with_id = [pc.if_else(pc.is_valid(mid), topic, _NULL_TEXT) for topic, mid in claims]
    topic = pc.coalesce(*with_id, *(t for t, _ in claims))
    message_id = pc.coalesce(*(mid for _, mid in claims))
    return topic, message_id, reduce(pc.and_, settled)


def _canonical_ids(message_ids: pa.Array) -> pa.Array:
    """``canonical_message_id`` of each value: plain spellings by kernels, others once per distinct value."""
    parts = pc.extract_regex(message_ids, _PLAIN_MESSAGE_ID)
    ledger, entry, partition, batch = (pc.struct_field(parts, [i]) for i in range(4))  # null: no match
    batch = pc.if_else(pc.equal(batch, ""), pa.scalar("-1"), batch)
    whole = pc.binary_join_element_wise(ledger, entry, partition, batch, ":")
    plain = pc.if_else(pc.equal(partition, ""), pc.binary_join_element_wise(ledger, entry, ":"), whole)
    other = pc.and_(pc.is_valid(message_ids), pc.invert(parts.is_valid()))
    if not other.true_count:
        return plain
    fixed = per_distinct(message_ids.filter(other), canonical_message_id, pa.string())
    return pc.replace_with_mask(plain, other, fixed)


def replay_ids(dlq_topics: pa.Array, dlq_ids: pa.Array, topic: pa.Array, message_id: pa.Array) -> list[str]:
    """:func:`~spark_apps.dlq_replay.normalize.row_replay_id` of each row's origin claim (null: no claim)."""
    canonical = per_distinct(topic, canonical_topic, pa.string())
    identity = pc.binary_join_element_wise(canonical, _canonical_ids(message_id), "|")
    own = pc.binary_join_element_wise(pc.fill_null(dlq_topics, ""), pc.fill_null(dlq_ids, ""), "\x1f")
    material = pc.if_else(
        pc.is_valid(identity), pc.binary_join_element_wise(pa.scalar("origin"), identity, "\x1f"), own
    )
    return [hashlib.sha256(raw).hexdigest()[:32] for raw in material.cast(pa.binary()).to_pylist()]


def context_columns(
    batch: pa.RecordBatch, undecodable_key: str, known_ids: pa.Array | None = None
) -> tuple[dict[str, pa.Array], pa.Array]:
    """``(columns, settled)`` of a batch of snapshot rows: the context columns (``CONTEXT_FIELDS``), replay
    id (``known_ids`` when given), previous replay count and :data:`UNDECODABLE`, as the scalar parser gives
    them where ``settled``."""
    look = _Lookups(batch.column("properties"), (*PROPERTY_KEYS, lineage.REPLAY_COUNT))
    kernels = _Kernels(look)
    fmt = _formats(look)
    settled: list[pa.Array] = []
    # The fields the table's readers give: all but the DLQ position and the format.
    fields = {name: _field(fmt, kernels, name, settled) for name in CONTEXT_FIELDS[2:-1]}
    for name, limit in INT_LIMITS.items():
        fields[name] = pc.if_else(pc.greater(fields[name], limit), pa.scalar(None, pa.int64()), fields[name])
    topic, message_id, claims_settled = _origin(look, kernels)
    counts, counts_settled = _int(look.values[lineage.REPLAY_COUNT], form=_PLAIN_COUNT)
    topics, ids = batch.column("topic"), batch.column("message_id_str")
    columns = {
        "dlq_topic": topics,
        "dlq_message_id": ids,
        **fields,
        "context_format": fmt,
        REPLAY_ID: pa.array(replay_ids(topics, ids, topic, message_id), pa.string())
        if known_ids is None
        else known_ids,
        REPLAY_COUNT: pc.fill_null(counts, 0),  # previous_replay_count: 0 when absent
        ORIGIN_CONFLICT: pa.nulls(look.n, pa.string()),
        UNDECODABLE: look.has(undecodable_key.__eq__),
    }
    return columns, reduce(pc.and_, [*settled, claims_settled, counts_settled])


def origin_replay_ids(batch: pa.RecordBatch) -> tuple[list[str], pa.Array]:
    """``(replay ids, settled)`` of a batch of snapshot rows: :func:`context_columns`' replay ids alone."""
    look = _Lookups(batch.column("properties"), ORIGIN_PROPERTY_KEYS)
    topic, message_id, settled = _origin(look, _Kernels(look))
    return replay_ids(batch.column("topic"), batch.column("message_id_str"), topic, message_id), settled
