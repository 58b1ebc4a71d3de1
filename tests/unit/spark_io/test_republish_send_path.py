"""The republish send path without a broker: rows grouped by producer, batches cut by the publisher at the
same places on every attempt with one receipt each, every row's result and id taken from its batch's, a
refused message failing alone, a failed or unconfirmed batch stopping its producer."""

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
    REPUBLISH_INPUT_SCHEMA,
    _by_producer,
    _epoch_ms,
    _properties,
)
from spark_apps.dlq_replay.pulsar_io.source import ddl_struct
from spark_apps.dlq_replay.schemas import arrow_schema

SCHEMA = arrow_schema(ddl_struct(REPUBLISH_INPUT_SCHEMA))
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
    """``_pulsar.Producer`` as the C++ client behaves with the publisher's settings: a message larger than
    the broker takes is refused at once; the others collect in a batch, sent before a message that does
    not fit (``max_bytes`` of payload), once it holds ``max_messages``, or on a flush (no timer). A sent
    batch completes the callbacks it has (a send may have none) in order on a client thread, all with the
    batch's one result. The broker deduplicates: a batch whose first sequence id is at most ``held`` is
    dropped (receipts with ledger -1)."""

    def __init__(self, owner: FakeProducer, max_messages: int, max_bytes: int) -> None:
        self.owner = owner
        self.max_messages, self.max_bytes = max_messages, max_bytes
        self.open: list[tuple[Any, Any]] = []

    def send_async(self, message: Any, callback: Any) -> None:
        size = len(message.data())
        if size > MAX_SIZE:
            if callback is not None:
                callback(_pulsar.Result.MessageTooBig, FakeId(-1, -1, -1))
            return
        if self.open and sum(len(m.data()) for m, _ in self.open) + size > self.max_bytes:
            self.send_batch()
        self.open.append((message, callback))
        if len(self.open) >= self.max_messages:
            self.send_batch()

    def flush_async(self, callback: Any) -> None:
        self.send_batch()
        callback(_pulsar.Result.Ok)

    def send_batch(self) -> None:
        batch, self.open = self.open, []
        if not batch:
            return
        owner = self.owner
        owner.batches.append([m.data() for m, _ in batch])
        owner.callbacks.append(sum(callback is not None for _, callback in batch))
        numbers = range(len(owner.sent), len(owner.sent) + len(batch))
        owner.sent.extend(m for m, _ in batch)
        first = int(batch[0][0].data().split(b":")[1].split(b".")[0])
        dropped = first <= owner.held
        if not dropped:
            owner.held = first
        entry = owner.entry
        owner.entry += 1
        if owner.lose_from is not None and numbers[-1] >= owner.lose_from:
            return
        result = next((owner.fail[n] for n in numbers if n in owner.fail), _pulsar.Result.Ok)
        ledger, at = (-1, -1) if dropped else (owner.ledger, entry)

        def complete() -> None:
            for batch_index, (_, callback) in enumerate(batch):
                if callback is not None:
                    callback(result, FakeId(ledger, at, batch_index, owner.id_text))

        thread = threading.Thread(target=complete)
        thread.start()
        thread.join()


class FakeProducer:
    """``pulsar.Producer`` over :class:`FakeRawProducer`; ``fail``: send number -> result of its batch,
    ``lose_from``: send number from whose batch on no receipt comes."""

    def __init__(self, name: str, ledger: int, held: int, max_messages: int, max_bytes: int) -> None:
        self.name, self.ledger, self.held = name, ledger, held
        self.held_at_creation = held
        self._producer = FakeRawProducer(self, max_messages, max_bytes)
        self.sent: list[Any] = []
        self.batches: list[list[bytes]] = []
        self.callbacks: list[int] = []  # per batch: the sends in it that asked for a receipt
        self.fail: dict[int, Any] = {}
        self.lose_from: int | None = None
        self.id_text: str | None = None
        self.entry = 0

    def last_sequence_id(self) -> int:
        return self.held_at_creation

    def flush(self) -> None:
        self._producer.send_batch()

    def close(self) -> None:
        pass


#: The broker's largest message in these tests: above the publisher's batch bytes, as 5 MB is.
MAX_SIZE = 2 * republish.BATCH_MAX_BYTES


