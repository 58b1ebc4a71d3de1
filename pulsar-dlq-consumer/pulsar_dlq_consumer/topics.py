"""What a Pulsar topic name is: the one rule shared by the library, the Airflow provider and the replay app.

A name is ``<name>`` (in ``public/default``), ``<tenant>/<namespace>/<name>`` or
``<domain>://<tenant>/<namespace>/<name>`` with domain ``persistent`` or ``non-persistent``. Each part is
non-empty and made of ``A-Z a-z 0-9 . _ - = :``, as the Pulsar clients accept; anything else (spaces,
control characters, an empty or extra part) is refused. A topic *pattern* (a glob over names, as the
backlog sensor takes) may also use ``* ? [ ] !`` in its last part, never in the tenant or namespace.
"""

from __future__ import annotations

import re

from pulsar_dlq_consumer.errors import ConfigurationError

PERSISTENT = "persistent://"
DOMAINS = ("persistent", "non-persistent")
_PART = re.compile(r"[A-Za-z0-9._\-=:]+")
_GLOB_PART = re.compile(r"[A-Za-z0-9._\-=:*?\[\]!]+")
_FORMS = "persistent://tenant/namespace/topic, tenant/namespace/topic or a short name (public/default)"


def qualify_topic(topic: object, *, pattern: bool = False) -> str | None:
    """The full name of ``topic`` (``orders`` -> ``persistent://public/default/orders``), or ``None``."""
    if not isinstance(topic, str) or not topic or len(topic) > 1024:
        return None
    domain, rest = topic.split("://", 1) if "://" in topic else ("persistent", topic)
    if domain not in DOMAINS:
        return None
    parts = rest.split("/")
    if len(parts) == 1:
        parts = ["public", "default", parts[0]]
    last = _GLOB_PART if pattern else _PART
    if len(parts) != 3 or not (
        _PART.fullmatch(parts[0]) and _PART.fullmatch(parts[1]) and last.fullmatch(parts[2])
    ):
        return None
    return f"{domain}://{'/'.join(parts)}"


def normalize_topic(topic: str, *, persistent_only: bool = False, pattern: bool = False) -> str:
    """The full name of ``topic``, else ``ConfigurationError`` showing the forms accepted;
    ``persistent_only`` refuses ``non-persistent://``, ``pattern`` accepts a glob in the last part."""
    if not isinstance(topic, str) or not topic.strip():
        raise ConfigurationError(f"Empty topic name; give names like {_FORMS}.")
    full = qualify_topic(topic, pattern=pattern)
    if full is None:
        where = (
            "; wildcards are allowed only in the topic name, e.g. persistent://acme/orders/*-DLQ"
            if pattern
            else ""
        )
        raise ConfigurationError(f"Topic {topic!r} is not a valid topic name; use {_FORMS}{where}.")
    if persistent_only and not full.startswith(PERSISTENT):
        raise ConfigurationError(
            f"Topic {topic!r} is not persistent; DLQ topics must be persistent://tenant/namespace/topic "
            "(a non-persistent topic loses data)."
        )
    return full
