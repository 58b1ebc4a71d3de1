"""The tuned single-process replay: what a careful engineer writes with the client's fast paths.

Batch receive; per message decide, fix and queue an async batched send (or buffer an archive line);
per batch: confirm every send, write and flush the archive lines, then ack the batch.
"""

from __future__ import annotations

import json
import time
from typing import IO, Any

from bench import workload
from bench.bench_fixes import fix_payload
from bench.contenders import ContenderSpec
from bench.pulsar_io import ConfirmedProducers, drain_resubscribing, make_client, subscribe
from pulsar_dlq_consumer.context import REAL_TOPIC, strip_bookkeeping_properties


def archive_record(msg: Any, props: dict[str, str]) -> str:
    """One archive line: where the message was, its key, properties and payload."""
    record = {
        "dlq_topic": msg.topic_name(),
        "message_id": str(msg.message_id()),
        "key": msg.partition_key(),
        "properties": props,
        "payload": msg.data().decode("utf-8", "replace"),
    }
    return json.dumps(record) + "\n"


def _replay_topic(
    client: Any,
    producers: ConfirmedProducers,
    archive: IO[str],
    counts: dict[str, int],
    topic: str,
    count: int,
    spec: ContenderSpec,
) -> int:
    def handle(consumer: Any, batch: list[Any]) -> None:
        lines: list[str] = []
        for msg in batch:
            props = msg.properties()
            if workload.decide(props) == workload.REPUBLISH:
                producers.send(
                    props[REAL_TOPIC],
                    fix_payload(msg.data()),
                    properties=strip_bookkeeping_properties(props),
                    partition_key=msg.partition_key(),
                    event_timestamp=msg.event_timestamp(),
                )
            else:
                lines.append(archive_record(msg, props))
        counts["republished"] += producers.confirm()
        if lines:
            archive.writelines(lines)
            archive.flush()
            counts["archived"] += len(lines)
        for msg in batch:
            consumer.acknowledge(msg)

    received, _ = drain_resubscribing(
        lambda: subscribe(client, topic, spec.subscription),
        handle,
        expected=count,
        idle_timeout_s=spec.idle_timeout_s,
    )
    return received


def run(spec: ContenderSpec) -> dict[str, Any]:
    started = time.perf_counter()
    client = make_client(spec.service_url)
    counts = {"republished": 0, "archived": 0}
    try:
        producers = ConfirmedProducers(client)
        ready = time.perf_counter()
        with open(spec.archive_path, "a", encoding="utf-8") as archive:
            received = sum(
                _replay_topic(client, producers, archive, counts, topic, count, spec)
                for topic, count in spec.topics()
            )
        producers.close()
        done = time.perf_counter()
    finally:
        client.close()
    return {
        "received": received,
        "republished": counts["republished"],
        "archived": counts["archived"],
        "setup_s": ready - started,
        "loop_s": done - ready,
        "total_s": time.perf_counter() - started,
    }