class FakeClient:
    """Producers by name; one created again keeps what the broker holds for its name (``held``)."""

    def __init__(self) -> None:
        self.producers: dict[str, FakeProducer] = {}
        self.options: dict[str, Any] = {}

    def create_producer(self, topic: str, *, producer_name: str, **options: Any) -> FakeProducer:
        self.options = options
        earlier = self.producers.get(producer_name)
        held = earlier.held if earlier else -1
        ledger = earlier.ledger if earlier else 10 + len(self.producers)
        producer = FakeProducer(
            producer_name,
            ledger,
            held,
            options["batching_max_messages"],
            options["batching_max_allowed_size_in_bytes"],
        )
        self.producers[producer_name] = producer
        return producer


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    fake = FakeClient()
    monkeypatch.setattr(republish, "get_client", lambda conf: fake)
    return fake


def publisher(send_timeout_ms: int = 30_000) -> Any:
    return republish._Publisher(PulsarConf(service_url="pulsar://127.0.0.1:6650"), None, send_timeout_ms)


def rows(
    producers: dict[str, int],
    start: int = 0,
    big: frozenset[tuple[str, int]] = frozenset(),
    size: int = 0,
) -> pa.RecordBatch:
    """``producers`` -> rows each (sequence ids from ``start``), interleaved as a decide file holds them;
    the rows ``big`` have a payload larger than the broker takes, the others at least ``size`` bytes."""
    out = []
    for seq in range(start, start + max(producers.values())):
        for name, count in producers.items():
            if seq < start + count:
                value = f"{name}:{seq}".encode()
                out.append(
                    {
                        "replay_id": f"{name}-{seq}",
                        "target_topic": f"persistent://t/n/{name}",
                        "producer_name": name,
                        "sequence_id": seq,
                        "value": value.ljust(MAX_SIZE + 1 if (name, seq) in big else size, b"."),
                        "key": f"k{seq}" if seq % 2 else None,
                        "ordering_key": "o" if seq % 3 == 0 else None,
                        "event_time": EVENT0 + dt.timedelta(milliseconds=seq) if seq % 4 else None,
                        "properties": [("REPLAY_ID", f"{name}-{seq}"), ("n", str(seq))],
                        "row": 1000 * seq + list(producers).index(name),  # the caller's number
                    }
                )
    return pa.RecordBatch.from_pylist(out, schema=SCHEMA)


def send_all(pub: Any, *batches: pa.RecordBatch) -> dict[str, dict[str, Any]]:
    """Every input batch through the publisher, then its finish: the result row of each replay id."""
    out = [r for b in batches for r in pub.publish(b).to_pylist()] + pub.finish().to_pylist()
    by_id = {r["replay_id"]: r for r in out}
    assert len(by_id) == len(out), "one result per row"
    return by_id


def slices(batch: pa.RecordBatch, size: int) -> list[pa.RecordBatch]:
    return [batch.slice(i, size) for i in range(0, batch.num_rows, size)]


def test_every_row_gets_its_result_and_the_id_its_batch_gives_it(client: FakeClient) -> None:
    pub = publisher()
    by_id = send_all(pub, rows({"a": 3, "b": 2}))

    assert pub.publish(rows({"a": 1})).schema.names == [
        "replay_id",
        "published",
        "published_message_id",
        "error",
        "row",
    ]
    assert by_id == {
        f"{name}-{seq}": {
            "replay_id": f"{name}-{seq}",
            "published": True,
            "published_message_id": f"{ledger}:0:-1:{seq}",
            "error": None,
            "row": 1000 * seq + index,  # each result carries its row's number back
        }
        for index, (name, ledger, count) in enumerate((("a", 10, 3), ("b", 11, 2)))
        for seq in range(count)
    }
    sent = client.producers["a"].sent
    assert [m.data() for m in sent[:3]] == [b"a:0", b"a:1", b"a:2"]  # each producer in sequence order
    assert [m.properties() for m in sent[:3]] == [{"REPLAY_ID": f"a-{i}", "n": str(i)} for i in range(3)]
    assert [m.partition_key() for m in sent[:3]] == ["", "k1", ""]
    event0_ms = int(EVENT0.timestamp() * 1000)
    assert [m.event_timestamp() for m in sent[:3]] == [0, event0_ms + 1, event0_ms + 2]
    assert (pub.sent, pub.failed) == (5, 0)
    assert client.options["batching_max_publish_delay_ms"] >= 3600 * 1000  # no timer cuts a batch


