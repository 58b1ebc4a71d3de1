"""The consumer-mode commit's compact index of final ids (pure logic)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from test_pulsar_io_window_consumer import FakeClient, FakeMessage

from spark_apps.dlq_replay.pulsar_io.commit import FinalEntries, FinalIds
from spark_apps.dlq_replay.pulsar_io.read import WindowPasses
from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow


def ids(*texts: str) -> FinalIds:
    return FinalIds.from_arrow(pa.array(texts, pa.string()))


def test_ids_are_sorted_by_id_order_and_counted_once():
    final = ids("1:10:-1:-1", "1:9:-1:-1", "0:5:-1:3", "1:9:-1:-1", "0:5:-1:1", "2:0:-1:-1")
    assert len(final) == 5
    assert final.index(0, 5, 1) == 0
    assert final.index(0, 5, 3) == 1
    assert final.index(1, 9, -1) == 2  # numeric order: 9 before 10, although "10" < "9" as text
    assert final.index(1, 10, -1) == 3
    assert final.index(2, 0, -1) == 4
    assert final.index(0, 5, 2) == -1
    assert final.index(1, 11, -1) == -1
    assert final.index(3, 0, -1) == -1


def test_a_chunked_array_and_an_empty_one():
    chunked = pa.chunked_array([["1:1:0:-1", "1:2:0:-1"], ["1:0:0:-1"]])
    final = FinalIds.from_arrow(chunked)
    assert [final.index(1, e, -1) for e in (0, 1, 2)] == [0, 1, 2]
    assert len(FinalIds.from_arrow(pa.array([], pa.string()))) == 0


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("1:2:3", "expected '<ledger>:<entry>:<partition>:<batch_index>'"),
        ("1:2:a:-1", "all four fields must be integers"),
        ("1:2:-1:x", "all four fields must be integers"),
    ],
)
def test_a_malformed_id_is_named(bad, message):
    with pytest.raises(ValueError, match=f"invalid message id '{bad}'.*{message}"):
        ids("1:1:-1:-1", bad)


def test_drop_beyond_keeps_exactly_the_window():
    texts = ["1:1:-1:-1", "1:2:-1:0", "1:2:-1:1", "1:2:-1:2", "1:3:-1:-1", "2:0:-1:-1"]
    whole_entry = ids(*texts)
    assert whole_entry.drop_beyond((1, 2, -1, -1)) == 2  # the end names the whole batched entry 1:2
    assert len(whole_entry) == 4
    assert whole_entry.index(1, 2, 2) == 3
    assert whole_entry.index(1, 3, -1) == -1
    inside_batch = ids(*texts)
    assert inside_batch.drop_beyond((1, 2, -1, 1)) == 3
    assert inside_batch.index(1, 2, 1) == 2
    assert inside_batch.index(1, 2, 2) == -1
    empty_window = ids(*texts)
    assert empty_window.drop_beyond(None) == 6
    assert len(empty_window) == 0
    assert ids(*texts).drop_beyond((9, 0, -1, -1)) == 0


def test_first_returns_each_id_once_and_tells_final_from_pending():
    final = ids("1:1:-1:-1", "1:3:-1:-1")
    seen = [
        (final.first(1, 1, -1, "1:1:-1:-1"), final.last_index),
        (final.first(1, 2, -1, "1:2:-1:-1"), final.last_index),  # pending: not a final id
        (final.first(1, 3, -1, "1:3:-1:-1"), final.last_index),
        (final.first(1, 1, -1, "1:1:-1:-1"), final.last_index),  # a redelivery, out of order
        (final.first(1, 2, -1, "1:2:-1:-1"), final.last_index),
    ]
    assert seen == [(True, 0), (True, -1), (True, 1), (False, 0), (False, -1)]


def test_the_window_read_skips_redeliveries_through_final_ids():
    script = [FakeMessage(1, 0), FakeMessage(1, 1), FakeMessage(1, 0), FakeMessage(1, 2), FakeMessage(1, 1)]
    final = ids("1:0:-1:-1", "1:2:-1:-1")
    window = PartitionWindow("persistent://t/n/dlq", -1, "1:2:-1:-1")
    consumer = WindowPasses(FakeClient(script), window, "replayer", role="commit", resume=False, seen=final)
    got = [(i, final.last_index) for i, *_ in consumer.messages()]
    assert got == [("1:0:-1:-1", 0), ("1:1:-1:-1", -1), ("1:2:-1:-1", 1)]
    assert consumer.stats.duplicates == 1  # 1:0 again; the read stopped at the end, before 1:1's repeat


def test_int64_copy_of_a_sliced_array():
    from spark_apps.dlq_replay.pulsar_io.commit import _int64s

    assert list(_int64s(pa.array([5, -1, 7, 9], pa.int64()).slice(1, 2))) == [-1, 7]


def test_whole_entries_take_any_message_of_theirs_and_single_ids_the_rest():
    # Entry 1:0 holds a batch of 3, all final; 1:1 is not batched and final; 1:2 is a batch of 2 with one
    # pending message (its final id comes alone); 1:3 is pending.
    final = FinalEntries([(1, 1, 1), (1, 0, 3)], ids("1:2:-1:0"))
    assert len(final) == 5
    seen = [(final.first(1, 0, b, f"1:0:-1:{b}"), final.last_index >= 0) for b in (0, 1, 2, 3)] + [
        (final.first(1, 1, -1, "1:1:-1:-1"), final.last_index >= 0),
        (final.first(1, 2, 0, "1:2:-1:0"), final.last_index >= 0),
        (final.first(1, 2, 1, "1:2:-1:1"), final.last_index >= 0),
        (final.first(1, 3, -1, "1:3:-1:-1"), final.last_index >= 0),
        (final.first(1, 0, 1, "1:0:-1:1"), final.last_index >= 0),  # a redelivery of a whole entry's
    ]
    # batch index 3 lies past the entry's 3 messages: not final (the snapshot never read it)
    assert seen == [
        (True, True),
        (True, True),
        (True, True),
        (True, False),
        (True, True),
        (True, True),
        (True, False),
        (True, False),
        (False, True),
    ]


def test_whole_entry_indexes_follow_the_single_ids():
    final = FinalEntries([(2, 0, 2)], ids("1:0:-1:-1", "1:1:-1:-1"))
    final.first(2, 0, 1, "2:0:-1:1")
    assert final.last_index == 3
    final.first(1, 1, -1, "1:1:-1:-1")
    assert final.last_index == 1


def test_whole_entries_beyond_the_window_are_dropped():
    final = FinalEntries([(1, 0, 2), (1, 1, 3), (1, 2, 1)], ids("1:1:-1:0"))
    assert final.drop_beyond((1, 1, -1, 1)) == 4  # 1:1 reaches past batch index 1; 1:2 lies beyond
    assert len(final) == 3  # 1:0's two messages and the single id
    assert final.first(1, 1, 2, "1:1:-1:2")
    assert final.last_index == -1


@pytest.mark.parametrize(
    ("entries", "message"), [([(1, 0, 0)], "has size 0"), ([(1, 0, 2), (1, 0, 2)], "given twice")]
)
def test_a_bad_whole_entry_is_named(entries, message):
    with pytest.raises(ValueError, match=message):
        FinalEntries(entries, ids())
