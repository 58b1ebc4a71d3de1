"""A snapshot read that stops idle before its window end reads again (scripted fake broker; pure logic)."""

from __future__ import annotations

import pulsar
import pytest

from spark_apps.dlq_replay.pulsar_io import source
from spark_apps.dlq_replay.pulsar_io.source import (
    SOURCE_SCHEMA,
    PulsarDataSourceReader,
    PulsarInputPartition,
    ddl_struct,
)
from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow, windows_to_json

TOPIC = "persistent://t/n/orders-DLQ"
END = "1:5:-1:-1"


class FakeId:
    def __init__(self, entry: int) -> None:
        self.entry = entry

    def ledger_id(self) -> int:
        return 1

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return -1

    def serialize(self) -> bytes:
        return f"1:{self.entry}".encode()


class FakeMessage:
    def __init__(self, entry: int) -> None:
        self.id = FakeId(entry)

    def message_id(self) -> FakeId:
        return self.id

    def partition_key(self) -> str:
        return f"k{self.id.entry}"

    def ordering_key(self) -> str:
        return ""

    def data(self) -> bytes:
        return b"{}"

    def properties(self) -> dict[str, str]:
        return {"REAL_TOPIC": "persistent://t/n/orders"}

    def publish_timestamp(self) -> int:
        return 1_700_000_000_000

    def event_timestamp(self) -> int:
        return 0

    def redelivery_count(self) -> int:
        return 0

    def producer_name(self) -> str:
        return "p"


class FakeConsumer:
    """Delivers its pass's entries, then times out (an idle stop, e.g. a broker stall)."""

    def __init__(self, entries: list[int]) -> None:
        self.script = [FakeMessage(e) for e in entries]

    def receive(self, timeout_millis: int) -> FakeMessage:
        if not self.script:
            raise pulsar.Timeout("idle")
        return self.script.pop(0)

    def close(self) -> None:
        pass


class FakeClient:
    def __init__(self, passes: list[list[int]]) -> None:
        self.passes = list(passes)
        self.subscribed = 0

    def subscribe(self, *args: object, **kwargs: object) -> FakeConsumer:
        self.subscribed += 1
        return FakeConsumer(self.passes.pop(0) if self.passes else [])


def read_keys(monkeypatch: pytest.MonkeyPatch, passes: list[list[int]], parallelism: int = 1):
    client = FakeClient(passes)
    monkeypatch.setattr(source, "get_client", lambda conf: client)
    options = {
        "service.url": "pulsar://127.0.0.1:6650",
        "subscription": "dlq-replayer",
        "window": windows_to_json([PartitionWindow(TOPIC, -1, END)]),
        "parallelism": str(parallelism),
        "idle.timeout.ms": "10",
    }
    reader = PulsarDataSourceReader(options, ddl_struct(SOURCE_SCHEMA))
    batches = list(reader.read(PulsarInputPartition(PartitionWindow(TOPIC, -1, END), 0)))
    keys = [k for batch in batches for k in batch.column("key").to_pylist()]
    return keys, client.subscribed


def test_idle_stop_before_the_end_reads_again_until_complete(monkeypatch):
    # Pass 1 stalls after 3 entries; pass 2 gets everything again (nothing was acked) up to the end.
    keys, subscribed = read_keys(monkeypatch, [[0, 1, 2], [0, 1, 2, 3, 4, 5]])
    assert keys == [f"k{e}" for e in range(6)]  # each message once
    assert subscribed == 2


def test_reading_stops_when_a_pass_finds_nothing_new(monkeypatch):
    # The tail of the window was acked earlier: idle stops, and the second pass brings nothing new.
    keys, subscribed = read_keys(monkeypatch, [[0, 1, 2], [0, 1, 2], [0, 1, 2]])
    assert keys == ["k0", "k1", "k2"]
    assert subscribed == 2


def test_no_second_pass_with_several_consumers_per_partition(monkeypatch):
    # With parallelism > 1 the other consumers hold the rest: an idle stop is normal.
    keys, subscribed = read_keys(monkeypatch, [[0, 2], [0, 1, 2, 3, 4, 5]], parallelism=2)
    assert keys == ["k0", "k2"]
    assert subscribed == 1
