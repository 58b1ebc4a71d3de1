"""Frozen read windows (invariant I3) and the read mode the broker allows (``docs/pulsar-data-source.md``)."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import astuple, dataclass, replace
from typing import TYPE_CHECKING, Any

from pulsar_dlq_consumer.context import base_topic, partition_index
from pulsar_dlq_consumer.errors import ConfigurationError
from pulsar_dlq_consumer.topics import normalize_topic
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf, get_client
from spark_apps.dlq_replay.pulsar_io.cursor import CursorState, EntryRange, ledger_sizes, pending_ranges
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError, WindowError
from spark_apps.dlq_replay.pulsar_io.ids import MessageIdKey, message_id_key, message_id_str

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

log = logging.getLogger(__name__)

WINDOW_FORMAT = 2
READER_MODE = "reader"
CONSUMER_MODE = "consumer"


@dataclass(frozen=True)
class PartitionWindow:
    """The frozen end of one topic partition (``partition`` -1: not partitioned; ``end_message_id``
    ``None``: empty; ``pending``: the entries the reader mode reads, ``None`` in the consumer mode)."""

    topic: str
    partition: int
    end_message_id: str | None
    pending: tuple[EntryRange, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or "://" not in self.topic:
            raise WindowError(f"window topic must be a full topic name; got {self.topic!r}")
        if self.end_message_id is not None:
            message_id_key(self.end_message_id)  # raises with the expected format

    @property
    def read_mode(self) -> str:
        return CONSUMER_MODE if self.pending is None else READER_MODE

    @property
    def pending_entries(self) -> int:
        """Entries the reader mode reads (0 in the consumer mode)."""
        return sum(r.entries for r in self.pending or ())

    @property
    def end_key(self) -> MessageIdKey | None:
        return None if self.end_message_id is None else message_id_key(self.end_message_id)

    @property
    def parent_topic(self) -> str:
        return self.topic if self.partition < 0 else base_topic(self.topic)


def parse_topics(topics: str | Iterable[str]) -> list[str]:
    """Normalise a comma-separated string or a list of topics; order kept, duplicates removed."""
    items = topics.split(",") if isinstance(topics, str) else list(topics)
    try:
        names = [normalize_topic(t.strip()) for t in items if t and t.strip()]
    except ConfigurationError as exc:
        raise PulsarConfigError(str(exc)) from None
    if not names:
        raise PulsarConfigError("no topics given; pass at least one DLQ topic, e.g. 'orders-sub-DLQ'")
    return list(dict.fromkeys(names))


def unique_consumer_name(role: str) -> str:
    """A consumer name no other process or task can pick (pid + time + random)."""
    return f"dlq-{role}-{os.getpid()}-{time.time_ns()}-{uuid.uuid4().hex[:8]}"


def subscribe_shared(
    client: Any, topic: str, subscription: str, role: str, queue: int, **options: Any
) -> Any:
    """A Shared consumer for ``role`` (``queue`` 0: nothing is dispatched to it), the subscription created
    at the earliest message if missing."""
    import pulsar

    return client.subscribe(
        topic,
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
        receiver_queue_size=queue,
        consumer_name=unique_consumer_name(role),
        **options,
    )


def expand_partitions(client: Any, topic: str) -> list[tuple[str, int]]:
    """``[(partition topic, index)]`` of a topic; a non-partitioned topic gives ``[(topic, -1)]``."""
    names = [str(n) for n in client.get_topic_partitions(topic)]
    if not names or names == [topic]:
        return [(topic, -1)]
    expanded = []
    for name in names:
        index = partition_index(name)
        if index is None:
            raise WindowError(f"broker named partition {name!r} of {topic!r} without a -partition-N suffix")
        if [str(n) for n in client.get_topic_partitions(name)] != [name]:
            raise WindowError(
                f"the broker reports partition {name!r} as itself partitioned, so it cannot be read on its "
                "own and no frozen window can be taken for it (pulsar-lite with default_partitions does "
                "this). Use non-partitioned DLQ topics on the embedded broker, or Apache Pulsar."
            )
        expanded.append((name, index))
    return sorted(expanded, key=lambda item: item[1])


def _last_message_id(client: Any, topic: str, partition: int, subscription: str) -> str | None:
    """Create the subscription if missing and return the partition's last message id (``None``: empty)."""
    import pulsar

    consumer = subscribe_shared(client, topic, subscription, "freeze", 0)  # freezing dispatches nothing
    try:
        last = consumer.get_last_message_id()
    except pulsar.UnknownError:
        # pulsar-lite's answer for an empty topic (Apache Pulsar's is an id with entry -1); safe: the run
        # then neither reads nor acks this partition.
        log.warning("get_last_message_id failed on %s; treating the partition as empty for this run", topic)
        return None
    finally:
        consumer.close()
    return None if last.ledger_id() < 0 or last.entry_id() < 0 else message_id_str(last, partition)


