"""The demo "orders" service: a Pulsar consumer built on ``pulsar_dlq_consumer``.

It fills real DLQs the way production services do. Orders that break a rule are termed straight to
the DLQ (PIP-372), orders that hit a down inventory service are retried through the retry topic until
the retries run out, and orders failing for unknown reasons are nacked with backoff until they exceed
the redelivery limit. Run it once with the inventory down, replay the DLQ, then run it again with the
inventory up: the replayed orders (with a ``REPLAY_ID`` property) are processed.

    python examples/orders_service.py produce --service-url pulsar://127.0.0.1:6650
    python examples/orders_service.py consume --service-url pulsar://127.0.0.1:6650 --inventory down
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

from pulsar_dlq_consumer import (
    DeadLetterPolicy,
    DlqConsumer,
    ExponentialBackoff,
    MessageProcessor,
    RetryPolicy,
    create_client,
)

ORDERS_TOPIC = "persistent://public/default/orders"
SUBSCRIPTION = "order-service"
DLQ_TOPIC = f"{ORDERS_TOPIC}-{SUBSCRIPTION}-DLQ"
REPLAY_SUBSCRIPTION = "dlq-replayer"

LOG = logging.getLogger("orders_service")


class OrderRejected(Exception):
    """The order breaks a business rule: retrying cannot help (terminal)."""


class SandboxOrderError(OrderRejected):
    """Sandbox traffic reached production (terminal)."""


class PricingError(Exception):
    """The price list has no entry for a SKU (unclassified: nacked with backoff)."""


@dataclass(frozen=True)
class OrderMix:
    """How many orders of each kind ``produce`` publishes (all deterministic)."""

    good: int = 30
    missing_currency: int = 10
    missing_currency_negative: int = 2
    inventory_north: int = 8
    not_json: int = 4
    sandbox: int = 3
    unpriced: int = 3

    @property
    def total(self) -> int:
        return sum(vars(self).values())


def build_orders(mix: OrderMix) -> list[tuple[str, bytes, dict[str, str]]]:
    """Return ``(key, payload, properties)`` for every order of the mix."""
    orders: list[tuple[str, bytes, dict[str, str]]] = []

    def add(kind: str, order: dict[str, Any] | None, props: dict[str, str] | None = None) -> None:
        n = len(orders) + 1
        key = f"customer-{n % 17}"
        payload = b"<order id=%d/>" % n if order is None else json.dumps({"id": f"o-{n}", **order}).encode()
        orders.append((key, payload, {"source": "web", "kind": kind, **(props or {})}))

    for _ in range(mix.good):
        add("good", {"amount": 25.0, "currency": "EUR", "sku": "SKU-1", "warehouse": "south"})
    for _ in range(mix.missing_currency):
        add("missing-currency", {"amount": 12.5, "sku": "SKU-2", "warehouse": "south"})
    for _ in range(mix.missing_currency_negative):
        add("missing-currency-negative", {"amount": -5, "sku": "SKU-2", "warehouse": "south"})
    for _ in range(mix.inventory_north):
        add("inventory", {"amount": 40.0, "currency": "USD", "sku": "SKU-3", "warehouse": "north"})
    for _ in range(mix.not_json):
        add("not-json", None)
    for _ in range(mix.sandbox):
        add("sandbox", {"amount": 1.0, "currency": "EUR", "sku": "SKU-1"}, {"env": "sandbox"})
    for _ in range(mix.unpriced):
        add("unpriced", {"amount": 9.0, "currency": "EUR", "sku": "SKU-404", "warehouse": "south"})
    return orders


def make_handler(inventory_up: bool, seen: Counter[str]) -> Any:
    """The service's business logic; raising decides what happens to the message."""

    def handle(msg: Any) -> None:
        props = msg.properties()
        order = json.loads(msg.data())  # JSONDecodeError: registered as terminal below
        if props.get("env") == "sandbox":
            raise SandboxOrderError(f"sandbox order {order['id']} reached production")
        if "currency" not in order:
            raise ValueError(f"missing currency in order {order['id']}")
        if order["amount"] <= 0:
            raise OrderRejected(f"order {order['id']}: amount must be positive, got {order['amount']}")
        if order.get("warehouse") == "north" and not inventory_up:
            raise TimeoutError(f"inventory service timed out after 5000 ms for sku {order['sku']}")
        if order["sku"] == "SKU-404":
            raise PricingError(f"no price for sku {order['sku']} in price list 2026-11")
        seen["replayed" if "REPLAY_ID" in props else "processed"] += 1

    return handle


def produce(service_url: str, mix: OrderMix) -> int:
    """Publish the order mix to the orders topic."""
    client = create_client(service_url, logger=logging.getLogger("pulsar"))
    try:
        producer = client.create_producer(ORDERS_TOPIC, block_if_queue_full=True)
        orders = build_orders(mix)
        for key, payload, props in orders:
            producer.send(payload, partition_key=key, properties=props)
        producer.flush()
        producer.close()
        return len(orders)
    finally:
        client.close()


def consume(service_url: str, *, inventory_up: bool, idle_timeout_s: float) -> dict[str, int]:
    """Run the service until it has been idle for ``idle_timeout_s``; return the outcome counts."""
    import pulsar

    client = create_client(service_url, logger=logging.getLogger("pulsar"))
    seen: Counter[str] = Counter()
    try:
        consumer = DlqConsumer(
            client,
            ORDERS_TOPIC,
            SUBSCRIPTION,
            dead_letter_policy=DeadLetterPolicy(
                max_redeliver_count=2, initial_subscription_name=REPLAY_SUBSCRIPTION
            ),
            retry_policy=RetryPolicy(max_reconsumes=3),  # delay levels 1s, 5s, 10s (level increment)
            backoff=ExponentialBackoff(min_delay=0.2, max_delay=1.0),
            consumer_name="order-service-1",
            initial_position=pulsar.InitialPosition.Earliest,
        )
        processor = MessageProcessor(
            consumer,
            make_handler(inventory_up, seen),
            terminal=[OrderRejected, ValueError, json.JSONDecodeError],
            retryable=[TimeoutError],
        )
        stats = processor.run(idle_timeout_s=idle_timeout_s)
        consumer.close()
    finally:
        client.close()
    return {
        "received": stats.received,
        "processed": seen["processed"],
        "processed_replayed": seen["replayed"],
        "termed": stats.termed,
        "retried": stats.retried,
        "nacked": stats.nacked,
        "failed": stats.failed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("command", choices=["produce", "consume"])
    parser.add_argument("--service-url", required=True, help="pulsar://host:port of the broker")
    parser.add_argument("--inventory", choices=["up", "down"], default="up", help="inventory service state")
    parser.add_argument("--idle-timeout", type=float, default=3.0, help="stop after this many idle seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "produce":
        print(json.dumps({"produced": produce(args.service_url, OrderMix()), "topic": ORDERS_TOPIC}))
    else:
        counts = consume(
            args.service_url, inventory_up=args.inventory == "up", idle_timeout_s=args.idle_timeout
        )
        print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # pulsar-client can abort during interpreter shutdown when a Python logger is attached
    # (apache/pulsar-client-python#256); all work is done and flushed, so leave without finalisers.
    os._exit(code)
