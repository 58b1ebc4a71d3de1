"""Error-context property names, the writer for our family and the parser for every known convention.

This is the one module that knows property names. The consumer wrapper writes context with
:func:`build_context_properties`; the Spark replay apps read any DLQ message back with
:func:`parse_error_context` into one :class:`ErrorContext` schema, whatever wrote it.

Formats read, in precedence order when a message carries several (the first that matches wins):

1. ``ours``: any ``__dlq.errors.*`` key that only this library writes (``reason``,
   ``exception.class``, ``failed.at``, ``consumer``, ``message.id``, ``subscription``, ...).
2. ``kafka_connect``: ``__connect.errors.*`` headers.
3. ``spring``: ``kafka_dlt-*`` headers.
4. ``kip1191``: ``__dlq.errors.topic/partition/offset/group/delivery.count/message`` only.
5. ``java_retry``: ``RECONSUMETIMES`` (or ``RETRY_TOPIC``/``DELAY_TIME``) together with ``REAL_TOPIC``.
6. ``tdmq``: ``RECONSUMETIMES``/``RETRY_TOPIC`` without ``REAL_TOPIC``.
7. ``pulsar_dlq_policy``: ``REAL_TOPIC`` and/or ``ORIGIN_MESSAGE_ID`` only (the official client's
   ``ConsumerDeadLetterPolicy``).
8. ``none``: nothing recognised.

The order is "richest first": formats that carry exception details come before those that carry
only positions. Properties are untrusted: the parser never raises, and junk values become ``None``.
"""

from __future__ import annotations

import hashlib
import re
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

# --------------------------------------------------------------------------- Pulsar standard keys

REAL_TOPIC = "REAL_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RECONSUMETIMES = "RECONSUMETIMES"
DELAY_TIME = "DELAY_TIME"  # requested delay in milliseconds
RETRY_TOPIC = "RETRY_TOPIC"
#: Misspelt key still written by the Go client next to ORIGIN_MESSAGE_ID: read, never written.
LEGACY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_IDY_TIME"

PULSAR_STANDARD_KEYS: tuple[str, ...] = (
    REAL_TOPIC,
    ORIGIN_MESSAGE_ID,
    RECONSUMETIMES,
    DELAY_TIME,
    RETRY_TOPIC,
    LEGACY_ORIGIN_MESSAGE_ID,
)

# --------------------------------------------------------------------------- our family

CONTEXT_PREFIX = "__dlq.errors."

KEY_TOPIC = CONTEXT_PREFIX + "topic"  # origin topic (shared with KIP-1191)
KEY_PARTITION = CONTEXT_PREFIX + "partition"  # origin partition index, when partitioned (KIP-1191 too)
KEY_MESSAGE_ID = CONTEXT_PREFIX + "message.id"  # origin message id, str(MessageId)
KEY_SUBSCRIPTION = CONTEXT_PREFIX + "subscription"
KEY_DELIVERY_COUNT = CONTEXT_PREFIX + "delivery.count"  # deliveries on the origin subscription (>= 1)
KEY_RECONSUME_COUNT = CONTEXT_PREFIX + "reconsume.count"  # trips through the retry topic so far
KEY_REASON = CONTEXT_PREFIX + "reason"  # term | max-redeliveries | max-reconsumes (DLQ messages only)
KEY_EXCEPTION_CLASS = CONTEXT_PREFIX + "exception.class"
KEY_EXCEPTION_MESSAGE = CONTEXT_PREFIX + "exception.message"
KEY_EXCEPTION_STACKTRACE = CONTEXT_PREFIX + "exception.stacktrace"
KEY_FAILED_AT = CONTEXT_PREFIX + "failed.at"  # epoch milliseconds
KEY_CONSUMER = CONTEXT_PREFIX + "consumer"
KEY_PAYLOAD_SHA256 = CONTEXT_PREFIX + "payload.sha256"  # only when the payload is not copied
KEY_PAYLOAD_COPIED = CONTEXT_PREFIX + "payload.copied"  # "true" | "false"

