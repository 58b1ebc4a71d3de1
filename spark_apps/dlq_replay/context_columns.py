"""The error context of a whole Arrow batch at once, with pyarrow kernels instead of a parse per row.

:func:`context_columns` gives, for every row of a batch of snapshot rows, what the consumer library's
scalar parser gives for that row's properties (:func:`~pulsar_dlq_consumer.context.error_context_values`,
the origin claim of :func:`~spark_apps.dlq_replay.normalize.origin_of`, the replay id and the previous
replay count), as Arrow arrays. The kernels settle the forms writers send: present or absent keys, plain
decimal numbers, texts within their byte bounds, claims that agree. A row holding anything else where its
convention reads it (a number with a sign, spaces or 19 digits, an over-long text or origin topic, Spring's
binary positions, origins that disagree) is parsed by the scalar parser instead, so every row gets exactly
the scalar result; only the cost differs (the kernels take a few microseconds a row, about a quarter of
the scalar parse).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from pulsar_dlq_consumer.context import (
    CONNECT_CONNECTOR,
    CONNECT_EXCEPTION_CLASS,
    CONNECT_EXCEPTION_MESSAGE,
    CONNECT_EXCEPTION_STACKTRACE,
    CONNECT_OFFSET,
    CONNECT_PARTITION,
    CONNECT_PREFIX,
    CONNECT_TASK,
    CONNECT_TOPIC,
    DELAY_TIME,
    KEY_CONSUMER,
    KEY_DELIVERY_COUNT,
    KEY_EXCEPTION_CLASS,
    KEY_EXCEPTION_MESSAGE,
    KEY_EXCEPTION_STACKTRACE,
    KEY_FAILED_AT,
    KEY_MESSAGE_ID,
    KEY_REASON,
    KEY_RECONSUME_COUNT,
    KEY_SUBSCRIPTION,
    KEY_TOPIC,
    KIP1191_DELIVERY_COUNT,
    KIP1191_GROUP,
    KIP1191_KEYS,
    KIP1191_MESSAGE,
    KIP1191_OFFSET,
    KIP1191_PARTITION,
    KIP1191_TOPIC,
    LEGACY_ORIGIN_MESSAGE_ID,
    MAX_CLAIM_CHARS,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_ERROR_STACK_BYTES,
    ORIGIN_MESSAGE_ID,
    ORIGIN_TOPIC_KEYS,
    OURS_ONLY_KEYS,
    REAL_TOPIC,
    REASON_MAX_RECONSUMES,
    REASON_MAX_REDELIVERIES,
    REASON_UNKNOWN,
    REASONS,
    RECONSUMETIMES,
    RETRY_TOPIC,
    SPRING_ORIGINAL_TOPIC,
    SPRING_PREFIX,
    ContextFormat,
    canonical_message_id,
    canonical_topic,
)
from spark_apps.dlq_replay.arrow_util import map_entries, per_distinct, row_numbers

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

_FORMATS = [f.value for f in ContextFormat]
_OURS, _CONNECT, _SPRING, _KIP, _JAVA, _TDMQ, _POLICY, _NONE = (
    ContextFormat.OURS,
    ContextFormat.KAFKA_CONNECT,
    ContextFormat.SPRING,
    ContextFormat.KIP1191,
    ContextFormat.JAVA_RETRY,
    ContextFormat.TDMQ,
    ContextFormat.PULSAR_DLQ_POLICY,
    ContextFormat.NONE,
)
#: What a plain number looks like where the scalar parser reads one (``_int``): up to 18 ASCII digits,
#: which int64 holds. Anything else that is present goes to the scalar parser.
_PLAIN_INT = r"^[0-9]{1,18}$"
_PLAIN_COUNT = r"^[0-9]{1,9}$"  # lineage.previous_replay_count's form
#: ``canonical_message_id``'s already-canonical spelling, whole string (RE2 gives the same groups).
_PART = r"(0|-?[1-9][0-9]{0,19})"
_PLAIN_MESSAGE_ID = rf"^\(?(?P<l>{_PART[1:-1]})[:,](?P<e>{_PART[1:-1]})(?:[:,](?P<p>{_PART[1:-1]}))?" + (
    rf"(?:[:,](?P<b>{_PART[1:-1]}))?\)?$"
)
_INT_TYPE_MAX = 2**31 - 1  # delivery_count and reconsume_times are Spark IntegerType


class _Lookups:
    """The batch's properties as one value column per key read, plus per-row key-class flags."""

    def __init__(self, properties: pa.Array, keys: Sequence[str], undecodable_key: str) -> None:
        n = len(properties)
        self.n = n
        flat_keys, items, parents, _ = map_entries(properties)
        if properties.null_count:  # a null map is no properties, as the scalar parser reads it
            keep = properties.is_valid().take(parents)
            flat_keys, items, parents = flat_keys.filter(keep), items.filter(keep), parents.filter(keep)
        self._rows = row_numbers(n)
        self._parents = parents
        encoded = flat_keys.dictionary_encode()
        self._codes, self._unique = encoded.indices, encoded.dictionary.to_pylist()
        self.values: dict[str, pa.Array] = {}
        wanted = pa.array(list(keys), pa.string())
        which = pc.index_in(flat_keys, value_set=wanted)
        present = pc.is_valid(which)
        which, found_rows, found_items = which.filter(present), parents.filter(present), items.filter(present)
        empty = pa.nulls(n, pa.string())
        for j, key in enumerate(keys):
            hit = pc.equal(which, j)
            self.values[key] = self._scatter(found_rows.filter(hit), found_items.filter(hit), empty)
        self.undecodable = self.has(lambda key: key == undecodable_key)

    def _scatter(self, rows: pa.Array, values: pa.Array, empty: pa.Array) -> pa.Array:
        """A column of ``n`` rows holding ``values`` at ``rows`` (ascending; the last of a row's repeated
        key wins, as in a dict built from the map), null elsewhere."""
        if not len(rows):
            return empty
        if len(rows) == self.n and self._dense(rows):  # one value in every row: already in place
            return values
        if len(rows) > 1:
            last = pc.not_equal(rows.slice(0, len(rows) - 1), rows.slice(1))
            if last.false_count:
                keep = pa.concat_arrays([last, pa.array([True])])
                rows, values = rows.filter(keep), values.filter(keep)
        return pc.replace_with_mask(empty, pc.is_in(self._rows, value_set=rows), values)

    def _dense(self, rows: pa.Array) -> bool:
        """Are ``rows`` exactly 0, 1, ... n - 1 (each row once, in order)?"""
        return bool(pc.all(pc.equal(rows, self._rows)).as_py())

    def has(self, test: Callable[[str], bool]) -> pa.Array:
        """Per row: does any of its keys pass ``test``? (``test`` runs once per distinct key.)"""
        marks = pa.array([test(key) for key in self._unique], pa.bool_())
        rows = self._parents.filter(marks.take(self._codes)) if len(self._codes) else self._parents
        return pc.is_in(self._rows, value_set=rows)


