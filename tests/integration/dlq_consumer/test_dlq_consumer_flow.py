"""The consumer library on Apache Pulsar: term, redelivery past the maximum, retry chain, official DLQ policy.

Measured timings (retry delays, nack backoff) are in ``test_dlq_consumer_timing.py``.
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta

import pulsar
import pytest
from dlq_consumer_helpers import RecordingMeterProvider, drain, nothing_pending, read_all, subscribe_earliest

from pulsar_dlq_consumer import (
    ConsumerMetrics,
    DeadLetterPolicy,
    DlqConsumer,
    RetryPolicy,
    parse_error_context,
)

pytestmark = pytest.mark.integration


def _raise(exc: Exception) -> Exception:
    try:
        raise exc
    except Exception as caught:
        return caught


def test_term_lands_in_dlq_after_one_delivery_with_full_context(pulsar_client, topic_factory):
    topic = topic_factory("orders")
    meters = RecordingMeterProvider()
    producer = pulsar_client.create_producer(topic)
    with DlqConsumer(
        pulsar_client,
        topic,
        "billing",
        dead_letter_policy=DeadLetterPolicy(initial_subscription_name="audit"),
        consumer_name="billing-1",
        metrics=ConsumerMetrics(meters),
        initial_position=pulsar.InitialPosition.Earliest,
    ) as consumer:
        sent_id = producer.send(
            b'{"order": 1}',
            properties={"tenant": "acme", "trace": "t-1"},
            partition_key="order-1",
            ordering_key="ord-key",
            event_timestamp=1_700_000_000_000,
        )
        msg = consumer.receive(timeout_millis=5000)
        assert msg.redelivery_count() == 0
        before = int(time.time() * 1000)
        dlq_id = consumer.term(msg, _raise(ValueError("total must be positive: -3")))
        assert dlq_id is not None
        assert consumer.dead_letter_topic == f"{topic}-billing-DLQ"
        assert nothing_pending(consumer)  # acked: not redelivered

    # The initial subscription was created before the first DLQ write, so it sees the message.
    dlq_reader = subscribe_earliest(pulsar_client, f"{topic}-billing-DLQ", "audit")
    (dead,) = drain(dlq_reader, expected=1)
    assert dead.data() == b'{"order": 1}'
    assert dead.partition_key() == "order-1"
    assert dead.ordering_key() == "ord-key"
    assert dead.event_timestamp() == 1_700_000_000_000
    props = dead.properties()
    assert props["tenant"] == "acme"
    assert props["trace"] == "t-1"
    ctx = parse_error_context(props, dlq_topic=dead.topic_name(), dlq_message_id=str(dead.message_id()))
    assert ctx.context_format == "ours"
    assert ctx.reason == "term"
    assert ctx.origin_topic == topic
    assert ctx.origin_message_id == str(sent_id)
    assert props["REAL_TOPIC"] == topic
    assert props["ORIGIN_MESSAGE_ID"] == str(sent_id)
    assert (ctx.subscription, ctx.delivery_count, ctx.reconsume_times) == ("billing", 1, 0)
    assert ctx.error_class == "ValueError"
    assert ctx.error_message == "total must be positive: -3"
    assert ctx.error_stack is not None
    assert "_raise" in ctx.error_stack
    assert ctx.consumer == "billing-1"
    assert ctx.failed_at is not None
    assert before <= ctx.failed_at <= int(time.time() * 1000)
    assert meters.total("pulsar_client_consumer_terms", topic=topic, subscription="billing") == 1
    assert meters.total("pulsar_client_consumer_dlq_messages", reason="term") == 1
    # A fresh consumer on the origin subscription gets nothing: exactly one delivery, then acked.
    again = subscribe_earliest(pulsar_client, topic, "billing")
    assert nothing_pending(again)
    again.close()
    dlq_reader.close()
    producer.close()


def test_redelivery_beyond_max_is_dead_lettered_on_receive(pulsar_client, topic_factory):
    """A message redelivered past the maximum without our nack (e.g. after crashes) is intercepted."""
    topic = topic_factory("crashloop")
    producer = pulsar_client.create_producer(topic)
    raw = pulsar_client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=10,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer.send(b"x")
    for _ in range(3):  # redelivery counts 0, 1, 2 consumed by a plain consumer
        raw.negative_acknowledge(raw.receive(timeout_millis=5000))
    with DlqConsumer(
        pulsar_client, topic, "s", dead_letter_policy=DeadLetterPolicy(max_redeliver_count=1)
    ) as consumer:
        raw.close()
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1500)  # count 3 > 1: dead-lettered, not returned
        dlq = subscribe_earliest(pulsar_client, consumer.dead_letter_topic, "check")
        (dead,) = drain(dlq, expected=1)
    ctx = parse_error_context(dead.properties())
    assert ctx.reason == "max-redeliveries"
    assert ctx.delivery_count is not None
    assert ctx.delivery_count >= 3
    dlq.close()
    producer.close()


def test_reconsume_chain_level_increment_then_max_reconsumes(pulsar_client, topic_factory):
    topic = topic_factory("retry")
    producer = pulsar_client.create_producer(topic)
    meters = RecordingMeterProvider()
    with DlqConsumer(
        pulsar_client,
        topic,
        "s",
        dead_letter_policy=DeadLetterPolicy(),
        # Real delays on Apache Pulsar: a short ladder with a distinct delay per level (the default
        # ladder's values are checked in the unit tests).
        retry_policy=RetryPolicy(max_reconsumes=5, delay_levels="1s 1.2s 1.4s 1.6s 1.8s"),
        metrics=ConsumerMetrics(meters),
        initial_position=pulsar.InitialPosition.Earliest,
    ) as consumer:
        dlq = subscribe_earliest(pulsar_client, consumer.dead_letter_topic, "check")
        sent_id = producer.send(b"retry-me", properties={"k": "v"}, partition_key="key-1")
        seen: list[tuple[str | None, str | None, str]] = []
        for attempt in range(6):
            msg = consumer.receive(timeout_millis=5000)
            props = msg.properties()
            seen.append((props.get("RECONSUMETIMES"), props.get("DELAY_TIME"), msg.topic_name()))
            assert msg.data() == b"retry-me"
            assert msg.partition_key() == "key-1"
            assert props["k"] == "v"
            if attempt:
                assert consumer.is_retry_message(msg)
                assert props["REAL_TOPIC"] == topic
                assert props["ORIGIN_MESSAGE_ID"] == str(sent_id)
                assert props["RETRY_TOPIC"] == consumer.retry_topic
                assert "ORIGIN_MESSAGE_IDY_TIME" not in props
            consumer.reconsume_later(msg, error=_raise(ConnectionError(f"attempt {attempt}")))
        (dead,) = drain(dlq, expected=1)
        assert nothing_pending(consumer)
    # RECONSUMETIMES 1..5 through the retry topic; retry n asks for level n of the ladder
    assert [s[0] for s in seen] == [None, "1", "2", "3", "4", "5"]
    assert [s[1] for s in seen] == [None, "1000", "1200", "1400", "1600", "1800"]
    assert seen[0][2] == topic
    assert all(s[2] == f"{topic}-s-RETRY" for s in seen[1:])
    ctx = parse_error_context(dead.properties())
    assert (ctx.reason, ctx.reconsume_times, ctx.origin_topic) == ("max-reconsumes", 5, topic)
    assert ctx.origin_message_id == str(sent_id)
    assert ctx.error_message == "attempt 5"
    assert dead.data() == b"retry-me"
    assert dead.partition_key() == "key-1"
    assert meters.total("pulsar_client_consumer_retries") == 5
    assert meters.total("pulsar_client_consumer_dlq_messages", reason="max-reconsumes") == 1
    dlq.close()
    producer.close()


def test_reconsume_custom_ladder_explicit_level_delay_and_custom_properties(pulsar_client, topic_factory):
    topic = topic_factory("ladder")
    producer = pulsar_client.create_producer(topic)
    with DlqConsumer(
        pulsar_client,
        topic,
        "s",
        dead_letter_policy=DeadLetterPolicy(),
        retry_policy=RetryPolicy(delay_levels="1s 1.5s 2s", max_reconsumes=10),
        initial_position=pulsar.InitialPosition.Earliest,
    ) as consumer:
        producer.send(b"m")
        requested = []
        calls = [
            {"level": 2},
            {"delay": timedelta(seconds=1)},
            {"level": "increment"},  # 3rd retry -> level 3
            {},  # default: level increment; 4th retry -> level 4, capped at the last level (2s)
            {"properties": {"why": "custom", "RECONSUMETIMES": "999"}},
        ]
        for kwargs in calls:
            msg = consumer.receive(timeout_millis=5000)
            requested.append(msg.properties().get("DELAY_TIME"))
            consumer.reconsume_later(msg, **kwargs)
        last = consumer.receive(timeout_millis=5000)
        requested.append(last.properties().get("DELAY_TIME"))
        assert last.properties()["why"] == "custom"
        assert last.properties()["RECONSUMETIMES"] == "5"  # standard keys win over custom ones
        consumer.acknowledge(last)
    assert requested == [None, "1500", "1000", "2000", "2000", "2000"]
    producer.close()


def test_long_delays_are_written_and_held_by_the_broker(pulsar_broker, pulsar_client, topic_factory):
    """90 s and the 10-day maximum: the copies are on the retry topic at once, and Apache Pulsar holds
    them back from the Shared subscription (a Reader, being Exclusive, sees them immediately)."""
    topic = topic_factory("longdelay")
    producer = pulsar_client.create_producer(topic)
    with DlqConsumer(
        pulsar_client,
        topic,
        "s",
        dead_letter_policy=DeadLetterPolicy(),
        retry_policy=RetryPolicy(),
        initial_position=pulsar.InitialPosition.Earliest,
    ) as consumer:
        producer.send(b"in-90s", partition_key="a")
        producer.send(b"in-10d", partition_key="b")
        consumer.reconsume_later(consumer.receive(timeout_millis=5000), timedelta(seconds=90))
        consumer.reconsume_later(consumer.receive(timeout_millis=5000), 864_000)
        copies = read_all(pulsar_client, consumer.retry_topic, expected=2)
        assert sorted((m.data(), m.properties()["DELAY_TIME"]) for m in copies) == [
            (b"in-10d", "864000000"),
            (b"in-90s", "90000"),
        ]
        assert nothing_pending(consumer, wait_ms=3000)  # held by the broker, not delivered early
        path = consumer.retry_topic.replace("persistent://", "/admin/v2/persistent/", 1)
        stats = pulsar_broker.admin().get(f"{path}/stats")["subscriptions"]["s"]
        assert (stats["msgBacklog"], stats["msgDelayed"]) == (2, 2)
    producer.close()


def test_official_client_dead_letter_policy_is_parsed(pulsar_client, topic_factory):
    topic = topic_factory("official")
    dlq_topic = f"{topic}-s-DLQ"
    consumer = pulsar_client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=10,
        initial_position=pulsar.InitialPosition.Earliest,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=1, dead_letter_topic=dlq_topic
        ),
    )
    dlq = subscribe_earliest(pulsar_client, dlq_topic, "check")
    producer = pulsar_client.create_producer(topic)
    sent_id = producer.send(b"official", properties={"a": "b"}, partition_key="K")
    deadline = time.monotonic() + 10
    dead = None
    while dead is None and time.monotonic() < deadline:
        with contextlib.suppress(pulsar.Timeout):
            consumer.negative_acknowledge(consumer.receive(timeout_millis=300))
        try:
            dead = dlq.receive(timeout_millis=100)
        except pulsar.Timeout:
            continue
    assert dead is not None
    dlq.acknowledge(dead)
    ctx = parse_error_context(
        dead.properties(), dlq_topic=dead.topic_name(), dlq_message_id=str(dead.message_id())
    )
    assert ctx.context_format == "pulsar_dlq_policy"
    assert ctx.reason == "max-redeliveries"
    assert ctx.origin_topic == topic
    assert ctx.origin_message_id == str(sent_id)
    assert ctx.dlq_topic == dlq_topic
    assert ctx.error_class is None
    consumer.close()
    dlq.close()
    producer.close()
