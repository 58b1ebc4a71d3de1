"""Consumer metrics through the OpenTelemetry API, named after PIP-372 (no-op unless an SDK is installed).

Counters of messages with attributes ``topic``, ``subscription``, ``pulsar_tenant``, ``pulsar_namespace``.
"""

from __future__ import annotations

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


class _NoOpCounter:
    def add(self, amount: int, attributes: dict[str, str] | None = None) -> None:
        pass


class _NoOpMeter:
    def create_counter(self, name: str, unit: str = "", description: str = "") -> _NoOpCounter:
        return _NoOpCounter()


class ConsumerMetrics:
    """The library's counters, from ``meter_provider`` or the global OpenTelemetry provider."""

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        meter: Any
        if meter_provider is not None:
            meter = meter_provider.get_meter(METER_NAME)
        else:
            try:
                from opentelemetry import metrics as otel_metrics
            except ImportError:  # the library also runs where only pulsar-client is installed
                meter = _NoOpMeter()
            else:
                meter = otel_metrics.get_meter(METER_NAME)
        self._terms = meter.create_counter(
            TERMS, unit="{message}", description="Messages termed by the client"
        )
        self._dlq = meter.create_counter(
            DLQ_MESSAGES, unit="{message}", description="Messages written to the dead-letter topic"
        )
        self._retries = meter.create_counter(
            RETRIES, unit="{message}", description="Messages sent to the retry topic by reconsume_later"
        )
        self._nacks = meter.create_counter(
            NACKS, unit="{message}", description="Negative acknowledgements scheduled with backoff"
        )

    def term(self, attributes: dict[str, str]) -> None:
        self._terms.add(1, attributes)

    def dead_lettered(self, attributes: dict[str, str], reason: str) -> None:
        self._dlq.add(1, {**attributes, "reason": reason})

    def retry(self, attributes: dict[str, str]) -> None:
        self._retries.add(1, attributes)

    def nack(self, attributes: dict[str, str]) -> None:
        self._nacks.add(1, attributes)
