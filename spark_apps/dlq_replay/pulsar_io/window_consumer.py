"""Consumer mode: read one partition's frozen window through Shared consumers on the replayer subscription.

Shared by the data source (read, never ack) and the commit (ack the final messages from the consumer that
received them). A consumer stops once a message of the window's last entry or a later one arrives
(entries are dispatched in order), or after ``idle_timeout_ms`` without a message. An idle stop may be a
broker stall, so :class:`WindowPasses` reads again with a new consumer while passes find new messages.
Messages beyond the end are neither returned nor acked; redeliveries are returned once.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.pulsar_io.ids import MessageIdKey, in_window, reached_end
from spark_apps.dlq_replay.pulsar_io.window import (
    DEFAULT_IDLE_TIMEOUT_MS,
    DRAIN_MS,
    MAX_PASSES,
    PartitionWindow,
    subscribe_shared,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from spark_apps.dlq_replay.pulsar_io.final_ids import FinalEntries, FinalIds

DEFAULT_RECEIVER_QUEUE_SIZE = 1000


@dataclass
class ConsumeStats:
    """What the consumers saw of their window."""

    in_window: int = 0
    duplicates: int = 0
    beyond_window: int = 0
    stopped_by: str = "not-started"  # end-reached | idle-timeout | empty-window


class SeenIds(set[str]):
    """The readable ids a read returned (the commit passes its final ids, which answer ``first`` too)."""

    def first(self, ledger: int, entry: int, batch: int, id_str: str) -> bool:
        """Whether the id is returned for the first time (and remember it)."""
        if id_str in self:
            return False
        self.add(id_str)
        return True


@dataclass
class WindowPasses:
    """Reads a window through one Shared consumer after another, each id once over all passes.

    :meth:`messages` yields ``(message_id_str, message, message_id, consumer)``: ack a message through
    its ``consumer`` while iterating. Another pass starts only with ``resume`` and after an idle stop
    that found new messages. ``stats`` sums the passes (``beyond_window``: the largest pass's).
    """

    client: Any
    window: PartitionWindow
    subscription: str
    _: KW_ONLY
    role: str
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS
    receiver_queue_size: int = DEFAULT_RECEIVER_QUEUE_SIZE
    batch_index_ack: bool = False
    resume: bool = True
    seen: SeenIds | FinalIds | FinalEntries = field(default_factory=SeenIds)
    passes: int = field(default=0, init=False)
    stats: ConsumeStats = field(default_factory=ConsumeStats, init=False)

    def messages(self) -> Iterator[tuple[str, Any, Any, Any]]:
        end = self.window.end_key
        if end is None:
            self.stats.stopped_by = "empty-window"
            return
        stats = self.stats
        while self.passes < MAX_PASSES:
            self.passes += 1
            found = ConsumeStats()
            consumer = subscribe_shared(
                self.client,
                self.window.topic,
                self.subscription,
                self.role,
                self.receiver_queue_size,
                batch_index_ack_enabled=self.batch_index_ack,
            )
            try:
                yield from self._pass(consumer, end, found)
            finally:
                consumer.close()
            stats.in_window += found.in_window
            stats.duplicates += found.duplicates
            stats.beyond_window = max(stats.beyond_window, found.beyond_window)
            stats.stopped_by = found.stopped_by
            if not self.resume or found.stopped_by != "idle-timeout" or found.in_window == 0:
                return

    def _pass(
        self, consumer: Any, end: MessageIdKey, stats: ConsumeStats
    ) -> Iterator[tuple[str, Any, Any, Any]]:
        """One consumer's messages of the window, until the end entry is reached or it is idle."""
        import pulsar

        # The wrapper's receive() builds a pulsar.Message per message; the hot loop uses the native one.
        receive = getattr(consumer, "_consumer", consumer).receive
        timeout = self.idle_timeout_ms
        part = self.window.partition
        first = self.seen.first
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
                    yield id_str, msg, mid, consumer
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
                # The end names a whole batched entry: its other messages are already queued locally.
                timeout = min(self.idle_timeout_ms, DRAIN_MS)
