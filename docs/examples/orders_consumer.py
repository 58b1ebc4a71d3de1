"""Orders consumer: term bad orders, retry transient failures through delay levels, nack the rest.

The Python equivalent of the Java ``enableRetry``/``reconsumeLater`` and PIP-372 ``terminate`` examples.

    python docs/examples/orders_consumer.py                       # starts the embedded broker
    python docs/examples/orders_consumer.py pulsar://localhost:6650

Without a service URL it starts the embedded pulsar-lite broker (``pip install
'airflow-provider-dlq[embedded]'``), which delivers delayed messages at once; on Apache Pulsar the
retries wait 1 s, then 5 s (the first levels of the default ladder).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import uuid

import pulsar

from pulsar_dlq_consumer import (
    DeadLetterPolicy,
    DlqConsumer,
    ExponentialBackoff,
    MessageProcessor,
    RetryableError,
    RetryPolicy,
    create_client,
    parse_error_context,
)


class InvalidOrder(Exception):
    """The order breaks a business rule: retrying cannot help (terminal)."""


class GatewayUnavailable(Exception):
    """The payment gateway is down for a while (retryable)."""


ORDERS: list[bytes] = [
    json.dumps({"id": "o-1", "total": 20}).encode(),
    json.dumps({"id": "o-2", "total": -3}).encode(),  # invalid: term
    b"\xff\x00 not json",  # undecodable: term
    json.dumps({"id": "o-4", "total": 15, "gateway": "flaky"}).encode(),  # 2 retries, then ok
    json.dumps({"id": "o-5", "total": 9, "cache": "cold"}).encode(),  # 1 nack with backoff, then ok
]
EXPECTED_DELIVERIES = 8  # 5 first deliveries + 2 retries + 1 redelivery after the nack


def handle(msg: pulsar.Message) -> None:
    """Process one order; raise to choose what happens to it."""
    order = json.loads(msg.data())  # json.JSONDecodeError / UnicodeDecodeError: registered as terminal
    if order["total"] <= 0:
        raise InvalidOrder(f"order {order['id']}: total must be positive, got {order['total']}")
    retries = int(msg.properties().get("RECONSUMETIMES", "0"))
    if order.get("gateway") == "flaky" and retries < 2:
        raise GatewayUnavailable("payment gateway returned 503")  # level increment: 1 s, then 5 s
    if order.get("cache") == "cold" and msg.redelivery_count() == 0:
        raise KeyError("price cache miss")  # anything else: nack with backoff
    print(f"processed order {order['id']}")


def main(service_url: str) -> int:
    logging.basicConfig(level=logging.WARNING)
    topic = f"persistent://public/default/orders-{uuid.uuid4().hex[:8]}"
    client = create_client(service_url, logger=logging.getLogger("pulsar"))
    try:
        producer = client.create_producer(topic)
        consumer = DlqConsumer(
            client,
            topic,
            "order-service",
            dead_letter_policy=DeadLetterPolicy(
                max_redeliver_count=5, initial_subscription_name="dlq-replay"
            ),
            retry_policy=RetryPolicy(max_reconsumes=3),  # delay levels 1s 5s 10s ... (level increment)
            backoff=ExponentialBackoff(min_delay=0.5, max_delay=30),
            consumer_name="order-service-1",
            initial_position=pulsar.InitialPosition.Earliest,
        )
        for i, payload in enumerate(ORDERS):
            producer.send(payload, partition_key=f"customer-{i}", properties={"source": "web"})

        processor = MessageProcessor(
            consumer,
            handle,
            terminal=[InvalidOrder, json.JSONDecodeError, UnicodeDecodeError],
            retryable=[GatewayUnavailable, RetryableError],
        )
        stats = processor.run(max_messages=EXPECTED_DELIVERIES, idle_timeout_s=30)
        consumer.close()
        print(
            f"received={stats.received} acked={stats.acked} termed={stats.termed} "
            f"retried={stats.retried} nacked={stats.nacked} failed={stats.failed}"
        )

        # Read the DLQ back through the subscription created for the replay (payloads are not printed).
        dlq = client.subscribe(
            consumer.dead_letter_topic,
            "dlq-replay",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        dead = 0
        while True:
            try:
                msg = dlq.receive(timeout_millis=2000)
            except pulsar.Timeout:
                break
            ctx = parse_error_context(
                msg.properties(), dlq_topic=msg.topic_name(), dlq_message_id=str(msg.message_id())
            )
            print(f"DLQ: reason={ctx.reason} error={ctx.error_class}: {ctx.error_message}")
            print(f"     origin={ctx.origin_topic} id={ctx.origin_message_id} failed_at={ctx.failed_at}")
            dlq.acknowledge(msg)
            dead += 1
        dlq.close()
        producer.close()
        print(f"dead-lettered={dead}")
        return 0 if (stats.acked, stats.termed, dead) == (3, 2, 2) else 1
    finally:
        client.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        code = main(sys.argv[1])
    else:
        from airflow_provider_dlq.embedded_broker import start_embedded_broker

        data_dir = tempfile.mkdtemp(prefix="orders-consumer-")
        broker = start_embedded_broker(data_dir)
        try:
            code = main(broker.service_url)
        finally:
            broker.stop()
            shutil.rmtree(data_dir, ignore_errors=True)  # the throwaway broker's data
    sys.stdout.flush()
    # pulsar-client 3.13 can abort during interpreter shutdown when a Python logger is attached
    # (apache/pulsar-client-python#256); everything is closed and flushed, so exit right away.
    os._exit(code)
