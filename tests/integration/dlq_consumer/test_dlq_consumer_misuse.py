"""Bad input and misuse against the embedded broker: clear errors, nothing lost."""

from __future__ import annotations

import pulsar
import pytest
from dlq_consumer_helpers import drain, nothing_pending, subscribe_earliest

from pulsar_dlq_consumer import (
    ConfigurationError,
    ConsumerClosedError,
    DeadLetterPolicy,
    DlqConsumer,
    DlqNotConfiguredError,
    ExponentialBackoff,
    InvalidDelayError,
    PublishError,
    RetryNotConfiguredError,
    RetryPolicy,
    TopicNameGuard,
    TopicNameGuardError,
    UnsupportedSubscriptionTypeError,
    parse_error_context,
)

pytestmark = pytest.mark.integration

FAST = ExponentialBackoff(min_delay=0.05, max_delay=0.1)


def _consumer(client, topic, **kwargs):
    kwargs.setdefault("initial_position", pulsar.InitialPosition.Earliest)
    return DlqConsumer(client, topic, "s", backoff=FAST, **kwargs)


def test_term_without_dlq_is_a_clear_error_and_the_message_survives(pulsar_client, topic_factory):
    topic = topic_factory("nodlq")
    producer = pulsar_client.create_producer(topic)
    producer.send(b"keep me")
    with _consumer(pulsar_client, topic) as consumer:
        msg = consumer.receive(timeout_millis=5000)
        with pytest.raises(DlqNotConfiguredError, match=r"dead_letter_policy=DeadLetterPolicy"):
            consumer.term(msg, ValueError("x"))
        with pytest.raises(RetryNotConfiguredError, match=r"retry_policy=RetryPolicy"):
            consumer.reconsume_later(msg, 5)
        consumer.negative_acknowledge(msg)
        again = consumer.receive(timeout_millis=5000)
        assert again.data() == b"keep me"
        assert again.redelivery_count() == 1
        consumer.acknowledge(again)
    producer.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"delay": 0.5}, "between 1 s and 864000 s"),
        ({"delay": 864_001}, "between 1 s and 864000 s"),
        ({"delay": float("nan")}, "between 1 s"),
        ({"delay": "5s"}, "seconds"),
        ({"level": 0}, "from 1 to 18"),
        ({"level": 19}, "from 1 to 18"),
        ({"level": "fast"}, "from 1 to 18"),
        ({"delay": 5, "level": 2}, "not both"),
    ],
)
def test_invalid_delays_and_levels_send_nothing(pulsar_client, topic_factory, kwargs, match):
    topic = topic_factory("baddelay")
    producer = pulsar_client.create_producer(topic)
    producer.send(b"m")
    with _consumer(
        pulsar_client, topic, dead_letter_policy=DeadLetterPolicy(), retry_policy=RetryPolicy()
    ) as consumer:
        retry_reader = subscribe_earliest(pulsar_client, consumer.retry_topic, "check")
        msg = consumer.receive(timeout_millis=5000)
        delay = kwargs.pop("delay", None)
        with pytest.raises(InvalidDelayError, match=match):
            consumer.reconsume_later(msg, delay, **kwargs)
        assert nothing_pending(retry_reader, wait_ms=500)  # nothing was produced
        consumer.reconsume_later(msg, 1)  # the message is still ours to settle
        assert drain(retry_reader, expected=1)[0].properties()["DELAY_TIME"] == "1000"
        retry_reader.close()
        consumer.acknowledge(consumer.receive(timeout_millis=5000))
    producer.close()