@dataclass(frozen=True)
class FrozenWindows:
    """The windows of a run and why they allow the read mode they do (:attr:`read_mode`)."""

    windows: list[PartitionWindow]
    reason: str

    @property
    def read_mode(self) -> str:
        return read_mode_of(self.windows)


def read_mode_of(windows: Sequence[PartitionWindow]) -> str:
    """``reader`` when every window carries its pending entries, else ``consumer``."""
    return READER_MODE if windows and all(w.pending is not None for w in windows) else CONSUMER_MODE


def freeze(conf: PulsarConf, topics: str | Sequence[str], subscription: str) -> FrozenWindows:
    """Freeze the window of every partition of ``topics``, creating the Shared ``subscription`` from the
    earliest message if missing (nothing is received or acked), and choose the read mode."""
    from spark_apps.dlq_replay.pulsar_io.admin import AdminUnavailable, PulsarAdmin

    if not subscription or not subscription.strip():
        raise PulsarConfigError("subscription is required, e.g. 'dlq-replayer'")
    client = get_client(conf)
    windows: list[PartitionWindow] = []
    for topic in parse_topics(topics):
        for name, index in expand_partitions(client, topic):
            windows.append(PartitionWindow(name, index, _last_message_id(client, name, index, subscription)))
    consumers = "Shared consumers read the window, and the commit reads it again to ack"
    if not conf.admin_url:
        return FrozenWindows(windows, f"no admin URL: {consumers}")
    admin = PulsarAdmin(conf)
    frozen = []
    try:
        for w in windows:  # each with the subscription's pending entries up to its end
            stats = admin.internal_stats(w.topic)
            cursor = CursorState.from_internal_stats(stats, subscription, topic=w.topic)
            end = w.end_key
            pending = () if end is None else tuple(pending_ranges(ledger_sizes(stats), cursor, end[:2]))
            frozen.append(replace(w, pending=pending))
    except AdminUnavailable as exc:
        reason = f"the admin URL {conf.admin_url} is not Apache Pulsar's admin REST ({exc}): {consumers}"
        log.warning("read mode consumer: %s", reason)
        return FrozenWindows(windows, reason)
    reason = "admin REST answers internalStats: Readers read each pending entry once; commit acks ledger ids"
    return FrozenWindows(frozen, reason)


def windows_to_json(windows: Sequence[PartitionWindow]) -> str:
    """Windows as JSON for the ``window`` option and ``plan.json`` (see :meth:`EntryRange.from_list`)."""
    items = [
        {"topic": w.topic, "partition": w.partition, "end_message_id": w.end_message_id}
        | ({} if w.pending is None else {"pending": [astuple(r) for r in w.pending]})
        for w in windows
    ]
    return json.dumps({"format": WINDOW_FORMAT, "windows": items}, sort_keys=True)


def windows_from_json(text: str) -> list[PartitionWindow]:
    """Parse :func:`windows_to_json` output; errors name what is wrong."""
    try:
        data = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise WindowError(f"window is not valid JSON ({exc}); pass the output of windows_to_json()") from exc
    items = data.get("windows") if isinstance(data, dict) and data.get("format") == WINDOW_FORMAT else None
    if not isinstance(items, list):
        raise WindowError(
            f"window JSON must be an object {{'format': {WINDOW_FORMAT}, 'windows': [...]}} "
            "as written by windows_to_json()"
        )
    windows = []
    base = {"topic", "partition", "end_message_id"}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) not in (base, base | {"pending"}):
            raise WindowError(
                f"window entry {i} must have exactly topic, partition, end_message_id (and pending in the "
                f"reader mode); got {str(item)[:300]}"
            )
        pending = item.get("pending")
        if pending is not None and not isinstance(pending, list):
            raise WindowError(f"window entry {i}: pending must be a list of [ledger, first, last, skipped]")
        ranges = None if pending is None else tuple(EntryRange.from_list(r) for r in pending)
        topic, partition, end = str(item["topic"]), int(item["partition"]), item["end_message_id"]
        windows.append(PartitionWindow(topic, partition, end, ranges))
    return windows