def _text(values: pa.Array) -> pa.Array:
    """The scalar parser's ``_text``: the value, or null when absent or empty."""
    return pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)


def _int(values: pa.Array, minimum: int = 0) -> tuple[pa.Array, pa.Array]:
    """``(numbers, settled)``: ``_int`` of each plain value (null when absent or below ``minimum``), and
    whether the kernels settled the row (absent or plain)."""
    plain = pc.match_substring_regex(values, _PLAIN_INT)
    numbers = pc.cast(pc.if_else(plain, values, pa.scalar(None, pa.string())), pa.int64())
    if minimum:
        numbers = pc.if_else(pc.less(numbers, minimum), pa.scalar(None, pa.int64()), numbers)
    return numbers, pc.or_kleene(pc.is_null(values), plain)


def _bounded(values: pa.Array, max_bytes: int) -> tuple[pa.Array, pa.Array]:
    """``(texts, settled)``: ``_bounded(_text(v))`` where it changes nothing (within ``max_bytes``)."""
    texts = _text(values)
    return texts, pc.fill_null(pc.less_equal(pc.binary_length(texts), max_bytes), True)


def _position(partition: pa.Array, offset: pa.Array) -> pa.Array:
    """``_position``: ``"<partition or 0>:<offset>"``, null without an offset."""
    part = pc.cast(pc.fill_null(partition, 0), pa.string())
    return pc.binary_join_element_wise(part, pc.cast(offset, pa.string()), ":")


