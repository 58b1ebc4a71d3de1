"""The copy ceiling: move every DLQ message, unchanged, to its origin topic as fast as the client can.

One process: batch receive, batched async sends confirmed once per received batch, then the acks of
that batch (never before its sends are confirmed). No parsing, no decisions, no fix: this is the
physical limit of any replay on the machine.
"""

from __future__ import annotations

import time
from typing import Any

from bench.contenders import ContenderSpec
from bench.pulsar_io import ConfirmedProducers, drain, make_client, subscribe
from pulsar_dlq_consumer.context import REAL_TOPIC


def _copy_topic(
    client: Any, producers: ConfirmedProducers, topic: str, count: int, spec: ContenderSpec
) -> int:
    consumer = subscribe(client, topic, spec.subscription)

    def handle(batch: list[Any]) -> None:
        for msg in batch:
            props = msg.properties()
            producers.send(
                props[REAL_TOPIC],
                msg.data(),
                properties=props,
                partition_key=msg.partition_key(),
                event_timestamp=msg.event_timestamp(),
            )
        producers.confirm()
        for msg in batch:
            consumer.acknowledge(msg)

    received = drain(consumer, handle, expected=count, idle_timeout_s=spec.idle_timeout_s)
    consumer.close()
    return received


def run(spec: ContenderSpec) -> dict[str, Any]:
    started = time.perf_counter()
    client = make_client(spec.service_url)
    try:
        producers = ConfirmedProducers(client)
        ready = time.perf_counter()
        received = sum(_copy_topic(client, producers, topic, count, spec) for topic, count in spec.topics())
        producers.close()
        done = time.perf_counter()
    finally:
        client.close()
    return {
        "received": received,
        "republished": producers.sent,
        "archived": 0,
        "setup_s": ready - started,
        "loop_s": done - ready,
        "total_s": time.perf_counter() - started,
    }
