"""Commit: ack exactly the final DLQ messages, none past the window end (``docs/pulsar-data-source.md``)."""

from __future__ import annotations

import logging
import time
from array import array
from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf, get_client
from spark_apps.dlq_replay.pulsar_io.cursor import (
    CursorState,
    Position,
    count_entries,
    ledger_sizes,
    parse_position,
    pending_ranges,
)
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError, WindowError
from spark_apps.dlq_replay.pulsar_io.ids import MessageIdKey, in_window, message_id_key
from spark_apps.dlq_replay.pulsar_io.read import DEFAULT_IDLE_TIMEOUT_MS, SeenIds, WindowPasses
from spark_apps.dlq_replay.pulsar_io.window import subscribe_shared

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow

log = logging.getLogger(__name__)

COMMIT_INPUT_SCHEMA = "dlq_topic string, dlq_message_id string"
#: Consumer mode: a row names one final message, or (``dlq_message_id`` null) a wholly final entry.
ENTRIES_COMMIT_INPUT_SCHEMA = (
    "dlq_topic string, dlq_message_id string, ledger_id long, entry_id long, batch_size long"
)
#: Reader mode: one row per snapshot entry; a row with a null ``ledger_id`` only names a partition.
ENTRY_COMMIT_INPUT_SCHEMA = (
    "dlq_topic string, ledger_id long, entry_id long, messages long, final_messages long, batch_size long"
)
#: One row per DLQ partition.
COMMIT_RESULT_SCHEMA = (
    "dlq_topic string, acked long, left_pending long, beyond_window long, final_in_partial_entries long, "
    "unacked_final long, entries_acked long, messages_read long"
)
#: ``(position, messages, final_messages, batch_size)`` of one snapshot entry.
_EntryRow = tuple[Position, int, int, "int | None"]
_RESULT_COLUMNS = [part.split()[0] for part in COMMIT_RESULT_SCHEMA.split(", ")]
MAX_ACK_ATTEMPTS = 3  # times the acks of an entry are sent before it is reported as unacked
VERIFY_TIMEOUT_S = 10.0


def _require(table: Any, names: Sequence[str], schema: str) -> None:
    missing = [c for c in names if c not in table.column_names]
    if missing:
        raise PulsarConfigError(f"commit input lacks columns {missing}; select {schema}")


