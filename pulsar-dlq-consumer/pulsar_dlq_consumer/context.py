"""The error-context schema, its writer and the scalar parser of the :mod:`~.conventions` table."""

from __future__ import annotations

import hashlib
import re
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

from pulsar_dlq_consumer.conventions import (
    BOOKKEEPING_KEYS,
    BOOKKEEPING_PREFIXES,
    CONVENTIONS,
    FIELD_DEFAULTS,
    KEY_CONSUMER,
    KEY_DELIVERY_COUNT,
    KEY_EXCEPTION_CLASS,
    KEY_EXCEPTION_MESSAGE,
    KEY_EXCEPTION_STACKTRACE,
    KEY_FAILED_AT,
    KEY_MESSAGE_ID,
    KEY_PARTITION,
    KEY_PAYLOAD_COPIED,
    KEY_PAYLOAD_SHA256,
    KEY_REASON,
    KEY_RECONSUME_COUNT,
    KEY_SUBSCRIPTION,
    KEY_TOPIC,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_ERROR_STACK_BYTES,
    ORIGIN_CLAIMS,
    ORIGIN_MESSAGE_ID,
    REAL_TOPIC,
    REASONS,
    TRUNCATION_MARKER,
    ContextFormat,
    read_text,
    safe_str,
    truncate_utf8,
)
from pulsar_dlq_consumer.topics import qualify_topic

if TYPE_CHECKING:
    from pulsar_dlq_consumer.conventions import Reader


@dataclass(frozen=True)
class ErrorContext:
    """The one error-context schema every part of the project reads a DLQ message into."""

    dlq_topic: str | None
    dlq_message_id: str | None
    origin_topic: str | None
    origin_message_id: str | None
    subscription: str | None
    delivery_count: int | None
    reconsume_times: int | None
    reason: str
    error_class: str | None
    error_message: str | None
    error_stack: str | None
    failed_at: int | None
    consumer: str | None
    context_format: str


#: The fields of :class:`ErrorContext`, in order.
CONTEXT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ErrorContext))

_PARTITION_SUFFIX = re.compile(r"^(?P<base>.+)-partition-(?P<index>\d+)$")


def base_topic(topic: str) -> str:
    """Return the topic without a ``-partition-N`` suffix (the name producers should use)."""
    match = _PARTITION_SUFFIX.match(topic)
    return match.group("base") if match else topic


def partition_index(topic: str) -> int | None:
    """Return ``N`` for a ``...-partition-N`` topic name, else ``None``."""
    match = _PARTITION_SUFFIX.match(topic)
    return int(match.group("index")) if match else None


def is_bookkeeping_property(key: str) -> bool:
    """True for a DLQ/retry bookkeeping key that a republish must strip (one a convention reads or owns)."""
    return isinstance(key, str) and (key in BOOKKEEPING_KEYS or key.startswith(BOOKKEEPING_PREFIXES))


