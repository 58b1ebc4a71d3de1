"""The hand-written baseline: the drain loop a user writes from the pulsar-client docs.

For each DLQ topic: receive one message, parse and decide, fix and ``send`` it (synchronously) or
append it to an archive file, then acknowledge it; repeat. Correct (nothing is acked before its
outcome is durable) and simple, and as slow as one broker round trip per message.
"""

from __future__ import annotations

import time
from typing import IO, Any

from bench import workload
from bench.bench_fixes import fix_payload
from bench.contenders import ContenderSpec
from bench.contenders.tuned import archive_record
from bench.pulsar_io import BenchError, make_client
from pulsar_dlq_consumer.context import REAL_TOPIC, strip_bookkeeping_properties


def _drain_topic(
    client: Any,
    producers: dict[str, Any],
    archive: IO[str],
    counts: dict[str, int],
    topic: str,
    count: int,
    spec: ContenderSpec,
) -> None:
    import pulsar

    consumer = client.subscribe(
        topic,
        spec.subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    for handled in range(count):
        try:
            msg = consumer.receive(timeout_millis=int(spec.idle_timeout_s * 1000))
        except pulsar.Timeout as exc:
            raise BenchError(f"stalled: handled {handled} of {count} messages of {topic}") from exc
        props = msg.properties()
        if workload.decide(props) == workload.REPUBLISH:
            origin = props[REAL_TOPIC]
            if origin not in producers:
                producers[origin] = client.create_producer(origin)
            producers[origin].send(
                fix_payload(msg.data()),
                properties=strip_bookkeeping_properties(props),
                partition_key=msg.partition_key() or None,
                event_timestamp=msg.event_timestamp() or None,
            )
            counts["republished"] += 1
        else:
            archive.write(archive_record(msg, props))
            archive.flush()
            counts["archived"] += 1
        consumer.acknowledge(msg)
    consumer.close()


def run(spec: ContenderSpec) -> dict[str, Any]:
    started = time.perf_counter()
    client = make_client(spec.service_url)
    counts = {"republished": 0, "archived": 0}
    try:
        producers: dict[str, Any] = {}
        ready = time.perf_counter()
        with open(spec.archive_path, "a", encoding="utf-8") as archive:
            for topic, count in spec.topics():
                _drain_topic(client, producers, archive, counts, topic, count, spec)
        for producer in producers.values():
            producer.close()
        done = time.perf_counter()
    finally:
        client.close()
    return {
        "received": counts["republished"] + counts["archived"],
        "republished": counts["republished"],
        "archived": counts["archived"],
        "setup_s": ready - started,
        "loop_s": done - ready,
        "total_s": time.perf_counter() - started,
    }