#: Keys only this library writes; any of them marks a message as format ``ours``.
OURS_ONLY_KEYS: frozenset[str] = frozenset(
    {
        KEY_MESSAGE_ID,
        KEY_SUBSCRIPTION,
        KEY_RECONSUME_COUNT,
        KEY_REASON,
        KEY_EXCEPTION_CLASS,
        KEY_EXCEPTION_MESSAGE,
        KEY_EXCEPTION_STACKTRACE,
        KEY_FAILED_AT,
        KEY_CONSUMER,
        KEY_PAYLOAD_SHA256,
        KEY_PAYLOAD_COPIED,
    }
)

# KIP-1191 (Kafka share-group DLQ) headers.
KIP1191_TOPIC = KEY_TOPIC
KIP1191_PARTITION = KEY_PARTITION
KIP1191_OFFSET = CONTEXT_PREFIX + "offset"
KIP1191_GROUP = CONTEXT_PREFIX + "group"
KIP1191_DELIVERY_COUNT = KEY_DELIVERY_COUNT
KIP1191_MESSAGE = CONTEXT_PREFIX + "message"
KIP1191_KEYS: frozenset[str] = frozenset(
    {KIP1191_TOPIC, KIP1191_PARTITION, KIP1191_OFFSET, KIP1191_GROUP, KIP1191_DELIVERY_COUNT, KIP1191_MESSAGE}
)

# Kafka Connect DLQ headers.
CONNECT_PREFIX = "__connect.errors."
CONNECT_TOPIC = CONNECT_PREFIX + "topic"
CONNECT_PARTITION = CONNECT_PREFIX + "partition"
CONNECT_OFFSET = CONNECT_PREFIX + "offset"
CONNECT_CONNECTOR = CONNECT_PREFIX + "connector.name"
CONNECT_TASK = CONNECT_PREFIX + "task.id"
CONNECT_EXCEPTION_CLASS = CONNECT_PREFIX + "exception.class.name"
CONNECT_EXCEPTION_MESSAGE = CONNECT_PREFIX + "exception.message"
CONNECT_EXCEPTION_STACKTRACE = CONNECT_PREFIX + "exception.stacktrace"

# Spring Kafka dead-letter-topic headers.
SPRING_PREFIX = "kafka_dlt-"
SPRING_EXCEPTION_FQCN = SPRING_PREFIX + "exception-fqcn"
SPRING_CAUSE_FQCN = SPRING_PREFIX + "exception-cause-fqcn"
SPRING_EXCEPTION_MESSAGE = SPRING_PREFIX + "exception-message"
SPRING_EXCEPTION_STACKTRACE = SPRING_PREFIX + "exception-stacktrace"
SPRING_ORIGINAL_TOPIC = SPRING_PREFIX + "original-topic"
SPRING_ORIGINAL_PARTITION = SPRING_PREFIX + "original-partition"
SPRING_ORIGINAL_OFFSET = SPRING_PREFIX + "original-offset"
SPRING_ORIGINAL_GROUP = SPRING_PREFIX + "original-consumer-group"

#: Bounds on what we write (UTF-8 bytes); the parser applies the same bounds to what it reads.
MAX_ERROR_MESSAGE_BYTES = 4 * 1024
MAX_ERROR_STACK_BYTES = 16 * 1024
TRUNCATION_MARKER = "...[truncated]"

REASON_TERM = "term"
REASON_MAX_REDELIVERIES = "max-redeliveries"
REASON_MAX_RECONSUMES = "max-reconsumes"
REASON_UNKNOWN = "unknown"
REASONS: frozenset[str] = frozenset({REASON_TERM, REASON_MAX_REDELIVERIES, REASON_MAX_RECONSUMES})


class ContextFormat(StrEnum):
    """Which convention an :class:`ErrorContext` was read from."""

    OURS = "ours"
    PULSAR_DLQ_POLICY = "pulsar_dlq_policy"
    JAVA_RETRY = "java_retry"
    TDMQ = "tdmq"
    KIP1191 = "kip1191"
    KAFKA_CONNECT = "kafka_connect"
    SPRING = "spring"
    NONE = "none"


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


