"""Stop rules of the window consumer, driven by a scripted fake consumer (pure logic)."""

from __future__ import annotations

import pulsar
import pytest

from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow
from spark_apps.dlq_replay.pulsar_io.window_consumer import WindowConsumer

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


def read(script: list[FakeMessage], end: str | None, partition: int = -1) -> tuple[list[str], WindowConsumer]:
    client = FakeClient(script)
    window = PartitionWindow(TOPIC, partition, end)
    with WindowConsumer(client, window, "replayer", role="read", idle_timeout_ms=500) as consumer:
        ids = [i for i, _, _ in consumer.messages()]
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
    with WindowConsumer(client, window, "replayer", role="read", idle_timeout_ms=5000) as consumer:
        ids = [i for i, _, _ in consumer.messages()]
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
    with WindowConsumer(client, PartitionWindow(TOPIC, -1, None), "s", role="read") as consumer:
        assert list(consumer.messages()) == []
    assert client.subscriptions == []
    assert consumer.stats.stopped_by == "empty-window"


def test_subscribes_shared_from_earliest_with_a_unique_name():
    client = FakeClient([])
    with WindowConsumer(client, PartitionWindow(TOPIC, -1, "1:1:-1:-1"), "replayer", role="commit") as c:
        list(c.messages())
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


def test_a_held_read_keeps_its_consumer_open_for_the_commit(monkeypatch):
    from spark_apps.dlq_replay.pulsar_io import window_consumer

    hold = window_consumer.ConsumerHold()
    monkeypatch.setattr(window_consumer, "_HOLD", hold)
    client = FakeClient([FakeMessage(3, e) for e in range(4)])
    window = PartitionWindow(TOPIC, 2, "3:2:2:-1")
    with WindowConsumer(client, window, "replayer", role="read", idle_timeout_ms=500) as consumer:
        ids = [i for i, _, _ in consumer.messages()]
    assert ids == ["3:0:2:-1", "3:1:2:-1", "3:2:2:-1"]
    assert not client.consumer.closed
    assert hold.consumers == {TOPIC: client.consumer}
    assert (hold.read, hold.received, hold.beyond_window) == ({TOPIC: 3}, {TOPIC: 3}, {TOPIC: 0})

    assert hold.ack_entries(TOPIC, [(3, 0), (3, 2)]) == 2
    assert [(m.ledger_id(), m.entry_id(), m.partition(), m.batch_index()) for m in client.consumer.acked] == [
        (3, 0, 2, -1),
        (3, 2, 2, -1),
    ]  # entry ids: every message of the entry, batched or not
    assert hold.ack_entries("persistent://t/n/other", [(3, 1)]) == 0
    hold.close()
    assert client.consumer.closed
    assert hold.consumers == {}


def failed_read(client: FakeClient, window: PartitionWindow) -> None:
    with WindowConsumer(client, window, "replayer", role="read") as consumer:
        next(consumer.messages())
        raise RuntimeError("task failed")


def test_a_failed_read_or_a_commit_read_closes_its_consumer_even_in_a_holding_process(monkeypatch):
    from spark_apps.dlq_replay.pulsar_io import window_consumer

    hold = window_consumer.ConsumerHold()
    monkeypatch.setattr(window_consumer, "_HOLD", hold)
    window = PartitionWindow(TOPIC, -1, "1:1:-1:-1")
    failing = FakeClient([FakeMessage(1, 0)])
    with pytest.raises(RuntimeError, match="task failed"):
        failed_read(failing, window)
    committing = FakeClient([FakeMessage(1, 0), FakeMessage(1, 1)])
    with WindowConsumer(committing, window, "replayer", role="commit") as consumer:
        list(consumer.messages())
    assert failing.consumer.closed
    assert committing.consumer.closed
    assert hold.consumers == {}


def test_a_resumed_read_closes_the_earlier_consumer_and_holds_one_that_received_everything(monkeypatch):
    """After an idle stop the next read's consumer is subscribed only once the earlier one is closed (the
    broker then sends it the earlier one's messages again): the hold keeps the last consumer, settled only
    when it received every message the reads returned."""
    from spark_apps.dlq_replay.pulsar_io import window_consumer

    hold = window_consumer.ConsumerHold()
    monkeypatch.setattr(window_consumer, "_HOLD", hold)
    window = PartitionWindow(TOPIC, -1, "1:3:-1:-1")
    seen = window_consumer.SeenIdSet()
    first = FakeClient([FakeMessage(1, 0), FakeMessage(1, 1)])  # then a stall: idle stop
    with WindowConsumer(first, window, "replayer", role="read", idle_timeout_ms=10, seen=seen) as consumer:
        list(consumer.messages())
    assert hold.consumers == {TOPIC: first.consumer}
    # The broker sends the closed consumer's two messages again, then the rest.
    second = FakeClient([FakeMessage(1, e) for e in range(4)])

    def subscribe(topic: str, subscription: str, **kwargs: object) -> FakeConsumer:
        assert first.consumer.closed  # closed before the new consumer subscribes
        return second.consumer

    second.subscribe = subscribe  # type: ignore[method-assign]
    with WindowConsumer(second, window, "replayer", role="read", idle_timeout_ms=10, seen=seen) as consumer:
        assert [i for i, _, _ in consumer.messages()] == ["1:2:-1:-1", "1:3:-1:-1"]
    assert hold.consumers == {TOPIC: second.consumer}
    assert (hold.read, hold.received) == ({TOPIC: 4}, {TOPIC: 4})
    assert hold.unsettled(wait_ms=10) == []
    hold.received[TOPIC] = 3  # had the broker not sent one of them again
    assert hold.unsettled(wait_ms=10) == [TOPIC]


def test_a_held_consumer_sent_its_window_again_is_unsettled_and_nothing_is_acked():
    from spark_apps.dlq_replay.pulsar_io.window_consumer import ConsumerHold, ConsumeStats

    hold = ConsumerHold()
    quiet, other = PartitionWindow(TOPIC, -1, "5:9:-1:-1"), PartitionWindow(TOPIC + "-b", -1, "5:9:-1:-1")
    past_end = FakeConsumer([FakeMessage(5, 10), FakeMessage(6, 0)])  # prefetched past the window: normal
    again = FakeConsumer([FakeMessage(5, 11), FakeMessage(5, 3)])  # an entry of the window, dispatched again
    hold.keep(quiet, past_end, ConsumeStats(in_window=10))
    hold.keep(other, again, ConsumeStats(in_window=10))
    assert hold.unsettled(wait_ms=10) == [TOPIC + "-b"]
    assert past_end.timeouts == [10, 10, 10]  # looked through its queue until nothing came
    assert past_end.acked == again.acked == []
