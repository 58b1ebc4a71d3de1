"""The batch kernels give exactly what the scalar functions give, row by row, on random and hostile input:
the error context (context_columns), templates and signatures, and the lineage properties."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from pulsar_dlq_consumer import context as C
from spark_apps.dlq_replay.context_columns import (
    ORIGIN_CONFLICT,
    REPLAY_COUNT,
    REPLAY_ID,
    UNDECODABLE,
    context_columns,
)
from spark_apps.dlq_replay.lineage import lineage_maps, previous_replay_count, republish_properties
from spark_apps.dlq_replay.normalize import INT_LIMITS, normalize_columns, origin_of, row_replay_id
from spark_apps.dlq_replay.pulsar_io.source import UNDECODABLE_PROPERTY
from spark_apps.dlq_replay.signatures import (
    error_signature,
    error_signatures,
    message_template,
    message_templates,
)

PROPS = pa.map_(pa.string(), pa.string())
SCHEMA = pa.schema([("topic", pa.string()), ("message_id_str", pa.string()), ("properties", PROPS)])
KEYS = [
    C.KEY_TOPIC, C.KEY_PARTITION, C.KEY_MESSAGE_ID, C.KEY_SUBSCRIPTION, C.KEY_DELIVERY_COUNT,
    C.KEY_RECONSUME_COUNT, C.KEY_REASON, C.KEY_EXCEPTION_CLASS, C.KEY_EXCEPTION_MESSAGE,
    C.KEY_EXCEPTION_STACKTRACE, C.KEY_FAILED_AT, C.KEY_CONSUMER, C.KEY_PAYLOAD_COPIED, C.KIP1191_OFFSET,
    C.KIP1191_GROUP, C.KIP1191_MESSAGE, C.REAL_TOPIC, C.ORIGIN_MESSAGE_ID, C.LEGACY_ORIGIN_MESSAGE_ID,
    C.RECONSUMETIMES, C.RETRY_TOPIC, C.DELAY_TIME, C.CONNECT_TOPIC, C.CONNECT_PARTITION, C.CONNECT_OFFSET,
    C.CONNECT_CONNECTOR, C.CONNECT_TASK, C.CONNECT_EXCEPTION_CLASS, C.CONNECT_EXCEPTION_MESSAGE,
    C.CONNECT_EXCEPTION_STACKTRACE, C.SPRING_ORIGINAL_TOPIC, C.SPRING_ORIGINAL_PARTITION,
    C.SPRING_ORIGINAL_OFFSET, C.SPRING_EXCEPTION_FQCN, C.SPRING_EXCEPTION_MESSAGE, C.SPRING_ORIGINAL_GROUP,
    "REPLAY_COUNT", "tenant", "__dlq.errors.other", "__connect.errors.x", UNDECODABLE_PROPERTY,
]  # fmt: skip
TOPICS = [
    "persistent://public/default/orders", "orders", "orders-partition-2", "persistent://t/n/orders-partition-0",
    "other", "bad topic", "", "x" * 310, "persistent://evil/ns/orders", "a/b",
]  # fmt: skip
NUMBERS = [
    "0", "1", "7", "42", "123456789012345678", "1234567890123456789", "99999999999", "-1", " 3", "3 ", "+4",
    "١٢", "x", "", "2147483648", "\x00\x00\x00\x05", "5\n",
]  # fmt: skip
IDS = ["(1,2,-1,-1)", "1:2:-1", "1:2:3:4", "1:2", "( 1 , 2 , 3 )", "01:2:3", "junk", "", "7:0:-1:0", "1,2,3"]
TEXTS = ["boom", "", "é ü", "x" * 5000, "é" * 2100, "amount '0,00' is bad", "term", "weird"]


def _value(key: str, rnd: random.Random) -> str:
    if "topic" in key.lower() or key in (C.REAL_TOPIC, C.RETRY_TOPIC):
        return rnd.choice(TOPICS)
    if "message.id" in key or "MESSAGE_ID" in key:
        return rnd.choice(IDS)
    if any(part in key for part in ("partition", "offset", "count", "COUNT", "TIMES", "failed.at", "DELAY")):
        return rnd.choice(NUMBERS)
    if key == C.KEY_REASON:
        return rnd.choice(["term", "max-redeliveries", "max-reconsumes", "bad", ""])
    return rnd.choice(TEXTS)


def random_rows(seed: int, n: int) -> list[dict[str, object]]:
    """Snapshot rows whose properties mix every convention's keys with junk values (some maps null)."""
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        keys = rnd.sample(KEYS, rnd.randint(0, 8))
        props = None if rnd.random() < 0.05 else [(key, _value(key, rnd)) for key in keys]
        topic = rnd.choice(["persistent://public/default/d-DLQ", None])
        message_id = rnd.choice([f"{i}:0:-1:-1", None])
        rows.append({"topic": topic, "message_id_str": message_id, "properties": props})
    return rows


