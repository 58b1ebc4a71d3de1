"""ShareReader over a scripted fake Reader: duplicates, acked entries in a short gap, an idle resume, the
window end's batch index and messages past it (pure logic, no broker)."""

from __future__ import annotations

import pulsar

from spark_apps.dlq_replay.pulsar_io.cursor import EntryRange
from spark_apps.dlq_replay.pulsar_io.read import ShareReader
from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow

TOPIC = "persistent://t/n/orders-DLQ"


class FakeId:
    def __init__(self, entry: int, batch: int) -> None:
        self.entry, self.batch = entry, batch

    def ledger_id(self) -> int:
        return 1

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return self.batch


class FakeMessage:
    def __init__(self, entry: int, batch: int = -1) -> None:
        self.id = FakeId(entry, batch)

    def message_id(self) -> FakeId:
        return self.id


class FakeReader:
    """Delivers its pass's messages, then times out (idle)."""

    def __init__(self, script: list[FakeMessage]) -> None:
        self.script = script
        self.closed = False

    def read_next(self, timeout_millis: int) -> FakeMessage:
        if not self.script:
            raise pulsar.Timeout("idle")
        return self.script.pop(0)

    def close(self) -> None:
        self.closed = True


class FakeClient:
    def __init__(self, passes: list[list[FakeMessage]]) -> None:
        self.passes = list(passes)
        self.opened: list[tuple[int, int, bool]] = []
        self.readers: list[FakeReader] = []

    def create_reader(self, topic: str, start: pulsar.MessageId, **kwargs: object) -> FakeReader:
        assert topic == TOPIC
        self.opened.append((start.ledger_id(), start.entry_id(), bool(kwargs["start_message_id_inclusive"])))
        reader = FakeReader(self.passes.pop(0) if self.passes else [])
        self.readers.append(reader)
        return reader


def batch(entry: int, *indexes: int) -> list[FakeMessage]:
    return [FakeMessage(entry, i) for i in indexes]


def read(passes: list[list[FakeMessage]], end: str, share: list[EntryRange]):
    client = FakeClient(passes)
    reader = ShareReader(client, PartitionWindow(TOPIC, -1, end), share, idle_timeout_ms=10)
    entries = [((e.ledger, e.entry), [m[0] for m in e.messages], e.size) for e in reader.entries()]
    assert all(r.closed for r in client.readers)
    return entries, reader.stats, client.opened


def test_entries_once_each_through_duplicates_gaps_a_resume_and_the_window_end():
    # Pending: entries 0..3 and 6..9 (4 and 5 acked: a short gap, read through and dropped). The window
    # ends at batch index 1 of entry 9.
    share = [EntryRange(1, 0, 3, 0), EntryRange(1, 6, 9, 2)]
    first_pass = [
        *batch(0, 0, 1),
        FakeMessage(0, 1),  # a duplicate of a batch index already returned
        *batch(0, 2),
        FakeMessage(1),
        *batch(2, 0, 1),
    ]  # then idle: a new Reader resumes after entry 2
    second_pass = [
        *batch(2, 0),  # entry 2 again: returned already
        FakeMessage(3),
        FakeMessage(4),  # acked (in the gap)
        *batch(5, 0, 1),  # acked, batched
        FakeMessage(6),
        FakeMessage(7),
        *batch(9, 0, 2),  # batch index 2 is past the window end (1) and ends the read
        *batch(9, 3),
        FakeMessage(10),
    ]
    entries, stats, opened = read([first_pass, second_pass], "1:9:-1:1", share)

    assert entries == [
        ((1, 0), ["1:0:-1:0", "1:0:-1:1", "1:0:-1:2"], 3),
        ((1, 1), ["1:1:-1:-1"], 1),
        ((1, 2), ["1:2:-1:0", "1:2:-1:1"], 2),
        ((1, 3), ["1:3:-1:-1"], 1),
        ((1, 6), ["1:6:-1:-1"], 1),
        ((1, 7), ["1:7:-1:-1"], 1),
        ((1, 9), ["1:9:-1:0"], 2),
    ]
    assert opened == [(1, 0, True), (1, 2, False)]
    assert (stats.entries, stats.messages, stats.skipped_entries, stats.duplicates) == (7, 10, 2, 2)
    assert (stats.beyond_window, stats.readers, stats.resumes, stats.unread_entries) == (1, 2, 1, 0)
    assert stats.stopped_by == "end-reached"


def test_the_last_entry_of_a_batched_window_end_stops_at_its_batch_index():
    entries, stats, _ = read([[*batch(4, 0, 1, 2), *batch(5, 0)]], "1:4:-1:1", [EntryRange(1, 4, 4, 0)])
    assert entries == [((1, 4), ["1:4:-1:0", "1:4:-1:1"], 2)]
    assert (stats.messages, stats.beyond_window, stats.stopped_by) == (2, 0, "end-reached")


def test_an_entry_past_the_share_stops_the_read_and_is_not_returned():
    entries, stats, _ = read(
        [[FakeMessage(0), FakeMessage(1), FakeMessage(2)]], "1:9:-1:-1", [EntryRange(1, 0, 1)]
    )
    assert [e[0] for e in entries] == [(1, 0), (1, 1)]
    assert stats.stopped_by == "end-reached"


def test_idle_passes_without_progress_leave_the_rest_unread():
    # Pass 1 returns entry 0 and stalls; pass 2 brings nothing: entries 1..4 stay pending.
    entries, stats, opened = read([[FakeMessage(0)], []], "1:4:-1:-1", [EntryRange(1, 0, 4)])
    assert [e[0] for e in entries] == [(1, 0)]
    assert opened == [(1, 0, True), (1, 0, False)]
    assert (stats.unread_entries, stats.resumes, stats.stopped_by) == (4, 1, "idle-timeout")