def _choose(fmt: pa.Array, cases: dict[str, pa.Array], out_type: pa.DataType) -> pa.Array:
    """Per row, the array of its format in ``cases`` (null for the other formats)."""
    if not cases:
        return pa.nulls(len(fmt), out_type)
    conditions = pc.make_struct(*(pc.equal(fmt, name) for name in cases), field_names=list(cases))
    return pc.case_when(conditions, *(pc.cast(v, out_type) for v in cases.values()))


def _first(*arrays: pa.Array) -> pa.Array:
    return pc.coalesce(*arrays)


def _formats(look: _Lookups) -> pa.Array:
    """``detect_format`` of every row, from which kinds of keys it carries."""
    ours = look.has(OURS_ONLY_KEYS.__contains__)
    connect = look.has(lambda key: key.startswith(CONNECT_PREFIX))
    spring = look.has(lambda key: key.startswith(SPRING_PREFIX))
    kip = look.has(KIP1191_KEYS.__contains__)
    retry = look.has({RECONSUMETIMES, RETRY_TOPIC, DELAY_TIME}.__contains__)
    real = look.has(lambda key: key == REAL_TOPIC)
    tdmq = look.has({RECONSUMETIMES, RETRY_TOPIC}.__contains__)
    policy = look.has({REAL_TOPIC, ORIGIN_MESSAGE_ID, LEGACY_ORIGIN_MESSAGE_ID}.__contains__)
    conditions = [ours, connect, spring, kip, pc.and_(retry, real), tdmq, policy]
    names = [_OURS, _CONNECT, _SPRING, _KIP, _JAVA, _TDMQ, _POLICY]
    struct = pc.make_struct(*conditions, field_names=[str(n) for n in names])
    return pc.case_when(struct, *(pa.scalar(str(n)) for n in names), pa.scalar(str(_NONE)))


#: Every property key the kernels read (the scalar parser reads Spring's keys for the rows it parses).
_KEYS: tuple[str, ...] = (
    KEY_TOPIC,
    KEY_MESSAGE_ID,
    KEY_SUBSCRIPTION,
    KEY_DELIVERY_COUNT,
    KEY_RECONSUME_COUNT,
    KEY_REASON,
    KEY_EXCEPTION_CLASS,
    KEY_EXCEPTION_MESSAGE,
    KEY_EXCEPTION_STACKTRACE,
    KEY_FAILED_AT,
    KEY_CONSUMER,
    REAL_TOPIC,
    ORIGIN_MESSAGE_ID,
    LEGACY_ORIGIN_MESSAGE_ID,
    RECONSUMETIMES,
    CONNECT_TOPIC,
    CONNECT_PARTITION,
    CONNECT_OFFSET,
    CONNECT_CONNECTOR,
    CONNECT_TASK,
    CONNECT_EXCEPTION_CLASS,
    CONNECT_EXCEPTION_MESSAGE,
    CONNECT_EXCEPTION_STACKTRACE,
    SPRING_ORIGINAL_TOPIC,
    KIP1191_PARTITION,
    KIP1191_OFFSET,
    KIP1191_GROUP,
    KIP1191_MESSAGE,
    "REPLAY_COUNT",
)


