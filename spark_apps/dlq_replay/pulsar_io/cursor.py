"""A subscription's cursor on one partition (admin REST ``internalStats``): its acked and pending entries."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.pulsar_io.errors import WindowError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

#: ``(ledger_id, entry_id)`` of an entry; tuples order entries the way the broker does.
Position = tuple[int, int]

_RANGE = re.compile(r"\((-?\d+):(-?\d+)\.\.(-?\d+):(-?\d+)\]")
_POSITION = re.compile(r"^\s*(-?\d+):(-?\d+)\s*$")
#: Entries a Reader reads through (and skips) rather than starting a new Reader after them.
DEFAULT_SEEK_GAP = 500


def parse_position(text: str) -> Position:
    """``"12:345"`` -> ``(12, 345)``."""
    match = _POSITION.match(str(text))
    if not match:
        raise WindowError(f"invalid cursor position {text!r}: expected '<ledger>:<entry>', e.g. '12:345'")
    return int(match.group(1)), int(match.group(2))


def parse_deleted_ranges(text: str) -> list[tuple[Position, Position]]:
    """Parse ``individuallyDeletedMessages`` (``"[(11:0..11:1],(11:2..11:3]]"``): open-closed ranges."""
    body = str(text or "").strip()
    if body in ("", "[]"):
        return []
    ranges = [((int(a), int(b)), (int(c), int(d))) for a, b, c, d in _RANGE.findall(body)]
    if not ranges:
        raise WindowError(
            f"cannot parse individuallyDeletedMessages {body[:200]!r}: expected '[(L:E..L:E],...]'"
        )
    return sorted(ranges)


@dataclass(frozen=True)
class CursorState:
    """What a subscription has acked on one partition: mark-delete plus the acked ranges beyond it, sorted."""

    mark_delete: Position
    deleted: tuple[tuple[Position, Position], ...] = ()

    @cached_property
    def upper_bounds(self) -> list[Position]:
        return [hi for _, hi in self.deleted]

    @classmethod
    def from_internal_stats(cls, stats: dict[str, Any], subscription: str, *, topic: str) -> CursorState:
        cursors = stats.get("cursors") if isinstance(stats, dict) else None
        if not isinstance(cursors, dict):
            raise WindowError(f"internalStats of {topic} has no 'cursors'; is the admin URL Apache Pulsar's?")
        cursor = cursors.get(subscription)
        if not isinstance(cursor, dict):
            raise WindowError(
                f"subscription {subscription!r} has no cursor on {topic} (cursors: {sorted(cursors)}); "
                "it is created by the plan step, so another process may have deleted it: run again"
            )
        return cls(
            parse_position(cursor.get("markDeletePosition", "")),
            tuple(parse_deleted_ranges(cursor.get("individuallyDeletedMessages", "[]"))),
        )

    def is_acked(self, position: Position) -> bool:
        if position <= self.mark_delete:
            return True
        his = self.upper_bounds
        i = bisect.bisect_left(his, position)
        return i < len(his) and self.deleted[i][0] < position


@dataclass(frozen=True)
class EntryRange:
    """Entries ``first..last`` (inclusive) of one ledger, after ``skipped_before`` acked entries."""

    ledger: int
    first: int
    last: int
    skipped_before: int = 0

    @property
    def entries(self) -> int:
        return self.last - self.first + 1

    @property
    def start(self) -> Position:
        return self.ledger, self.first

    @property
    def stop(self) -> Position:
        return self.ledger, self.last

    @classmethod
    def from_list(cls, item: Sequence[Any]) -> EntryRange:
        if not isinstance(item, (list, tuple)) or len(item) != 4:
            raise WindowError(f"pending range must be [ledger, first, last, skipped_before]; got {item!r}")
        ledger, first, last, skipped = (int(v) for v in item)
        if first < 0 or last < first or skipped < 0:
            raise WindowError(f"invalid pending range {item!r}: need 0 <= first <= last, skipped >= 0")
        return cls(ledger, first, last, skipped)


def ledger_sizes(stats: dict[str, Any]) -> list[tuple[int, int]]:
    """``[(ledger_id, entries)]`` of a topic from ``internalStats`` (the open ledger counted too)."""
    ledgers = stats.get("ledgers")
    if not isinstance(ledgers, list):
        raise WindowError("internalStats has no 'ledgers' list; is the admin URL an Apache Pulsar?")
    sizes = [(int(item["ledgerId"]), int(item.get("entries") or 0)) for item in ledgers]
    if sizes and stats.get("state") != "LedgerClosed":
        # The last ledger is the open one: its entries are in currentLedgerEntries, not in the list.
        last_id, listed = sizes[-1]
        sizes[-1] = (last_id, max(listed, int(stats.get("currentLedgerEntries") or 0)))
    last_confirmed = stats.get("lastConfirmedEntry")
    if last_confirmed:
        lac_ledger, lac_entry = parse_position(last_confirmed)
        sizes = [(lid, max(n, lac_entry + 1) if lid == lac_ledger else n) for lid, n in sizes]
    return sorted(sizes)


def pending_ranges(
    sizes: Iterable[tuple[int, int]], cursor: CursorState, end: Position, *, after: Position | None = None
) -> list[EntryRange]:
    """The entries after the cursor's mark-delete (or ``after``, if later) up to ``end`` not acked, in
    order, one ledger per range (``sizes``: :func:`ledger_sizes`)."""
    start = max(cursor.mark_delete, after or cursor.mark_delete)
    if end <= start:
        return []
    known = dict(sizes)
    known[end[0]] = max(known.get(end[0], 0), end[1] + 1)
    out: list[EntryRange] = []
    skipped = 0
    deleted = cursor.deleted
    his = cursor.upper_bounds
    for ledger in sorted(lid for lid in known if start[0] <= lid <= end[0]):
        lo = start[1] + 1 if ledger == start[0] else 0
        hi = end[1] if ledger == end[0] else known[ledger] - 1
        if hi < lo:
            continue
        cursor_at = lo
        i = bisect.bisect_left(his, (ledger, lo))
        while i < len(deleted) and deleted[i][0] < (ledger, hi):
            d_lo, d_hi = deleted[i]
            acked_first = max(d_lo[1] + 1 if d_lo[0] == ledger else lo, cursor_at)
            acked_last = min(d_hi[1], hi) if d_hi[0] == ledger else hi
            if acked_first <= acked_last:
                if acked_first > cursor_at:
                    out.append(EntryRange(ledger, cursor_at, acked_first - 1, skipped))
                    skipped = 0
                skipped += acked_last - acked_first + 1
                cursor_at = acked_last + 1
            i += 1
        if cursor_at <= hi:
            out.append(EntryRange(ledger, cursor_at, hi, skipped))
            skipped = 0
    return out


def count_entries(ranges: Iterable[EntryRange]) -> int:
    return sum(r.entries for r in ranges)


def split_for_readers(ranges: Sequence[EntryRange], readers: int, min_entries: int) -> list[list[EntryRange]]:
    """Split ordered pending ranges into at most ``readers`` contiguous shares of about equal entries,
    each of at least ``min_entries`` (a range may be cut in two)."""
    total = count_entries(ranges)
    shares = min(readers, total // min_entries or 1)
    target = -(-total // shares)  # ceil
    out: list[list[EntryRange]] = [[]]
    room = target
    for current in ranges:
        while current.entries > room:
            head = replace(current, last=current.first + room - 1)
            out[-1].append(head)
            out.append([])
            current = replace(current, first=head.last + 1, skipped_before=0)
            room = target
        out[-1].append(current)
        room -= current.entries
        if room == 0 and len(out) < shares:
            out.append([])
            room = target
    return [share for share in out if share]


def reader_segments(share: Sequence[EntryRange], seek_gap: int = DEFAULT_SEEK_GAP) -> list[list[EntryRange]]:
    """Group a share's ranges into runs one Reader reads in order; a gap over ``seek_gap`` starts another."""
    segments: list[list[EntryRange]] = []
    for r in share:
        if not segments or r.skipped_before > seek_gap:
            segments.append([r])
        else:
            segments[-1].append(r)
    return segments
