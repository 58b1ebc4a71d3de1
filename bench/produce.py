"""Fill a fresh broker with the workload (the untimed produce phase)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench import workload
from bench.pulsar_io import ConfirmedProducers, ensure_subscriptions, make_client


@dataclass(frozen=True)
class Produced:
    messages: int
    seconds: float


def prepare_and_produce(service_url: str, n: int, *, confirm_every: int = 20_000) -> Produced:
    """Create the DLQ and verification subscriptions, then produce the ``n`` DLQ messages.

    The subscriptions come first: on Apache Pulsar a topic keeps messages only for its subscriptions.
    """
    client = make_client(service_url)
    try:
        ensure_subscriptions(client, workload.DLQ_TOPICS, workload.DLQ_SUBSCRIPTION)
        ensure_subscriptions(client, workload.ORIGIN_TOPICS, workload.VERIFY_SUBSCRIPTION)
        producers = ConfirmedProducers(client, name_prefix="bench-dlq-writer")
        started = time.perf_counter()
        messages = workload.generate(n)
        producers.send_all(
            ((m.dlq_topic, m.payload, m.properties, m.partition_key, m.event_timestamp) for m in messages),
            confirm_every=confirm_every,
        )
        producers.close()
        return Produced(messages=n, seconds=time.perf_counter() - started)
    finally:
        client.close()
