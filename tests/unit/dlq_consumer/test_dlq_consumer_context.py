"""Table-driven tests of the error-context parser and writer (pure logic)."""

from __future__ import annotations

import dataclasses

import pytest

from pulsar_dlq_consumer import context as c
from pulsar_dlq_consumer.context import (
    CONTEXT_FIELDS,
    ContextFormat,
    ErrorContext,
    build_context_properties,
    detect_format,
    is_bookkeeping_property,
    parse_error_context,
    strip_bookkeeping_properties,
)

OURS = {
    "REAL_TOPIC": "persistent://acme/orders/payments",
    "ORIGIN_MESSAGE_ID": "(12,34,-1,-1)",
    "__dlq.errors.topic": "persistent://acme/orders/payments",
    "__dlq.errors.message.id": "(12,34,-1,-1)",
    "__dlq.errors.subscription": "billing",
    "__dlq.errors.delivery.count": "3",
    "__dlq.errors.reconsume.count": "2",
    "__dlq.errors.reason": "term",
    "__dlq.errors.exception.class": "orders.errors.BadTotal",
    "__dlq.errors.exception.message": "total -3 < 0",
    "__dlq.errors.exception.stacktrace": "Traceback ...",
    "__dlq.errors.failed.at": "1700000000123",
    "__dlq.errors.consumer": "billing-1",
    "__dlq.errors.payload.copied": "true",
    "app": "x",
}

