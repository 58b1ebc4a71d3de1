"""A subscription's backlog per topic, from the admin REST API or Prometheus metrics (``docs/sensor.md``)."""

from __future__ import annotations

import fnmatch
import json
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from http.client import HTTPException
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow_provider_dlq.errors import DlqProviderError
from pulsar_dlq_consumer import admin
from pulsar_dlq_consumer.context import base_topic
from pulsar_dlq_consumer.errors import ConfigurationError
from pulsar_dlq_consumer.topics import normalize_topic

if TYPE_CHECKING:
    import ssl
    from collections.abc import Iterable, Sequence

BACKLOG_METRIC = "pulsar_subscription_back_log"
_SAMPLE = re.compile(rf"^{BACKLOG_METRIC}(?:\{{(?P<labels>.*)\}})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"')

#: Largest entry backlog (per topic or partition) whose messages ``analyzeBacklog`` counts (it reads them).
COUNT_MAX_ENTRIES = 10_000


class BacklogReadError(DlqProviderError, RuntimeError):
    """The backlog could not be read (source unreachable, refused or answered nonsense)."""


class BacklogConfigError(DlqProviderError, ValueError):
    """The backlog request cannot work with this connection (e.g. a pattern without a topic listing)."""


@dataclass(frozen=True)
class TopicBacklog:
    """Backlog of one subscription on one topic (partitions summed): pending messages when ``exact``,
    else pending entries (a lower bound when producers batch)."""

    topic: str
    subscription: str
    backlog: int
    source: str  # "admin" | "metrics"
    found: bool  # False: the topic or the subscription does not exist (yet) at the source
    oldest_age_seconds: float | None = None
    entries: int | None = None
    exact: bool = False


@dataclass(frozen=True)
class AdminHttp:
    """The connection's TLS context and bearer token for the admin/metrics requests (never logged)."""

    context: ssl.SSLContext | None = None
    token: str | None = field(default=None, repr=False)
    timeout: float = 10.0

    def send(self, url: str, method: str = "GET") -> tuple[int, str]:
        """``(status, body)`` of one bodiless request; one with no answer raises :class:`BacklogReadError`."""
        try:
            status, body = admin.fetch(url, self.context, self.timeout, token=self.token, method=method)
        except (OSError, HTTPException) as exc:  # no answer: refused, unknown host, timeout, TLS failure
            cause = getattr(exc, "reason", None) or exc
            raise BacklogReadError(f"{method} {url} failed: {type(cause).__name__}: {cause}") from exc
        return status, body.decode("utf-8", "replace")


def is_pattern(topic: str) -> bool:
    return any(ch in topic for ch in "*?[")


def split_topics(topics: str | Sequence[str]) -> list[str]:
    """A list of topics from a list or one comma-separated string, blanks dropped."""
    items = topics.split(",") if isinstance(topics, str) else list(topics)
    return [str(t).strip() for t in items if str(t).strip()]


def prepare_topics(topics: Iterable[str]) -> list[str]:
    """Names and patterns normalised by the library (persistent topics only), in order, without duplicates."""
    seen: dict[str, None] = {}
    for topic in topics:
        try:
            seen[normalize_topic(topic.strip(), persistent_only=True, pattern=is_pattern(topic))] = None
        except ConfigurationError as exc:
            raise BacklogConfigError(str(exc)) from None
    if not seen:
        raise BacklogConfigError("No topics given; pass at least one DLQ topic or topic pattern.")
    return list(seen)


def _expand(requested: Sequence[str], available: Iterable[str]) -> list[str]:
    """Requested names as-is, patterns replaced by the matching available topics (sorted)."""
    available = sorted(set(available))
    out: dict[str, None] = {}
    for item in requested:
        out.update(dict.fromkeys(fnmatch.filter(available, item) if is_pattern(item) else [item]))
    return list(out)


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def parse_prometheus_backlog(text: str, subscription: str) -> dict[str, int]:
    """Sum ``pulsar_subscription_back_log`` per (partition-collapsed) topic for one subscription, in
    Apache Pulsar's (``topic="persistent://..."``) or pulsar-lite's (``namespace=..., topic=...``) labels."""
    totals: Counter[str] = Counter()
    for line in text.splitlines():
        if not (match := _SAMPLE.match(line)):
            continue
        labels = {m.group("key"): _unescape(m.group("value")) for m in _LABEL.finditer(match["labels"] or "")}
        if labels.get("subscription") != subscription or not labels.get("topic"):
            continue
        topic = labels["topic"]
        if "://" not in topic:
            topic = f"persistent://{labels.get('namespace', 'public/default')}/{topic}"
        if not topic.startswith("persistent://"):
            continue
        try:
            value = int(float(match["value"]))
        except (ValueError, OverflowError):  # NaN, +Inf
            continue
        totals[base_topic(topic)] += value
    return dict(totals)


def metrics_backlog(
    http: AdminHttp, metrics_url: str, topics: Sequence[str], subscription: str
) -> dict[str, TopicBacklog]:
    """One GET of the metrics page; topics absent from it have backlog 0 and ``found=False``."""
    status, text = http.send(metrics_url)
    if status != 200:
        raise BacklogReadError(
            f"GET {metrics_url} returned HTTP {status}; check the extra 'metrics_url' "
            "(the broker's Prometheus endpoint, e.g. http://broker:8080/metrics)."
        )
    if "# TYPE" not in text and BACKLOG_METRIC not in text:
        raise BacklogReadError(
            f"{metrics_url} does not look like a Prometheus metrics page; check the extra 'metrics_url'."
        )
    counts = parse_prometheus_backlog(text, subscription)
    return {
        topic: TopicBacklog(topic, subscription, counts.get(topic, 0), "metrics", topic in counts)
        for topic in _expand(topics, counts)
    }


def _get_json(http: AdminHttp, url: str) -> Any:
    """The JSON at ``url``, ``None`` when it does not exist (404); raises with the fix for the rest."""
    status, text = http.send(url)
    if status == 404:
        return None
    if status in (401, 403):
        raise BacklogConfigError(
            f"GET {url} was refused (HTTP {status}); the connection's token (Password) lacks "
            "permission to read topic stats. Grant it, or use a token with admin rights."
        )
    if status != 200:
        raise BacklogReadError(
            f"GET {url} returned HTTP {status}; check the extra 'admin_url' (e.g. http://broker:8080)."
        )
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BacklogReadError(f"GET {url} did not return JSON; check the extra 'admin_url'.") from exc


def _subscription(stats: Any, subscription: str) -> dict[str, Any] | None:
    """The stats of ``subscription`` in a topic stats document, if any."""
    subs = stats.get("subscriptions") if isinstance(stats, dict) else None
    sub = subs.get(subscription) if isinstance(subs, dict) else None
    return sub if isinstance(sub, dict) else None


def parse_admin_stats(stats: Any, topic: str, subscription: str, now_ms: float) -> TopicBacklog:
    """A :class:`TopicBacklog` of the entry count ``msgBacklog`` (exact only when 0) from topic stats."""
    sub = _subscription(stats, subscription)
    if sub is None:
        return TopicBacklog(topic, subscription, backlog=0, source="admin", found=False)
    entries = _count(sub.get("msgBacklog")) or 0
    earliest = _count(sub.get("earliestMsgPublishTimeInBacklog"))
    age = max(0.0, (now_ms - earliest) / 1000.0) if earliest and entries else None
    return TopicBacklog(topic, subscription, entries, "admin", True, age, entries, exact=entries == 0)


def _count(value: Any) -> int | None:
    """A non-negative int from JSON, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return int(value)


def _partition_entries(stats: dict[str, Any], subscription: str) -> dict[str, int]:
    """Entry backlog of ``subscription`` per partition topic, from ``partitioned-stats?perPartition=true``."""
    per = stats.get("partitions")
    out: dict[str, int] = {}
    for name, part in per.items() if isinstance(per, dict) else ():
        if entries := _count((_subscription(part, subscription) or {}).get("msgBacklog")):
            out[name] = entries
    return out


def count_messages(
    http: AdminHttp, admin_url: str, topic: str, subscription: str, entries: int
) -> tuple[int, bool]:
    """``(messages, exact)`` for ``entries`` pending entries of one (partition) topic, counted by
    ``analyzeBacklog`` up to :data:`COUNT_MAX_ENTRIES`; a refusal gives ``(entries, False)``, a minimum."""
    if entries > COUNT_MAX_ENTRIES:
        return entries, False
    url = f"{admin_url}{admin.admin_path(topic)}/subscription/{quote(subscription, safe='')}/analyzeBacklog"
    try:
        status, text = http.send(url, "POST")
        doc = json.loads(text) if status == 200 else None
    except (BacklogReadError, ValueError):
        doc = None
    if not isinstance(doc, dict):
        return entries, False
    messages, scanned = _count(doc.get("messages")), _count(doc.get("entries"))
    if messages is None or scanned is None:
        return entries, False
    if doc.get("aborted"):
        # The broker stopped early: count the entries it did not read as one message each.
        return max(entries, messages + max(0, entries - scanned)), False
    return messages, True


def admin_backlog(
    http: AdminHttp, admin_url: str, topics: Sequence[str], subscription: str, now_ms: float
) -> dict[str, TopicBacklog]:
    """Expand patterns by listing namespaces, read each topic's stats, count batched messages."""
    listed: set[str] = set()
    for url in sorted({admin_url + admin.admin_path(t, parts=2) for t in topics if is_pattern(t)}):
        names = _get_json(http, url)
        if names is not None and not isinstance(names, list):
            raise BacklogReadError(f"GET {url} did not return a list of topics.")
        listed.update(base_topic(str(n)) for n in names or () if str(n).startswith("persistent://"))
    backlogs: dict[str, TopicBacklog] = {}
    for topic in _expand(topics, listed):
        base = admin_url + admin.admin_path(topic)
        meta = _get_json(http, f"{base}/partitions")
        partitions = int(meta.get("partitions", 0)) if isinstance(meta, dict) else 0
        suffix = "partitioned-stats?perPartition=true&" if partitions > 0 else "stats?"
        stats = _get_json(http, f"{base}/{suffix}getEarliestTimeInBacklog=true")
        item = parse_admin_stats(stats, topic, subscription, now_ms)
        if item.found and not item.exact:
            parts = _partition_entries(stats, subscription) if partitions > 0 else {topic: item.backlog}
            counted = [count_messages(http, admin_url, p, subscription, n) for p, n in parts.items()]
            messages, exact = sum(n for n, _ in counted), all(ok for _, ok in counted)
            # Partition stats that do not add up to the total (a race, or an odd broker): keep the total.
            if sum(parts.values()) != item.backlog:
                messages, exact = max(messages, item.backlog), False
            item = replace(item, backlog=messages, exact=exact)
        backlogs[topic] = item
    return backlogs


def consumer_properties(
    http: AdminHttp, admin_url: str, topic: str, subscription: str
) -> list[dict[str, str]]:
    """Each consumer's properties on ``subscription`` of a non-partitioned ``topic`` (``[]``: none)."""
    sub = _subscription(_get_json(http, f"{admin_url}{admin.admin_path(topic)}/stats"), subscription)
    consumers = (sub or {}).get("consumers") or []
    return [{str(k): str(v) for k, v in (c.get("metadata") or {}).items()} for c in consumers]
