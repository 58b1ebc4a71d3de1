"""The copy ceiling: move every DLQ message, unchanged, to its origin topic as fast as the client can.

Batch receive, batched ``send_async`` confirmed by one ``flush`` per received batch (plus a check that
the broker acknowledged exactly the count sent), then the acks of that batch (never before its sends
are confirmed). No parsing, no decisions, no fix: the physical limit of any replay on the machine.

What makes it fast is tunable (:class:`CeilingSettings`) and was measured (``docs/benchmarks.md``):
worker processes (each copies its share of the DLQ topics with its own client), receiver queue, batch
size, producer pending limit, and how the batch is acked (each message, or one cumulative ack on a
Failover subscription: correct here because the ceiling acks everything it received, in order).
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.contenders import ContenderSpec
from bench.pulsar_io import BenchError, ConfirmedProducers, drain_resubscribing, make_client
from pulsar_dlq_consumer.context import REAL_TOPIC

ACK_MODES = ("each", "cumulative")


@dataclass(frozen=True)
class CeilingSettings:
    """Knobs of the copy loop. The defaults are the fastest combination measured on both brokers."""

    workers: int = 2
    batch: int = 1000
    receiver_queue: int = 1000
    max_pending: int = 10_000
    ack: str = "each"

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> CeilingSettings:
        settings = cls(**(data or {}))
        if settings.ack not in ACK_MODES:
            raise ValueError(f"ceiling ack mode {settings.ack!r}: choose from {', '.join(ACK_MODES)}")
        if min(settings.workers, settings.batch, settings.receiver_queue, settings.max_pending) < 1:
            raise ValueError(f"ceiling settings must be positive: {settings}")
        return settings

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _subscribe(client: Any, topic: str, spec: ContenderSpec, settings: CeilingSettings) -> Any:
    import pulsar

    policy = pulsar.ConsumerBatchReceivePolicy(settings.batch, 64 * 1024 * 1024, 100)
    kind = pulsar.ConsumerType.Failover if settings.ack == "cumulative" else pulsar.ConsumerType.Shared
    return client.subscribe(
        topic,
        spec.subscription,
        consumer_type=kind,
        initial_position=pulsar.InitialPosition.Earliest,
        receiver_queue_size=settings.receiver_queue,
        batch_receive_policy=policy,
    )


def _copy_topic(
    client: Any,
    producers: ConfirmedProducers,
    topic: str,
    count: int,
    spec: ContenderSpec,
    settings: CeilingSettings,
) -> tuple[int, int]:
    cumulative = settings.ack == "cumulative"

    def handle(consumer: Any, batch: list[Any]) -> None:
        send = producers.send
        for msg in batch:
            props = msg.properties()
            send(
                props[REAL_TOPIC],
                msg.data(),
                properties=props,
                partition_key=msg.partition_key(),
                event_timestamp=msg.event_timestamp(),
            )
        producers.confirm()
        if cumulative:  # a Failover consumer receives in order: the last id acks the whole batch
            consumer.acknowledge_cumulative(batch[-1])
        else:
            ack = consumer.acknowledge
            for msg in batch:
                ack(msg)

    return drain_resubscribing(
        lambda: _subscribe(client, topic, spec, settings),
        handle,
        expected=count,
        idle_timeout_s=spec.idle_timeout_s,
    )


def copy_topics(
    spec: ContenderSpec, settings: CeilingSettings, topics: list[tuple[str, int]]
) -> dict[str, int]:
    """One client copying ``topics`` one after the other; returns received and republished counts."""
    client = make_client(spec.service_url)
    try:
        producers = ConfirmedProducers(client, max_pending=settings.max_pending, batch=settings.batch)
        copied = [_copy_topic(client, producers, t, c, spec, settings) for t, c in topics]
        producers.close()
        return {
            "received": sum(received for received, _ in copied),
            "republished": producers.sent,
            "resubscribes": sum(again for _, again in copied),
        }
    finally:
        client.close()


def _worker(
    spec_json: dict[str, Any], settings_json: dict[str, Any], topics: list[tuple[str, int]], out: Any
) -> None:
    try:
        result = copy_topics(
            ContenderSpec.from_json(spec_json), CeilingSettings.from_json(settings_json), topics
        )
        out.put(("ok", result))
    except BaseException as exc:  # reported to the parent, which fails the run
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def run(spec: ContenderSpec) -> dict[str, Any]:
    settings = CeilingSettings.from_json(spec.settings)
    started = time.perf_counter()
    shares = [spec.topics()[i :: settings.workers] for i in range(settings.workers)]
    shares = [s for s in shares if s]
    if len(shares) == 1:
        ready = time.perf_counter()
        totals = copy_topics(spec, settings, shares[0])
    else:
        # Spawned (not forked) workers, each with its own client: a pulsar client never crosses fork().
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_worker, args=(spec.to_json(), settings.to_json(), s, out)) for s in shares
        ]
        ready = time.perf_counter()
        for proc in procs:
            proc.start()
        answers = [out.get() for _ in procs]
        for proc in procs:
            proc.join()
        errors = [str(body) for status, body in answers if status != "ok"]
        if errors:
            raise BenchError("ceiling worker failed: " + "; ".join(errors))
        keys = ("received", "republished", "resubscribes")
        totals = {k: sum(int(body[k]) for _, body in answers) for k in keys}
    done = time.perf_counter()
    return {
        **totals,
        "archived": 0,
        "settings": settings.to_json(),
        "setup_s": ready - started,
        "loop_s": done - ready,
        "total_s": time.perf_counter() - started,
    }
