"""The error-context schema, the writer for our family and the scalar parser of every known convention.

The consumer wrapper writes context with :func:`build_context_properties`; the Spark replay apps read any
DLQ message back with :func:`parse_error_context` into one :class:`ErrorContext` schema, whatever wrote
it. The conventions themselves (their property keys, how to recognise them and how each field is read)
are data, in :mod:`pulsar_dlq_consumer.conventions`: the parser here interprets that table one message at
a time, as the replay's Arrow kernels do a batch at a time. Properties are untrusted: the parser never
raises, and junk values become ``None``.
"""

from __future__ import annotations

import hashlib
import re
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

from pulsar_dlq_consumer.conventions import (
    BOOKKEEPING_KEYS,
    BOOKKEEPING_PREFIXES,
    CONTEXT_PREFIX,
    CONVENTIONS,
    DELAY_TIME,
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
    LEGACY_ORIGIN_MESSAGE_ID,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_ERROR_STACK_BYTES,
    ORIGIN_CLAIMS,
    ORIGIN_MESSAGE_ID,
    ORIGIN_PROPERTY_KEYS,
    ORIGIN_TOPIC_KEYS,
    PULSAR_STANDARD_KEYS,
    REAL_TOPIC,
    REASON_MAX_RECONSUMES,
    REASON_MAX_REDELIVERIES,
    REASON_TERM,
    REASON_UNKNOWN,
    REASONS,
    RECONSUMETIMES,
    RETRY_TOPIC,
    TRUNCATION_MARKER,
    ContextFormat,
    read_text,
    safe_str,
    truncate_utf8,
)

if TYPE_CHECKING:
    from pulsar_dlq_consumer.conventions import Convention, Reader


CONTEXT_FIELDS: tuple[str, ...] = (
    "dlq_topic",
    "dlq_message_id",
    "origin_topic",
    "origin_message_id",
    "subscription",
    "delivery_count",
    "reconsume_times",
    "reason",
    "error_class",
    "error_message",
    "error_stack",
    "failed_at",
    "consumer",
    "context_format",
)


@dataclass(frozen=True)
class ErrorContext:
    """The one error-context schema every part of the project reads a DLQ message into.

    ``origin_message_id`` is the Pulsar message id string for Pulsar formats and
    ``"<partition>:<offset>"`` for Kafka formats. ``delivery_count`` counts deliveries on the origin
    subscription (first delivery = 1); ``reconsume_times`` counts trips through a retry topic.
    ``failed_at`` is epoch milliseconds. ``origin_topic`` may name a partition (``...-partition-N``):
    see :func:`base_topic`.
    """

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

    def as_dict(self) -> dict[str, object]:
        """Return the fields as a dict in :data:`CONTEXT_FIELDS` order."""
        return asdict(self)


# --------------------------------------------------------------------------- helpers

_PARTITION_SUFFIX = re.compile(r"^(?P<base>.+)-partition-(?P<index>\d+)$")


def base_topic(topic: str) -> str:
    """Return the topic without a ``-partition-N`` suffix (the name producers should use)."""
    match = _PARTITION_SUFFIX.match(topic)
    return match.group("base") if match else topic


def partition_index(topic: str) -> int | None:
    """Return ``N`` for a ``...-partition-N`` topic name, else ``None``."""
    match = _PARTITION_SUFFIX.match(topic)
    return int(match.group("index")) if match else None


def exception_class_name(error: BaseException) -> str:
    """Qualified class name of ``error`` (``builtins.`` left out, as in ``ValueError``)."""
    cls = type(error)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def is_bookkeeping_property(key: str) -> bool:
    """True for DLQ/retry bookkeeping keys that a republish must strip.

    These are every key a convention of :data:`~pulsar_dlq_consumer.conventions.CONVENTIONS` marks or
    reads (the Pulsar standard keys ``REAL_TOPIC``, ``ORIGIN_MESSAGE_ID``, ``RECONSUMETIMES``,
    ``DELAY_TIME``, ``RETRY_TOPIC`` and the misspelt legacy ``ORIGIN_MESSAGE_IDY_TIME``) and every key
    under a convention's namespace (``__dlq.errors.``, ``__connect.errors.``, ``kafka_dlt-``).
    """
    if not isinstance(key, str):
        return False
    return key in BOOKKEEPING_KEYS or key.startswith(BOOKKEEPING_PREFIXES)


def strip_bookkeeping_properties(properties: Mapping[str, str] | None) -> dict[str, str]:
    """Return a copy of ``properties`` without the keys :func:`is_bookkeeping_property` names."""
    if not properties:
        return {}
    return {k: v for k, v in properties.items() if not is_bookkeeping_property(k)}


