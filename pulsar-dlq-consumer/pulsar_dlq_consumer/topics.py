"""What a Pulsar topic name is (parts of ``A-Za-z0-9._-=:``, as the clients accept; a pattern may glob)."""

from __future__ import annotations

import re

from pulsar_dlq_consumer.errors import ConfigurationError

_PART = re.compile(r"[A-Za-z0-9._\-=:]+")
_GLOB_PART = re.compile(r"[A-Za-z0-9._\-=:*?\[\]!]+")
_FORMS = "persistent://tenant/namespace/topic, tenant/namespace/topic or a short name (public/default)"
_WILDCARDS = "; wildcards are allowed only in the topic name, e.g. persistent://acme/orders/*-DLQ"


def qualify_topic(topic: object, *, pattern: bool = False) -> str | None:
    """The full name of ``topic`` (``orders`` -> ``persistent://public/default/orders``), or ``None``."""
    if not isinstance(topic, str) or not topic or len(topic) > 1024:
        return None
    domain, rest = topic.split("://", 1) if "://" in topic else ("persistent", topic)
    if domain not in ("persistent", "non-persistent"):
        return None
    parts = rest.split("/")
    if len(parts) == 1:
        parts = ["public", "default", parts[0]]
    rules = (_PART, _PART, _GLOB_PART if pattern else _PART)
    if len(parts) != 3 or not all(rule.fullmatch(part) for rule, part in zip(rules, parts, strict=True)):
        return None
    return f"{domain}://{'/'.join(parts)}"


def normalize_topic(topic: str, *, persistent_only: bool = False, pattern: bool = False) -> str:
    """The full name of ``topic``, else ``ConfigurationError`` showing the forms accepted;
    ``persistent_only`` refuses ``non-persistent://``, ``pattern`` accepts a glob in the last part."""
    if not isinstance(topic, str) or not topic.strip():
        raise ConfigurationError(f"Empty topic name; give names like {_FORMS}.")
    full = qualify_topic(topic, pattern=pattern)
    if full is None:
        where = _WILDCARDS if pattern else ""
        raise ConfigurationError(f"Topic {topic!r} is not a valid topic name; use {_FORMS}{where}.")
    if persistent_only and not full.startswith("persistent://"):
        raise ConfigurationError(
            f"Topic {topic!r} is not persistent; DLQ topics must be persistent://tenant/namespace/topic "
            "(a non-persistent topic loses data)."
        )
    return full