def test_construction_errors_are_precise(pulsar_client, topic_factory):
    topic = topic_factory("cfg")
    with pytest.raises(TopicNameGuardError, match=r"starting with 'dlq\.'"):
        DlqConsumer(
            pulsar_client, topic, "s", dead_letter_policy=DeadLetterPolicy(name_guard=TopicNameGuard("dlq."))
        )
    with pytest.raises(TopicNameGuardError, match="internal name"):
        DlqConsumer(
            pulsar_client,
            topic,
            "s",
            dead_letter_policy=DeadLetterPolicy(dead_letter_topic="public/default/__dlq"),
        )
    with pytest.raises(TopicNameGuardError, match="retry topic"):
        DlqConsumer(
            pulsar_client,
            topic,
            "s",
            dead_letter_policy=DeadLetterPolicy(
                dead_letter_topic="dlq.orders", name_guard=TopicNameGuard("dlq.")
            ),
            retry_policy=RetryPolicy(),
        )
    with pytest.raises(UnsupportedSubscriptionTypeError, match=r"Shared or ConsumerType\.KeyShared"):
        DlqConsumer(pulsar_client, topic, "s", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(ConfigurationError, match="needs a dead-letter policy"):
        DlqConsumer(pulsar_client, topic, "s", retry_policy=RetryPolicy())
    with pytest.raises(ConfigurationError, match="managed by DlqConsumer"):
        DlqConsumer(pulsar_client, topic, "s", negative_ack_redelivery_delay_ms=5)
    with pytest.raises(ConfigurationError, match="must all differ"):
        DlqConsumer(pulsar_client, topic, "s", dead_letter_policy=DeadLetterPolicy(dead_letter_topic=topic))
    guarded = DlqConsumer(
        pulsar_client,
        topic,
        "s",
        dead_letter_policy=DeadLetterPolicy(
            dead_letter_topic="dlq.orders", name_guard=TopicNameGuard("dlq.")
        ),
        retry_policy=RetryPolicy(topic="dlq.orders-retry"),
    )
    assert guarded.dead_letter_topic == "persistent://public/default/dlq.orders"
    guarded.close()
    with pytest.raises(ConsumerClosedError):
        guarded.receive(timeout_millis=10)


def test_non_utf8_payloads_survive_term_and_retry(pulsar_client, topic_factory):
    topic = topic_factory("binary")
    payload = bytes(range(256)) + b"\xff\xfe\xc3\x28"
    producer = pulsar_client.create_producer(topic)
    producer.send(payload, properties={"note": "caf\u00e9 \u2603"})
    with _consumer(
        pulsar_client, topic, dead_letter_policy=DeadLetterPolicy(), retry_policy=RetryPolicy()
    ) as consumer:
        dlq = subscribe_earliest(pulsar_client, consumer.dead_letter_topic, "check")
        msg = consumer.receive(timeout_millis=5000)
        consumer.reconsume_later(msg, level=1, error=UnicodeDecodeError("utf-8", payload, 256, 257, "bad"))
        retried = consumer.receive(timeout_millis=5000)
        assert retried.data() == payload
        consumer.term(retried, "undecodable \udcff payload")  # lone surrogate in the error text
        (dead,) = drain(dlq, expected=1)
        dlq.close()
    assert dead.data() == payload
    assert dead.properties()["note"] == "caf\u00e9 \u2603"
    ctx = parse_error_context(dead.properties())
    assert ctx.reason == "term"
    assert ctx.error_message == "undecodable \ufffd payload"
    producer.close()


def test_payload_copy_off_writes_hash_only(pulsar_client, topic_factory):
    topic = topic_factory("nopayload")
    producer = pulsar_client.create_producer(topic)
    producer.send(b"card=4111111111111111")
    with _consumer(pulsar_client, topic, dead_letter_policy=DeadLetterPolicy(copy_payload=False)) as consumer:
        dlq = subscribe_earliest(pulsar_client, consumer.dead_letter_topic, "check")
        consumer.term(consumer.receive(timeout_millis=5000), ValueError("bad card"))
        (dead,) = drain(dlq, expected=1)
        dlq.close()
    assert dead.data() == b""
    props = dead.properties()
    assert props["__dlq.errors.payload.copied"] == "false"
    import hashlib

    assert props["__dlq.errors.payload.sha256"] == hashlib.sha256(b"card=4111111111111111").hexdigest()
    producer.close()


def test_property_values_near_the_size_limit(pulsar_client, topic_factory):
    """Big properties are copied intact; a copy that no longer fits fails clearly and loses nothing."""
    topic = topic_factory("bigprops")
    # A short send timeout: a message the client lets through but the broker refuses is retried
    # until the send times out.
    producer = pulsar_client.create_producer(topic, send_timeout_millis=5000)
    big = "v" * (1024 * 1024)
    producer.send(b"a", properties={"big": big})
    # Find a property just under Apache Pulsar's maxMessageSize (5 MiB by default, announced to the
    # client, counting payload and metadata): 1 KiB of slack, less than the error context adds.
    limit = 5 * 1024 * 1024
    near = None
    for slack in range(1000, 20_000, 100):
        try:
            producer.send(b"b", properties={"huge": "h" * (limit - slack)})
        except pulsar.PulsarException:
            continue
        near = limit - slack
        break
    assert near is not None
    policy = DeadLetterPolicy(max_error_message_bytes=4096)
    with _consumer(pulsar_client, topic, dead_letter_policy=policy) as consumer:
        dlq = subscribe_earliest(pulsar_client, consumer.dead_letter_topic, "check")
        first = consumer.receive(timeout_millis=5000)
        consumer.term(first, ValueError("\u20ac" * 5000))  # 15,000 bytes of message: bounded
        (dead,) = drain(dlq, expected=1)
        assert dead.properties()["big"] == big
        assert len(dead.properties()["__dlq.errors.exception.message"].encode()) <= 4096

        second = consumer.receive(timeout_millis=5000)
        assert len(second.properties()["huge"]) == near
        error = ValueError("x" * 4000)
        with pytest.raises(PublishError, match="redelivered"):
            consumer.term(second, error)
        again = consumer.receive(timeout_millis=5000)  # not lost: nacked at once and redelivered
        assert again.properties()["huge"] == second.properties()["huge"]
        assert again.redelivery_count() == 1
        consumer.acknowledge(again)
        dlq.close()
    producer.close()


def test_async_terms_are_batched_checked_and_flushed_on_close(pulsar_client, topic_factory):
    topic = topic_factory("asyncterm")
    producer = pulsar_client.create_producer(topic, batching_enabled=True, block_if_queue_full=True)
    n = 300
    for i in range(n):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    consumer = _consumer(pulsar_client, topic, dead_letter_policy=DeadLetterPolicy())
    dlq = subscribe_earliest(pulsar_client, consumer.dead_letter_topic, "check")
    futures = [consumer.term_async(consumer.receive(timeout_millis=5000), "bulk") for _ in range(n)]
    consumer.close()  # flushes producers and waits for every send and ack
    assert all(f.done() and f.exception() is None for f in futures)
    dead = drain(dlq, expected=n, timeout_s=20)
    assert sorted(m.data() for m in dead) == sorted(f"m{i}".encode() for i in range(n))
    origin = subscribe_earliest(pulsar_client, topic, "s")
    assert nothing_pending(origin)  # all acked after their DLQ copy was confirmed
    origin.close()
    dlq.close()
    producer.close()
