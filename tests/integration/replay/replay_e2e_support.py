"""Shared helpers of the replay end-to-end tests: a mixed DLQ with known expected outcomes."""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = str(REPO / "examples" / "playbooks" / "orders.yaml")
LOG = logging.getLogger("tests.replay")


def close_driver_clients() -> None:
    """Close the Pulsar clients the in-process runner opened, while the interpreter is fully alive.

    A client still open at interpreter shutdown is closed by an atexit hook, and closing a client with a
    Python logger during shutdown can abort the process (apache/pulsar-client-python#256).
    """
    from spark_apps.dlq_replay.pulsar_io import conf

    conf.close_own_clients()


_ORIGIN_IDS = itertools.count()


def ours(origin: str, cls: str | None, message: str, **extra: str) -> dict[str, str]:
    """Our library's context for a new original message (each call a distinct origin message id)."""
    props = {
        "REAL_TOPIC": origin,
        "ORIGIN_MESSAGE_ID": f"7:{next(_ORIGIN_IDS)}:-1:-1",
        "__dlq.errors.topic": origin,
        "__dlq.errors.subscription": "orders-sub",
        "__dlq.errors.reason": "term",
        "__dlq.errors.exception.message": message,
        "__dlq.errors.failed.at": "1714521600000",
    }
    if cls:
        props["__dlq.errors.exception.class"] = cls
    props.update(extra)
    return props


def order(i: int, **fields: Any) -> bytes:
    body = {"order_id": f"ORD-{i:06d}", "amount": 10 + i}
    body.update(fields)
    return json.dumps(body, sort_keys=True).encode()


@dataclass
class MixedDlq:
    """Topics and the expected outcome of every DLQ message, by key."""

    orders: str
    admin: str
    dlq_a: str
    dlq_b: str
    expected: dict[str, str] = field(default_factory=dict)  # key -> outcome
    payloads: dict[str, bytes] = field(default_factory=dict)

    @property
    def topics_arg(self) -> str:
        return f"{self.dlq_a},{self.dlq_b}"

    def keys(self, *outcomes: str) -> set[str]:
        return {k for k, v in self.expected.items() if v in outcomes}


def build_mixed_dlq(client: Any, per_kind: int = 6, batch: int = 0) -> MixedDlq:
    """Produce a DLQ in every context format with every kind of outcome (``per_kind`` of each), one
    message an entry, or ``batch`` consecutive messages an entry (batches mixing outcomes)."""
    u = uuid.uuid4().hex[:8]
    orders = f"persistent://public/default/orders-{u}"
    mixed = MixedDlq(
        orders=orders,
        admin=f"persistent://public/default/admin-{u}",
        dlq_a=f"persistent://public/default/orders-{u}-sub-DLQ",
        dlq_b=f"persistent://public/default/connect-{u}-DLQ",
    )
    a: list[tuple[str, bytes, dict[str, str], str]] = []
    b: list[tuple[str, bytes, dict[str, str], str]] = []
    for i in range(per_kind):
        miss = f"missing currency in order ORD-{i:06d}"
        a.append((f"fix-{i}", order(i), ours(orders, "ValueError", miss), "republished"))
        a.append((f"badjson-{i}", b"{not json", ours(orders, "ValueError", miss), "malformed"))
        a.append((f"fixfail-{i}", order(i, amount=-1), ours(orders, "ValueError", miss), "fix_failed"))
        a.append(
            (
                f"timeout-{i}",
                order(i),
                ours(orders + "-partition-0", "builtins.TimeoutError", "inventory timed out after 30s"),
                "republished",
            )
        )
        a.append(
            (f"loop-{i}", order(i), ours(orders, "TimeoutError", "slow", REPLAY_COUNT="3"), "loop_guarded")
        )
        a.append((f"forged-{i}", order(i), ours(mixed.admin, "TimeoutError", "slow"), "origin_refused"))
        a.append((f"sandbox-{i}", order(i), ours(orders, "ValueError", "x", env="sandbox"), "dropped"))
        a.append(
            (f"policy-{i}", order(i), {"REAL_TOPIC": orders, "ORIGIN_MESSAGE_ID": f"1:{i}:-1:-1"}, "skipped")
        )
        a.append(
            (
                f"retry-{i}",
                order(i),
                {
                    "REAL_TOPIC": orders,
                    "RETRY_TOPIC": orders + "-RETRY",
                    "RECONSUMETIMES": "16",
                    "DELAY_TIME": "1000",
                },
                "skipped",
            )
        )
        a.append(
            (
                f"tdmq-{i}",
                order(i),
                {
                    "ORIGIN_MESSAGE_ID": f"1:{i}:-1:-1",
                    "RETRY_TOPIC": orders + "-RETRY",
                    "RECONSUMETIMES": "3",
                },
                "skipped",
            )
        )
        a.append((f"none-{i}", order(i), {"app": "orders"}, "malformed"))
        b.append(
            (
                f"connect-{i}",
                order(i),
                {
                    "__connect.errors.topic": orders.rsplit("/", 1)[1],
                    "__connect.errors.exception.class.name": "java.util.concurrent.TimeoutError",
                    "__connect.errors.exception.message": "timed out",
                },
                "republished",
            )
        )
        b.append(
            (
                f"spring-{i}",
                b"\x00\x01",
                {
                    "kafka_dlt-exception-fqcn": "org.json.JSONDecodeError",
                    "kafka_dlt-exception-message": "bad json at 3",
                    "kafka_dlt-original-topic": orders,
                    "kafka_dlt-original-partition": "\x00\x00\x00\x01",
                },
                "archived",
            )
        )
        b.append(
            (
                f"kip-{i}",
                order(i),
                {
                    "__dlq.errors.topic": orders,
                    "__dlq.errors.partition": "0",
                    "__dlq.errors.offset": str(i),
                    "__dlq.errors.message": "boom",
                },
                "skipped",
            )
        )
    for topic, items in ((mixed.dlq_a, a), (mixed.dlq_b, b)):
        batching: dict[str, Any] = {}
        if batch:  # batches close when full (or at the flush)
            batching = {"batching_max_messages": batch, "batching_max_publish_delay_ms": 60_000}
        producer = client.create_producer(topic, batching_enabled=batch > 0, **batching)
        for key, payload, props, outcome in items:
            if batch:
                producer.send_async(payload, None, properties=props, partition_key=key)
            else:
                producer.send(payload, properties=props, partition_key=key)
            mixed.expected[key] = outcome
            mixed.payloads[key] = payload
        producer.flush()
        producer.close()
    return mixed


