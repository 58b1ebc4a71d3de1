"""Reader mode: read a share of a partition's pending entries with non-durable Readers, each entry once.

Readers ack nothing and no unacked limit applies. Acked entries in a gap of at most ``seek_gap`` are
read through and dropped; after a longer gap a new Reader starts. After an idle stop a new Reader
resumes after the last entry while passes make progress; entries left unread stay pending for the next run.
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.pulsar_io.cursor import EntryRange, Position, reader_segments
from spark_apps.dlq_replay.pulsar_io.window import (
    DEFAULT_IDLE_TIMEOUT_MS,
    DRAIN_MS,
    MAX_PASSES,
    unique_consumer_name,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow

log = logging.getLogger(__name__)

DEFAULT_READER_QUEUE_SIZE = 2000  # vs 1000: about 1.7x the read rate on Apache Pulsar (fewer flow requests)


@dataclass
class Entry:
    """One pending entry: its ``(id_str, message, message_id)`` in the window and the messages it holds."""

    ledger: int
    entry: int
    messages: list[tuple[str, Any, Any]] = field(default_factory=list)
    size: int = 0  # messages the entry holds (1 when not batched), those past the window end included
    last_batch_index: int = -2  # none read yet: below every batch index (-1 when not batched)

    @property
    def position(self) -> Position:
        return self.ledger, self.entry


@dataclass
class ReadStats:
    """What a :class:`ShareReader` read."""

    entries: int = 0
    messages: int = 0
    skipped_entries: int = 0  # acked entries read through in short gaps, dropped
    duplicates: int = 0
    beyond_window: int = 0  # messages of the end entry past the window end (never on Apache Pulsar)
    readers: int = 0
    resumes: int = 0
    unread_entries: int = 0  # pending entries not read (idle stops without progress)
    stopped_by: str = "not-started"  # end-reached | idle-timeout | empty


@dataclass
class ShareReader:
    """Iterates the pending entries of one share of a partition window, in order, each once."""

    client: Any
    window: PartitionWindow
    share: Sequence[EntryRange]
    _: KW_ONLY
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS
    receiver_queue_size: int = DEFAULT_READER_QUEUE_SIZE
    stats: ReadStats = field(default_factory=ReadStats, init=False)

    def entries(self) -> Iterator[Entry]:
        if self.window.end_message_id is None or not self.share:
            self.stats.stopped_by = "empty"
            return
        self.stats.stopped_by = "end-reached"
        for segment in reader_segments(self.share):
            yield from self._segment(segment)

    def _segment(self, ranges: list[EntryRange]) -> Iterator[Entry]:
        last: Position | None = None  # the last entry returned or skipped: nothing at or before it again
        passes = 0
        while True:
            passes += 1
            reading = _ReaderPass(self, ranges, last)
            yield from reading.entries()
            last = reading.last
            if reading.done:
                return
            if not reading.progress or passes >= MAX_PASSES:
                unread = _entries_after(ranges, last)
                self.stats.unread_entries += unread
                self.stats.stopped_by = "idle-timeout"
                log.warning(
                    "reader %s: nothing arrived for %d ms after %s; %d pending entries of the window stay "
                    "unread and pending for the next run",
                    self.window.topic,
                    self.idle_timeout_ms,
                    "the start" if last is None else f"entry {last[0]}:{last[1]}",
                    unread,
                )
                return
            self.stats.resumes += 1


class _ReaderPass:
    """One Reader over a segment, from its start or after ``last``; ``done`` once the share's end is read."""

    def __init__(self, owner: ShareReader, ranges: list[EntryRange], last: Position | None) -> None:
        end = owner.window.end_key
        assert end is not None
        self.owner = owner
        self.stats = owner.stats
        self.ranges = ranges
        self.stop = ranges[-1].stop
        self.end_pos: Position = (end[0], end[1])
        self.end_batch: int = end[3]
        self.last = last  # the last entry returned or skipped
        self.index = 0  # the range of ``ranges`` that the read is in
        self.skipping: Position | None = None  # the acked entry being read through
        self.current: Entry | None = None  # after the read: the entry still to return
        self.timeout = owner.idle_timeout_ms
        self.progress = False
        self.done = False

    def entries(self) -> Iterator[Entry]:
        import pulsar

        owner, last = self.owner, self.last
        start = self.ranges[0].start if last is None else last
        owner.stats.readers += 1
        reader = owner.client.create_reader(
            owner.window.topic,
            pulsar.MessageId(max(owner.window.partition, -1), start[0], start[1], -1),
            receiver_queue_size=owner.receiver_queue_size,
            reader_name=unique_consumer_name("reader"),
            start_message_id_inclusive=last is None,
        )
        read = getattr(reader, "_reader", reader).read_next  # the native reader: no wrapper per message
        try:
            yield from self._read(read)
        finally:
            reader.close()
        if self.current is not None:
            yield self._emit(self.current)
            self.last = self.current.position

    def _read(self, read: Callable[[int], Any]) -> Iterator[Entry]:
        import pulsar

        stats, end_batch, part = self.stats, self.end_batch, self.owner.window.partition
        timeout = self.timeout
        done = False
        current: Entry | None = None
        # The current entry's position, and what its messages need, in locals: most messages belong
        # to the entry before them (a batch arrives unpacked), so that path is kept short.
        current_pos: Position | None = None
        add: Any = None  # current.messages.append
        id_prefix = ""  # "ledger:entry:partition:" of the current entry
        at_end = at_stop_end = False  # the current entry is the window end's (and the share's last)
        while not done:
            try:
                msg = read(timeout)
            except pulsar.Timeout:
                done = timeout < self.owner.idle_timeout_ms  # a drain after the last entry ended
                break
            mid = msg.message_id()
            pos = (mid.ledger_id(), mid.entry_id())
            batch = mid.batch_index()
            if pos != current_pos:
                if pos == self.skipping:
                    continue
                if current is not None:
                    yield self._emit(current)
                    self.last = current_pos
                current = self._start(pos, batch)
                done, timeout = self.done, self.timeout
                if current is None:
                    current_pos = None
                    continue
                current_pos, add, id_prefix = pos, current.messages.append, f"{pos[0]}:{pos[1]}:{part}:"
                at_end = pos == self.end_pos
                at_stop_end = at_end and pos == self.stop
            assert current is not None
            if batch <= current.last_batch_index:
                stats.duplicates += 1
                continue
            current.size += 1
            current.last_batch_index = batch
            if at_end and 0 <= end_batch < batch:
                stats.beyond_window += 1
            else:
                add((f"{id_prefix}{batch}", msg, mid))
            if at_stop_end and 0 <= end_batch <= batch:
                done = True
        self.done, self.current = done, current

    def _start(self, pos: Position, batch: int) -> Entry | None:
        """The entry a message at ``pos`` begins, or ``None`` when it is dropped (returned already, acked
        in a short gap, or past the share). Every pass's first message comes here: progress."""
        self.progress = True
        if self.last is not None and pos <= self.last:
            self.stats.duplicates += 1
            return None
        if pos > self.stop:
            self.done = True
            return None
        ranges = self.ranges
        while ranges[self.index].stop < pos:
            self.index += 1
        if pos < ranges[self.index].start:
            self.stats.skipped_entries += 1
            self.skipping = self.last = pos
            return None
        if pos == self.stop:  # the share's last entry
            if batch < 0:
                self.done = True  # not batched: this message is the whole entry
            else:
                self.timeout = min(self.owner.idle_timeout_ms, DRAIN_MS)  # the rest of the batch is queued
        return Entry(pos[0], pos[1])

    def _emit(self, entry: Entry) -> Entry:
        self.stats.entries += 1
        self.stats.messages += len(entry.messages)
        return entry


def _entries_after(ranges: Sequence[EntryRange], last: Position | None) -> int:
    total = 0
    for r in ranges:
        if last is None or r.start > last:
            total += r.entries
        elif r.stop > last:
            total += r.last - last[1]
    return total
