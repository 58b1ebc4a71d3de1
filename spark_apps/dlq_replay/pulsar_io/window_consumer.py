"""Consume one partition's frozen window through a Shared consumer on the replayer subscription.

The consumer mode (brokers without Apache Pulsar's admin REST, e.g. the embedded one): shared by the
data source (read, never ack) and the commit (ack exactly the final messages, from the consumer that
received them). The consumer stops when

* it has received a message from the window's last entry or a later one (entries are dispatched in
  order, so everything up to the end has been dispatched), or
* nothing arrived for ``idle_timeout_ms`` (the last message of the window may already be acked, or the
  backlog may be empty).

An idle stop can also be a broker stall. :class:`WindowPasses` then reads the window again with a new
consumer (every pending message comes back, ids already returned are skipped) while passes keep
finding new messages.

Messages beyond the end are neither returned nor acked: closing the consumer hands them back to the
broker for the next run. Redeliveries can repeat a message, so ids are de-duplicated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from spark_apps.dlq_replay.pulsar_io.ids import in_window, reached_end
from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow, unique_consumer_name

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import TracebackType

DEFAULT_IDLE_TIMEOUT_MS = 5000
#: Reads of a window at most while idle stops keep finding new messages.
MAX_PASSES = 20
DEFAULT_RECEIVER_QUEUE_SIZE = 1000
_BATCH_DRAIN_MS = 200


@dataclass
class ConsumeStats:
    """What one consumer saw of its window."""

    in_window: int = 0
    duplicates: int = 0
    beyond_window: int = 0
    stopped_by: str = "not-started"  # end-reached | idle-timeout | empty-window


class SeenIds(Protocol):
    """The ids a read has returned: how it skips redeliveries, over one consumer or several."""

    def first(self, ledger: int, entry: int, batch: int, id_str: str) -> bool:
        """Whether the id is returned for the first time (and remember it)."""
        ...


class SeenIdSet:
    """:class:`SeenIds` as a set of readable ids (the data source's read)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def first(self, ledger: int, entry: int, batch: int, id_str: str) -> bool:
        if id_str in self.ids:
            return False
        self.ids.add(id_str)
        return True


class WindowConsumer:
    """Context manager over a Shared consumer bounded by a :class:`PartitionWindow`.

    Use :meth:`messages` to iterate ``(message_id_str, message, message_id)`` of the window, each id once,
    and :meth:`acknowledge` to ack one of them (commit only). Ids ``seen`` already returned count as
    duplicates, so a read that resumes with a new consumer returns only what it had not returned yet.
    """

    def __init__(
        self,
        client: Any,
        window: PartitionWindow,
        subscription: str,
        *,
        role: str,
        idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
        receiver_queue_size: int = DEFAULT_RECEIVER_QUEUE_SIZE,
        batch_index_ack: bool = False,
        seen: SeenIds | None = None,
    ) -> None:
        self.client = client
        self.window = window
        self.subscription = subscription
        self.role = role
        self.idle_timeout_ms = int(idle_timeout_ms)
        self.receiver_queue_size = int(receiver_queue_size)
        self.batch_index_ack = batch_index_ack
        self.stats = ConsumeStats()
        self.seen: SeenIds = SeenIdSet() if seen is None else seen  # pass one to several reads to resume
        self._consumer: Any = None

    def __enter__(self) -> WindowConsumer:
        if self.window.end_key is None:
            return self
        import pulsar

        self._consumer = self.client.subscribe(
            self.window.topic,
            self.subscription,
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
            receiver_queue_size=self.receiver_queue_size,
            consumer_name=unique_consumer_name(self.role),
            batch_index_ack_enabled=self.batch_index_ack,
        )
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()

    def messages(self) -> Iterator[tuple[str, Any, Any]]:
        """Yield ``(message_id_str, message, message_id)`` for every message of the window, once each.

        ``message`` is the client's low-level message (``data()``, ``properties()``, ``partition_key()``,
        ... as on ``pulsar.Message``), skipping a Python wrapper object per message.
        """
        end = self.window.end_key
        if end is None or self._consumer is None:
            self.stats.stopped_by = "empty-window"
            return
        import pulsar

        # The wrapper's receive() builds a pulsar.Message per message; the hot loop uses the native one.
        receive = getattr(self._consumer, "_consumer", self._consumer).receive
        timeout = self.idle_timeout_ms
        part = self.window.partition
        first = self.seen.first
        stats = self.stats
        while True:
            try:
                msg = receive(timeout)
            except pulsar.Timeout:
                stats.stopped_by = "end-reached" if timeout < self.idle_timeout_ms else "idle-timeout"
                return
            mid = msg.message_id()
            ledger, entry, batch = mid.ledger_id(), mid.entry_id(), mid.batch_index()
            if in_window(ledger, entry, batch, end):
                id_str = f"{ledger}:{entry}:{part}:{batch}"
                if first(ledger, entry, batch, id_str):
                    stats.in_window += 1
                    yield id_str, msg, mid
                else:
                    stats.duplicates += 1
            else:
                stats.beyond_window += 1
            if not reached_end(ledger, entry, end):
                continue
            if (ledger, entry) != end[:2] or batch < 0 or (end[3] >= 0 and batch >= end[3]):
                stats.stopped_by = "end-reached"
                return
            if end[3] < 0:
                # The end names a whole batched entry: its other messages are already queued locally
                # (a batch is unpacked on arrival), so drain them with a short timeout.
                timeout = min(self.idle_timeout_ms, _BATCH_DRAIN_MS)

    def acknowledge(self, msg: Any) -> None:
        """Ack one message received by this consumer."""
        self._consumer.acknowledge(msg)


class WindowPasses:
    """Reads a window through one :class:`WindowConsumer` after another, resuming after idle stops.

    :meth:`messages` yields ``(message_id_str, message, message_id, consumer)``, each id once over all
    passes; ack a message through the ``consumer`` it came with, while iterating. Another pass starts
    only when ``resume`` is set and a pass stopped idle after finding new messages. ``stats`` sums the
    passes (``beyond_window`` is the largest pass's; ``stopped_by`` is the last pass's). ``seen`` is
    the de-duplication over all passes (default: a :class:`SeenIdSet` per :meth:`messages` call).
    """

    def __init__(
        self,
        client: Any,
        window: PartitionWindow,
        subscription: str,
        *,
        role: str,
        idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
        receiver_queue_size: int = DEFAULT_RECEIVER_QUEUE_SIZE,
        batch_index_ack: bool = False,
        resume: bool = True,
        max_passes: int = MAX_PASSES,
        seen: SeenIds | None = None,
    ) -> None:
        self._seen = seen
        self._consumer_args = (client, window, subscription)
        self._consumer_kwargs: dict[str, Any] = {
            "role": role,
            "idle_timeout_ms": idle_timeout_ms,
            "receiver_queue_size": receiver_queue_size,
            "batch_index_ack": batch_index_ack,
        }
        self.resume = resume
        self.max_passes = max_passes
        self.passes = 0
        self.stats = ConsumeStats()

    def messages(self) -> Iterator[tuple[str, Any, Any, WindowConsumer]]:
        seen = SeenIdSet() if self._seen is None else self._seen
        stats = self.stats
        while self.passes < self.max_passes:
            self.passes += 1
            with WindowConsumer(*self._consumer_args, **self._consumer_kwargs, seen=seen) as consumer:
                for id_str, msg, mid in consumer.messages():
                    yield id_str, msg, mid, consumer
                found = consumer.stats
            stats.in_window += found.in_window
            stats.duplicates += found.duplicates
            stats.beyond_window = max(stats.beyond_window, found.beyond_window)
            stats.stopped_by = found.stopped_by
            if not self.resume or found.stopped_by != "idle-timeout" or found.in_window == 0:
                return
