"""Helpers shared by the consumer-library integration tests (bounded receives only)."""

from __future__ import annotations

import time
from typing import Any


def subscribe_earliest(client: Any, topic: str, subscription: str) -> Any:
    """A plain Shared consumer reading ``topic`` from the earliest message."""
    import pulsar

    return client.subscribe(
        topic,
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )


def drain(
    consumer: Any, *, expected: int | None = None, timeout_s: float = 5.0, idle_ms: int = 700
) -> list[Any]:
    """Receive (and ack) until ``expected`` messages arrived or nothing came for ``idle_ms``."""
    import pulsar

    messages: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (expected is None or len(messages) < expected):
        try:
            msg = consumer.receive(timeout_millis=idle_ms)
        except pulsar.Timeout:
            if expected is None:
                break
            continue
        consumer.acknowledge(msg)
        messages.append(msg)
    return messages


def nothing_pending(consumer: Any, wait_ms: int = 1200) -> bool:
    """True if ``consumer`` receives nothing within ``wait_ms``."""
    import pulsar

    try:
        consumer.receive(timeout_millis=wait_ms)
    except pulsar.Timeout:
        return True
    return False


class RecordingMeterProvider:
    """A minimal OpenTelemetry-API-shaped meter provider that records counter additions."""

    def __init__(self) -> None:
        self.points: list[tuple[str, int, dict[str, str]]] = []

    def get_meter(self, name: str, *args: Any, **kwargs: Any) -> RecordingMeterProvider:
        return self

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Any:
        provider = self

        class _Counter:
            def add(self, amount: int, attributes: dict[str, str] | None = None) -> None:
                provider.points.append((name, amount, dict(attributes or {})))

        return _Counter()

    def total(self, name: str, **attrs: str) -> int:
        return sum(
            a for n, a, at in self.points if n == name and all(at.get(k) == v for k, v in attrs.items())
        )


def read_all(client: Any, topic: str, *, expected: int, timeout_s: float = 10.0) -> list[Any]:
    """Read ``topic`` from the start with a Reader until ``expected`` messages arrived.

    A Reader is an Exclusive, non-durable subscription: Apache Pulsar hands it delayed messages at
    once (delayed delivery applies to Shared and Key_Shared subscriptions only), so a test can look at
    a retry copy that a Shared consumer will get only after its delay.
    """
    import pulsar

    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    messages: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(messages) < expected and time.monotonic() < deadline:
            try:
                messages.append(reader.read_next(timeout_millis=500))
            except pulsar.Timeout:
                continue
    finally:
        reader.close()
    return messages
