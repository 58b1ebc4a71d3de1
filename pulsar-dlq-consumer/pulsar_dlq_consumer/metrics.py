"""Consumer metrics through the OpenTelemetry API, named after PIP-372 (no-op unless an SDK is installed).

Counters of messages with attributes ``topic``, ``subscription``, ``pulsar_tenant``, ``pulsar_namespace``.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

METER_NAME = "pulsar_dlq_consumer"
TERMS = "pulsar_client_consumer_terms"
DLQ_MESSAGES = "pulsar_client_consumer_dlq_messages"
RETRIES = "pulsar_client_consumer_retries"
NACKS = "pulsar_client_consumer_nacks"


def topic_attributes(topic: str, subscription: str) -> dict[str, str]:
    """Metric attributes for a fully qualified topic name and a subscription."""
    attributes = {"topic": topic, "subscription": subscription}
    rest = topic.split("://", 1)[-1].split("/")
    if len(rest) == 3:
        attributes["pulsar_tenant"] = rest[0]
        attributes["pulsar_namespace"] = f"{rest[0]}/{rest[1]}"
    return attributes


class _NoOp:
    """Meter and counter where OpenTelemetry is not installed (the library runs on pulsar-client alone)."""

    def create_counter(self, *args: Any, **kwargs: Any) -> _NoOp:
        return self

    def add(self, *args: Any, **kwargs: Any) -> None:
        pass


class ConsumerMetrics:
    """The library's counters, from ``meter_provider`` or the global OpenTelemetry provider."""

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        if meter_provider is None:
            with contextlib.suppress(ImportError):
                from opentelemetry.metrics import get_meter_provider

                meter_provider = get_meter_provider()
        meter: Any = _NoOp() if meter_provider is None else meter_provider.get_meter(METER_NAME)

        def counter(name: str, description: str) -> Any:
            return meter.create_counter(name, unit="{message}", description=description)

        self._terms = counter(TERMS, "Messages termed by the client")
        self._dlq = counter(DLQ_MESSAGES, "Messages written to the dead-letter topic")
        self._retries = counter(RETRIES, "Messages sent to the retry topic by reconsume_later")
        self._nacks = counter(NACKS, "Negative acknowledgements scheduled with backoff")

    def term(self, attributes: dict[str, str]) -> None:
        self._terms.add(1, attributes)

    def dead_lettered(self, attributes: dict[str, str], reason: str) -> None:
        self._dlq.add(1, {**attributes, "reason": reason})

    def retry(self, attributes: dict[str, str]) -> None:
        self._retries.add(1, attributes)

    def nack(self, attributes: dict[str, str]) -> None:
        self._nacks.add(1, attributes)
