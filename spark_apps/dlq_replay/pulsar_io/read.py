"""Read a frozen partition window with Readers or Shared consumers (``docs/pulsar-data-source.md``)."""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.pulsar_io.cursor import EntryRange, Position, reader_segments
from spark_apps.dlq_replay.pulsar_io.ids import MessageIdKey, in_window
from spark_apps.dlq_replay.pulsar_io.window import subscribe_shared, unique_consumer_name

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from spark_apps.dlq_replay.pulsar_io.commit import FinalEntries, FinalIds
    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow

log = logging.getLogger(__name__)

#: How long a read waits for a message before it stops (idle), and how often it resumes at most.
DEFAULT_IDLE_TIMEOUT_MS = 5000
MAX_PASSES = 20
#: The wait for the rest of a batch already queued locally once its entry ends the read.
DRAIN_MS = 200
DEFAULT_RECEIVER_QUEUE_SIZE = 1000
DEFAULT_READER_QUEUE_SIZE = 2000  # vs 1000: about 1.7x the read rate on Apache Pulsar (fewer flow requests)


@dataclass
class ConsumeStats:
    """What the consumers saw of their window."""

    in_window: int = 0
    duplicates: int = 0
    beyond_window: int = 0
    stopped_by: str = "not-started"  # end-reached | idle-timeout | empty-window


class SeenIds(set[str]):
    """The readable ids a read returned (the commit passes its final ids, which answer ``first`` too)."""

    def first(self, ledger: int, entry: int, batch: int, id_str: str) -> bool:
        """Whether the id is returned for the first time (and remember it)."""
        if id_str in self:
            return False
        self.add(id_str)
        return True


@dataclass
class WindowPasses:
    """Reads a window through one Shared consumer after another (``resume``: after an idle stop that
    found messages), each id once; ``stats`` sums the passes (``beyond_window``: the largest pass's)."""

    client: Any
    window: PartitionWindow
    subscription: str
    _: KW_ONLY
    role: str
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS
    receiver_queue_size: int = DEFAULT_RECEIVER_QUEUE_SIZE
    batch_index_ack: bool = False
    resume: bool = True
    seen: SeenIds | FinalIds | FinalEntries = field(default_factory=SeenIds)
    passes: int = field(default=0, init=False)
    stats: ConsumeStats = field(default_factory=ConsumeStats, init=False)

    def messages(self) -> Iterator[tuple[str, Any, Any, Any]]:
        """``(message_id_str, message, message_id, consumer)``: ack through that consumer while iterating."""
        end = self.window.end_key
        if end is None:
            self.stats.stopped_by = "empty-window"
            return
        stats = self.stats
        while self.passes < MAX_PASSES:
            self.passes += 1
            found = ConsumeStats()
            consumer = subscribe_shared(
                self.client,
                self.window.topic,
                self.subscription,
                self.role,
                self.receiver_queue_size,
                batch_index_ack_enabled=self.batch_index_ack,
            )
            try:
                yield from self._pass(consumer, end, found)
            finally:
                consumer.close()
            stats.in_window += found.in_window
            stats.duplicates += found.duplicates
            stats.beyond_window = max(stats.beyond_window, found.beyond_window)
            stats.stopped_by = found.stopped_by
            if not self.resume or found.stopped_by != "idle-timeout" or found.in_window == 0:
                return

    def _pass(
        self, consumer: Any, end: MessageIdKey, stats: ConsumeStats
    ) -> Iterator[tuple[str, Any, Any, Any]]:
        """One consumer's messages of the window, until the end entry is reached or it is idle."""
        import pulsar

        # The wrapper's receive() builds a pulsar.Message per message; the hot loop uses the native one.
        receive = getattr(consumer, "_consumer", consumer).receive
        timeout = self.idle_timeout_ms
        part = self.window.partition
        first = self.seen.first
        end_pos = end[:2]
        while True:
            try:
                msg = receive(timeout)
            except pulsar.Timeout:
                stats.stopped_by = "end-reached" if timeout < self.idle_timeout_ms else "idle-timeout"
                return
            mid = msg.message_id()
            ledger, entry, batch = mid.ledger_id(), mid.entry_id(), mid.batch_index()
            if in_window(ledger, entry, batch, end):
                id_str = f"{ledger}:{entry}:{part}:{batch}"
                if first(ledger, entry, batch, id_str):
                    stats.in_window += 1
                    yield id_str, msg, mid, consumer
                else:
                    stats.duplicates += 1
            else:
                stats.beyond_window += 1
            if (ledger, entry) < end_pos:  # the window's last entry not reached yet (entries come in order)
                continue
            if (ledger, entry) != end_pos or batch < 0 or (end[3] >= 0 and batch >= end[3]):
                stats.stopped_by = "end-reached"
                return
            if end[3] < 0:
                # The end names a whole batched entry: its other messages are already queued locally.
                timeout = min(self.idle_timeout_ms, DRAIN_MS)