def _context(look: _Lookups, fmt: pa.Array) -> tuple[dict[str, pa.Array], pa.Array]:
    """``(fields, settled)``: the origin and error fields of ``error_context_values`` per row, and
    whether the kernels settled the row (Spring rows and rows with unplain values are not)."""
    v = look.values
    text = {key: _text(v[key]) for key in _KEYS}
    settled = [pc.not_equal(fmt, str(_SPRING))]

    def number(key: str, fmts: Sequence[str], minimum: int = 0) -> pa.Array:
        numbers, ok = _int(v[key], minimum)
        settled.append(pc.or_(pc.invert(pc.is_in(fmt, value_set=pa.array(fmts))), ok))
        return numbers

    def bounded(key: str, fmt_name: str, max_bytes: int) -> pa.Array:
        texts, ok = _bounded(v[key], max_bytes)
        settled.append(pc.or_(pc.not_equal(fmt, fmt_name), ok))
        return texts

    ours, connect, kip = str(_OURS), str(_CONNECT), str(_KIP)
    retry = [str(_JAVA), str(_TDMQ)]
    origin_id_std = _first(text[ORIGIN_MESSAGE_ID], text[LEGACY_ORIGIN_MESSAGE_ID])
    given_reason = text[KEY_REASON]
    ours_reason = pc.if_else(
        pc.fill_null(pc.is_in(given_reason, value_set=pa.array(sorted(REASONS))), False),
        given_reason,
        pa.scalar(REASON_UNKNOWN),
    )
    connector, task = text[CONNECT_CONNECTOR], text[CONNECT_TASK]
    connect_consumer = pc.if_else(
        pc.and_(pc.is_valid(connector), pc.is_valid(task)),
        pc.binary_join_element_wise(connector, task, "-"),
        connector,
    )
    policy_topic = text[REAL_TOPIC]
    reconsumes = number(RECONSUMETIMES, [ours, *retry])
    fields = {
        "origin_topic": _choose(
            fmt,
            {
                ours: _first(text[KEY_TOPIC], text[REAL_TOPIC]),
                connect: text[CONNECT_TOPIC],
                kip: text[KIP1191_TOPIC],
                **dict.fromkeys([*retry, str(_POLICY)], policy_topic),
            },
            pa.string(),
        ),
        "origin_message_id": _choose(
            fmt,
            {
                ours: _first(text[KEY_MESSAGE_ID], origin_id_std),
                connect: _position(number(CONNECT_PARTITION, [connect]), number(CONNECT_OFFSET, [connect])),
                kip: _position(number(KIP1191_PARTITION, [kip]), number(KIP1191_OFFSET, [kip])),
                **dict.fromkeys([*retry, str(_POLICY)], origin_id_std),
            },
            pa.string(),
        ),
        "subscription": _choose(
            fmt,
            {ours: text[KEY_SUBSCRIPTION], connect: connector, kip: text[KIP1191_GROUP]},
            pa.string(),
        ),
        "delivery_count": _choose(
            fmt,
            {
                ours: number(KEY_DELIVERY_COUNT, [ours], minimum=1),
                kip: number(KIP1191_DELIVERY_COUNT, [kip], minimum=1),
            },
            pa.int64(),
        ),
        "reconsume_times": _choose(
            fmt,
            {
                ours: _first(number(KEY_RECONSUME_COUNT, [ours]), reconsumes),
                **dict.fromkeys(retry, reconsumes),
            },
            pa.int64(),
        ),
        "reason": pc.fill_null(
            _choose(
                fmt,
                {
                    ours: ours_reason,
                    **dict.fromkeys(retry, pa.scalar(REASON_MAX_RECONSUMES)),
                    str(_POLICY): pa.scalar(REASON_MAX_REDELIVERIES),
                },
                pa.string(),
            ),
            REASON_UNKNOWN,
        ),
        "error_class": _choose(
            fmt, {ours: text[KEY_EXCEPTION_CLASS], connect: text[CONNECT_EXCEPTION_CLASS]}, pa.string()
        ),
        "error_message": _choose(
            fmt,
            {
                ours: bounded(KEY_EXCEPTION_MESSAGE, ours, MAX_ERROR_MESSAGE_BYTES),
                connect: bounded(CONNECT_EXCEPTION_MESSAGE, connect, MAX_ERROR_MESSAGE_BYTES),
                kip: bounded(KIP1191_MESSAGE, kip, MAX_ERROR_MESSAGE_BYTES),
            },
            pa.string(),
        ),
        "error_stack": _choose(
            fmt,
            {
                ours: bounded(KEY_EXCEPTION_STACKTRACE, ours, MAX_ERROR_STACK_BYTES),
                connect: bounded(CONNECT_EXCEPTION_STACKTRACE, connect, MAX_ERROR_STACK_BYTES),
            },
            pa.string(),
        ),
        "failed_at": _choose(fmt, {ours: number(KEY_FAILED_AT, [ours])}, pa.int64()),
        "consumer": _choose(fmt, {ours: text[KEY_CONSUMER], connect: connect_consumer}, pa.string()),
    }
    for name in ("delivery_count", "reconsume_times"):  # Spark IntegerType columns: larger is no count
        values = fields[name]
        fields[name] = pc.if_else(pc.greater(values, _INT_TYPE_MAX), pa.scalar(None, pa.int64()), values)
    return fields, _all(settled, look.n)


