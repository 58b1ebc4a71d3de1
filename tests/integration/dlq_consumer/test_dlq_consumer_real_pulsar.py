"""Actual delay timing needs broker delayed delivery: runs only against a full Apache Pulsar."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from airflow_provider_dlq.dlq_consumer import DeadLetterPolicy, DlqConsumer, RetryPolicy, create_client

pytestmark = [pytest.mark.integration, pytest.mark.real_pulsar]


def test_reconsume_later_delays_are_honoured_by_the_broker(real_pulsar_url):
    import pulsar

    client = create_client(real_pulsar_url, logger=logging.getLogger("pulsar.real"))
    topic = f"persistent://public/default/dlqc-timing-{uuid.uuid4().hex[:8]}"
    try:
        producer = client.create_producer(topic)
        with DlqConsumer(
            client,
            topic,
            "s",
            dead_letter=DeadLetterPolicy(),
            retry=RetryPolicy(delay_levels="2s 4s"),
            initial_position=pulsar.InitialPosition.Earliest,
        ) as consumer:
            producer.send(b"timed")
            msg = consumer.receive(timeout_millis=10_000)
            gaps = []
            for _ in range(2):  # level increment: 2 s, then 4 s
                started = time.monotonic()
                consumer.reconsume_later(msg)
                msg = consumer.receive(timeout_millis=15_000)
                gaps.append(time.monotonic() - started)
            consumer.acknowledge(msg)
            started = time.monotonic()
            producer.send(b"explicit")
            first = consumer.receive(timeout_millis=10_000)
            consumer.reconsume_later(first, 3)
            consumer.acknowledge(consumer.receive(timeout_millis=15_000))
            explicit = time.monotonic() - started
        assert 1.9 <= gaps[0] < 4.0, gaps
        assert 3.9 <= gaps[1] < 7.0, gaps
        assert 2.9 <= explicit < 6.0, explicit
        producer.close()
    finally:
        client.close()