@dataclass
class Entry:
    """One pending entry: its ``(id_str, message, message_id)`` in the window and the messages it holds."""

    ledger: int
    entry: int
    messages: list[tuple[str, Any, Any]] = field(default_factory=list)
    size: int = 0  # messages the entry holds (1 when not batched), those past the window end included
    last_batch_index: int = -2  # none read yet: below every batch index (-1 when not batched)


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
    stopped_by: str = "not-started"  # end-reached | idle-timeout


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
        self.stats.stopped_by = "end-reached"
        for segment in reader_segments(self.share):
            for entry in self._segment(segment):
                self.stats.entries += 1
                self.stats.messages += len(entry.messages)
                yield entry

    def _segment(self, ranges: list[EntryRange]) -> Iterator[Entry]:
        last: Position | None = None  # the last entry returned or skipped: nothing at or before it again
        for passes in range(1, MAX_PASSES + 1):
            reading = _ReaderPass(self, ranges, last)
            yield from reading.entries()
            last = reading.last
            if reading.done:
                return
            if not reading.progress or passes == MAX_PASSES:
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
        self.owner = owner
        self.ranges = ranges
        self.stop = ranges[-1].stop
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
            yield self.current
            self.last = (self.current.ledger, self.current.entry)

    def _read(self, read: Callable[[int], Any]) -> Iterator[Entry]:
        import pulsar

        stats, part, end = self.owner.stats, self.owner.window.partition, self.owner.window.end_key
        assert end is not None
        end_pos, end_batch = end[:2], end[3]
        timeout = self.timeout
        done = False
        current: Entry | None = None
        # The current entry in locals: most messages belong to the entry before them (batches come unpacked).
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
                    yield current
                    self.last = current_pos
                current = self._start(pos, batch)
                done, timeout = self.done, self.timeout
                if current is None:
                    current_pos = None
                    continue
                current_pos, add, id_prefix = pos, current.messages.append, f"{pos[0]}:{pos[1]}:{part}:"
                at_end = pos == end_pos
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
            self.owner.stats.duplicates += 1
            return None
        if pos > self.stop:
            self.done = True
            return None
        ranges = self.ranges
        while ranges[self.index].stop < pos:
            self.index += 1
        if pos < ranges[self.index].start:
            self.owner.stats.skipped_entries += 1
            self.skipping = self.last = pos
            return None
        if pos == self.stop:  # the share's last entry
            if batch < 0:
                self.done = True  # not batched: this message is the whole entry
            else:
                self.timeout = min(self.owner.idle_timeout_ms, DRAIN_MS)  # the rest of the batch is queued
        return Entry(pos[0], pos[1])


def _entries_after(ranges: Sequence[EntryRange], last: Position | None) -> int:
    total = 0
    for r in ranges:
        if last is None or r.start > last:
            total += r.entries
        elif r.stop > last:
            total += r.last - last[1]
    return total