CASES: list[tuple[str, dict[str, str], dict[str, object]]] = [
    (
        "ours",
        OURS,
        {
            "context_format": "ours",
            "origin_topic": "persistent://acme/orders/payments",
            "origin_message_id": "(12,34,-1,-1)",
            "subscription": "billing",
            "delivery_count": 3,
            "reconsume_times": 2,
            "reason": "term",
            "error_class": "orders.errors.BadTotal",
            "error_message": "total -3 < 0",
            "error_stack": "Traceback ...",
            "failed_at": 1700000000123,
            "consumer": "billing-1",
        },
    ),
    (
        "ours_retry_message_without_reason",
        {
            "REAL_TOPIC": "t",
            "ORIGIN_MESSAGE_ID": "(1,2,-1,-1)",
            "RECONSUMETIMES": "4",
            "RETRY_TOPIC": "t-s-RETRY",
            "DELAY_TIME": "5000",
            "__dlq.errors.topic": "t",
            "__dlq.errors.exception.class": "ValueError",
            "__dlq.errors.failed.at": "5",
        },
        {"context_format": "ours", "reason": "unknown", "reconsume_times": 4, "origin_topic": "t"},
    ),
    (
        "pulsar_dlq_policy",
        {"REAL_TOPIC": "persistent://public/default/in", "ORIGIN_MESSAGE_ID": "(5,6,-1,-1)", "k": "v"},
        {
            "context_format": "pulsar_dlq_policy",
            "origin_topic": "persistent://public/default/in",
            "origin_message_id": "(5,6,-1,-1)",
            "reason": "max-redeliveries",
            "delivery_count": None,
            "error_class": None,
        },
    ),
    (
        "java_retry",
        {
            "REAL_TOPIC": "persistent://public/default/in",
            "RETRY_TOPIC": "persistent://public/default/in-sub-RETRY",
            "RECONSUMETIMES": "16",
            "DELAY_TIME": "60000",
            "ORIGIN_MESSAGE_ID": "1:2:-1",
        },
        {
            "context_format": "java_retry",
            "origin_topic": "persistent://public/default/in",
            "origin_message_id": "1:2:-1",
            "reconsume_times": 16,
            "reason": "max-reconsumes",
        },
    ),
    (
        "java_retry_go_legacy_key_only",
        {"REAL_TOPIC": "in", "RECONSUMETIMES": "3", "ORIGIN_MESSAGE_IDY_TIME": "7:8:0"},
        {"context_format": "java_retry", "origin_message_id": "7:8:0", "reconsume_times": 3},
    ),
    (
        "go_writes_both_keys_correct_one_wins",
        {
            "REAL_TOPIC": "in",
            "RECONSUMETIMES": "3",
            "ORIGIN_MESSAGE_IDY_TIME": "old",
            "ORIGIN_MESSAGE_ID": "new",
        },
        {"context_format": "java_retry", "origin_message_id": "new"},
    ),
    (
        "tdmq",
        {"ORIGIN_MESSAGE_ID": "9:9:-1", "RETRY_TOPIC": "in-sub-RETRY", "RECONSUMETIMES": "16"},
        {
            "context_format": "tdmq",
            "origin_topic": None,
            "origin_message_id": "9:9:-1",
            "reconsume_times": 16,
            "reason": "max-reconsumes",
        },
    ),
    (
        "kip1191",
        {
            "__dlq.errors.topic": "orders",
            "__dlq.errors.partition": "2",
            "__dlq.errors.offset": "1234",
            "__dlq.errors.group": "share-g",
            "__dlq.errors.delivery.count": "5",
            "__dlq.errors.message": "delivery count exceeded",
        },
        {
            "context_format": "kip1191",
            "origin_topic": "orders",
            "origin_message_id": "2:1234",
            "subscription": "share-g",
            "delivery_count": 5,
            "error_message": "delivery count exceeded",
            "reason": "unknown",
        },
    ),
    (
        "kafka_connect",
        {
            "__connect.errors.topic": "orders",
            "__connect.errors.partition": "0",
            "__connect.errors.offset": "42",
            "__connect.errors.connector.name": "sink-1",
            "__connect.errors.task.id": "3",
            "__connect.errors.stage": "VALUE_CONVERTER",
            "__connect.errors.class.name": "org.apache.kafka.connect.json.JsonConverter",
            "__connect.errors.exception.class.name": "org.apache.kafka.connect.errors.DataException",
            "__connect.errors.exception.message": "Converting byte[] to Kafka Connect data failed",
            "__connect.errors.exception.stacktrace": "org.apache...DataException\n\tat ...",
        },
        {
            "context_format": "kafka_connect",
            "origin_topic": "orders",
            "origin_message_id": "0:42",
            "subscription": "sink-1",
            "consumer": "sink-1-3",
            "error_class": "org.apache.kafka.connect.errors.DataException",
            "error_message": "Converting byte[] to Kafka Connect data failed",
            "error_stack": "org.apache...DataException\n\tat ...",
            "reason": "unknown",
        },
    ),
    (
        "spring_decimal",
        {
            "kafka_dlt-exception-fqcn": "org.springframework.kafka.listener.ListenerExecutionFailedException",
            "kafka_dlt-exception-cause-fqcn": "java.lang.IllegalStateException",
            "kafka_dlt-exception-message": "Listener failed; bad state",
            "kafka_dlt-exception-stacktrace": "java.lang.IllegalStateException: bad state",
            "kafka_dlt-original-topic": "orders",
            "kafka_dlt-original-partition": "1",
            "kafka_dlt-original-offset": "77",
            "kafka_dlt-original-consumer-group": "g1",
        },
        {
            "context_format": "spring",
            "origin_topic": "orders",
            "origin_message_id": "1:77",
            "subscription": "g1",
            "error_class": "java.lang.IllegalStateException",
            "error_message": "Listener failed; bad state",
        },
    ),
    (
        "spring_big_endian_binary_partition_offset",
        {
            "kafka_dlt-exception-fqcn": "java.lang.RuntimeException",
            "kafka_dlt-original-topic": "orders",
            "kafka_dlt-original-partition": "\x00\x00\x00\x03",
            "kafka_dlt-original-offset": "\x00\x00\x00\x00\x00\x00\x01\x00",
        },
        {
            "context_format": "spring",
            "origin_message_id": "3:256",
            "error_class": "java.lang.RuntimeException",
        },
    ),
    (
        "spring_undecodable_binary_does_not_crash",
        {
            "kafka_dlt-exception-fqcn": "E",
            "kafka_dlt-original-partition": "\ufffd\ufffd",
            "kafka_dlt-original-offset": "\ufffd\ufffd\ufffd\ufffd\ufffd",
        },
        {"context_format": "spring", "origin_message_id": None, "error_class": "E"},
    ),
    ("none_plain_properties", {"app": "x", "trace": "y"}, {"context_format": "none", "reason": "unknown"}),
    ("none_empty", {}, {"context_format": "none", "origin_topic": None}),
]


@pytest.mark.parametrize(("props", "expected"), [(p, e) for _, p, e in CASES], ids=[n for n, _, _ in CASES])
def test_parse_every_format(props: dict[str, str], expected: dict[str, object]) -> None:
    ctx = parse_error_context(props, dlq_topic="dlq-t", dlq_message_id="(1,1,-1,-1)")
    got = dataclasses.asdict(ctx)
    assert got["dlq_topic"] == "dlq-t"
    assert got["dlq_message_id"] == "(1,1,-1,-1)"
    for field, value in expected.items():
        assert got[field] == value, field
    assert ContextFormat(str(got["context_format"])) is detect_format(props)


def test_schema_fields_are_exactly_context_fields_in_order() -> None:
    assert tuple(f.name for f in dataclasses.fields(ErrorContext)) == CONTEXT_FIELDS
    assert tuple(dataclasses.asdict(parse_error_context(None))) == CONTEXT_FIELDS