def scalar_row(row: dict[str, object]) -> dict[str, object]:
    """What the scalar parser and helpers give for one row (as normalize did row by row)."""
    props = dict(row["properties"] or [])  # type: ignore[call-overload]
    values = list(C.error_context_values(props, dlq_topic=row["topic"], dlq_message_id=row["message_id_str"]))
    fields = dict(zip(C.CONTEXT_FIELDS, values, strict=True))
    for name, limit in INT_LIMITS.items():
        if fields[name] is not None and fields[name] > limit:
            fields[name] = None
    claim, conflict = origin_of(props)
    fields[REPLAY_ID] = row_replay_id(row["topic"], row["message_id_str"], claim)  # type: ignore[arg-type]
    fields[REPLAY_COUNT] = previous_replay_count(props)
    fields[ORIGIN_CONFLICT] = conflict
    fields[UNDECODABLE] = UNDECODABLE_PROPERTY in props
    return fields


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_kernels_settle_rows_exactly_as_the_scalar_parser(seed):
    rows = random_rows(seed, 600)
    batch = pa.RecordBatch.from_pylist(rows, schema=SCHEMA).slice(5, 590)  # a slice, as Spark hands them
    rows = rows[5:595]
    columns, settled = context_columns(batch, UNDECODABLE_PROPERTY)
    lists = {name: column.to_pylist() for name, column in columns.items()}
    flags = settled.to_pylist()
    assert 0.3 < sum(flags) / len(flags) < 1  # junk leaves rows to the scalar parser, most settle
    for i, row in enumerate(rows):
        if flags[i]:
            expected = scalar_row(row)
            assert {name: lists[name][i] for name in expected} == expected, row


@pytest.mark.parametrize("seed", [4, 5])
def test_normalize_columns_is_the_scalar_parse_of_every_row(seed):
    rows = random_rows(seed, 400)
    columns = normalize_columns(pa.RecordBatch.from_pylist(rows, schema=SCHEMA))
    lists = {name: column.to_pylist() for name, column in columns.items()}
    for i, row in enumerate(rows):
        expected = scalar_row(row)
        assert {name: lists[name][i] for name in expected} == expected, row
        template = message_template(expected["error_message"])  # type: ignore[arg-type]
        assert lists["error_template"][i] == template
        material = (expected["error_class"], template, expected["origin_topic"], expected["reason"])
        assert lists["signature"][i] == error_signature(*material)  # type: ignore[arg-type]


def test_plain_messages_of_every_convention_are_settled_by_the_kernels():
    plain = [
        {C.REAL_TOPIC: "orders", C.ORIGIN_MESSAGE_ID: "1:2:-1"},
        {C.REAL_TOPIC: "orders", C.RECONSUMETIMES: "3", C.ORIGIN_MESSAGE_ID: "(1,2,-1,-1)"},
        {C.RETRY_TOPIC: "orders-RETRY", C.RECONSUMETIMES: "16"},
        {C.KEY_TOPIC: "orders", C.KEY_PARTITION: "2", C.KIP1191_OFFSET: "9", C.KEY_DELIVERY_COUNT: "4"},
        {C.CONNECT_TOPIC: "orders", C.CONNECT_PARTITION: "1", C.CONNECT_OFFSET: "3", C.CONNECT_TASK: "0"},
        {C.KEY_TOPIC: "orders", C.KEY_REASON: "term", C.KEY_EXCEPTION_MESSAGE: "id 42", C.REAL_TOPIC: "o-1"}
        | {C.REAL_TOPIC: "orders"},
        {"app": "x"},
    ]
    rows = [
        {"topic": "t", "message_id_str": f"{i}:1:-1:-1", "properties": list(p.items())}
        for i, p in enumerate(plain)
    ]
    _, settled = context_columns(pa.RecordBatch.from_pylist(rows, schema=SCHEMA), UNDECODABLE_PROPERTY)
    assert settled.to_pylist() == [True] * len(plain)