def test_batches_are_cut_by_blocks_and_counts_never_where_an_input_batch_ends(client: FakeClient) -> None:
    block, per_batch = republish.BATCH_BLOCK, republish.BATCH_MAX_MESSAGES
    count = 2 * block + 500
    for name, size in (("whole", count), ("cut", 333)):
        send_all(publisher(), *slices(rows({name: count}), size))
    for name in ("whole", "cut"):
        firsts = [int(b[0].split(b":")[1]) for b in client.producers[name].batches]
        assert firsts == list(range(0, count, per_batch)), name
    # a message too big for a batch goes alone (here refused); a block still ends its batch at its end
    send_all(publisher(), rows({"gap": count}, big=frozenset({("gap", 5)})))
    assert [int(b[-1].split(b":")[1].split(b".")[0]) for b in client.producers["gap"].batches] == [
        4,
        5 + per_batch,
        block - 1,
        block + per_batch - 1,
        2 * block - 1,
        count - 1,
    ]


def test_batches_are_cut_by_payload_bytes_and_each_asks_for_one_receipt(client: FakeClient) -> None:
    third = republish.BATCH_MAX_BYTES // 3 + 1  # two fit in a batch, a third would not
    by_id = send_all(publisher(), *slices(rows({"a": 7}, size=third), 3))

    assert [len(b) for b in client.producers["a"].batches] == [2, 2, 2, 1]
    assert client.producers["a"].callbacks == [1, 1, 1, 1]  # one Python callback per batch
    assert [by_id[f"a-{seq}"]["published_message_id"] for seq in range(7)] == [
        "10:0:-1:0",
        "10:0:-1:1",
        "10:1:-1:0",
        "10:1:-1:1",
        "10:2:-1:0",
        "10:2:-1:1",
        "10:3:-1:0",
    ]