_SURROGATES = re.compile("[\ud800-\udfff]")


def safe_str(value: str) -> str:
    """Return ``value`` as a string that encodes to UTF-8 (lone surrogates become U+FFFD)."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", value)


def truncate_utf8(value: str, max_bytes: int) -> str:
    """Bound ``value`` to ``max_bytes`` UTF-8 bytes, ending with a marker when cut (never splits a char)."""
    if len(value) <= max_bytes and value.isascii():  # one byte per character: nothing to cut
        return value
    text = safe_str(value)
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    marker = TRUNCATION_MARKER.encode("utf-8")
    keep = max(0, max_bytes - len(marker))
    return raw[:keep].decode("utf-8", "ignore") + (TRUNCATION_MARKER if max_bytes >= len(marker) else "")


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

    These are the Pulsar standard keys (``REAL_TOPIC``, ``ORIGIN_MESSAGE_ID``, ``RECONSUMETIMES``,
    ``DELAY_TIME``, ``RETRY_TOPIC``, the misspelt legacy ``ORIGIN_MESSAGE_IDY_TIME``) and every key under
    ``__dlq.errors.``, ``__connect.errors.`` and ``kafka_dlt-``.
    """
    if not isinstance(key, str):
        return False
    return key in PULSAR_STANDARD_KEYS or key.startswith((CONTEXT_PREFIX, CONNECT_PREFIX, SPRING_PREFIX))


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


def _text(props: Mapping[str, str], key: str) -> str | None:
    value = props.get(key)
    if not isinstance(value, str) or value == "":
        return None
    return value if value.isascii() else safe_str(value)


_ASCII_INT = re.compile(r"-?[0-9]{1,19}")


def _int(props: Mapping[str, str], key: str, *, minimum: int = 0) -> int | None:
    value = props.get(key)
    if not isinstance(value, str):
        return None
    # Fast path: 1 to 19 ASCII digits (what writers send); anything else is checked by _ASCII_INT.
    plain = value.isascii() and value.isdigit() and len(value) <= 19
    if not plain and not _ASCII_INT.fullmatch(value.strip()):
        return None
    number = int(value)
    return number if number >= minimum else None


