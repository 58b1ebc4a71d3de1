"""The republish send path without a broker: rows grouped by producer, each send's receipt taken for its
own row, a failed or unconfirmed send stopping its producer, and the columns converted once per batch."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import _pulsar
import pyarrow as pa
import pytest

from spark_apps.dlq_replay.pulsar_io import republish
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.pulsar_io.republish import (
    REPUBLISH_INPUT_COLUMNS,
    _by_producer,
    _epoch_ms,
    _id_texts,
    _properties,
)

SCHEMA = pa.schema(
    [
        ("replay_id", pa.string()),
        ("target_topic", pa.string()),
        ("producer_name", pa.string()),
        ("sequence_id", pa.int64()),
        ("value", pa.binary()),
        ("key", pa.string()),
        ("ordering_key", pa.string()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("properties", pa.map_(pa.string(), pa.string())),
    ]
)
EVENT0 = dt.datetime(2024, 3, 1, 8, 30, tzinfo=dt.UTC)


class FakeId:
    def __init__(self, ledger: int, entry: int, batch_index: int, text: str | None = None) -> None:
        self.parts = (ledger, entry, -1, batch_index)
        self.text = text

    def __str__(self) -> str:
        return self.text or "({},{},{},{})".format(*self.parts)

    def ledger_id(self) -> int:
        return self.parts[0]

    def entry_id(self) -> int:
        return self.parts[1]

    def partition(self) -> int:
        return self.parts[2]

    def batch_index(self) -> int:
        return self.parts[3]


class FakeRawProducer:
    """``_pulsar.Producer``: keeps each sent message and its callback until the flush."""

    def __init__(self, owner: FakeProducer) -> None:
        self.owner = owner

    def send_async(self, message: Any, callback: Any) -> None:
        self.owner.pending.append((message, callback))


class FakeProducer:
    """``pulsar.Producer``: its flush completes the pending sends in order on another thread, as the
    client does, with the receipts the test chose (``fail`` -> that result; ``lose`` -> no receipt)."""

    def __init__(self, name: str, ledger: int) -> None:
        self.name, self.ledger = name, ledger
        self._producer = FakeRawProducer(self)
        self.pending: list[tuple[Any, Any]] = []
        self.sent: list[Any] = []
        self.fail: dict[int, Any] = {}  # send number -> result
        self.lose_from: int | None = None  # send number from which no receipt comes
        self.id_text: str | None = None
        self.entry = 0

    def flush(self) -> None:
        pending, self.pending = self.pending, []

        def complete() -> None:
            for batch_index, (message, callback) in enumerate(pending):
                number = len(self.sent)
                self.sent.append(message)
                if self.lose_from is not None and number >= self.lose_from:
                    continue
                result = self.fail.get(number, _pulsar.Result.Ok)
                callback(result, FakeId(self.ledger, self.entry, batch_index, self.id_text))
            self.entry += 1

        thread = threading.Thread(target=complete)
        thread.start()
        thread.join()

    def close(self) -> None:
        pass


class FakeClient:
    def __init__(self) -> None:
        self.producers: dict[str, FakeProducer] = {}

    def create_producer(self, topic: str, *, producer_name: str, **kwargs: Any) -> FakeProducer:
        producer = self.producers[producer_name] = FakeProducer(producer_name, 10 + len(self.producers))
        return producer


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    fake = FakeClient()
    monkeypatch.setattr(republish, "get_client", lambda conf: fake)
    return fake


def publisher(send_timeout_ms: int = 30_000) -> Any:
    return republish._Publisher(PulsarConf(service_url="pulsar://127.0.0.1:6650"), None, send_timeout_ms)


def rows(producers: dict[str, int], start: int = 0) -> pa.RecordBatch:
    """``producers`` -> rows each (sequence ids from ``start``), interleaved as a decide file holds them."""
    out = []
    for seq in range(start, start + max(producers.values())):
        for name, count in producers.items():
            if seq < start + count:
                out.append(
                    {
                        "replay_id": f"{name}-{seq}",
                        "target_topic": f"persistent://t/n/{name}",
                        "producer_name": name,
                        "sequence_id": seq,
                        "value": f"{name}:{seq}".encode(),
                        "key": f"k{seq}" if seq % 2 else None,
                        "ordering_key": "o" if seq % 3 == 0 else None,
                        "event_time": EVENT0 + dt.timedelta(milliseconds=seq) if seq % 4 else None,
                        "properties": [("REPLAY_ID", f"{name}-{seq}"), ("n", str(seq))],
                    }
                )
    return pa.RecordBatch.from_pylist(out, schema=SCHEMA)


def test_every_row_gets_its_own_receipt_in_row_order(client: FakeClient) -> None:
    pub = publisher()
    out = pub.publish(rows({"a": 3, "b": 2}))

    assert out.schema.names == ["replay_id", "published", "published_message_id", "error"]
    assert out.schema.types == [pa.string(), pa.bool_(), pa.string(), pa.string()]
    assert out.to_pylist() == [
        {"replay_id": "a-0", "published": True, "published_message_id": "10:0:-1:0", "error": None},
        {"replay_id": "b-0", "published": True, "published_message_id": "11:0:-1:0", "error": None},
        {"replay_id": "a-1", "published": True, "published_message_id": "10:0:-1:1", "error": None},
        {"replay_id": "b-1", "published": True, "published_message_id": "11:0:-1:1", "error": None},
        {"replay_id": "a-2", "published": True, "published_message_id": "10:0:-1:2", "error": None},
    ]
    sent = client.producers["a"].sent
    assert [m.data() for m in sent] == [b"a:0", b"a:1", b"a:2"]  # each producer in sequence order
    assert [m.properties() for m in sent] == [{"REPLAY_ID": f"a-{i}", "n": str(i)} for i in range(3)]
    assert [m.partition_key() for m in sent] == ["", "k1", ""]
    event0_ms = int(EVENT0.timestamp() * 1000)
    assert [m.event_timestamp() for m in sent] == [0, event0_ms + 1, event0_ms + 2]
    assert (pub.sent, pub.failed) == (5, 0)


def test_a_failed_send_stops_its_producers_later_rows_only(client: FakeClient) -> None:
    pub = publisher()
    pub.publish(rows({"a": 1, "b": 1}))  # creates the producers
    client.producers["a"].fail = {2: _pulsar.Result.Timeout}  # a's 3rd send (2nd of this batch)

    first = pub.publish(rows({"a": 3, "b": 3}, start=1)).to_pylist()
    second = pub.publish(rows({"a": 2, "b": 2}, start=4)).to_pylist()

    by_id = {r["replay_id"]: r for r in first + second}
    assert by_id["a-1"]["published_message_id"] == "10:1:-1:0"
    assert by_id["a-2"] == {
        "replay_id": "a-2",
        "published": False,
        "published_message_id": None,
        "error": "send failed: Result.Timeout",
    }
    assert by_id["a-3"]["published"] is True  # already sent in the same batch: its own receipt
    assert by_id["a-3"]["published_message_id"] == "10:1:-1:2"
    for seq in (4, 5):
        assert by_id[f"a-{seq}"]["error"] == "not sent: an earlier send failed (Result.Timeout)"
        assert by_id[f"b-{seq}"]["published"] is True
    assert len(client.producers["a"].sent) == 4
    assert (pub.sent, pub.failed) == (2 + 2 + 3 + 2, 1)


def test_unconfirmed_sends_are_reported_after_the_timeout(
    client: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(republish, "_CONFIRM_GRACE_S", 0.0)
    pub = publisher(send_timeout_ms=50)
    pub.publish(rows({"a": 1, "b": 1}))
    client.producers["a"].lose_from = 2

    first = pub.publish(rows({"a": 2, "b": 2}, start=1)).to_pylist()
    second = pub.publish(rows({"a": 1, "b": 1}, start=3)).to_pylist()

    by_id = {r["replay_id"]: r for r in first + second}
    assert by_id["a-1"]["published"] is True
    assert by_id["a-2"]["error"] == "send not confirmed within 50 ms"
    assert by_id["a-3"]["error"] == "not sent: send not confirmed within 50 ms"
    assert all(by_id[f"b-{seq}"]["published"] for seq in range(1, 4))


def test_ids_in_another_text_form_are_read_from_their_parts(client: FakeClient) -> None:
    pub = publisher()
    pub.publish(rows({"a": 1}))
    client.producers["a"].id_text = "MessageId(ledger=10)"
    out = pub.publish(rows({"a": 2}, start=1))
    assert out.column("published_message_id").to_pylist() == ["10:1:-1:0", "10:1:-1:1"]


def test_rows_lacking_what_a_send_needs_are_reported_and_the_others_sent(client: FakeClient) -> None:
    batch = rows({"a": 3, "b": 1})
    table = pa.Table.from_batches([batch])
    values = pa.array([b"x", None, b"y", b"z"], pa.binary())  # rows a-0, b-0, a-1, a-2
    names = pa.array(["a", "", "a", "a"], pa.string())
    table = table.set_column(table.schema.get_field_index("value"), "value", values)
    table = table.set_column(table.schema.get_field_index("producer_name"), "producer_name", names)
    out = publisher().publish(table.to_batches()[0]).to_pylist()

    assert [r["published"] for r in out] == [True, False, True, True]
    assert out[1]["error"] == "row lacks producer_name, target_topic, sequence_id or value; not sent"
    assert [m.data() for m in client.producers["a"].sent] == [b"x", b"y", b"z"]
    assert "" not in client.producers


def test_by_producer_groups_rows_in_row_order() -> None:
    batch = rows({"a": 2, "b": 2})
    errors: list[str | None] = [None] * batch.num_rows
    assert _by_producer(batch, errors) == {
        ("a", "persistent://t/n/a"): [0, 2],
        ("b", "persistent://t/n/b"): [1, 3],
    }
    assert errors == [None] * 4
    assert set(REPUBLISH_INPUT_COLUMNS) == set(batch.schema.names)


def test_id_texts() -> None:
    assert _id_texts(["(1,2,-1,0)", None, "(-1,-1,-1,-1)"]).to_pylist() == ["1:2:-1:0", None, "-1:-1:-1:-1"]
    assert _id_texts([None]).to_pylist() == [None]
    assert _id_texts(["1:2:-1:0"]) is None


def test_properties_without_values_and_null_maps() -> None:
    col = pa.array([[("a", "1"), ("b", None)], None, [], [("c", "3")]], pa.map_(pa.string(), pa.string()))
    assert _properties(col) == [{"a": "1"}, None, {}, {"c": "3"}]
    assert _properties(col.slice(2)) == [{}, {"c": "3"}]


def test_epoch_ms_rounds_down_before_1970() -> None:
    before = dt.datetime(1969, 12, 31, 23, 59, 59, 998500, tzinfo=dt.UTC)  # -1.5 ms
    for unit in ("us", "ns"):
        assert _epoch_ms(pa.array([before, None], pa.timestamp(unit, tz="UTC"))) == [-2, None]
