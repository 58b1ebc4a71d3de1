"""Helpers shared by the Pulsar I/O integration tests: produce known messages, drain a subscription."""

from __future__ import annotations

import time
from typing import Any

import pulsar

EVENT_BASE_MS = 1_700_000_000_000


def expected_message(topic: str, i: int) -> dict[str, Any]:
    """Message ``i`` of ``topic``: even ones have a key and event time, every third an ordering key."""
    return {
        "value": f"v|{topic}|{i}".encode(),
        "key": f"k{i % 37}" if i % 2 == 0 else None,
        "ordering_key": f"o{i % 5}" if i % 3 == 0 else None,
        "event_ms": EVENT_BASE_MS + i if i % 2 == 0 else None,
        "properties": {"i": str(i), "REAL_TOPIC": "persistent://public/default/orders", "note": "é ü"},
    }


def produce(
    client: Any, topic: str, count: int, *, batched: bool = True, start: int = 0, late: bool = False
) -> None:
    """Send ``count`` known messages (``late`` ones carry value ``late|...``), all confirmed."""
    producer = client.create_producer(
        topic,
        batching_enabled=batched,
        batching_max_messages=500,
        block_if_queue_full=True,
        max_pending_messages=2000,
    )
    failures: list[Any] = []

    def done(result: Any, _msg_id: Any) -> None:
        if result != pulsar.Result.Ok:
            failures.append(result)

    for i in range(start, start + count):
        m = expected_message(topic, i)
        producer.send_async(
            (b"late|" + m["value"]) if late else m["value"],
            done,
            properties=m["properties"],
            partition_key=m["key"],
            ordering_key=m["ordering_key"],
            event_timestamp=m["event_ms"],
        )
    producer.flush()
    producer.close()
    assert not failures, failures


def drain(client: Any, topic: str, subscription: str, *, timeout_ms: int = 1500) -> list[Any]:
    """Receive everything pending on a Shared subscription from the earliest message, acking nothing."""
    consumer = client.subscribe(
        topic,
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    out = []
    try:
        while True:
            try:
                out.append(consumer.receive(timeout_millis=timeout_ms))
            except pulsar.Timeout:
                return out
    finally:
        consumer.close()


def wait_for_deduplication(admin_url: str, topic: str, timeout_s: float = 30.0) -> None:
    """Wait until Apache Pulsar deduplicates ``topic`` (a ``persistent://`` name, loaded). A topic turns
    deduplication on asynchronously after it loads (``deduplicationStatus``: Initialized, Enabling,
    Enabled), and until then its messages are neither checked nor recorded."""
    from pulsar_standalone.admin import AdminClient

    path = "/admin/v2/persistent/" + topic.removeprefix("persistent://") + "/stats"
    admin, deadline, status = AdminClient(admin_url), time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        status = admin.get(path).get("deduplicationStatus")
        if status == "Enabled":
            return
        time.sleep(0.05)
    raise AssertionError(f"deduplication of {topic} is {status!r} after {timeout_s} s, not Enabled")