FRAGMENTS = [
    "amount", "'0,00'", '"x y"', "`q`", "a@b.co", "john.doe+x@mail.example.org",
    "550e8400-e29b-41d4-a716-446655440000", "0x1F", "0XdeadBEEF", "deadbeef", "deadbeef12", "12345678",
    "abcdef12345", "ORD-000123", "user_42", "cust:17", "A12345", "utf-8", "v1.2.3", "42", "-7", "+3.5",
    "1,000.25", "x1", "a-1", "--3", "(1)(2)", "12-3", "\t", "\n", "\x1c", "  ", "é", "ü12", "日本", "\x01",
    "\x02", "#99", "/a/b/12", ".5", "5.", "a.b.c12d", "0xZZ", "ffffffff", "FFFFFFFF1", "g12345678",
    "12345678g", "_12", "a__12", "x:y:12", "'unterminated", "it's", "e-mail@", "1e10", "abc123def456abc1",
]  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2])
def test_templates_by_re2_are_the_python_templates(seed):
    rnd = random.Random(seed)
    separators = [" ", "", ",", ": ", "(", ")", "-", "/", "="]
    messages: list[str | None] = [None, "", " ", "x" * 3000 + " 12", "1 " * 1500, "\u00e9 12 0x1f"]
    for _ in range(3000):
        parts = rnd.randint(1, 12)
        messages.append("".join(rnd.choice(FRAGMENTS) + rnd.choice(separators) for _ in range(parts)))
    got = message_templates(pa.array(messages, pa.string())).to_pylist()
    assert got == [message_template(m) for m in messages]


def test_signatures_by_batch_are_the_scalar_signatures():
    rows = [
        ("E", "t <num>", "persistent://p/d/orders-partition-3", "term"),
        (None, "", None, None),
        ("E", "t <num>", "persistent://p/d/orders", "term"),
        ("E", "t\x1f<num>", "", ""),
    ]
    columns = [pa.array(list(column), pa.string()) for column in zip(*rows, strict=True)]
    assert error_signatures(*columns).to_pylist() == [error_signature(*row) for row in rows]


KEYS_FOR_LINEAGE = [
    "tenant", "schema", "REAL_TOPIC", "__dlq.errors.x", "REPLAY_ID", "REPLAY_COUNT", "a", "b", "kafka_dlt-q",
    "__connect.errors.y", "ORIGIN_MESSAGE_ID", "REPLAY_FIX", "z",
]  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lineage_maps_are_republish_properties(seed):
    rnd = random.Random(seed)
    for trial in range(60):
        n = rnd.randint(0, 30)
        picked = [rnd.sample(KEYS_FOR_LINEAGE, rnd.randint(0, 8)) for _ in range(n)]
        props = [None if rnd.random() < 0.1 else [(k, f"v{k}") for k in keys] for keys in picked]
        chosen = [rnd.random() < 0.7 for _ in range(n)]
        counts = [rnd.randint(0, 5) for _ in range(n)]
        fixes = [rnd.choice(["", "m:f@1"]) for _ in range(n)]
        start = 2 if trial % 3 == 1 and n > 3 else 0  # sliced columns too
        column = pa.array(props, PROPS).slice(start)
        got = lineage_maps(
            column,
            pa.array(chosen[start:], pa.bool_()),
            pa.array([f"r{i}" for i in range(start, n)], pa.string()),
            "run-1",
            pa.array(counts[start:], pa.int32()),
            pa.array([f"t{i % 3}" for i in range(start, n)], pa.string()),
            pa.array(fixes[start:], pa.string()),
        ).to_pylist()
        for j, i in enumerate(range(start, n)):
            if not chosen[i]:
                assert got[j] is None
                continue
            expected = republish_properties(
                dict(props[i] or []),
                replay_id=f"r{i}",
                run_id="run-1",
                previous_count=counts[i],
                dlq_topic=f"t{i % 3}",
                fix_label=fixes[i],
            )
            assert got[j] == list(expected.items())