def strip_bookkeeping_properties(properties: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of ``properties`` without bookkeeping keys."""
    return {k: v for k, v in (properties or {}).items() if not is_bookkeeping_property(k)}


def build_context_properties(
    *,
    origin_topic: str,
    origin_message_id: str,
    subscription: str,
    reason: str | None,
    delivery_count: int | None = None,
    reconsume_times: int | None = None,
    error: BaseException | str | None = None,
    include_stacktrace: bool = True,
    consumer: str | None = None,
    failed_at: int,
    payload: bytes | None = None,
    payload_copied: bool = True,
    max_message_bytes: int = MAX_ERROR_MESSAGE_BYTES,
    max_stack_bytes: int = MAX_ERROR_STACK_BYTES,
) -> dict[str, str]:
    """Our context properties (bounded valid ``str``) for a DLQ message, or a retry message (``reason``
    None); ``error`` is an exception or a message. ``ValueError`` for an unknown ``reason``."""
    if reason is not None and reason not in REASONS:
        raise ValueError(f"reason must be one of {sorted(REASONS)} or None; got {reason!r}")
    props: dict[str, str] = {
        REAL_TOPIC: safe_str(origin_topic),
        ORIGIN_MESSAGE_ID: safe_str(origin_message_id),
        KEY_TOPIC: safe_str(origin_topic),
        KEY_MESSAGE_ID: safe_str(origin_message_id),
        KEY_SUBSCRIPTION: safe_str(subscription),
        KEY_FAILED_AT: str(int(failed_at)),
        KEY_PAYLOAD_COPIED: "true" if payload_copied else "false",
    }
    counts = {
        KEY_PARTITION: partition_index(origin_topic),
        KEY_DELIVERY_COUNT: delivery_count,
        KEY_RECONSUME_COUNT: reconsume_times,
    }
    props.update({key: str(int(value)) for key, value in counts.items() if value is not None})
    if reason is not None:
        props[KEY_REASON] = reason
    if consumer:
        props[KEY_CONSUMER] = safe_str(consumer)
    props.update(_error_properties(error, include_stacktrace, max_message_bytes, max_stack_bytes))
    if not payload_copied and payload is not None:
        props[KEY_PAYLOAD_SHA256] = hashlib.sha256(payload).hexdigest()
    return props


def _error_properties(
    error: BaseException | str | None, include_stacktrace: bool, max_message_bytes: int, max_stack_bytes: int
) -> dict[str, str]:
    if isinstance(error, str):
        return {KEY_EXCEPTION_MESSAGE: truncate_utf8(error, max_message_bytes)}
    if not isinstance(error, BaseException):
        return {}
    cls = type(error)
    try:
        message = str(error)
    except Exception:  # a broken __str__ must not break dead-lettering
        message = f"<unprintable {cls.__name__}>"
    builtin = cls.__module__ in ("builtins", "__main__")  # ``ValueError``, else ``pkg.mod.Error``
    name = cls.__qualname__ if builtin else f"{cls.__module__}.{cls.__qualname__}"
    props = {
        KEY_EXCEPTION_CLASS: safe_str(name),
        KEY_EXCEPTION_MESSAGE: truncate_utf8(message, max_message_bytes),
    }
    if include_stacktrace and error.__traceback__ is not None:
        stack = "".join(traceback.format_exception(cls, error, error.__traceback__))
        props[KEY_EXCEPTION_STACKTRACE] = truncate_utf8(stack, max_stack_bytes, keep_tail=True)
    return props


#: The fields a convention's readers give (all but the DLQ position and the format).
_READ_FIELDS = CONTEXT_FIELDS[2:-1]
#: Per convention, its reader of each of :data:`_READ_FIELDS` (``None``: the field's default).
_READERS: dict[ContextFormat, tuple[Reader | None, ...]] = {
    c.format: tuple(c.fields.get(name) for name in _READ_FIELDS) for c in CONVENTIONS
} | {ContextFormat.NONE: (None,) * len(_READ_FIELDS)}
_DEFAULTS = tuple(FIELD_DEFAULTS.get(name) for name in _READ_FIELDS)
_DELIVERY_COUNT = _READ_FIELDS.index("delivery_count")


def detect_format(properties: Mapping[str, str] | None) -> ContextFormat:
    """Return the richest convention present in ``properties`` (the first match in the table)."""
    if not isinstance(properties, Mapping) or not properties:
        return ContextFormat.NONE
    keys = {k for k in properties if isinstance(k, str)}
    return next((c.format for c in CONVENTIONS if c.matches(keys)), ContextFormat.NONE)


def parse_error_context(
    properties: Mapping[str, str] | None,
    *,
    dlq_topic: str | None = None,
    dlq_message_id: str | None = None,
    redelivery_count: int | None = None,
) -> ErrorContext:
    """The :class:`ErrorContext` of a DLQ (or retry) message's properties (never raises)."""
    return ErrorContext(
        *error_context_values(
            properties, dlq_topic=dlq_topic, dlq_message_id=dlq_message_id, redelivery_count=redelivery_count
        )
    )


def error_context_values(
    properties: Mapping[str, str] | None,
    *,
    dlq_topic: str | None = None,
    dlq_message_id: str | None = None,
    redelivery_count: int | None = None,
) -> tuple[Any, ...]:
    """:func:`parse_error_context` as a tuple in :data:`CONTEXT_FIELDS` order (for column builders)."""
    props: Mapping[str, str] = properties if isinstance(properties, Mapping) else {}
    fmt = detect_format(props)
    values = [
        default if reader is None or (value := reader.read(props)) is None else value
        for reader, default in zip(_READERS[fmt], _DEFAULTS, strict=True)
    ]
    if values[_DELIVERY_COUNT] is None and type(redelivery_count) is int and redelivery_count >= 0:
        values[_DELIVERY_COUNT] = redelivery_count + 1
    return (
        dlq_topic if isinstance(dlq_topic, str) else None,
        dlq_message_id if isinstance(dlq_message_id, str) else None,
        *values,
        fmt.value,
    )


#: Longest origin topic value kept in an :class:`OriginClaim` (a longer one is cut, marked, never valid).
MAX_CLAIM_CHARS = 300
_MESSAGE_ID = re.compile(r"\(?\s*(-?\d{1,20})\s*(?:[:,]\s*(-?\d{1,20})\s*){1,3}\)?")
_ID_PART = re.compile(r"-?\d{1,20}")


@dataclass(frozen=True)
class OriginClaim:
    """A convention's origin: the topic ``key``, its value (cut at :data:`MAX_CLAIM_CHARS`) and message id."""

    key: str
    topic: str
    message_id: str | None


def origin_claims(properties: Mapping[str, str] | None) -> tuple[OriginClaim, ...]:
    """Every convention's claim about the origin, in ``ORIGIN_TOPIC_KEYS`` order (never raises)."""
    if not isinstance(properties, Mapping):
        return ()
    claims = []
    for claim in ORIGIN_CLAIMS:
        if (value := read_text(properties, claim.topic_key)) is not None:
            topic = value[:MAX_CLAIM_CHARS] + TRUNCATION_MARKER if len(value) > MAX_CLAIM_CHARS else value
            message_id = cast("str | None", claim.message_id.read(properties))  # Text or Position readers
            claims.append(OriginClaim(claim.topic_key, topic, message_id))
    return tuple(claims)


@lru_cache(maxsize=4096)
def canonical_topic(topic: str | None) -> str | None:
    """The topic a claim names, qualified, without ``-partition-N``; ``None`` when it is no topic name."""
    qualified = qualify_topic(topic) if topic and TRUNCATION_MARKER not in topic else None
    return None if qualified is None else base_topic(qualified)


def conflicting_claims(claims: tuple[OriginClaim, ...]) -> tuple[OriginClaim, ...]:
    """One claim per distinct origin topic (:func:`canonical_topic`) when they disagree, else ``()``."""
    seen: dict[str, OriginClaim] = {}
    for claim in claims:
        seen.setdefault(canonical_topic(claim.topic) or f"\x00{claim.topic}", claim)
    return tuple(seen.values()) if len(seen) > 1 else ()


def resolve_claims(claims: tuple[OriginClaim, ...], precedence: Sequence[str]) -> OriginClaim | None:
    """The claim of the first property key in ``precedence`` that the message carries, else ``None``."""
    by_key = {claim.key: claim for claim in claims}
    return next((by_key[key] for key in precedence if key in by_key), None)


def canonical_message_id(message_id: str | None) -> str | None:
    """A message id in one spelling, ``ledger:entry:partition:batch`` (batch -1 when absent), whichever
    client wrote it; Kafka ``partition:offset`` stays; anything else gives ``None``."""
    if not isinstance(message_id, str) or not _MESSAGE_ID.fullmatch(message_id.strip()):
        return None
    parts = _ID_PART.findall(message_id)
    if len(parts) == 3:
        parts.append("-1")
    return ":".join(str(int(p)) for p in parts)


def origin_identity(origin_topic: str | None, origin_message_id: str | None) -> str | None:
    """``<canonical topic>|<canonical message id>``: the same for every DLQ copy of one original."""
    topic, message_id = canonical_topic(origin_topic), canonical_message_id(origin_message_id)
    return None if topic is None or message_id is None else f"{topic}|{message_id}"