def _first_int(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def _bounded(value: str | None, max_bytes: int) -> str | None:
    return None if value is None else truncate_utf8(value, max_bytes)


def _big_endian_or_decimal(props: Mapping[str, str], key: str) -> int | None:
    """Spring writes partition/offset as big-endian binary; a bridge may pass it through as latin-1."""
    number = _int(props, key)
    if number is not None:
        return number
    value = props.get(key)
    if not isinstance(value, str) or len(value) not in (4, 8) or not value.startswith("\x00"):
        return None
    if any(ord(ch) > 0xFF for ch in value):
        return None
    return int.from_bytes(value.encode("latin-1"), "big")


def _position(partition: int | None, offset: int | None) -> str | None:
    if offset is None:
        return None
    return f"{partition if partition is not None else 0}:{offset}"


def detect_format(properties: Mapping[str, str] | None) -> ContextFormat:
    """Return the richest convention present in ``properties`` (see the module docstring)."""
    if not properties:
        return ContextFormat.NONE
    keys = {k for k in properties if isinstance(k, str)}
    if not keys.isdisjoint(OURS_ONLY_KEYS):
        return ContextFormat.OURS
    if any(k.startswith(CONNECT_PREFIX) for k in keys):
        return ContextFormat.KAFKA_CONNECT
    if any(k.startswith(SPRING_PREFIX) for k in keys):
        return ContextFormat.SPRING
    if keys & KIP1191_KEYS:
        return ContextFormat.KIP1191
    retry_keys = {RECONSUMETIMES, RETRY_TOPIC, DELAY_TIME}
    if keys & retry_keys and REAL_TOPIC in keys:
        return ContextFormat.JAVA_RETRY
    if keys & {RECONSUMETIMES, RETRY_TOPIC}:
        return ContextFormat.TDMQ
    if keys & {REAL_TOPIC, ORIGIN_MESSAGE_ID, LEGACY_ORIGIN_MESSAGE_ID}:
        return ContextFormat.PULSAR_DLQ_POLICY
    return ContextFormat.NONE


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
    fmt = detect_format(props)
    fallback_delivery = (
        redelivery_count + 1
        if isinstance(redelivery_count, int)
        and not isinstance(redelivery_count, bool)
        and redelivery_count >= 0
        else None
    )
    origin_topic: str | None = None
    origin_message_id: str | None = None
    subscription: str | None = None
    delivery_count: int | None = None
    reconsume_times: int | None = None
    reason = REASON_UNKNOWN
    error_class: str | None = None
    error_message: str | None = None
    error_stack: str | None = None
    failed_at: int | None = None
    consumer: str | None = None
    origin_id_std = _text(props, ORIGIN_MESSAGE_ID) or _text(props, LEGACY_ORIGIN_MESSAGE_ID)
    if fmt is ContextFormat.OURS:
        given_reason = _text(props, KEY_REASON)
        origin_topic = _text(props, KEY_TOPIC) or _text(props, REAL_TOPIC)
        origin_message_id = _text(props, KEY_MESSAGE_ID) or origin_id_std
        subscription = _text(props, KEY_SUBSCRIPTION)
        delivery_count = _int(props, KEY_DELIVERY_COUNT, minimum=1)
        reconsume_times = _first_int(_int(props, KEY_RECONSUME_COUNT), _int(props, RECONSUMETIMES))
        reason = given_reason if given_reason in REASONS else REASON_UNKNOWN
        error_class = _text(props, KEY_EXCEPTION_CLASS)
        error_message = _bounded(_text(props, KEY_EXCEPTION_MESSAGE), MAX_ERROR_MESSAGE_BYTES)
        error_stack = _bounded(_text(props, KEY_EXCEPTION_STACKTRACE), MAX_ERROR_STACK_BYTES)
        failed_at = _int(props, KEY_FAILED_AT)
        consumer = _text(props, KEY_CONSUMER)
    elif fmt is ContextFormat.KAFKA_CONNECT:
        connector = _text(props, CONNECT_CONNECTOR)
        task = _text(props, CONNECT_TASK)
        origin_topic = _text(props, CONNECT_TOPIC)
        origin_message_id = _position(_int(props, CONNECT_PARTITION), _int(props, CONNECT_OFFSET))
        subscription = connector
        consumer = f"{connector}-{task}" if connector and task else connector
        error_class = _text(props, CONNECT_EXCEPTION_CLASS)
        error_message = _bounded(_text(props, CONNECT_EXCEPTION_MESSAGE), MAX_ERROR_MESSAGE_BYTES)
        error_stack = _bounded(_text(props, CONNECT_EXCEPTION_STACKTRACE), MAX_ERROR_STACK_BYTES)
    elif fmt is ContextFormat.SPRING:
        origin_topic = _text(props, SPRING_ORIGINAL_TOPIC)
        origin_message_id = _position(
            _big_endian_or_decimal(props, SPRING_ORIGINAL_PARTITION),
            _big_endian_or_decimal(props, SPRING_ORIGINAL_OFFSET),
        )
        subscription = _text(props, SPRING_ORIGINAL_GROUP)
        error_class = _text(props, SPRING_CAUSE_FQCN) or _text(props, SPRING_EXCEPTION_FQCN)
        error_message = _bounded(_text(props, SPRING_EXCEPTION_MESSAGE), MAX_ERROR_MESSAGE_BYTES)
        error_stack = _bounded(_text(props, SPRING_EXCEPTION_STACKTRACE), MAX_ERROR_STACK_BYTES)
    elif fmt is ContextFormat.KIP1191:
        origin_topic = _text(props, KIP1191_TOPIC)
        origin_message_id = _position(_int(props, KIP1191_PARTITION), _int(props, KIP1191_OFFSET))
        subscription = _text(props, KIP1191_GROUP)
        delivery_count = _int(props, KIP1191_DELIVERY_COUNT, minimum=1)
        error_message = _bounded(_text(props, KIP1191_MESSAGE), MAX_ERROR_MESSAGE_BYTES)
    elif fmt in (ContextFormat.JAVA_RETRY, ContextFormat.TDMQ):
        origin_topic = _text(props, REAL_TOPIC)
        origin_message_id = origin_id_std
        reconsume_times = _int(props, RECONSUMETIMES)
        reason = REASON_MAX_RECONSUMES
    elif fmt is ContextFormat.PULSAR_DLQ_POLICY:
        origin_topic = _text(props, REAL_TOPIC)
        origin_message_id = origin_id_std
        reason = REASON_MAX_REDELIVERIES
    return (
        dlq_topic if isinstance(dlq_topic, str) else None,
        dlq_message_id if isinstance(dlq_message_id, str) else None,
        origin_topic,
        origin_message_id,
        subscription,
        fallback_delivery if delivery_count is None else delivery_count,
        reconsume_times,
        reason,
        error_class,
        error_message,
        error_stack,
        failed_at,
        consumer,
        fmt.value,
    )


# --------------------------------------------------------------------------- origin identity

#: Property keys that name the origin topic, one per convention family, in the parser's precedence.
ORIGIN_TOPIC_KEYS: tuple[str, ...] = (KEY_TOPIC, CONNECT_TOPIC, SPRING_ORIGINAL_TOPIC, REAL_TOPIC)
#: Every property :func:`origin_claims` reads: a message's origin identity depends on these alone.
ORIGIN_PROPERTY_KEYS: tuple[str, ...] = (
    KEY_TOPIC,
    KEY_MESSAGE_ID,
    KIP1191_PARTITION,
    KIP1191_OFFSET,
    CONNECT_TOPIC,
    CONNECT_PARTITION,
    CONNECT_OFFSET,
    SPRING_ORIGINAL_TOPIC,
    SPRING_ORIGINAL_PARTITION,
    SPRING_ORIGINAL_OFFSET,
    REAL_TOPIC,
    ORIGIN_MESSAGE_ID,
    LEGACY_ORIGIN_MESSAGE_ID,
)
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


def _origin_message_id(props: Mapping[str, str], key: str) -> str | None:
    if key == REAL_TOPIC:
        return _text(props, ORIGIN_MESSAGE_ID) or _text(props, LEGACY_ORIGIN_MESSAGE_ID)
    if key == KEY_TOPIC:
        return _text(props, KEY_MESSAGE_ID) or _position(
            _int(props, KIP1191_PARTITION), _int(props, KIP1191_OFFSET)
        )
    if key == CONNECT_TOPIC:
        return _position(_int(props, CONNECT_PARTITION), _int(props, CONNECT_OFFSET))
    return _position(
        _big_endian_or_decimal(props, SPRING_ORIGINAL_PARTITION),
        _big_endian_or_decimal(props, SPRING_ORIGINAL_OFFSET),
    )


def origin_claims(properties: Mapping[str, str] | None) -> tuple[OriginClaim, ...]:
    """Every convention's claim about the origin, in :data:`ORIGIN_TOPIC_KEYS` order (never raises)."""
    if not isinstance(properties, Mapping):
        return ()
    claims = []
    for key in ORIGIN_TOPIC_KEYS:
        if key not in properties:
            continue
        value = _text(properties, key)
        if value is None:
            continue
        if len(value) > MAX_CLAIM_CHARS:
            value = value[:MAX_CLAIM_CHARS] + TRUNCATION_MARKER
        claims.append(OriginClaim(key, value, _origin_message_id(properties, key)))
    return tuple(claims)


@lru_cache(maxsize=4096)
def canonical_topic(topic: str | None) -> str | None:
    """The topic a claim names, for comparing claims: fully qualified, without a ``-partition-N`` suffix
    (a partition and its topic are the same origin). ``None`` for anything that is not a topic name."""
    if not topic or TRUNCATION_MARKER in topic:
        return None
    from pulsar_dlq_consumer.errors import ConfigurationError
    from pulsar_dlq_consumer.policy import normalize_topic

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
