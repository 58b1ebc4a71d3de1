"""Consumer metrics through the OpenTelemetry API, named after PIP-372 (no-op unless an SDK is installed)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

METER_NAME = "pulsar_dlq_consumer"
NAME_PREFIX = "pulsar_client_consumer_"


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
    """Counters ``NAME_PREFIX + <attribute>`` of messages (attributes: :func:`topic_attributes`, and the
    ``reason`` of ``dlq_messages``) from ``meter_provider`` (default: OpenTelemetry's global provider)."""

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        if meter_provider is None:
            with contextlib.suppress(ImportError):
                from opentelemetry.metrics import get_meter_provider

                meter_provider = get_meter_provider()
        meter: Any = _NoOp() if meter_provider is None else meter_provider.get_meter(METER_NAME)

        def counter(name: str, description: str) -> Any:
            return meter.create_counter(NAME_PREFIX + name, unit="{message}", description=description)

        self.terms = counter("terms", "Messages termed by the client")
        self.dlq_messages = counter("dlq_messages", "Messages written to the dead-letter topic")
        self.retries = counter("retries", "Messages sent to the retry topic by reconsume_later")
        self.nacks = counter("nacks", "Negative acknowledgements scheduled with backoff")