def produce_late(client: Any, mixed: MixedDlq, count: int) -> list[str]:
    """Fixable messages that reach the DLQ after the window was frozen."""
    producer = client.create_producer(mixed.dlq_a, batching_enabled=False)
    keys = []
    for i in range(count):
        key = f"late-{i}"
        miss = f"missing currency in order ORD-{900 + i:06d}"
        producer.send(order(900 + i), properties=ours(mixed.orders, "ValueError", miss), partition_key=key)
        keys.append(key)
    producer.close()
    return keys


def drain(client: Any, topics: str | list[str], subscription: str, idle_ms: int = 1500) -> list[Any]:
    """Receive everything the subscription delivers (no acks), until ``idle_ms`` without a message."""
    import pulsar

    consumer = client.subscribe(
        topics if isinstance(topics, list) else [topics],
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
        consumer_name=f"drain-{os.getpid()}-{uuid.uuid4().hex[:6]}",
    )
    got: dict[str, Any] = {}
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            try:
                msg = consumer.receive(timeout_millis=idle_ms)
            except pulsar.Timeout:
                break
            got[str(msg.message_id())] = msg
    finally:
        consumer.close()
    return list(got.values())


def read_all(client: Any, topic: str) -> list[Any]:
    """Every stored message of a non-partitioned topic, read with a Reader (exact on Apache Pulsar, acks
    nothing, and not stopped by the 50,000 unacked-message limit a Shared consumer has)."""
    import pulsar

    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=2000)
    out: list[Any] = []
    try:
        while reader.has_message_available():
            out.append(reader.read_next(30_000))
    finally:
        reader.close()
    return out


def pending_on(client: Any, admin_url: str, topic: str, subscription: str = "dlq-replayer") -> list[Any]:
    """The messages ``subscription`` has not acked on a non-partitioned topic: a Reader's messages whose
    entry is not acked on the cursor (admin REST ``internalStats``). Exact, whatever the count."""
    from spark_apps.dlq_replay.pulsar_io.admin import PulsarAdmin
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
    from spark_apps.dlq_replay.pulsar_io.cursor import CursorState

    admin = PulsarAdmin(PulsarConf("pulsar://unused:6650", admin_url=admin_url))
    cursor = CursorState.from_internal_stats(admin.internal_stats(topic), subscription, topic=topic)
    return [
        m
        for m in read_all(client, topic)
        if not cursor.is_acked((m.message_id().ledger_id(), m.message_id().entry_id()))
    ]


def pending_keys(client: Any, mixed: MixedDlq, subscription: str = "dlq-replayer") -> list[str]:
    return sorted(m.partition_key() for m in drain(client, [mixed.dlq_a, mixed.dlq_b], subscription))


def expected_totals(mixed: MixedDlq, keys: set[str] | None = None) -> dict[str, int]:
    totals: dict[str, int] = {}
    for key, outcome in mixed.expected.items():
        if keys is None or key in keys:
            totals[outcome] = totals.get(outcome, 0) + 1
    return totals