def test_a_batch_the_client_cuts_elsewhere_fails_the_task_naming_the_cause(
    client: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(republish, "_CLIENT_BATCH_BYTES", 10)  # a client cutting before the publisher
    with pytest.raises(republish.RepublishError, match="maxMessageSize"):
        send_all(publisher(), rows({"a": 4}, size=8))


def test_a_refused_message_fails_alone_wherever_it_is_in_its_batch(client: FakeClient) -> None:
    big = frozenset({("a", 0), ("a", 7), ("a", 999), ("b", 1500)})
    pub = publisher()
    by_id = send_all(pub, *slices(rows({"a": 2500, "b": 2500}, big=big), 700))

    failed = {rid: r["error"] for rid, r in by_id.items() if not r["published"]}
    assert failed == {f"{n}-{s}": "send refused: Result.MessageTooBig" for n, s in big}
    sent = {m.data().split(b".")[0].decode() for p in client.producers.values() for m in p.sent}
    for rid, r in by_id.items():  # every other row was sent, with a receipt of its own
        name, seq = rid.split("-")
        if rid not in failed:
            assert f"{name}:{seq}" in sent
            assert r["published_message_id"] is not None
    assert (pub.sent, pub.failed) == (5000 - 4, 4)


def test_a_resent_wave_is_dropped_exactly_where_the_broker_holds_it(client: FakeClient) -> None:
    batch = rows({"a": 4500})
    first = publisher()
    first.publish(batch.slice(0, 2600))  # killed here: batches 0-999, 1000-1999 stored, the rest not
    client.producers["a"]._producer.open = []
    assert client.producers["a"].held == 1000  # the first id of the last batch stored

    again = send_all(publisher(), *slices(batch, 1234))

    ids = {rid: r["published_message_id"] for rid, r in again.items()}
    assert all(r["published"] for r in again.values())
    assert {rid for rid, i in ids.items() if i.startswith("-1:")} == {f"a-{s}" for s in range(2000)}
    # the same batches as the first attempt: the two it stored dropped whole, the rest stored
    assert [int(b[0].split(b":")[1]) for b in client.producers["a"].batches] == [0, 1000, 2000, 3000, 4000]
    assert client.producers["a"].held == 4000


def test_a_drop_the_broker_does_not_account_for_is_not_counted_as_published(client: FakeClient) -> None:
    pub = publisher()
    state = pub._producer("a", "persistent://t/n/a")
    state.held = 999  # the broker said it holds batches up to the one starting at 999
    assert republish._unheld_drop(1500, 501, state) is None  # batch starts at 999: held
    error = republish._unheld_drop(1500, 2, state)  # batch starts at 1498: not held
    assert error is not None
    assert "not counted as published" in error


def test_a_failed_batch_fails_whole_and_stops_its_producers_later_rows_only(client: FakeClient) -> None:
    pub = publisher()
    pub._producer("a", "persistent://t/n/a")
    client.producers["a"].fail = {1: _pulsar.Result.Timeout}  # the batch of a's 2nd send fails
    first = send_all(pub, rows({"a": 3, "b": 3}))
    second = send_all(pub, rows({"a": 2, "b": 2}, start=3))

    assert first["a-1"] == {
        "replay_id": "a-1",
        "published": False,
        "published_message_id": None,
        "error": "send failed: Result.Timeout",
        "row": 1000,
    }
    assert {first[f"a-{seq}"]["error"] for seq in range(3)} == {"send failed: Result.Timeout"}
    for seq in (3, 4):
        assert second[f"a-{seq}"]["error"] == "not sent: an earlier send failed (Result.Timeout)"
        assert second[f"b-{seq}"]["published"] is True
    assert all(first[f"b-{seq}"]["published"] for seq in range(3))
    assert len(client.producers["a"].sent) == 3
    assert (pub.sent, pub.failed) == (5, 3)


def test_unconfirmed_sends_are_reported_after_the_timeout(
    client: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(republish, "_CONFIRM_GRACE_S", 0.0)
    pub = publisher(send_timeout_ms=50)
    before = send_all(pub, rows({"a": 1, "b": 1}))
    client.producers["a"].lose_from = 1  # no receipt for a's batches from its 2nd send on

    first = send_all(pub, rows({"a": 2, "b": 2}, start=1))
    second = send_all(pub, rows({"a": 1, "b": 1}, start=3))

    assert before["a-0"]["published"] is True
    assert {first[f"a-{seq}"]["error"] for seq in (1, 2)} == {"send not confirmed within 50 ms"}
    assert second["a-3"]["error"] == "not sent: send not confirmed within 50 ms"
    assert all(r["published"] for rid, r in {**first, **second}.items() if rid.startswith("b"))


def test_ids_in_another_text_form_are_read_from_their_parts(client: FakeClient) -> None:
    pub = publisher()
    pub.publish(rows({"a": 1}))
    client.producers["a"].id_text = "MessageId(ledger=10)"
    out = send_all(pub, rows({"a": 2}, start=1))
    assert {rid: r["published_message_id"] for rid, r in out.items()} == {
        "a-0": "10:0:-1:0",
        "a-1": "10:0:-1:1",
        "a-2": "10:0:-1:2",
    }


def test_rows_lacking_what_a_send_needs_are_reported_and_the_others_sent(client: FakeClient) -> None:
    batch = rows({"a": 3, "b": 1})
    table = pa.Table.from_batches([batch])
    values = pa.array([b"a:0", None, b"a:1", b"a:2"], pa.binary())  # rows a-0, b-0, a-1, a-2
    names = pa.array(["a", "", "a", "a"], pa.string())
    table = table.set_column(table.schema.get_field_index("value"), "value", values)
    table = table.set_column(table.schema.get_field_index("producer_name"), "producer_name", names)
    out = send_all(publisher(), table.to_batches()[0])

    assert {rid: r["published"] for rid, r in out.items()} == {
        "a-0": True,
        "b-0": False,
        "a-1": True,
        "a-2": True,
    }
    assert out["b-0"]["error"] == "row lacks producer_name, target_topic, sequence_id or value; not sent"
    assert [m.data() for m in client.producers["a"].sent] == [b"a:0", b"a:1", b"a:2"]
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


def test_results_carry_readable_ids(client: FakeClient) -> None:
    pub = publisher()
    pub.ready = [(("a", 0), "(1,2,-1,0)", None), (("b", 1), None, "no"), (("c", 2), "(-1,-1,-1,-1)", None)]
    batch = pub._emit()
    assert batch.column("published_message_id").to_pylist() == ["1:2:-1:0", None, "-1:-1:-1:-1"]
    assert batch.column("published").to_pylist() == [True, False, True]
    pub.ready = [(("d", 3), None, "failed")]
    assert pub._emit().column("published_message_id").to_pylist() == [None]


def test_properties_without_values_and_null_maps() -> None:
    col = pa.array([[("a", "1"), ("b", None)], None, [], [("c", "3")]], pa.map_(pa.string(), pa.string()))
    assert _properties(col) == [{"a": "1"}, None, {}, {"c": "3"}]
    assert _properties(col.slice(2)) == [{}, {"c": "3"}]


def test_epoch_ms_rounds_down_before_1970() -> None:
    before = dt.datetime(1969, 12, 31, 23, 59, 59, 998500, tzinfo=dt.UTC)  # -1.5 ms
    for unit in ("us", "ns"):
        assert _epoch_ms(pa.array([before, None], pa.timestamp(unit, tz="UTC"))) == [-2, None]
