"""The read tasks' Arrow batches: the builder's columns against a row-by-row oracle, its entry marks against
the ids, and where batches end (pure logic over fake messages, no broker)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pulsar
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from spark_apps.dlq_replay.pulsar_io import source
from spark_apps.dlq_replay.pulsar_io.cursor import EntryRange
from spark_apps.dlq_replay.pulsar_io.source import (
    ENTRY_FIRST,
    SOURCE_SCHEMA,
    UNDECODABLE_PROPERTY,
    PulsarDataSourceReader,
    PulsarInputPartition,
    _BatchBuilder,
    _by_entry,
    ddl_struct,
)
from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow, windows_to_json

TOPIC = "persistent://t/n/orders-DLQ"
SCHEMA = to_arrow_schema(ddl_struct(SOURCE_SCHEMA), timezone="UTC")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
UNDECODABLE = (UNDECODABLE_PROPERTY, "properties or key are not valid UTF-8")


class FakeId:
    def __init__(self, ledger: int, entry: int, batch: int) -> None:
        self.ledger, self.entry, self.batch = ledger, entry, batch

    def ledger_id(self) -> int:
        return self.ledger

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return self.batch

    def serialize(self) -> bytes:
        return f"{self.ledger}/{self.entry}/{self.batch}".encode()


class FakeMessage:
    """A message whose fields vary with ``n``; ``bad`` names the text fields that are not valid UTF-8."""

    def __init__(self, ledger: int, entry: int, batch: int, n: int, bad: tuple[str, ...] = ()) -> None:
        self.id = FakeId(ledger, entry, batch)
        self.n, self.bad = n, bad

    def message_id(self) -> FakeId:
        return self.id

    def partition_key(self) -> str:
        if "key" in self.bad:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return "" if self.n % 4 == 0 else f"k{self.n}"

    def ordering_key(self) -> str | bytes:
        return ("", "o", b"\xffo", b"")[self.n % 4]

    def data(self) -> bytes:
        return f"payload {self.n}".encode()

    def properties(self) -> dict[str, str]:
        if "properties" in self.bad:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return {f"p{i}": f"v{self.n}.{i}" for i in range(self.n % 3)}

    def publish_timestamp(self) -> int:
        return 1_700_000_000_000 + self.n

    def event_timestamp(self) -> int:
        return 0 if self.n % 2 else 1_600_000_000_000 + self.n

    def redelivery_count(self) -> int:
        return self.n % 5

    def producer_name(self) -> str:
        return f"producer-{self.n % 2}"


def entry(
    ledger: int, entry_id: int, batches: list[int], start: int, bad: dict[int, tuple[str, ...]] | None = None
) -> list[tuple[str, FakeMessage, FakeId]]:
    """The ``(id_str, message, message_id)`` of one entry's messages, numbered from ``start``."""
    out: list[tuple[str, FakeMessage, FakeId]] = []
    for i, b in enumerate(batches):
        msg = FakeMessage(ledger, entry_id, b, start + i, (bad or {}).get(start + i, ()))
        out.append((f"{ledger}:{entry_id}:-1:{b}", msg, msg.id))
    return out


def expected_row(id_str: str, msg: Any, mid: Any, batch_size: int) -> dict[str, Any]:
    """One row as the source defines it, computed message by message."""
    bad = False
    try:
        key = msg.partition_key() or None
    except UnicodeDecodeError:
        key, bad = None, True
    try:
        props = msg.properties()
    except UnicodeDecodeError:
        props, bad = {}, True
    if bad:
        props = {**props, UNDECODABLE_PROPERTY: "properties or key are not valid UTF-8"}
    ordering = msg.ordering_key()
    if isinstance(ordering, bytes):
        ordering = ordering.decode("utf-8", "replace")

    def ts(ms: int) -> dt.datetime | None:
        return EPOCH + dt.timedelta(milliseconds=ms) if ms else None

    return {
        "topic": TOPIC,
        "partition": -1,
        "message_id": mid.serialize(),
        "message_id_str": id_str,
        "key": key,
        "ordering_key": ordering or None,
        "value": msg.data(),
        "properties": list(props.items()),
        "publish_time": ts(msg.publish_timestamp()),
        "event_time": ts(msg.event_timestamp()),
        "redelivery_count": msg.redelivery_count(),
        "producer_name": msg.producer_name(),
        "batch_size": batch_size,
    }


def entry_marks(id_strs: list[str]) -> list[bool]:
    """True where a row's entry (``ledger:entry``) differs from the row before it."""
    entries = [s.rsplit(":", 2)[0] for s in id_strs]
    return [e != p for e, p in zip(entries, [None, *entries[:-1]], strict=True)]


def build(entries: list[tuple[list[tuple[str, Any, Any]], int]], limit: int) -> list[pa.RecordBatch]:
    """Batches as the read tasks emit them: flushed after a whole entry once ``limit`` rows are held."""
    builder = _BatchBuilder(PartitionWindow(TOPIC, -1, "9:9:-1:-1"), SCHEMA, mark_entries=True)
    batches = [builder.flush() for messages, size in entries if builder.add_entry(messages, size) >= limit]
    return [*batches, builder.flush()] if builder.rows else batches