MIXED: list[tuple[str, dict[str, str], str]] = [
    (
        "ours_beats_everything",
        {**OURS, "__connect.errors.topic": "k", "kafka_dlt-original-topic": "s"},
        "ours",
    ),
    (
        "connect_beats_spring",
        {"__connect.errors.topic": "k", "kafka_dlt-original-topic": "s"},
        "kafka_connect",
    ),
    ("spring_beats_kip1191", {"kafka_dlt-original-topic": "s", "__dlq.errors.offset": "1"}, "spring"),
    (
        "kip1191_beats_pulsar",
        {"__dlq.errors.topic": "k", "REAL_TOPIC": "p", "RECONSUMETIMES": "1"},
        "kip1191",
    ),
    (
        "java_retry_beats_policy",
        {"REAL_TOPIC": "p", "ORIGIN_MESSAGE_ID": "1", "RECONSUMETIMES": "1"},
        "java_retry",
    ),
    ("tdmq_without_real_topic", {"ORIGIN_MESSAGE_ID": "1", "RETRY_TOPIC": "r"}, "tdmq"),
    ("only_origin_id_is_policy", {"ORIGIN_MESSAGE_ID": "1"}, "pulsar_dlq_policy"),
]


@pytest.mark.parametrize(("props", "fmt"), [(p, f) for _, p, f in MIXED], ids=[n for n, _, _ in MIXED])
def test_mixed_properties_pick_the_richest_format(props: dict[str, str], fmt: str) -> None:
    assert parse_error_context(props).context_format == fmt
    # deterministic: key order does not matter
    assert parse_error_context(dict(reversed(list(props.items())))).context_format == fmt


JUNK: list[tuple[str, dict[object, object]]] = [
    ("negative_count", {"__dlq.errors.reason": "term", "__dlq.errors.delivery.count": "-4"}),
    ("float_count", {"__dlq.errors.reason": "term", "__dlq.errors.delivery.count": "1.5"}),
    ("huge_number", {"__dlq.errors.reason": "term", "__dlq.errors.failed.at": "9" * 400}),
    ("unicode_digits", {"__dlq.errors.reason": "term", "__dlq.errors.failed.at": "\u0663\u0664"}),
    ("non_str_values", {"__dlq.errors.reason": None, "__dlq.errors.exception.class": 5, 7: "x"}),
    ("bogus_reason", {"__dlq.errors.reason": "because; DROP TABLE"}),
    ("empty_strings", {"__dlq.errors.reason": "", "REAL_TOPIC": ""}),
    ("surrogates", {"__dlq.errors.exception.message": "bad \udcff byte", "__dlq.errors.reason": "term"}),
]


@pytest.mark.parametrize("props", [p for _, p in JUNK], ids=[n for n, _ in JUNK])
def test_junk_values_become_none_never_raise(props: dict[object, object]) -> None:
    ctx = parse_error_context(props)  # type: ignore[arg-type]
    assert ctx.context_format == "ours"
    assert ctx.delivery_count is None
    assert ctx.failed_at is None
    assert ctx.reason in ("term", "unknown")
    if ctx.error_message is not None:
        ctx.error_message.encode("utf-8")  # always valid UTF-8
    assert ctx.error_class is None or isinstance(ctx.error_class, str)


def test_unknown_reason_is_unknown_and_non_mapping_input_is_none() -> None:
    assert parse_error_context({"__dlq.errors.reason": "bogus"}).reason == "unknown"
    assert parse_error_context("not a mapping").context_format == "none"  # type: ignore[arg-type]


def test_redelivery_count_is_only_a_fallback() -> None:
    assert parse_error_context({"REAL_TOPIC": "t"}, redelivery_count=2).delivery_count == 3
    assert (
        parse_error_context(
            {"__dlq.errors.delivery.count": "9", "__dlq.errors.reason": "term"}, redelivery_count=2
        ).delivery_count
        == 9
    )
    assert parse_error_context({}, redelivery_count=-1).delivery_count is None


def test_parser_bounds_foreign_messages_and_stacks() -> None:
    props = {"kafka_dlt-exception-message": "m" * 100_000, "kafka_dlt-exception-stacktrace": "s" * 100_000}
    ctx = parse_error_context(props)
    assert ctx.error_message is not None
    assert ctx.error_stack is not None
    assert len(ctx.error_message.encode()) <= c.MAX_ERROR_MESSAGE_BYTES
    assert len(ctx.error_stack.encode()) <= c.MAX_ERROR_STACK_BYTES
    assert ctx.error_message.endswith(c.TRUNCATION_MARKER)