def payload_sha256(payload: bytes) -> str:
    """Hex SHA-256 of a payload, written instead of the payload when payload copy is off."""
    return hashlib.sha256(payload).hexdigest()


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
    """Build our context properties for a retry or DLQ message (all values valid, bounded ``str``).

    Writes ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID`` plus the ``__dlq.errors.*`` family. ``reason`` is
    given for DLQ messages and ``None`` for retry messages. ``error`` is an exception (class, message
    and, when it was raised and ``include_stacktrace``, the stack) or a plain message string. When
    ``payload_copied`` is false, ``payload`` is hashed into ``__dlq.errors.payload.sha256``. The
    caller adds ``RECONSUMETIMES``/``DELAY_TIME``/``RETRY_TOPIC`` for retry messages.

    Raises
    ------
    ValueError
        If ``reason`` is not one of ``term``, ``max-redeliveries``, ``max-reconsumes`` or ``None``.
    """
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
    index = partition_index(origin_topic)
    if index is not None:
        props[KEY_PARTITION] = str(index)
    if delivery_count is not None:
        props[KEY_DELIVERY_COUNT] = str(int(delivery_count))
    if reconsume_times is not None:
        props[KEY_RECONSUME_COUNT] = str(int(reconsume_times))
    if reason is not None:
        props[KEY_REASON] = reason
    if consumer:
        props[KEY_CONSUMER] = safe_str(consumer)
    props.update(_error_properties(error, include_stacktrace, max_message_bytes, max_stack_bytes))
    if not payload_copied and payload is not None:
        props[KEY_PAYLOAD_SHA256] = payload_sha256(payload)
    return props


def _error_properties(
    error: BaseException | str | None, include_stacktrace: bool, max_message_bytes: int, max_stack_bytes: int
) -> dict[str, str]:
    """The exception class, message and stack of ``error`` (only the message for a string)."""
    props: dict[str, str] = {}
    if isinstance(error, BaseException):
        props[KEY_EXCEPTION_CLASS] = safe_str(exception_class_name(error))
        props[KEY_EXCEPTION_MESSAGE] = truncate_utf8(_exception_message(error), max_message_bytes)
        if include_stacktrace and error.__traceback__ is not None:
            stack = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            props[KEY_EXCEPTION_STACKTRACE] = _truncate_stack(stack, max_stack_bytes)
    elif isinstance(error, str):
        props[KEY_EXCEPTION_MESSAGE] = truncate_utf8(error, max_message_bytes)
    return props


def _exception_message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # a broken __str__ must not break dead-lettering
        return f"<unprintable {type(error).__name__}>"