@pytest.mark.parametrize("limit", [1, 3, 64, 2000])
def test_batches_equal_the_row_by_row_oracle_and_end_after_whole_entries(limit):
    entries: list[tuple[list[tuple[str, Any, Any]], int]] = []
    n = 0
    for e in range(
        30
    ):  # single messages, batches of 2..120 and an entry of which only a part is in the window
        batches = [-1] if e % 3 == 0 else list(range((e * 7) % 120 + 2))
        size = len(batches) + (3 if e == 29 else 0)
        entries.append((entry(5, e, batches, n), size))
        n += len(batches)
    entries.append(([], 4))  # an entry with no message in the window adds no row

    batches = build(entries, limit)

    rows = [expected_row(*m, size) for messages, size in entries for m in messages]
    got = pa.Table.from_batches(batches)
    assert got.schema == SCHEMA.append(pa.field(ENTRY_FIRST, pa.bool_()))
    assert got.drop_columns([ENTRY_FIRST]).to_pylist() == rows
    assert got.column(ENTRY_FIRST).to_pylist() == entry_marks([r["message_id_str"] for r in rows])
    # Each batch ends with a whole entry, the first one to reach the limit.
    sizes, held = [], 0
    for messages, _ in entries:
        held += len(messages)
        if held >= limit:
            sizes.append(held)
            held = 0
    assert [b.num_rows for b in batches] == sizes + ([held] if held else [])


def test_undecodable_key_or_properties_flag_only_their_message():
    bad = {5: ("key",), 70: ("properties",), 71: ("key", "properties")}
    entries = [(entry(5, 0, list(range(60)), 0, bad), 60), (entry(5, 1, list(range(20)), 60, bad), 20)]
    table = pa.Table.from_batches(build(entries, 2000))

    rows = [expected_row(*m, size) for messages, size in entries for m in messages]
    assert table.drop_columns([ENTRY_FIRST]).to_pylist() == rows
    assert [i for i, r in enumerate(rows) if UNDECODABLE in r["properties"]] == [5, 70, 71]
    assert rows[5]["key"] is None
    assert rows[5]["properties"] == [("p0", "v5.0"), ("p1", "v5.1"), UNDECODABLE]  # its own kept, flag last
    assert rows[70]["key"] == "k70"
    assert rows[70]["properties"] == [UNDECODABLE]


def test_consumer_groups_are_marked_as_the_ids_say_also_when_a_pass_continues_an_entry():
    # A second consumer pass continues entry 2 (the first pass stopped inside it): one group.
    stream = [*entry(5, 1, [-1], 0), *entry(5, 2, [0, 1], 1), *entry(5, 2, [2], 3), *entry(5, 3, [0, 1], 4)]
    groups = list(_by_entry((id_str, msg, mid, None) for id_str, msg, mid in stream))
    assert [len(g) for g in groups] == [1, 3, 2]

    table = pa.Table.from_batches(build([(g, source._batch_size(g)) for g in groups], 2))
    assert table.column(ENTRY_FIRST).to_pylist() == entry_marks([s for s, _, _ in stream]) == [
        True, True, False, False, True, False,
    ]  # fmt: skip
    assert table.column("batch_size").to_pylist() == [1, 3, 3, 3, 2, 2]


class FakeReader:
    def __init__(self, script: list[FakeMessage]) -> None:
        self.script = list(script)

    def read_next(self, timeout_millis: int) -> FakeMessage:
        if not self.script:
            raise pulsar.Timeout("idle")
        return self.script.pop(0)

    def close(self) -> None:
        pass


class FakeClient:
    """Every Reader it opens delivers ``script`` from the start, then stays idle."""

    def __init__(self, script: list[FakeMessage]) -> None:
        self.script = script

    def create_reader(self, topic: str, start: object, **kwargs: object) -> FakeReader:
        return FakeReader(self.script)


def test_reader_mode_read_batches_with_and_without_marks(monkeypatch):
    script = [m for _, m, _ in entry(5, 0, [0, 1, 2], 0) + entry(5, 1, [-1], 3) + entry(5, 2, [0, 1], 4)]
    monkeypatch.setattr(source, "get_client", lambda conf: FakeClient(script))
    end = "5:2:-1:-1"
    options = {
        "service.url": "pulsar://127.0.0.1:6650",
        "subscription": "dlq-replayer",
        "window": windows_to_json([PartitionWindow(TOPIC, -1, end, (EntryRange(5, 0, 2),))]),
        "max.batch.rows": "4",
        "idle.timeout.ms": "10",
    }
    reader = PulsarDataSourceReader(options, ddl_struct(SOURCE_SCHEMA))
    part = PulsarInputPartition(PartitionWindow(TOPIC, -1, end), 0, [EntryRange(5, 0, 2, 0)])

    marked = list(reader.read(part, mark_entries=True))
    plain = list(reader.read(part))
    assert [b.num_rows for b in marked] == [4, 2] == [b.num_rows for b in plain]
    assert [b.column(ENTRY_FIRST).to_pylist() for b in marked] == [[True, False, False, True], [True, False]]
    assert all(
        p.schema == SCHEMA and m.drop_columns([ENTRY_FIRST]).equals(p)
        for m, p in zip(marked, plain, strict=True)
    )
    assert pa.Table.from_batches(plain)["message_id_str"].to_pylist() == [
        "5:0:-1:0", "5:0:-1:1", "5:0:-1:2", "5:1:-1:-1", "5:2:-1:0", "5:2:-1:1",
    ]  # fmt: skip