# --------------------------------------------------------------------------- writer


def _raise_nested(depth: int) -> None:
    if depth == 0:
        raise ValueError("amount 12.50 is not positive " + "é" * 3000)
    _raise_nested(depth - 1)


def test_build_then_parse_round_trip_with_bounds() -> None:
    try:
        _raise_nested(300)
    except ValueError as exc:
        error = exc
    props = build_context_properties(
        origin_topic="persistent://acme/orders/payments-partition-2",
        origin_message_id="(1,2,2,-1)",
        subscription="billing",
        reason="max-redeliveries",
        delivery_count=17,
        reconsume_times=0,
        error=error,
        consumer="c-1",
        failed_at=1_700_000_000_000,
    )
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in props.items())
    assert props["__dlq.errors.partition"] == "2"
    assert props["__dlq.errors.payload.copied"] == "true"
    assert "__dlq.errors.payload.sha256" not in props
    assert len(props["__dlq.errors.exception.message"].encode()) <= c.MAX_ERROR_MESSAGE_BYTES
    stack = props["__dlq.errors.exception.stacktrace"]
    assert len(stack.encode()) <= c.MAX_ERROR_STACK_BYTES
    assert stack.startswith("Traceback")
    assert "ValueError: amount" in stack
    assert all(is_bookkeeping_property(k) for k in props)
    ctx = parse_error_context(props)
    assert ctx.context_format == "ours"
    assert ctx.origin_topic == "persistent://acme/orders/payments-partition-2"
    assert (ctx.subscription, ctx.delivery_count, ctx.reconsume_times) == ("billing", 17, 0)
    assert (ctx.reason, ctx.error_class, ctx.consumer, ctx.failed_at) == (
        "max-redeliveries",
        "ValueError",
        "c-1",
        1_700_000_000_000,
    )
    assert c.base_topic(ctx.origin_topic) == "persistent://acme/orders/payments"


def test_writer_payload_off_hashes_and_sanitises_strings() -> None:
    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("broken __str__")

    props = build_context_properties(
        origin_topic="t\udcff",
        origin_message_id="m",
        subscription="s",
        reason="term",
        error=Weird(),
        failed_at=1,
        payload=b"\xff\xfe secret",
        payload_copied=False,
    )
    assert props["__dlq.errors.payload.copied"] == "false"
    assert len(props["__dlq.errors.payload.sha256"]) == 64
    assert "secret" not in "".join(props.values())
    assert props["__dlq.errors.exception.message"] == "<unprintable Weird>"
    assert "__dlq.errors.exception.stacktrace" not in props  # never raised: no traceback
    for value in props.values():
        value.encode("utf-8")
    props2 = build_context_properties(
        origin_topic="t",
        origin_message_id="m",
        subscription="s",
        reason=None,
        error="plain text",
        failed_at=1,
    )
    assert "__dlq.errors.reason" not in props2
    assert props2["__dlq.errors.exception.message"] == "plain text"


def test_writer_rejects_unknown_reason() -> None:
    with pytest.raises(ValueError, match="reason must be one of"):
        build_context_properties(
            origin_topic="t", origin_message_id="m", subscription="s", reason="x", failed_at=1
        )


BOOKKEEPING = [
    ("REAL_TOPIC", True),
    ("ORIGIN_MESSAGE_ID", True),
    ("RECONSUMETIMES", True),
    ("DELAY_TIME", True),
    ("RETRY_TOPIC", True),
    ("ORIGIN_MESSAGE_IDY_TIME", True),
    ("__dlq.errors.reason", True),
    ("__connect.errors.topic", True),
    ("kafka_dlt-original-offset", True),
    ("REPLAY_ID", False),
    ("real_topic", False),
    ("app", False),
    ("__dlq.errorsX", False),
]


@pytest.mark.parametrize(("key", "expected"), BOOKKEEPING)
def test_is_bookkeeping_property(key: str, expected: bool) -> None:
    assert is_bookkeeping_property(key) is expected


def test_strip_bookkeeping_keeps_user_properties() -> None:
    assert strip_bookkeeping_properties({**OURS, "RECONSUMETIMES": "1"}) == {"app": "x"}
    assert strip_bookkeeping_properties(None) == {}


def test_truncate_utf8_never_splits_a_character() -> None:
    text = "€" * 10  # 3 bytes each
    out = c.truncate_utf8(text, 20)
    assert len(out.encode()) <= 20
    assert out.endswith(c.TRUNCATION_MARKER)
    assert c.truncate_utf8("short", 20) == "short"
