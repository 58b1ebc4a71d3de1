"""Pulsar plumbing shared by the harness and the single-process contenders.

``pulsar`` is imported inside functions so that ``python -m bench --help`` works without it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

LOG = logging.getLogger("bench.pulsar")

#: Receive/produce batch sizes used by the "best the client offers" contenders.
BATCH_MESSAGES = 1000
#: The client's default. On the embedded broker, Shared consumers with a receiver queue of 5,000 stall
#: for good after a few thousand batched messages in about one run out of three; 1,000 never did.
RECEIVER_QUEUE = 1000
BATCH_TIMEOUT_MS = 100


class BenchError(RuntimeError):
    """A benchmark run failed or produced a wrong answer."""


class Stalled(BenchError):
    """Nothing new arrived for a while before the expected count; ``received`` were handled by then."""

    def __init__(self, message: str, received: int) -> None:
        super().__init__(message)
        self.received = received


#: A copy loop with nothing new for this long before its count subscribes again (see
#: :func:`drain_resubscribing`); a healthy broker never pauses that long mid-backlog.
RESUBSCRIBE_AFTER_S = 5.0


def make_client(service_url: str) -> Any:
    """A ``pulsar.Client`` that logs through Python logging (never to stdout)."""
    import pulsar

    return pulsar.Client(service_url, logger=LOG, operation_timeout_seconds=30)


def subscribe(client: Any, topic: str, subscription: str, *, batch: bool = True) -> Any:
    """A Shared consumer on one topic from the earliest position (optionally with batch receive).

    One consumer per topic, never a multi-topic consumer: on the embedded broker, acks sent by a
    multi-topic consumer stall its deliveries after a few thousand messages.
    """
    import pulsar

    kwargs: dict[str, Any] = {}
    if batch:
        policy = pulsar.ConsumerBatchReceivePolicy(BATCH_MESSAGES, 64 * 1024 * 1024, BATCH_TIMEOUT_MS)
        kwargs["batch_receive_policy"] = policy
        kwargs["receiver_queue_size"] = RECEIVER_QUEUE
    return client.subscribe(
        topic,
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
        **kwargs,
    )


def ensure_subscriptions(client: Any, topics: Iterable[str], subscription: str) -> None:
    """Create the durable ``subscription`` on each topic (so the broker retains what arrives)."""
    for topic in topics:
        subscribe(client, topic, subscription, batch=False).close()


@dataclass
class _Tracked:
    producer: Any
    first_sequence_id: int = -1
    sent: int = 0
    confirmed: int = 0


class ConfirmedProducers:
    """Batched async producers, one per topic, whose sends are confirmed once per batch.

    ``send`` queues a message (``block_if_queue_full=True``, so nothing is dropped when the queue is
    full). ``confirm`` flushes every producer with unconfirmed sends (``flush`` raises when the send it
    waits for failed) and then checks that the broker acknowledged exactly the messages sent: the
    producer's ``last_sequence_id`` (the last id the broker acknowledged) must have advanced by the
    number of messages sent. No per-message callback: a Python callback per message costs about a
    third of the throughput (GIL hand-offs from the client's IO thread), and the count check plus the
    benchmark's end-state verification catch any loss.
    """

    def __init__(
        self,
        client: Any,
        *,
        name_prefix: str | None = None,
        batching: bool = True,
        max_pending: int = 10_000,
        batch: int = BATCH_MESSAGES,
    ) -> None:
        self._client = client
        self._name_prefix = name_prefix
        self._batching = batching
        self._max_pending = max_pending
        self._batch = batch
        self._producers: dict[str, _Tracked] = {}
        self.sent = 0

    def _get(self, topic: str) -> _Tracked:
        tracked = self._producers.get(topic)
        if tracked is None:
            kwargs: dict[str, Any] = {
                "block_if_queue_full": True,
                "batching_enabled": self._batching,
                "max_pending_messages": self._max_pending,
            }
            if self._batching:
                kwargs.update(
                    batching_max_messages=self._batch,
                    batching_max_allowed_size_in_bytes=4 * 1024 * 1024,
                    batching_max_publish_delay_ms=5,
                )
            if self._name_prefix:
                kwargs["producer_name"] = f"{self._name_prefix}-{len(self._producers)}"
            producer = self._client.create_producer(topic, **kwargs)
            tracked = _Tracked(producer=producer, first_sequence_id=producer.last_sequence_id())
            self._producers[topic] = tracked
        return tracked

    def send(
        self,
        topic: str,
        payload: bytes,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        event_timestamp: int | None = None,
    ) -> None:
        tracked = self._get(topic)
        tracked.producer.send_async(
            payload,
            None,
            properties=properties,
            partition_key=partition_key or None,
            event_timestamp=event_timestamp or None,
        )
        tracked.sent += 1
        self.sent += 1

    def send_all(
        self, messages: Iterable[tuple[str, bytes, dict[str, str], str, int]], *, confirm_every: int
    ) -> None:
        """:meth:`send` each ``(topic, payload, properties, partition key, event timestamp)``, with a
        :meth:`confirm` after every ``confirm_every`` messages and at the end."""
        for count, (topic, payload, properties, key, event_timestamp) in enumerate(messages, 1):
            self.send(
                topic, payload, properties=properties, partition_key=key, event_timestamp=event_timestamp
            )
            if count % confirm_every == 0:
                self.confirm()
        self.confirm()

    def confirm(self) -> int:
        """Flush every producer with unconfirmed sends and verify them; returns how many were confirmed.

        Raises :class:`BenchError` when a flush fails or the broker acknowledged a different count.
        """
        confirmed = 0
        for topic, tracked in self._producers.items():
            pending = tracked.sent - tracked.confirmed
            if not pending:
                continue
            try:
                tracked.producer.flush()
            except Exception as exc:
                raise BenchError(f"send to {topic} failed: {exc}; see the pulsar client log") from exc
            acknowledged = tracked.producer.last_sequence_id() - tracked.first_sequence_id
            if acknowledged != tracked.sent:
                raise BenchError(
                    f"{topic}: the broker acknowledged {acknowledged} messages, {tracked.sent} were sent"
                )
            tracked.confirmed = tracked.sent
            confirmed += pending
        return confirmed

    def close(self) -> None:
        self.confirm()
        for tracked in self._producers.values():
            tracked.producer.close()
        self._producers.clear()


class ReaderBatches:
    """``batch_receive()`` over a Reader of one topic from its earliest message: unlike a Shared
    consumer that acks nothing, a Reader is not stopped by Apache Pulsar's 50,000 unacked messages per
    consumer, and reading again starts from the beginning again.

    A message id returned before is dropped and counted in :attr:`redelivered`: pulsar-lite's Readers
    deliver some entries again after a few hundred (``EMBEDDED_BROKER.md``), which is not a message
    stored twice. A message stored twice has two ids and is returned twice."""

    def __init__(self, client: Any, topic: str) -> None:
        import pulsar

        self._timeout = pulsar.Timeout
        earliest = pulsar.MessageId.earliest
        self.reader = client.create_reader(topic, earliest, receiver_queue_size=RECEIVER_QUEUE)
        self._seen: set[tuple[int, int, int, int]] = set()
        self.redelivered = 0

    def batch_receive(self) -> list[Any]:
        """Up to :data:`BATCH_MESSAGES` messages not returned before, waiting at most
        :data:`BATCH_TIMEOUT_MS` for them."""
        batch: list[Any] = []
        deadline = time.monotonic() + BATCH_TIMEOUT_MS / 1000
        while len(batch) < BATCH_MESSAGES:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            try:
                msg = self.reader.read_next(timeout_millis=left_ms)
            except self._timeout:
                break
            mid = msg.message_id()
            key = (mid.ledger_id(), mid.entry_id(), mid.batch_index(), mid.partition())
            if key in self._seen:
                self.redelivered += 1
                continue
            self._seen.add(key)
            batch.append(msg)
        return batch

    def close(self) -> None:
        self.reader.close()


def drain(
    consumer: Any,
    handle: Callable[[list[Any]], None],
    *,
    expected: int,
    idle_timeout_s: float,
    extra_wait_s: float = 0.0,
) -> int:
    """Batch-receive until ``expected`` messages were handled, then keep listening ``extra_wait_s``
    for any surplus. Returns the number received. Raises :class:`BenchError` after ``idle_timeout_s``
    with nothing new before ``expected`` is reached."""
    received = 0
    last_progress = time.monotonic()
    stop_at: float | None = time.monotonic() + extra_wait_s if expected == 0 else None
    while True:
        if stop_at is not None and time.monotonic() >= stop_at:
            return received
        batch = consumer.batch_receive()
        if batch:
            handle(batch)
            received += len(batch)
            last_progress = time.monotonic()
            if received >= expected and stop_at is None:
                stop_at = time.monotonic() + extra_wait_s
        elif stop_at is None and time.monotonic() - last_progress > idle_timeout_s:
            raise Stalled(
                f"stalled: received {received} of {expected} messages, "
                f"nothing new for {idle_timeout_s:.0f} s",
                received,
            )


def drain_resubscribing(
    subscribe: Callable[[], Any],
    handle: Callable[[Any, list[Any]], None],
    *,
    expected: int,
    idle_timeout_s: float,
    stall_s: float = RESUBSCRIBE_AFTER_S,
) -> tuple[int, int]:
    """:func:`drain` through consumers from ``subscribe()``, each closed after its part; ``handle(consumer,
    batch)`` acks through the consumer it is given. When nothing new arrives for ``stall_s`` before
    ``expected``, the consumer is closed and a new one subscribed: the broker delivers again what was not
    acked (the embedded broker's Shared consumers can stop dispatching for good, see
    ``docs/benchmarks.md``), so a stall costs ``stall_s``, not the run. Raises :class:`Stalled` after
    ``idle_timeout_s`` without a new message over all consumers. Returns ``(received, resubscribes)``.
    """
    received = resubscribes = 0
    last_progress = time.monotonic()
    while True:
        consumer = subscribe()
        try:
            part = drain(
                consumer,
                functools.partial(handle, consumer),
                expected=expected - received,
                idle_timeout_s=min(stall_s, idle_timeout_s),
            )
            return received + part, resubscribes
        except Stalled as stall:
            received += stall.received
            now = time.monotonic()
            if stall.received:
                last_progress = now - stall_s
            if now - last_progress >= idle_timeout_s:
                raise Stalled(
                    f"stalled: received {received} of {expected} messages, nothing new for "
                    f"{idle_timeout_s:.0f} s over {resubscribes + 1} consumer(s)",
                    received,
                ) from None
            resubscribes += 1
            LOG.warning(
                "nothing new for %.0f s after %d of %d messages: subscribing again",
                stall_s,
                received,
                expected,
            )
        finally:
            consumer.close()


def count_until_idle(consumer: Any, idle_s: float) -> int:
    """Batch-receive (without acking) until nothing arrives for ``idle_s``; return how many arrived."""
    count = 0
    last = time.monotonic()
    while time.monotonic() - last < idle_s:
        batch = consumer.batch_receive()
        if batch:
            count += len(batch)
            last = time.monotonic()
    return count
