"""Smoke suite on the embedded pulsar-lite broker: the library's term and retry paths work there too.

(pulsar-lite ignores delayed delivery, so a retry arrives at once; the delay the library asked for is
checked on the message. Real delays are measured on Apache Pulsar in test_dlq_consumer_real_pulsar.py.)
"""

from __future__ import annotations

import logging
import uuid

import pulsar
import pytest
from dlq_consumer_helpers import drain, subscribe_earliest

from pulsar_dlq_consumer import DeadLetterPolicy, DlqConsumer, RetryPolicy, parse_error_context

pytestmark = [pytest.mark.integration, pytest.mark.embedded]


def test_term_and_retry_on_the_embedded_broker(lite_broker):
    client = pulsar.Client(lite_broker.service_url, logger=logging.getLogger("pulsar.lite"))
    topic = f"persistent://public/default/lite-orders-{uuid.uuid4().hex[:8]}"
    try:
        producer = client.create_producer(topic)
        with DlqConsumer(
            client,
            topic,
            "svc",
            dead_letter_policy=DeadLetterPolicy(),
            retry_policy=RetryPolicy(delay_levels="2s 4s", max_reconsumes=1),
            initial_position=pulsar.InitialPosition.Earliest,
        ) as consumer:
            dlq = subscribe_earliest(client, consumer.dead_letter_topic, "check")
            producer.send(b"bad", partition_key="k-term")
            producer.send(b"slow", partition_key="k-retry")
            for _ in range(2):
                msg = consumer.receive(timeout_millis=5000)
                if msg.partition_key() == "k-term":
                    consumer.term(msg, ValueError("invalid order"))
                else:
                    consumer.reconsume_later(msg, error=TimeoutError("inventory"))
            retried = consumer.receive(timeout_millis=5000)
            assert retried.properties()["RECONSUMETIMES"] == "1"
            assert retried.properties()["DELAY_TIME"] == "2000"
            consumer.reconsume_later(retried, error=TimeoutError("inventory"))  # retries run out
            dead = {m.partition_key(): parse_error_context(m.properties()) for m in drain(dlq, expected=2)}
        assert dead["k-term"].reason == "term"
        assert dead["k-term"].error_message == "invalid order"
        assert dead["k-retry"].reason == "max-reconsumes"
        assert dead["k-retry"].origin_topic == topic
        dlq.close()
        producer.close()
    finally:
        client.close()
