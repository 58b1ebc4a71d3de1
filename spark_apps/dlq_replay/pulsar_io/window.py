"""Frozen read windows: the last message id of every DLQ partition at the start of a run.

A run reads and acks only messages at or before its window end, so messages reaching the DLQ after the
run started wait for the next run (invariant I3). :func:`freeze_window` expands partitioned topics,
makes sure the durable replayer subscription exists (Shared, from the earliest message) and records each
partition's last message id.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf, get_client
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError, WindowError
from spark_apps.dlq_replay.pulsar_io.ids import MessageIdKey, message_id_key, message_id_str

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

log = logging.getLogger(__name__)

WINDOW_FORMAT = 1
_PARTITION_SUFFIX = re.compile(r"^(?P<parent>.+)-partition-(?P<index>\d+)$")


@dataclass(frozen=True)
class PartitionWindow:
    """The frozen end of one topic partition.

    ``topic`` is the partition's full name (``persistent://t/ns/name-partition-3``), ``partition`` its
    index or -1 for a non-partitioned topic, and ``end_message_id`` the readable id of its last
    message when the window was frozen, or ``None`` when it was empty.
    """

    topic: str
    partition: int
    end_message_id: str | None

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or "://" not in self.topic:
            raise WindowError(f"window topic must be a full topic name; got {self.topic!r}")
        if self.end_message_id is not None:
            message_id_key(self.end_message_id)  # raises with the expected format

    @property
    def end_key(self) -> MessageIdKey | None:
        """The window end as an ordering key, ``None`` for an empty window."""
        return None if self.end_message_id is None else message_id_key(self.end_message_id)

    @property
    def parent_topic(self) -> str:
        """The topic as the user named it (the partitioned topic for a partition)."""
        if self.partition < 0:
            return self.topic
        match = _PARTITION_SUFFIX.match(self.topic)
        return match.group("parent") if match else self.topic


def normalize_topic(name: str) -> str:
    """Return the full name of a topic: ``orders-DLQ`` -> ``persistent://public/default/orders-DLQ``."""
    text = name.strip()
    if not text:
        raise PulsarConfigError("empty topic name; give topics as full names, e.g. persistent://t/ns/name")
    if "://" in text:
        scheme, rest = text.split("://", 1)
        if scheme not in ("persistent", "non-persistent") or len(rest.split("/")) != 3:
            raise PulsarConfigError(
                f"invalid topic {name!r}: expected persistent://<tenant>/<namespace>/<name>"
            )
        return text
    parts = text.split("/")
    if len(parts) == 1:
        return f"persistent://public/default/{text}"
    if len(parts) == 3:
        return f"persistent://{text}"
    raise PulsarConfigError(f"invalid topic {name!r}: expected <name> or <tenant>/<namespace>/<name>")


def parse_topics(topics: str | Iterable[str]) -> list[str]:
    """Normalise a comma-separated string or a list of topics; order kept, duplicates removed."""
    items = topics.split(",") if isinstance(topics, str) else list(topics)
    names = [normalize_topic(t) for t in items if t and t.strip()]
    if not names:
        raise PulsarConfigError("no topics given; pass at least one DLQ topic, e.g. 'orders-sub-DLQ'")
    return list(dict.fromkeys(names))


def partition_index(topic: str) -> int:
    """Index of a partition from its name, -1 when the name is not a partition's."""
    match = _PARTITION_SUFFIX.match(topic)
    return int(match.group("index")) if match else -1


def unique_consumer_name(role: str) -> str:
    """A consumer name no other process or task can pick (pid + time + random)."""
    return f"dlq-{role}-{os.getpid()}-{time.time_ns()}-{uuid.uuid4().hex[:8]}"


def expand_partitions(client: Any, topic: str) -> list[tuple[str, int]]:
    """``[(partition topic, index)]`` of a topic; a non-partitioned topic gives ``[(topic, -1)]``."""
    names = [str(n) for n in client.get_topic_partitions(topic)]
    if not names or names == [topic]:
        return [(topic, -1)]
    expanded = []
    for name in names:
        index = partition_index(name)
        if index < 0:
            raise WindowError(f"broker named partition {name!r} of {topic!r} without a -partition-N suffix")
        # A broker must let a client address one partition; pulsar-lite with default_partitions
        # reports every partition as partitioned again, so no per-partition window can be taken.
        if [str(n) for n in client.get_topic_partitions(name)] != [name]:
            raise WindowError(
                f"the broker reports partition {name!r} as itself partitioned, so it cannot be read on its "
                "own and no frozen window can be taken for it (pulsar-lite with default_partitions does "
                "this). Use non-partitioned DLQ topics on the embedded broker, or Apache Pulsar."
            )
        expanded.append((name, index))
    return sorted(expanded, key=lambda item: item[1])


def _last_message_id(client: Any, topic: str, partition: int, subscription: str) -> str | None:
    import pulsar

    consumer = client.subscribe(
        topic,
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
        receiver_queue_size=0,  # no prefetch: freezing must not dispatch messages
        consumer_name=unique_consumer_name("freeze"),
    )
    try:
        last = consumer.get_last_message_id()
    except pulsar.UnknownError:
        # pulsar-lite raises UnknownError for an empty topic (Apache Pulsar returns an id with entry -1).
        # Treating it as empty is safe: the run then neither reads nor acks this partition.
        log.warning("get_last_message_id failed on %s; treating the partition as empty for this run", topic)
        return None
    finally:
        consumer.close()
    if last.ledger_id() < 0 or last.entry_id() < 0:
        return None
    return message_id_str(last, partition=partition)


def freeze_window(conf: PulsarConf, topics: str | Sequence[str], subscription: str) -> list[PartitionWindow]:
    """Freeze the read window of ``topics`` for ``subscription``.

    Partitioned topics expand to their partitions. The durable subscription is created when missing
    (Shared, from the earliest message); nothing is received or acked.
    """
    if not subscription or not subscription.strip():
        raise PulsarConfigError("subscription is required, e.g. 'dlq-replayer'")
    client = get_client(conf)
    windows: list[PartitionWindow] = []
    for topic in parse_topics(topics):
        for name, index in expand_partitions(client, topic):
            windows.append(PartitionWindow(name, index, _last_message_id(client, name, index, subscription)))
    return windows


def windows_to_json(windows: Sequence[PartitionWindow]) -> str:
    """Serialise windows for the ``window`` data-source option and ``plan.json``."""
    return json.dumps({"format": WINDOW_FORMAT, "windows": [asdict(w) for w in windows]}, sort_keys=True)


def windows_from_json(text: str) -> list[PartitionWindow]:
    """Parse :func:`windows_to_json` output; errors name what is wrong."""
    try:
        data = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise WindowError(f"window is not valid JSON ({exc}); pass the output of windows_to_json()") from exc
    if (
        not isinstance(data, dict)
        or data.get("format") != WINDOW_FORMAT
        or not isinstance(data.get("windows"), list)
    ):
        raise WindowError(
            f"window JSON must be an object {{'format': {WINDOW_FORMAT}, 'windows': [...]}} "
            "as written by windows_to_json()"
        )
    windows = []
    for i, item in enumerate(data["windows"]):
        if not isinstance(item, dict) or set(item) != {"topic", "partition", "end_message_id"}:
            raise WindowError(
                f"window entry {i} must have exactly topic, partition, end_message_id; got {item!r}"
            )
        windows.append(PartitionWindow(str(item["topic"]), int(item["partition"]), item["end_message_id"]))
    return windows
