"""The processing loop on Apache Pulsar: classification, BaseException, registered classes."""

from __future__ import annotations

import json

import pulsar
import pytest
from dlq_consumer_helpers import drain, subscribe_earliest

from pulsar_dlq_consumer import (
    DeadLetterPolicy,
    DlqConsumer,
    DlqNotConfiguredError,
    ExponentialBackoff,
    MessageProcessor,
    Outcome,
    RetryableError,
    RetryPolicy,
    TerminalError,
    parse_error_context,
)

pytestmark = pytest.mark.integration


class InvalidOrder(Exception):
    """A user's own terminal error class."""


class Throttled(Exception):
    """A user's own retryable error class."""


def test_loop_classifies_every_outcome(pulsar_client, topic_factory):
    topic = topic_factory("loop")
    producer = pulsar_client.create_producer(topic)
    for kind in ["ok", "terminal", "invalid", "retry-level", "throttled", "flaky"]:
        producer.send(json.dumps({"kind": kind}).encode(), properties={"kind": kind})

    flaky_calls = {"n": 0}

    def handler(msg: pulsar.Message) -> None:
        kind = json.loads(msg.data())["kind"]
        if msg.properties().get("RECONSUMETIMES") or kind == "ok":
            return  # retried messages succeed
        if kind == "terminal":
            raise TerminalError("schema violation")
        if kind == "invalid":
            raise InvalidOrder("total < 0")
        if kind == "retry-level":
            raise RetryableError("downstream 503", level=3)
        if kind == "throttled":
            raise Throttled("429")
        flaky_calls["n"] += 1
        if flaky_calls["n"] == 1:
            raise ConnectionResetError("flaky")  # default: nack with backoff, then succeeds

    with DlqConsumer(
        pulsar_client,
        topic,
        "s",
        dead_letter_policy=DeadLetterPolicy(),
        retry_policy=RetryPolicy(delay_levels="1s 1.5s 2s"),  # real delays: level 3 is 2 s, level 1 is 1 s
        backoff=ExponentialBackoff(min_delay=0.05, max_delay=0.1),
        initial_position=pulsar.InitialPosition.Earliest,
    ) as consumer:
        dlq = subscribe_earliest(pulsar_client, consumer.dead_letter_topic, "check")
        retry_reader = subscribe_earliest(pulsar_client, consumer.retry_topic, "check")
        processor = MessageProcessor(consumer, handler, terminal=[InvalidOrder])
        processor.register_retryable(Throttled)
        stats = processor.run(max_messages=9, idle_timeout_s=3)
        dead = drain(dlq, expected=2)
        retried = drain(retry_reader, expected=2)
    # 6 first deliveries + 2 retried copies + 1 redelivery after the nack
    assert (stats.received, stats.acked, stats.termed, stats.retried, stats.nacked) == (9, 4, 2, 2, 1)
    # RetryableError(level=3) asked for level 3; the registered retryable class for the default (level 1)
    assert sorted((m.properties()["kind"], m.properties()["DELAY_TIME"]) for m in retried) == [
        ("retry-level", "2000"),
        ("throttled", "1000"),
    ]
    assert sorted(parse_error_context(m.properties()).error_class or "" for m in dead) == [
        "pulsar_dlq_consumer.errors.TerminalError",
        f"{InvalidOrder.__module__}.InvalidOrder",
    ]
    dlq.close()
    retry_reader.close()
    producer.close()


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_base_exceptions_propagate_and_leave_the_message_unacked(pulsar_client, topic_factory, exc_type):
    topic = topic_factory("baseexc")
    producer = pulsar_client.create_producer(topic)
    producer.send(b"precious")

    def handler(msg: pulsar.Message) -> None:
        raise exc_type()

    consumer = DlqConsumer(
        pulsar_client,
        topic,
        "s",
        dead_letter_policy=DeadLetterPolicy(),
        initial_position=pulsar.InitialPosition.Earliest,
    )
    dlq = subscribe_earliest(pulsar_client, consumer.dead_letter_topic, "check")
    with pytest.raises(exc_type):
        MessageProcessor(consumer, handler, default=Outcome.TERM).run(max_messages=1, idle_timeout_s=3)
    consumer.close()  # the unacked message goes back to the subscription
    assert drain(dlq, expected=None, idle_ms=800) == []  # not treated as a failure
    fresh = subscribe_earliest(pulsar_client, topic, "s")
    (again,) = drain(fresh, expected=1)
    assert again.data() == b"precious"
    fresh.close()
    dlq.close()
    producer.close()


def test_terminal_error_without_dlq_nacks_and_raises(pulsar_client, topic_factory):
    topic = topic_factory("termnodlq")
    producer = pulsar_client.create_producer(topic)
    producer.send(b"m")
    with DlqConsumer(
        pulsar_client,
        topic,
        "s",
        backoff=ExponentialBackoff(min_delay=0.05, max_delay=0.1),
        initial_position=pulsar.InitialPosition.Earliest,
    ) as consumer:

        def handler(msg: pulsar.Message) -> None:
            if msg.redelivery_count() == 0:
                raise TerminalError("bad")

        processor = MessageProcessor(consumer, handler)
        with pytest.raises(DlqNotConfiguredError):
            processor.run(max_messages=1, idle_timeout_s=3)
        stats = processor.run(max_messages=1, idle_timeout_s=3)  # nacked, so it comes back
        assert stats.acked == 1
    producer.close()
