"""Is broker deduplication on for every topic a replay republishes to? Any doubt answers *no*."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_apps.dlq_replay.pulsar_io.admin import PulsarAdmin, topic_path
from spark_apps.dlq_replay.pulsar_io.errors import PulsarIOError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf


@dataclass(frozen=True)
class Deduplication:
    """Whether deduplication applies to every topic asked about, and why (for the run's log)."""

    on: bool
    reason: str


def deduplication(conf: PulsarConf, topics: Iterable[str]) -> Deduplication:
    """The deduplication the broker applies to ``topics`` (``deduplicationEnabled?applied=true``)."""
    chosen = sorted(set(topics))
    if not chosen:
        return Deduplication(False, "no target topic")
    if not conf.admin_url:
        return Deduplication(False, "no admin URL to ask the broker")
    try:
        admin = PulsarAdmin(conf)
        for topic in chosen:
            if admin.get(topic_path(topic) + "/deduplicationEnabled?applied=true") is not True:
                return Deduplication(False, f"deduplication is off for {topic}")
    except PulsarIOError as exc:
        return Deduplication(False, f"the admin REST did not say ({type(exc).__name__}: {str(exc)[:200]})")
    return Deduplication(True, f"the broker deduplicates all {len(chosen)} target topic(s)")