def _all(conditions: Sequence[pa.Array], n: int) -> pa.Array:
    out = pa.array([True] * n) if not conditions else conditions[0]
    for condition in conditions[1:]:
        out = pc.and_(out, condition)
    return out


def _claims(look: _Lookups) -> tuple[list[tuple[pa.Array, pa.Array]], pa.Array]:
    """``(claims, settled)``: per key of ``ORIGIN_TOPIC_KEYS``, the claimed topic and message id of each
    row (null where the row makes no such claim), and whether the kernels settled the row's claims."""
    v = look.values
    text = {key: _text(v[key]) for key in (*ORIGIN_TOPIC_KEYS, KEY_MESSAGE_ID, ORIGIN_MESSAGE_ID)}
    text[LEGACY_ORIGIN_MESSAGE_ID] = _text(v[LEGACY_ORIGIN_MESSAGE_ID])
    settled: list[pa.Array] = []
    claims: list[tuple[pa.Array, pa.Array]] = []
    for key in ORIGIN_TOPIC_KEYS:
        if key == SPRING_ORIGINAL_TOPIC:  # its positions may be binary: the scalar parser reads them
            settled.append(pc.is_null(text[key]))
            continue
        topic = text[key]
        claimed = pc.is_valid(topic)
        settled.append(pc.fill_null(pc.less_equal(pc.utf8_length(topic), MAX_CLAIM_CHARS), True))
        if key == REAL_TOPIC:
            message_id = _first(text[ORIGIN_MESSAGE_ID], text[LEGACY_ORIGIN_MESSAGE_ID])
        else:
            kip = key == KEY_TOPIC
            part_key = KIP1191_PARTITION if kip else CONNECT_PARTITION
            offset_key = KIP1191_OFFSET if kip else CONNECT_OFFSET
            partition, ok_partition = _int(v[part_key])
            offset, ok_offset = _int(v[offset_key])
            settled.append(pc.or_(pc.invert(claimed), pc.and_(ok_partition, ok_offset)))
            position = _position(partition, offset)
            message_id = _first(text[KEY_MESSAGE_ID], position) if key == KEY_TOPIC else position
        claims.append((topic, pc.if_else(claimed, message_id, pa.scalar(None, pa.string()))))
    return claims, _all(settled, look.n)


def _claim_key(topic: str | None) -> str | None:
    """What ``conflicting_claims`` compares of a claimed topic (null: no claim)."""
    return None if topic is None else canonical_topic(topic) or f"\x00{topic}"


def _origin(look: _Lookups) -> tuple[pa.Array, pa.Array, pa.Array]:
    """``(topic, message id, settled)`` of the claim each row's identity comes from (``origin_of`` for
    claims that agree); rows whose claims disagree are not settled."""
    claims, settled = _claims(look)
    keys = [per_distinct(topic, _claim_key, pa.string()) for topic, _ in claims]
    first_key = _first(*keys)
    agree = _all([pc.fill_null(pc.equal(key, first_key), True) for key in keys], look.n)
    with_id = [pc.if_else(pc.is_valid(mid), topic, pa.scalar(None, pa.string())) for topic, mid in claims]
    topic = _first(*with_id, *(t for t, _ in claims))
    message_id = _first(*(mid for _, mid in claims))
    return topic, message_id, pc.and_(settled, agree)


