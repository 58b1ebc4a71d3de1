"""Stop rules of the consumer-mode window read, driven by a scripted fake consumer (pure logic)."""

from __future__ import annotations

import pulsar
import pytest

from spark_apps.dlq_replay.pulsar_io.read import WindowPasses
from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow

TOPIC = "persistent://t/n/dlq"


class FakeId:
    def __init__(self, ledger: int, entry: int, batch: int) -> None:
        self.v = (ledger, entry, batch)

    def ledger_id(self) -> int:
        return self.v[0]

    def entry_id(self) -> int:
        return self.v[1]

    def batch_index(self) -> int:
        return self.v[2]


class FakeMessage:
    def __init__(self, ledger: int, entry: int, batch: int = -1) -> None:
        self.id = FakeId(ledger, entry, batch)

    def message_id(self) -> FakeId:
        return self.id


class FakeConsumer:
    def __init__(self, script: list[FakeMessage]) -> None:
        self.script = list(script)
        self.timeouts: list[int] = []
        self.acked: list[FakeId | pulsar.MessageId] = []
        self.closed = False

    def receive(self, timeout_millis: int) -> FakeMessage:
        self.timeouts.append(timeout_millis)
        if not self.script:
            raise pulsar.Timeout("idle")
        return self.script.pop(0)

    def acknowledge(self, msg: FakeMessage | pulsar.MessageId) -> None:
        self.acked.append(msg if isinstance(msg, pulsar.MessageId) else msg.id)

    def close(self) -> None:
        self.closed = True


class FakeClient:
    def __init__(self, script: list[FakeMessage]) -> None:
        self.consumer = FakeConsumer(script)
        self.subscriptions: list[tuple[str, str, dict]] = []

    def subscribe(self, topic: str, subscription: str, **kwargs: object) -> FakeConsumer:
        self.subscriptions.append((topic, subscription, kwargs))
        return self.consumer


def read(script: list[FakeMessage], end: str | None, partition: int = -1) -> tuple[list[str], WindowPasses]:
    client = FakeClient(script)
    window = PartitionWindow(TOPIC, partition, end)
    consumer = WindowPasses(client, window, "replayer", role="read", idle_timeout_ms=500, resume=False)
    ids = [i for i, *_ in consumer.messages()]
    assert client.subscriptions == [] or client.consumer.closed
    return ids, consumer


def test_stops_at_the_end_message_and_never_returns_later_ones():
    script = [FakeMessage(1, e) for e in range(5)] + [FakeMessage(1, 5), FakeMessage(1, 6)]
    ids, consumer = read(script, "1:4:-1:-1")
    assert ids == [f"1:{e}:-1:-1" for e in range(5)]
    assert consumer.stats.stopped_by == "end-reached"
    assert consumer.stats.beyond_window == 0


def test_beyond_window_message_stops_and_is_counted_when_the_end_was_acked():
    # The end (1:4) was acked before the run: the first later message proves the window is done.
    script = [FakeMessage(1, 0), FakeMessage(1, 2), FakeMessage(2, 0), FakeMessage(2, 1)]
    ids, consumer = read(script, "1:4:-1:-1")
    assert ids == ["1:0:-1:-1", "1:2:-1:-1"]
    assert consumer.stats.beyond_window == 1
    assert consumer.stats.stopped_by == "end-reached"


def test_idle_timeout_stops_when_nothing_beyond_exists():
    ids, consumer = read([FakeMessage(1, 0), FakeMessage(1, 1)], "1:4:-1:-1")
    assert ids == ["1:0:-1:-1", "1:1:-1:-1"]
    assert consumer.stats.stopped_by == "idle-timeout"


def test_redeliveries_are_returned_once():
    script = [FakeMessage(1, 0), FakeMessage(1, 1), FakeMessage(1, 0), FakeMessage(1, 1), FakeMessage(1, 2)]
    ids, consumer = read(script, "1:2:-1:-1")
    assert ids == ["1:0:-1:-1", "1:1:-1:-1", "1:2:-1:-1"]
    assert consumer.stats.duplicates == 2


def test_whole_entry_end_drains_the_rest_of_the_batch():
    # End 1:3 with batch index -1 names the whole batched entry: all 4 messages belong to the window.
    batch = [FakeMessage(1, 3, b) for b in range(4)]
    client = FakeClient([FakeMessage(1, 2, 0), *batch, FakeMessage(1, 4, 0)])
    window = PartitionWindow(TOPIC, 2, "1:3:2:-1")
    consumer = WindowPasses(client, window, "replayer", role="read", idle_timeout_ms=5000)
    ids = [i for i, *_ in consumer.messages()]
    assert ids == ["1:2:2:0"] + [f"1:3:2:{b}" for b in range(4)]
    assert consumer.stats.beyond_window == 1
    # After the first message of the end entry the wait drops to the short drain timeout.
    assert client.consumer.timeouts[:2] == [5000, 5000]
    assert max(client.consumer.timeouts[2:]) < 5000


def test_batch_index_end_cuts_inside_the_batch():
    batch = [FakeMessage(1, 3, b) for b in range(4)]
    ids, consumer = read(batch, "1:3:-1:1")
    assert ids == ["1:3:-1:0", "1:3:-1:1"]
    assert consumer.stats.stopped_by == "end-reached"


def test_empty_window_never_subscribes():
    client = FakeClient([FakeMessage(1, 0)])
    consumer = WindowPasses(client, PartitionWindow(TOPIC, -1, None), "s", role="read")
    assert list(consumer.messages()) == []
    assert client.subscriptions == []
    assert consumer.stats.stopped_by == "empty-window"


def test_subscribes_shared_from_earliest_with_a_unique_name():
    client = FakeClient([])
    list(WindowPasses(client, PartitionWindow(TOPIC, -1, "1:1:-1:-1"), "replayer", role="commit").messages())
    ((topic, sub, kwargs),) = client.subscriptions
    assert (topic, sub) == (TOPIC, "replayer")
    assert kwargs["consumer_type"] == pulsar.ConsumerType.Shared
    assert kwargs["initial_position"] == pulsar.InitialPosition.Earliest
    assert str(kwargs["consumer_name"]).startswith("dlq-commit-")
    assert client.consumer.closed


@pytest.mark.parametrize("partition", [-1, 4])
def test_ids_carry_the_window_partition(partition):
    ids, _ = read([FakeMessage(9, 9)], "9:9:-1:-1", partition=partition)
    assert ids == [f"9:9:{partition}:-1"]