def _result_table(rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    return pa.table(
        {
            name: pa.array([r.get(name, 0) for r in rows], pa.string() if name == "dlq_topic" else pa.int64())
            for name in _RESULT_COLUMNS
        }
    )


def make_commit_fn(
    conf: PulsarConf,
    windows: Sequence[PartitionWindow],
    subscription: str,
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
    *,
    batch_index_ack: bool = False,
) -> Callable[[Any], Any]:
    """Consumer mode: the ``groupBy("dlq_topic").applyInArrow`` function over :data:`COMMIT_INPUT_SCHEMA`
    or :data:`ENTRIES_COMMIT_INPUT_SCHEMA` rows, a :data:`COMMIT_RESULT_SCHEMA` row per topic."""
    if not subscription:
        raise PulsarConfigError("subscription is required, e.g. 'dlq-replayer'")
    if idle_timeout_ms <= 0:
        raise PulsarConfigError(f"idle_timeout_ms must be > 0; got {idle_timeout_ms}")
    by_topic = {w.topic: w for w in windows}
    passes = dict(subscription=subscription, idle_timeout_ms=idle_timeout_ms, batch_index_ack=batch_index_ack)

    # A plain one-argument function: Spark picks the ``pyarrow.Table -> pyarrow.Table`` form by arity
    # (a callable object would count ``self`` and receive the grouping key too).
    def commit(table: Any) -> Any:
        import pyarrow.compute as pc

        _require(table, ("dlq_topic", "dlq_message_id"), COMMIT_INPUT_SCHEMA)
        topics = table.column("dlq_topic")
        if topics.null_count:
            raise PulsarConfigError("commit input has a null dlq_topic; drop such rows")
        names = pc.unique(topics).to_pylist()  # one per group of groupBy("dlq_topic"): no Python str per row
        rows = []
        for topic in names:
            final = _final_of(table if len(names) == 1 else table.filter(pc.equal(topics, topic)))
            window = by_topic.get(topic)
            if window is None:
                raise WindowError(
                    f"dlq_topic {topic!r} is not in the run's frozen window; commit only messages read from "
                    f"that window (known: {sorted(by_topic)})"
                )
            rows.append(_commit_topic(conf, window, final, passes))
        return _result_table(rows)

    return commit


def _commit_topic(
    conf: PulsarConf, window: PartitionWindow, final: FinalIds | FinalEntries, passes: dict[str, Any]
) -> dict[str, Any]:
    """Ack the ``final`` ids of one partition from the consumers that receive them; its result row."""
    topic = window.topic
    outside = final.drop_beyond(window.end_key)
    if outside:
        log.warning("commit %s: %d ids lie beyond the window end and are not acked", topic, outside)
    if not len(final):
        return {"dlq_topic": topic}
    # At the window end, final ids not seen were acked by an earlier commit; an idle stop may be a stall
    # (read again while that finds more). Redeliveries are skipped by the received flags.
    reader = WindowPasses(get_client(conf), window, role="commit", seen=final, **passes)
    acked = left = 0
    for _, msg, _, consumer in reader.messages():
        if final.last_index >= 0:  # the message just returned is a final one, received once
            consumer.acknowledge(msg)
            acked += 1
        else:
            left += 1
    beyond = reader.stats.beyond_window
    log.info(
        "commit %s: acked %d, left pending %d, beyond window %d, %d final ids not received "
        "(already acked), %d pass(es)",
        topic,
        acked,
        left,
        beyond,
        len(final) - acked,
        reader.passes,
    )
    read = reader.stats.in_window + reader.stats.duplicates + beyond
    return dict(dlq_topic=topic, acked=acked, left_pending=left, beyond_window=beyond, messages_read=read)


def _final_of(table: Any) -> FinalIds | FinalEntries:
    import pyarrow.compute as pc

    ids = table.column("dlq_message_id")
    if "ledger_id" not in table.column_names:
        if ids.null_count:
            raise PulsarConfigError("commit input has a null dlq_message_id; drop such rows")
        return FinalIds.from_arrow(ids)
    _require(table, ("entry_id", "batch_size"), ENTRIES_COMMIT_INPUT_SCHEMA)
    named = pc.is_valid(ids)
    whole = table.filter(pc.invert(named))
    columns = [whole.column(c) for c in ("ledger_id", "entry_id", "batch_size")]
    if any(c.null_count for c in columns):
        raise PulsarConfigError(
            "commit input has a row with neither a dlq_message_id nor a whole entry (ledger_id, entry_id, "
            "batch_size); drop such rows"
        )
    entries = list(zip(*(c.to_pylist() for c in columns), strict=True))
    return FinalEntries(entries, FinalIds.from_arrow(ids.filter(named)))


#: A readable id Arrow can cast field by field: ``<ledger>:<entry>:<partition>:<batch_index>``.
_PLAIN_ID = "^" + ":".join(["-?[0-9]{1,18}"] * 4) + "$"


def _parse(ids: Any) -> tuple[Any, ...]:
    """``(ledger, entry, batch_index)`` int64 arrays of readable ids; ``ValueError`` names a malformed one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    # Four integers of at most 18 digits always cast to int64; any other id is parsed one at a time.
    if pc.all(pc.match_substring_regex(ids, _PLAIN_ID)).as_py() is False:  # None: no ids
        keys = [message_id_key(text) for text in ids.to_pylist()]  # names a malformed id
        return tuple(pa.array([k[i] for k in keys], pa.int64()) for i in (0, 1, 3))
    parts = pc.split_pattern(ids, ":")
    return tuple(pc.cast(pc.list_element(parts, i), pa.int64()) for i in (0, 1, 3))


def _int64s(column: Any) -> array[int]:
    """An ``array('q')`` copy of a null-free ``pyarrow`` int64 array."""
    out = array("q")
    out.frombytes(column.to_numpy().data.cast("B"))  # zero-copy view of the (sliced) values, copied once
    return out


class FinalIds:
    """Sorted, distinct ``(ledger, entry, batch_index)`` of the messages to ack in one partition."""

    def __init__(self, ledgers: array[int], entries: array[int], batches: array[int]) -> None:
        self._ledgers, self._entries, self._batches = ledgers, entries, batches
        self._received = bytearray(len(ledgers))
        self._others = SeenIds()  # the ids that are not final, by their readable id
        self._hint = 0
        #: Index of the id the last :meth:`first` call looked up, -1 when it was not a final id.
        self.last_index = -1

    @classmethod
    def from_arrow(cls, ids: Any) -> FinalIds:
        """From a null-free ``pyarrow`` string array of readable ids, sorted and de-duplicated in Arrow."""
        import pyarrow as pa
        import pyarrow.compute as pc

        try:
            order = [(c, "ascending") for c in "leb"]
            keys = pa.table(dict(zip("leb", _parse(ids), strict=True))).sort_by(order)
            columns = [column.combine_chunks() for column in keys.columns]
            if len(columns[0]) > 1:
                repeated = [pc.equal(c[1:], c[:-1]) for c in columns]
                first = pc.invert(pc.and_(pc.and_(repeated[0], repeated[1]), repeated[2]))
                keep = pa.concat_arrays([pa.array([True]), first])
                columns = [c.filter(keep) for c in columns]
            return cls(*(_int64s(c) for c in columns))
        finally:
            pa.default_memory_pool().release_unused()

    def __len__(self) -> int:
        return len(self._ledgers)

    def drop_beyond(self, end: MessageIdKey | None) -> int:
        """Forget the ids past the window ``end`` (all of them when it is ``None``); returns how many."""
        n = len(self)
        ledgers, entries, batches = self._ledgers, self._entries, self._batches
        # in_window holds for a prefix of the sorted ids: find where it stops
        lo = bisect_left(range(n), True, key=lambda i: not in_window(ledgers[i], entries[i], batches[i], end))
        for column in (ledgers, entries, batches, self._received):
            del column[lo:]
        return n - lo

    def index(self, ledger: int, entry: int, batch: int) -> int:
        i, n = self._hint, len(self._ledgers)
        ledgers, entries, batches = self._ledgers, self._entries, self._batches
        if i < n and batches[i] == batch and entries[i] == entry and ledgers[i] == ledger:
            return i
        lo = bisect_left(ledgers, ledger)
        hi = bisect_right(ledgers, ledger, lo)
        lo = bisect_left(entries, entry, lo, hi)
        hi = bisect_right(entries, entry, lo, hi)
        i = bisect_left(batches, batch, lo, hi)
        return i if i < hi and batches[i] == batch else -1

    def first(self, ledger: int, entry: int, batch: int, id_str: str) -> bool:
        """Whether this is the first time the read returns the id; sets :attr:`last_index`."""
        i = self.last_index = self.index(ledger, entry, batch)
        if i < 0:
            return self._others.first(ledger, entry, batch, id_str)
        self._hint = i + 1
        first = not self._received[i]
        self._received[i] = 1
        return first


class FinalEntries:
    """Whole final entries (any message received of one is acked) plus :class:`FinalIds`; same interface."""

    def __init__(self, entries: list[tuple[int, int, int]], ids: FinalIds) -> None:
        self._ids = ids
        self._offset = len(ids)  # slots are numbered after the ids' indexes: last_index names one message
        self._slots: dict[tuple[int, int], tuple[int, int]] = {}
        slots = 0
        for ledger, entry, size in sorted(entries):
            if size < 1:
                raise ValueError(f"entry {ledger}:{entry} has size {size}; a whole entry holds >= 1 message")
            if (ledger, entry) in self._slots:
                raise ValueError(f"entry {ledger}:{entry} is given twice; give each whole entry once")
            self._slots[(ledger, entry)] = (self._offset + slots, size)
            slots += size
        self._received = bytearray(slots)
        self._whole = slots
        self._entry: tuple[int, int] | None = None
        self._slot: tuple[int, int] | None = None
        self.last_index = -1

    def __len__(self) -> int:
        return len(self._ids) + self._whole

    def drop_beyond(self, end: MessageIdKey | None) -> int:
        """Forget the messages past the window ``end``; returns how many."""
        dropped = self._ids.drop_beyond(end)
        for (ledger, entry), (_, size) in list(self._slots.items()):
            if not in_window(ledger, entry, size - 1, end):
                del self._slots[(ledger, entry)]
                self._whole -= size
                dropped += size
        self._entry = self._slot = None
        return dropped

    def first(self, ledger: int, entry: int, batch: int, id_str: str) -> bool:
        if (ledger, entry) != self._entry:
            self._entry = (ledger, entry)
            self._slot = self._slots.get(self._entry)
        slot = self._slot
        if slot is not None and max(batch, 0) < slot[1]:
            i = self.last_index = slot[0] + max(batch, 0)
            at = i - self._offset
            first = not self._received[at]
            self._received[at] = 1
            return first
        seen = self._ids.first(ledger, entry, batch, id_str)
        self.last_index = self._ids.last_index
        return seen


class EntryCommitFn:
    """Reader mode: acks the entries with ``final_messages == messages == batch_size``; a row per topic."""

    def __init__(self, conf: PulsarConf, windows: Sequence[PartitionWindow], subscription: str) -> None:
        if not subscription:
            raise PulsarConfigError("subscription is required, e.g. 'dlq-replayer'")
        if not conf.admin_url:
            raise PulsarConfigError("the reader-mode commit verifies acks through admin REST: set admin_url")
        self.conf = conf
        self.windows = {w.topic: w for w in windows}
        self.subscription = subscription

    def commit_table(self, table: Any, topics: Sequence[str] = ()) -> Any:
        """One result row per ``dlq_topic`` of ``table`` and per topic of ``topics``."""
        names = ("dlq_topic", "ledger_id", "entry_id", "messages", "final_messages", "batch_size")
        _require(table, names, ENTRY_COMMIT_INPUT_SCHEMA)
        by_topic: dict[str, list[_EntryRow]] = {topic: [] for topic in topics}
        columns = [table.column(c).to_pylist() for c in names]
        for topic, ledger, entry, messages, final, size in zip(*columns, strict=True):
            if topic is None:
                raise PulsarConfigError("commit input has a null dlq_topic; drop such rows")
            entries = by_topic.setdefault(topic, [])
            if ledger is not None and entry is not None:
                entries.append(((int(ledger), int(entry)), int(messages or 0), int(final or 0), size))
        return _result_table([self.commit_topic(topic, entries) for topic, entries in by_topic.items()])

    def commit_topic(self, topic: str, entries: list[_EntryRow]) -> dict[str, Any]:
        from spark_apps.dlq_replay.pulsar_io.admin import PulsarAdmin

        window = self.windows.get(topic)
        if window is None or window.pending is None:
            raise WindowError(
                f"dlq_topic {topic!r} has no reader-mode window in this run (known: {sorted(self.windows)}); "
                "commit only entries read from the run's frozen window"
            )
        end = None if window.end_key is None else window.end_key[:2]
        ackable: dict[Position, int] = {}
        left = partial = 0
        for position, messages, final, size in entries:
            if end is None or position > end:
                raise WindowError(
                    f"entry {position} of {topic} lies beyond the window end {window.end_message_id}"
                )
            if messages > 0 and final == messages and size == messages:
                ackable[position] = ackable.get(position, 0) + messages
            else:
                left += messages - final
                partial += final
        admin = PulsarAdmin(self.conf)
        before, _ = self._cursor(admin, topic)
        todo = [p for p in ackable if not before.is_acked(p)]  # a resumed commit may have acked some
        sent = bool(todo)
        if todo:
            todo = self._ack(admin, window, todo)
        cursor, stats = self._cursor(admin, topic)
        beyond = 0  # pending entries after the window end (all of them if the window is empty)
        if last := stats.get("lastConfirmedEntry"):
            ranges = pending_ranges(ledger_sizes(stats), cursor, parse_position(last), after=end)
            beyond = count_entries(ranges)
        unacked = sum(ackable[p] for p in todo)
        acked, entries_acked = sum(ackable.values()) - unacked, len(ackable) - len(todo)
        if unacked:
            log.warning(
                "commit %s: %d entries (%d final messages) could not be verified acked; they stay pending",
                topic,
                len(todo),
                unacked,
            )
        log.info(
            "commit %s (reader): acked %d messages in %d entries, %d final messages held by partly pending "
            "entries, %d left pending, %d pending entries beyond the window%s",
            topic,
            acked,
            entries_acked,
            partial,
            left,
            beyond,
            "" if sent else " (nothing to send: already acked)",
        )
        counts = dict(acked=acked, left_pending=left, beyond_window=beyond, final_in_partial_entries=partial)
        return dict(dlq_topic=topic, unacked_final=unacked, entries_acked=entries_acked, **counts)

    def _cursor(self, admin: Any, topic: str) -> tuple[CursorState, dict[str, Any]]:
        stats = admin.internal_stats(topic)
        return CursorState.from_internal_stats(stats, self.subscription, topic=topic), stats

    def _ack(self, admin: Any, window: PartitionWindow, todo: list[Position]) -> list[Position]:
        """Ack ``todo`` and verify the acks on the cursor; returns the entries still not acked."""
        import pulsar

        # acks only: nothing is dispatched to this consumer
        consumer = subscribe_shared(get_client(self.conf), window.topic, self.subscription, "ack", 0)
        part = max(window.partition, -1)
        try:
            for attempt in range(1, MAX_ACK_ATTEMPTS + 1):
                for ledger, entry in todo:
                    consumer.acknowledge(pulsar.MessageId(part, ledger, entry, -1))
                todo = self._wait_acked(admin, window.topic, todo)
                if not todo:
                    break
                log.warning(
                    "commit %s: %d acked entries not on the cursor after attempt %d/%d%s",
                    window.topic,
                    len(todo),
                    attempt,
                    MAX_ACK_ATTEMPTS,
                    ", sending them again" if attempt < MAX_ACK_ATTEMPTS else "",
                )
        finally:
            consumer.close()
        return todo

    def _wait_acked(self, admin: Any, topic: str, todo: list[Position]) -> list[Position]:
        deadline = time.monotonic() + VERIFY_TIMEOUT_S
        delay = 0.1
        while True:
            time.sleep(delay)  # the client sends grouped acks every 100 ms
            cursor, _ = self._cursor(admin, topic)
            todo = [p for p in todo if not cursor.is_acked(p)]
            if not todo or time.monotonic() >= deadline:
                return todo
            delay = min(1.0, delay * 2)