def _truncate_stack(stack: str, max_bytes: int) -> str:
    """Keep the head and the tail of a long stack (the innermost frames are at the end)."""
    text = safe_str(stack)
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    marker = "\n" + TRUNCATION_MARKER + "\n"
    budget = max(0, max_bytes - len(marker.encode("utf-8")))
    head = raw[: budget // 4].decode("utf-8", "ignore")
    tail = raw[len(raw) - (budget - budget // 4) :].decode("utf-8", "ignore")
    return head + marker + tail


# --------------------------------------------------------------------------- parser

#: The fields a convention's readers give (all but the DLQ position and the format).
_READ_FIELDS = CONTEXT_FIELDS[2:-1]
#: Per convention, its reader of each of :data:`_READ_FIELDS` (``None``: the field's default).
_READERS: dict[ContextFormat | None, tuple[Reader | None, ...]] = {
    c.format: tuple(c.fields.get(name) for name in _READ_FIELDS) for c in CONVENTIONS
} | {None: (None,) * len(_READ_FIELDS)}
_DEFAULTS = tuple(FIELD_DEFAULTS.get(name) for name in _READ_FIELDS)
_DELIVERY_COUNT = _READ_FIELDS.index("delivery_count")


def _convention(properties: object) -> Convention | None:
    """The first convention of the table that ``properties`` are written in."""
    if not isinstance(properties, Mapping) or not properties:
        return None
    keys = {k for k in properties if isinstance(k, str)}
    return next((c for c in CONVENTIONS if c.matches(keys)), None)


def detect_format(properties: Mapping[str, str] | None) -> ContextFormat:
    """Return the richest convention present in ``properties`` (the first match in the table)."""
    convention = _convention(properties)
    return ContextFormat.NONE if convention is None else convention.format


def parse_error_context(
    properties: Mapping[str, str] | None,
    *,
    dlq_topic: str | None = None,
    dlq_message_id: str | None = None,
    redelivery_count: int | None = None,
) -> ErrorContext:
    """Normalise the properties of a DLQ (or retry) message into an :class:`ErrorContext`.

    Never raises on untrusted input: junk values become ``None``, an unknown ``reason`` becomes
    ``"unknown"``, and properties in no known convention give ``context_format="none"``.

    Parameters
    ----------
    properties
        The message properties (headers). Non-string keys or values are ignored.
    dlq_topic, dlq_message_id
        Where the message being parsed was read from; copied into the result.
    redelivery_count
        The origin subscription's redelivery count of the failed message, when the caller knows it
        (the consumer wrapper does). Used only when the properties carry no delivery count, as
        ``delivery_count = redelivery_count + 1``. Do not pass the redelivery count seen while
        reading the DLQ topic itself: it says nothing about the origin.
    """
    return ErrorContext(
        *error_context_values(
            properties,
            dlq_topic=dlq_topic,
            dlq_message_id=dlq_message_id,
            redelivery_count=redelivery_count,
        )
    )


def error_context_values(
    properties: Mapping[str, str] | None,
    *,
    dlq_topic: str | None = None,
    dlq_message_id: str | None = None,
    redelivery_count: int | None = None,
) -> tuple[Any, ...]:
    """The fields of :func:`parse_error_context` (same arguments) as a tuple in :data:`CONTEXT_FIELDS`
    order, without building the :class:`ErrorContext`: for callers that parse many messages into
    columns. Never raises on untrusted input either."""
    props: Mapping[str, str] = properties if isinstance(properties, Mapping) else {}
    convention = _convention(props)
    fmt = None if convention is None else convention.format
    values = [
        default if reader is None or (value := reader.read(props)) is None else value
        for reader, default in zip(_READERS[fmt], _DEFAULTS, strict=True)
    ]
    counted = isinstance(redelivery_count, int) and not isinstance(redelivery_count, bool)
    redeliveries = redelivery_count if counted and redelivery_count is not None else -1
    if values[_DELIVERY_COUNT] is None and redeliveries >= 0:
        values[_DELIVERY_COUNT] = redeliveries + 1
    return (
        dlq_topic if isinstance(dlq_topic, str) else None,
        dlq_message_id if isinstance(dlq_message_id, str) else None,
        *values,
        (fmt or ContextFormat.NONE).value,
    )


# --------------------------------------------------------------------------- origin identity

#: Longest origin topic value kept in an :class:`OriginClaim` (a longer one is cut, marked, never valid).
MAX_CLAIM_CHARS = 300
_MESSAGE_ID = re.compile(r"\(?\s*(-?\d{1,20})\s*(?:[:,]\s*(-?\d{1,20})\s*){1,3}\)?")
_ID_PART = re.compile(r"-?\d{1,20}")
#: A message id whose parts are already spelt as ``str(int(part))`` (ASCII, no spaces, no leading zero):
#: what clients write. Its canonical form needs no conversion.
_PLAIN_PART = r"(0|-?[1-9][0-9]{0,19})"
_PLAIN_MESSAGE_ID = re.compile(
    rf"\(?{_PLAIN_PART}[:,]{_PLAIN_PART}(?:[:,]{_PLAIN_PART})?(?:[:,]{_PLAIN_PART})?\)?"
)


@dataclass(frozen=True)
class OriginClaim:
    """What one convention's properties say the origin of a DLQ message was.

    ``key`` is the property that names the topic (one of :data:`ORIGIN_TOPIC_KEYS`), ``topic`` its
    value (bounded to :data:`MAX_CLAIM_CHARS`) and ``message_id`` the origin message id the same
    convention gives (``None`` when it gives none or junk).
    """

    key: str
    topic: str
    message_id: str | None


def origin_claims(properties: Mapping[str, str] | None) -> tuple[OriginClaim, ...]:
    """Every convention's claim about the origin, in :data:`ORIGIN_TOPIC_KEYS` order (never raises)."""
    if not isinstance(properties, Mapping):
        return ()
    claims = []
    for claim in ORIGIN_CLAIMS:
        value = read_text(properties, claim.topic_key)
        if value is None:
            continue
        if len(value) > MAX_CLAIM_CHARS:
            value = value[:MAX_CLAIM_CHARS] + TRUNCATION_MARKER
        message_id = cast("str | None", claim.message_id.read(properties))  # Text or Position readers
        claims.append(OriginClaim(claim.topic_key, value, message_id))
    return tuple(claims)


@lru_cache(maxsize=4096)
def canonical_topic(topic: str | None) -> str | None:
    """The topic a claim names, for comparing claims: fully qualified, without a ``-partition-N`` suffix
    (a partition and its topic are the same origin). ``None`` for anything that is not a topic name."""
    if not topic or TRUNCATION_MARKER in topic:
        return None
    from pulsar_dlq_consumer.errors import ConfigurationError
    from pulsar_dlq_consumer.topics import normalize_topic

    try:
        qualified = normalize_topic(topic)
    except ConfigurationError:
        return None
    if any(ch.isspace() or ord(ch) < 0x20 for ch in qualified):
        return None
    return base_topic(qualified)


def conflicting_claims(claims: tuple[OriginClaim, ...]) -> tuple[OriginClaim, ...]:
    """The claims when they name different origin topics (one claim per distinct topic), else ``()``.

    Two claims agree when they name the same topic, qualified or short, partition or whole topic
    (``REAL_TOPIC=persistent://public/default/orders-partition-0`` agrees with
    ``__dlq.errors.topic=orders``). A value that is no topic name disagrees with every other value.
    """
    seen: dict[str, OriginClaim] = {}
    for claim in claims:
        seen.setdefault(canonical_topic(claim.topic) or f"\x00{claim.topic}", claim)
    return tuple(seen.values()) if len(seen) > 1 else ()


def resolve_claims(claims: tuple[OriginClaim, ...], precedence: Sequence[str]) -> OriginClaim | None:
    """The claim of the first property key in ``precedence`` that the message carries, else ``None``."""
    by_key = {claim.key: claim for claim in claims}
    return next((by_key[key] for key in precedence if key in by_key), None)


def canonical_message_id(message_id: str | None) -> str | None:
    """A message id in one spelling, so copies written by different clients compare equal.

    Pulsar ids: Python ``(ledger,entry,partition,batch)``, Java ``ledger:entry:partition`` or
    ``ledger:entry:partition:batch`` all become ``ledger:entry:partition:batch`` (batch -1 when absent).
    Kafka positions ``partition:offset`` stay as they are. Anything else gives ``None``.
    """
    if not message_id:
        return None
    plain = _PLAIN_MESSAGE_ID.fullmatch(message_id) if isinstance(message_id, str) else None
    if plain is not None:
        ledger, entry, partition, batch = plain.groups()
        if partition is None:
            return f"{ledger}:{entry}"
        return f"{ledger}:{entry}:{partition}:{'-1' if batch is None else batch}"
    if not _MESSAGE_ID.fullmatch(message_id.strip()):
        return None
    parts = _ID_PART.findall(message_id)
    if len(parts) == 3:
        parts.append("-1")
    return ":".join(str(int(p)) for p in parts)


def origin_identity(origin_topic: str | None, origin_message_id: str | None) -> str | None:
    """``<qualified origin topic without partition suffix>|<canonical message id>``: the same for every
    DLQ copy of one original message, whichever convention or client wrote it; ``None`` when either part
    is missing or not valid (callers then fall back to the DLQ message's own identity)."""
    topic = canonical_topic(origin_topic)
    message_id = canonical_message_id(origin_message_id)
    if topic is None or message_id is None:
        return None
    return f"{topic}|{message_id}"


__all__ = [
    "CONTEXT_FIELDS",
    "CONTEXT_PREFIX",
    "DELAY_TIME",
    "KEY_CONSUMER",
    "KEY_DELIVERY_COUNT",
    "KEY_EXCEPTION_CLASS",
    "KEY_EXCEPTION_MESSAGE",
    "KEY_EXCEPTION_STACKTRACE",
    "KEY_FAILED_AT",
    "KEY_MESSAGE_ID",
    "KEY_PARTITION",
    "KEY_PAYLOAD_COPIED",
    "KEY_PAYLOAD_SHA256",
    "KEY_REASON",
    "KEY_RECONSUME_COUNT",
    "KEY_SUBSCRIPTION",
    "KEY_TOPIC",
    "LEGACY_ORIGIN_MESSAGE_ID",
    "MAX_ERROR_MESSAGE_BYTES",
    "MAX_ERROR_STACK_BYTES",
    "ORIGIN_MESSAGE_ID",
    "ORIGIN_PROPERTY_KEYS",
    "ORIGIN_TOPIC_KEYS",
    "PULSAR_STANDARD_KEYS",
    "REAL_TOPIC",
    "REASONS",
    "REASON_MAX_RECONSUMES",
    "REASON_MAX_REDELIVERIES",
    "REASON_TERM",
    "REASON_UNKNOWN",
    "RECONSUMETIMES",
    "RETRY_TOPIC",
    "ContextFormat",
    "ErrorContext",
    "OriginClaim",
    "base_topic",
    "build_context_properties",
    "canonical_message_id",
    "canonical_topic",
    "conflicting_claims",
    "detect_format",
    "error_context_values",
    "exception_class_name",
    "is_bookkeeping_property",
    "origin_claims",
    "origin_identity",
    "parse_error_context",
    "partition_index",
    "payload_sha256",
    "resolve_claims",
    "safe_str",
    "strip_bookkeeping_properties",
    "truncate_utf8",
]
