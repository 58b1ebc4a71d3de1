"""Cursor state from ``internalStats``: acked entries, pending ranges of a window, reader shares."""

from __future__ import annotations

import json
import random

import pytest

from spark_apps.dlq_replay.pulsar_io.cursor import (
    CursorState,
    EntryRange,
    count_entries,
    ledger_sizes,
    parse_deleted_ranges,
    parse_position,
    pending_ranges,
    reader_segments,
    split_for_readers,
)
from spark_apps.dlq_replay.pulsar_io.errors import WindowError
from spark_apps.dlq_replay.pulsar_io.window import (
    CONSUMER_MODE,
    READER_MODE,
    PartitionWindow,
    read_mode_of,
    windows_from_json,
    windows_to_json,
)

SUB = "dlq-replayer"


def stats(ledgers, mark_delete="3:-1", deleted="[]", *, current=None, lac=None, state="LedgerOpened"):
    """An ``internalStats`` answer as Apache Pulsar 4.0 shapes it (the open ledger listed with 0 entries)."""
    listed = [{"ledgerId": lid, "entries": n, "size": 1, "offloaded": False} for lid, n in ledgers]
    out = {
        "state": state,
        "ledgers": listed,
        "currentLedgerEntries": current if current is not None else 0,
        "cursors": {SUB: {"markDeletePosition": mark_delete, "individuallyDeletedMessages": deleted}},
    }
    if lac:
        out["lastConfirmedEntry"] = lac
    return out


def test_positions_and_deleted_ranges_parse_and_fail_with_the_format():
    assert parse_position("12:345") == (12, 345)
    assert parse_position("3:-1") == (3, -1)
    assert parse_deleted_ranges("[]") == []
    assert parse_deleted_ranges("[(11:2..11:3],(11:0..11:1]]") == [((11, 0), (11, 1)), ((11, 2), (11, 3))]
    with pytest.raises(WindowError, match="'<ledger>:<entry>'"):
        parse_position("12")
    with pytest.raises(WindowError, match="individuallyDeletedMessages"):
        parse_deleted_ranges("[garbage]")


def test_cursor_from_internal_stats_and_is_acked():
    cursor = CursorState.from_internal_stats(
        stats([(4, 0)], "4:1", "[(4:2..4:3],(4:5..4:7]]", current=10), SUB, topic="t"
    )
    acked = [e for e in range(10) if cursor.is_acked((4, e))]
    assert acked == [0, 1, 3, 6, 7]
    assert cursor.is_acked((3, 99))  # an earlier ledger is behind the mark-delete
    assert not cursor.is_acked((5, 0))
    with pytest.raises(WindowError, match="has no cursor"):
        CursorState.from_internal_stats(stats([(4, 0)]), "other-sub", topic="t")
    with pytest.raises(WindowError, match="no 'cursors'"):
        CursorState.from_internal_stats({"ledgers": []}, SUB, topic="t")


def test_ledger_sizes_count_the_open_ledger():
    assert ledger_sizes(stats([(3, 10), (7, 0)], current=4, lac="7:3")) == [(3, 10), (7, 4)]
    assert ledger_sizes(stats([(3, 10), (7, 5)], state="LedgerClosed")) == [(3, 10), (7, 5)]
    with pytest.raises(WindowError, match="no 'ledgers'"):
        ledger_sizes({"cursors": {}})


def test_pending_ranges_skip_acked_holes_and_count_the_gaps():
    sizes = [(3, 10), (5, 0), (7, 6)]  # ledger 5 is empty
    cursor = CursorState((3, 1), (((3, 3), (3, 5)), ((3, 8), (7, 1))))  # the second spans ledgers
    ranges = pending_ranges(sizes, cursor, (7, 4))
    assert ranges == [
        EntryRange(3, 2, 3, 0),
        EntryRange(3, 6, 8, 2),  # 3:4 and 3:5 acked
        EntryRange(7, 2, 4, 3),  # 3:9, 7:0, 7:1 acked
    ]
    assert count_entries(ranges) == 8
    # Everything at or before the mark-delete, or past the window end, is never pending.
    assert pending_ranges(sizes, CursorState((7, 4)), (7, 4)) == []
    assert pending_ranges(sizes, CursorState((7, 5)), (7, 4)) == []
    # ``after`` starts later than the mark-delete (entries beyond a window end).
    assert pending_ranges(sizes, CursorState((3, -1)), (7, 5), after=(7, 4)) == [EntryRange(7, 5, 5, 0)]