def _canonical_ids(message_ids: pa.Array) -> pa.Array:
    """``canonical_message_id`` of each value: the plain spellings by kernels, the others by the scalar
    function once per distinct value."""
    parts = pc.extract_regex(message_ids, _PLAIN_MESSAGE_ID)
    ledger, entry, partition, batch = (parts.field(i) for i in range(4))
    no_partition = pc.equal(partition, "")
    batch = pc.if_else(pc.equal(batch, ""), pa.scalar("-1"), batch)
    matched = parts.is_valid()
    plain = pc.if_else(
        matched,
        pc.if_else(
            no_partition,
            pc.binary_join_element_wise(ledger, entry, ":"),
            pc.binary_join_element_wise(ledger, entry, partition, batch, ":"),
        ),
        pa.scalar(None, pa.string()),
    )
    other = pc.and_(pc.is_valid(message_ids), pc.invert(matched))
    if not other.true_count:
        return plain
    fixed = per_distinct(message_ids.filter(other), canonical_message_id, pa.string())
    return pc.replace_with_mask(plain, other, fixed)


def replay_ids(dlq_topics: pa.Array, dlq_ids: pa.Array, topic: pa.Array, message_id: pa.Array) -> list[str]:
    """The replay id of each row from its origin claim (``topic``, ``message_id``; null: no claim), as
    :func:`~spark_apps.dlq_replay.normalize.row_replay_id` computes it."""
    canonical = per_distinct(topic, canonical_topic, pa.string())
    identity = pc.binary_join_element_wise(canonical, _canonical_ids(message_id), "|")
    own = pc.binary_join_element_wise(pc.fill_null(dlq_topics, ""), pc.fill_null(dlq_ids, ""), "\x1f")
    material = pc.if_else(
        pc.is_valid(identity), pc.binary_join_element_wise(pa.scalar("origin"), identity, "\x1f"), own
    )
    sha = hashlib.sha256
    return [sha(raw).hexdigest()[:32] for raw in material.cast(pa.binary()).to_pylist()]


def _replay_counts(values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``(counts, settled)``: ``previous_replay_count`` where absent (0) or plain."""
    plain = pc.match_substring_regex(values, _PLAIN_COUNT)
    counts = pc.cast(pc.if_else(plain, values, pa.scalar(None, pa.string())), pa.int64())
    return pc.fill_null(counts, 0), pc.or_kleene(pc.is_null(values), plain)


def context_columns(batch: pa.RecordBatch, undecodable_key: str) -> tuple[dict[str, pa.Array], pa.Array]:
    """``(columns, settled)`` of a batch of snapshot rows (``topic``, ``message_id_str``,
    ``properties``): every context column of ``error_context_values`` (``CONTEXT_FIELDS``), the replay
    id, the previous replay count and the :data:`UNDECODABLE` flag, as the scalar parser gives them
    wherever ``settled`` is true. The caller parses the other rows with the scalar parser."""
    look = _Lookups(batch.column("properties"), _KEYS, undecodable_key)
    fmt = _formats(look)
    fields, settled = _context(look, fmt)
    topic, message_id, claims_settled = _origin(look)
    counts, counts_settled = _replay_counts(look.values["REPLAY_COUNT"])
    topics, ids = batch.column("topic"), batch.column("message_id_str")
    columns = {
        "dlq_topic": topics,
        "dlq_message_id": ids,
        **fields,
        "context_format": fmt,
        REPLAY_ID: pa.array(replay_ids(topics, ids, topic, message_id), pa.string()),
        REPLAY_COUNT: counts,
        ORIGIN_CONFLICT: pa.nulls(look.n, pa.string()),
        UNDECODABLE: look.undecodable,
    }
    return columns, pc.and_(pc.and_(settled, claims_settled), counts_settled)


def origin_replay_ids(batch: pa.RecordBatch, undecodable_key: str) -> tuple[list[str], pa.Array]:
    """``(replay ids, settled)`` of a batch of snapshot rows: :func:`context_columns`' replay ids alone."""
    look = _Lookups(batch.column("properties"), (*ORIGIN_TOPIC_KEYS, *_CLAIM_KEYS), undecodable_key)
    topic, message_id, settled = _origin(look)
    topics, ids = batch.column("topic"), batch.column("message_id_str")
    return replay_ids(topics, ids, topic, message_id), settled


_CLAIM_KEYS = (
    KEY_MESSAGE_ID,
    ORIGIN_MESSAGE_ID,
    LEGACY_ORIGIN_MESSAGE_ID,
    KIP1191_PARTITION,
    KIP1191_OFFSET,
    CONNECT_PARTITION,
    CONNECT_OFFSET,
)
