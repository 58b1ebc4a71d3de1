"""The final message ids of one partition, compact: what the consumer-mode commit looks messages up in.

:class:`FinalIds` keeps the ids sorted in three ``array('q')`` columns with a received flag each (25
bytes an id, against about 90 in a set of strings) and is also the read's de-duplication
(:class:`~.read.SeenIds`). A lookup first tries the id after the last one found.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from typing import Any

from spark_apps.dlq_replay.pulsar_io.ids import MessageIdKey, in_window, message_id_key

#: A readable id Arrow can cast field by field: ``<ledger>:<entry>:<partition>:<batch_index>``.
_PLAIN_ID = "^" + ":".join(["-?[0-9]{1,18}"] * 4) + "$"


def _parse(ids: Any) -> tuple[Any, Any, Any]:
    """``(ledger, entry, batch_index)`` int64 arrays of readable ids; ``ValueError`` names a malformed one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    # Four plain integers of at most 18 digits each always cast to int64; anything else (a malformed id,
    # or a form Python's int reads and Arrow does not) is parsed one id at a time.
    if pc.all(pc.match_substring_regex(ids, _PLAIN_ID)).as_py() is False:  # None: no ids
        keys = [message_id_key(text) for text in ids.to_pylist()]  # names a malformed id
        ledger, entry, batch = (pa.array([k[i] for k in keys], pa.int64()) for i in (0, 1, 3))
        return ledger, entry, batch
    parts = pc.split_pattern(ids, ":")
    ledger, entry, _, batch = (pc.cast(pc.list_element(parts, i), pa.int64()) for i in range(4))
    return ledger, entry, batch


def _int64s(column: Any) -> array[int]:
    """An ``array('q')`` copy of a null-free ``pyarrow`` int64 array."""
    out = array("q")
    start = column.offset * out.itemsize
    out.frombytes(memoryview(column.buffers()[1])[start : start + len(column) * out.itemsize])
    return out


class FinalIds:
    """Sorted, distinct ``(ledger, entry, batch_index)`` of the messages to ack in one partition."""

    def __init__(self, ledgers: array[int], entries: array[int], batches: array[int]) -> None:
        self._ledgers, self._entries, self._batches = ledgers, entries, batches
        self._received = bytearray(len(ledgers))
        self._others: set[str] = set()
        self._hint = 0
        #: Index of the id the last :meth:`first` call looked up, -1 when it was not a final id.
        self.last_index = -1

    @classmethod
    def from_arrow(cls, ids: Any) -> FinalIds:
        """From a null-free ``pyarrow`` string array of readable ids, sorted and de-duplicated in Arrow."""
        import pyarrow as pa
        import pyarrow.compute as pc

        try:
            keys = pa.table(dict(zip("leb", _parse(ids), strict=True)))
            keys = keys.take(pc.sort_indices(keys, [(c, "ascending") for c in "leb"]))
            columns = [keys.column(c).combine_chunks() for c in "leb"]
            del keys
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
        for column in (self._ledgers, self._entries, self._batches):
            del column[lo:]
        del self._received[lo:]
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
            if id_str in self._others:
                return False
            self._others.add(id_str)
            return True
        self._hint = i + 1
        if self._received[i]:
            return False
        self._received[i] = 1
        return True


class FinalEntries:
    """Whole final entries (any message received of one is acked, no id to look up) plus the single
    final ids of other entries; the same interface as :class:`FinalIds`."""

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
            if self._received[at]:
                return False
            self._received[at] = 1
            return True
        seen = self._ids.first(ledger, entry, batch, id_str)
        self.last_index = self._ids.last_index
        return seen