def test_pending_ranges_match_a_brute_force_count_on_random_cursors():
    rng = random.Random(7)
    for _ in range(300):
        sizes = [(lid, rng.randint(0, 12)) for lid in sorted(rng.sample(range(1, 30), rng.randint(1, 4)))]
        entries = [(lid, e) for lid, n in sizes for e in range(n)]
        if not entries:
            continue
        acked = {p for p in entries if rng.random() < 0.4}
        mark = rng.choice([(sizes[0][0], -1), *entries])
        # Build open-closed ranges from maximal runs of acked entries after the mark-delete.
        deleted, run_start, prev = [], None, None
        for p in entries:
            if p > mark and p in acked:
                if run_start is None:
                    run_start = prev if prev is not None else (p[0], p[1] - 1)
                last = p
            elif run_start is not None:
                deleted.append((run_start, last))
                run_start = None
            prev = p
        if run_start is not None:
            deleted.append((run_start, last))
        cursor = CursorState(mark, tuple(deleted))
        end = rng.choice(entries)
        expected = [p for p in entries if mark < p <= end and not cursor.is_acked(p)]
        got = [(r.ledger, e) for r in pending_ranges(sizes, cursor, end) for e in range(r.first, r.last + 1)]
        assert got == expected
        assert all(p in acked for p in entries if mark < p <= end and p not in expected)


def test_split_for_readers_gives_contiguous_balanced_shares():
    ranges = [EntryRange(3, 0, 9999, 0), EntryRange(3, 10_100, 14_999, 100), EntryRange(9, 0, 4999, 0)]
    shares = split_for_readers(ranges, 4, min_entries=1000)
    assert len(shares) == 4
    flat = [(r.ledger, e) for share in shares for r in share for e in range(r.first, r.last + 1)]
    assert flat == [(r.ledger, e) for r in ranges for e in range(r.first, r.last + 1)]
    assert [count_entries(s) for s in shares] == [4975, 4975, 4975, 4975]  # 19,900 entries
    # Fewer shares when each would get less than the minimum; one share for a tiny window.
    assert len(split_for_readers(ranges, 16, min_entries=6000)) == 3
    assert len(split_for_readers([EntryRange(3, 0, 9, 0)], 8, min_entries=1000)) == 1
    assert split_for_readers([], 4, min_entries=1000) == []


def test_reader_segments_start_a_new_reader_after_a_long_gap():
    share = [EntryRange(3, 0, 9, 0), EntryRange(3, 20, 29, 10), EntryRange(3, 2000, 2009, 1970)]
    assert reader_segments(share, seek_gap=500) == [share[:2], share[2:]]
    assert reader_segments(share, seek_gap=5000) == [share]


def test_windows_json_keeps_the_reader_mode_state_and_reads_format_1():
    reader = [
        PartitionWindow("persistent://t/n/a-partition-0", 0, "3:9:0:4", (EntryRange(3, 2, 9, 1),)),
        PartitionWindow("persistent://t/n/a-partition-1", 1, None, ()),
    ]
    back = windows_from_json(windows_to_json(reader))
    assert back == reader
    assert read_mode_of(back) == READER_MODE
    assert back[0].pending_entries == 8
    consumer = json.dumps(
        {"format": 2, "windows": [{"topic": "persistent://t/n/a", "partition": -1, "end_message_id": None}]}
    )
    assert read_mode_of(windows_from_json(consumer)) == CONSUMER_MODE
    with pytest.raises(WindowError, match="pending range"):
        EntryRange.from_list([3, 5, 2, 0])
