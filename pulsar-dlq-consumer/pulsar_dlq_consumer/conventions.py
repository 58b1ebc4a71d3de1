"""Every DLQ convention, described once as data: the one module that knows property names.

:data:`CONVENTIONS` lists them richest first (the first that matches wins). Two engines interpret the
table and must agree: the scalar parser of :mod:`pulsar_dlq_consumer.context` and the replay's Arrow
kernels (``context_columns.py``). A reader never raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Mapping
    from collections.abc import Set as AbstractSet


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

# KIP-1191 (Kafka share-group DLQ) headers: topic, partition and delivery count are ours too.
KIP1191_OFFSET = CONTEXT_PREFIX + "offset"
KIP1191_GROUP = CONTEXT_PREFIX + "group"
KIP1191_MESSAGE = CONTEXT_PREFIX + "message"

# Kafka Connect and Spring Kafka DLQ headers (the others are spelt out in their table entries).
CONNECT_PREFIX = "__connect.errors."
CONNECT_TOPIC = CONNECT_PREFIX + "topic"
SPRING_PREFIX = "kafka_dlt-"
SPRING_ORIGINAL_TOPIC = SPRING_PREFIX + "original-topic"

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
    """Which convention an error context was read from (``none``: no convention matched)."""

    OURS = "ours"
    PULSAR_DLQ_POLICY = "pulsar_dlq_policy"
    JAVA_RETRY = "java_retry"
    TDMQ = "tdmq"
    KIP1191 = "kip1191"
    KAFKA_CONNECT = "kafka_connect"
    SPRING = "spring"
    NONE = "none"


_SURROGATES = re.compile("[\ud800-\udfff]")
_ASCII_INT = re.compile(r"-?[0-9]{1,19}")


def safe_str(value: str) -> str:
    """Return ``value`` as a string that encodes to UTF-8 (lone surrogates become U+FFFD)."""
    return value if value.isascii() else _SURROGATES.sub("\ufffd", value)


def truncate_utf8(value: str, max_bytes: int, *, keep_tail: bool = False) -> str:
    """Bound ``value`` to ``max_bytes`` UTF-8 bytes, ending with a marker when cut (never splits a char);
    ``keep_tail`` keeps a quarter head, the marker on its own line and the tail (a stack's last frames)."""
    if len(value) <= max_bytes and value.isascii():  # one byte per character: nothing to cut
        return value
    text = safe_str(value)
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    if keep_tail:
        budget = max(0, max_bytes - len(TRUNCATION_MARKER) - 2)  # the marker is ASCII, plus two newlines
        head, tail = raw[: budget // 4], raw[len(raw) - (budget - budget // 4) :]
        return f"{head.decode('utf-8', 'ignore')}\n{TRUNCATION_MARKER}\n{tail.decode('utf-8', 'ignore')}"
    keep = max_bytes - len(TRUNCATION_MARKER)  # the marker is ASCII: one byte per character
    return raw[: max(0, keep)].decode("utf-8", "ignore") + (TRUNCATION_MARKER if keep >= 0 else "")


def read_text(props: Mapping[str, Any], key: str) -> str | None:
    """The value of ``key`` as valid UTF-8 text; ``None`` when absent, empty or not a string."""
    value = props.get(key)
    return safe_str(value) if isinstance(value, str) and value else None


def read_int(props: Mapping[str, Any], key: str, minimum: int = 0) -> int | None:
    """``key`` as a decimal of at most 19 ASCII digits (sign, spaces allowed) >= ``minimum``, else None."""
    value = props.get(key)
    if not isinstance(value, str):
        return None
    # Fast path: 1 to 19 ASCII digits (what writers send); anything else is checked by _ASCII_INT.
    plain = value.isascii() and value.isdigit() and len(value) <= 19
    if not plain and not _ASCII_INT.fullmatch(value.strip()):
        return None
    number = int(value)
    return number if number >= minimum else None


def _big_endian_or_decimal(props: Mapping[str, Any], key: str) -> int | None:
    """Spring writes partition/offset as big-endian binary; a bridge may pass it through as latin-1."""
    number = read_int(props, key)
    if number is not None:
        return number
    value = props.get(key)
    if not isinstance(value, str) or len(value) not in (4, 8) or not value.startswith("\x00"):
        return None
    return None if any(ord(ch) > 0xFF for ch in value) else int.from_bytes(value.encode("latin-1"), "big")


#: The fields of a reader that name a property key.
_KEY_FIELDS = frozenset({"key", "partition", "offset", "first", "second"})


class _Keyed:
    """A reader whose ``keys`` are the property keys it looks at (its fields in :data:`_KEY_FIELDS`)."""

    __slots__ = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(getattr(self, f.name) for f in fields(self) if f.name in _KEY_FIELDS)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Text(_Keyed):
    """The value of ``key`` (absent, empty or not text: ``None``), cut to ``max_bytes`` UTF-8 bytes."""

    key: str
    max_bytes: int | None = None

    def read(self, props: Mapping[str, Any]) -> str | None:
        value = read_text(props, self.key)
        return value if value is None or self.max_bytes is None else truncate_utf8(value, self.max_bytes)


@dataclass(frozen=True, slots=True)
class Number(_Keyed):
    """A decimal number (see :func:`read_int`) of at least ``minimum``."""

    key: str
    minimum: int = 0

    def read(self, props: Mapping[str, Any]) -> int | None:
        return read_int(props, self.key, self.minimum)


@dataclass(frozen=True, slots=True)
class Position(_Keyed):
    """A Kafka position, ``"<partition or 0>:<offset>"`` (no offset: ``None``); ``binary``: Spring's."""

    partition: str
    offset: str
    binary: bool = False

    def read(self, props: Mapping[str, Any]) -> str | None:
        number = _big_endian_or_decimal if self.binary else read_int
        offset = number(props, self.offset)
        if offset is None:
            return None
        partition = number(props, self.partition)
        return f"{partition if partition is not None else 0}:{offset}"


@dataclass(frozen=True, slots=True)
class Const(_Keyed):
    """Always ``value`` (what a convention implies without saying it, e.g. its reason)."""

    value: str

    def read(self, props: Mapping[str, Any]) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Choice(_Keyed):
    """The text of ``key`` when it is one of ``allowed``, else ``default``."""

    key: str
    allowed: frozenset[str]
    default: str

    def read(self, props: Mapping[str, Any]) -> str:
        value = read_text(props, self.key)
        return value if value in self.allowed else self.default


@dataclass(frozen=True, slots=True)
class Joined(_Keyed):
    """``"<first><sep><second>"`` when both texts are given, else the first text."""

    first: str
    second: str
    sep: str = "-"

    def read(self, props: Mapping[str, Any]) -> str | None:
        first, second = read_text(props, self.first), read_text(props, self.second)
        return f"{first}{self.sep}{second}" if first and second else first


@dataclass(frozen=True, slots=True)
class First:
    """The first of ``readers`` that gives a value."""

    readers: tuple[Reader, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for reader in self.readers for key in reader.keys)

    def read(self, props: Mapping[str, Any]) -> Any:
        return next((value for reader in self.readers if (value := reader.read(props)) is not None), None)


#: Every kind of reader of one field (the Arrow kernels have one per kind); ``read`` gives ``None`` for none.
Reader: TypeAlias = Text | Number | Position | Const | Choice | Joined | First


def first(*readers: Reader) -> Reader:
    """:class:`First` of ``readers`` (one reader: itself)."""
    return readers[0] if len(readers) == 1 else First(readers)


@dataclass(frozen=True)
class Claim:
    """What a convention says the origin was: the key naming the topic and how to read the message id."""

    topic_key: str
    message_id: Reader


@dataclass(frozen=True)
class Convention:
    """One DLQ convention: a message is in it when a key is in ``markers`` or starts with ``marker_prefix``
    and it carries every key of ``requires``; ``fields`` maps context fields to readers (others: the
    :data:`FIELD_DEFAULTS` value or ``None``), ``claim`` its origin claim (default: what ``fields`` read)."""

    format: ContextFormat
    fields: Mapping[str, Reader]
    markers: frozenset[str] = frozenset()
    marker_prefix: str = ""
    requires: frozenset[str] = frozenset()
    namespace: str = ""
    claim: Claim | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        read = (key for reader in self.fields.values() for key in reader.keys)
        return tuple(dict.fromkeys((*sorted(self.markers), *self.requires, *read)))

    def marks(self, key: str) -> bool:
        """Does ``key`` mark a message as written in this convention (with :attr:`requires`)?"""
        return key in self.markers or (bool(self.marker_prefix) and key.startswith(self.marker_prefix))

    def matches(self, keys: AbstractSet[str]) -> bool:
        marked = not self.markers.isdisjoint(keys) or (
            bool(self.marker_prefix) and any(key.startswith(self.marker_prefix) for key in keys)
        )
        return marked and self.requires <= keys


_STD_ORIGIN_ID = first(Text(ORIGIN_MESSAGE_ID), Text(LEGACY_ORIGIN_MESSAGE_ID))
_PULSAR_ORIGIN = {"origin_topic": Text(REAL_TOPIC), "origin_message_id": _STD_ORIGIN_ID}
_RETRIED = {
    **_PULSAR_ORIGIN,
    "reconsume_times": Number(RECONSUMETIMES),
    "reason": Const(REASON_MAX_RECONSUMES),
}

#: Every convention, in precedence order (richest first).
CONVENTIONS: tuple[Convention, ...] = (
    Convention(  # this library: any key only it writes
        ContextFormat.OURS,
        markers=frozenset(
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
        ),
        namespace=CONTEXT_PREFIX,
        claim=Claim(KEY_TOPIC, Text(KEY_MESSAGE_ID)),
        fields={
            "origin_topic": first(Text(KEY_TOPIC), Text(REAL_TOPIC)),
            "origin_message_id": first(Text(KEY_MESSAGE_ID), _STD_ORIGIN_ID),
            "subscription": Text(KEY_SUBSCRIPTION),
            "delivery_count": Number(KEY_DELIVERY_COUNT, minimum=1),
            "reconsume_times": first(Number(KEY_RECONSUME_COUNT), Number(RECONSUMETIMES)),
            "reason": Choice(KEY_REASON, REASONS, REASON_UNKNOWN),
            "error_class": Text(KEY_EXCEPTION_CLASS),
            "error_message": Text(KEY_EXCEPTION_MESSAGE, MAX_ERROR_MESSAGE_BYTES),
            "error_stack": Text(KEY_EXCEPTION_STACKTRACE, MAX_ERROR_STACK_BYTES),
            "failed_at": Number(KEY_FAILED_AT),
            "consumer": Text(KEY_CONSUMER),
        },
    ),
    Convention(  # Kafka Connect's errors.deadletterqueue.context.headers.enable
        ContextFormat.KAFKA_CONNECT,
        marker_prefix=CONNECT_PREFIX,
        namespace=CONNECT_PREFIX,
        fields={
            "origin_topic": Text(CONNECT_TOPIC),
            "origin_message_id": Position(CONNECT_PREFIX + "partition", CONNECT_PREFIX + "offset"),
            "subscription": Text(CONNECT_PREFIX + "connector.name"),
            "error_class": Text(CONNECT_PREFIX + "exception.class.name"),
            "error_message": Text(CONNECT_PREFIX + "exception.message", MAX_ERROR_MESSAGE_BYTES),
            "error_stack": Text(CONNECT_PREFIX + "exception.stacktrace", MAX_ERROR_STACK_BYTES),
            "consumer": Joined(CONNECT_PREFIX + "connector.name", CONNECT_PREFIX + "task.id"),
        },
    ),
    Convention(  # Spring Kafka's DeadLetterPublishingRecoverer
        ContextFormat.SPRING,
        marker_prefix=SPRING_PREFIX,
        namespace=SPRING_PREFIX,
        fields={
            "origin_topic": Text(SPRING_ORIGINAL_TOPIC),
            "origin_message_id": Position(
                SPRING_PREFIX + "original-partition", SPRING_PREFIX + "original-offset", binary=True
            ),
            "subscription": Text(SPRING_PREFIX + "original-consumer-group"),
            "error_class": first(
                Text(SPRING_PREFIX + "exception-cause-fqcn"), Text(SPRING_PREFIX + "exception-fqcn")
            ),
            "error_message": Text(SPRING_PREFIX + "exception-message", MAX_ERROR_MESSAGE_BYTES),
            "error_stack": Text(SPRING_PREFIX + "exception-stacktrace", MAX_ERROR_STACK_BYTES),
        },
    ),
    Convention(  # KIP-1191 share-group DLQ headers (a subset of our keys)
        ContextFormat.KIP1191,
        markers=frozenset(
            {KEY_TOPIC, KEY_PARTITION, KIP1191_OFFSET, KIP1191_GROUP, KEY_DELIVERY_COUNT, KIP1191_MESSAGE}
        ),
        namespace=CONTEXT_PREFIX,
        fields={
            "origin_topic": Text(KEY_TOPIC),
            "origin_message_id": Position(KEY_PARTITION, KIP1191_OFFSET),
            "subscription": Text(KIP1191_GROUP),
            "delivery_count": Number(KEY_DELIVERY_COUNT, minimum=1),
            "error_message": Text(KIP1191_MESSAGE, MAX_ERROR_MESSAGE_BYTES),
        },
    ),
    Convention(  # the Java client's retry letter topic (RetryMessageUtil)
        ContextFormat.JAVA_RETRY,
        markers=frozenset({RECONSUMETIMES, RETRY_TOPIC, DELAY_TIME}),
        requires=frozenset({REAL_TOPIC}),
        fields=_RETRIED,
    ),
    Convention(  # TDMQ for Pulsar's retry topic: no REAL_TOPIC
        ContextFormat.TDMQ,
        markers=frozenset({RECONSUMETIMES, RETRY_TOPIC}),
        fields=_RETRIED,
    ),
    Convention(  # the official clients' DeadLetterPolicy / ConsumerDeadLetterPolicy
        ContextFormat.PULSAR_DLQ_POLICY,
        markers=frozenset({REAL_TOPIC, ORIGIN_MESSAGE_ID, LEGACY_ORIGIN_MESSAGE_ID}),
        fields={**_PULSAR_ORIGIN, "reason": Const(REASON_MAX_REDELIVERIES)},
    ),
)

#: What a field is when the message's convention gives nothing for it (other fields: ``None``).
FIELD_DEFAULTS: Mapping[str, Any] = {"reason": REASON_UNKNOWN}


def _origin_claims() -> tuple[Claim, ...]:
    """One claim per topic key, in table order (a shared key reads the id the first way that gives one)."""
    readers: dict[str, dict[Reader, None]] = {}
    for c in CONVENTIONS:
        claim = c.claim or Claim(c.fields["origin_topic"].keys[0], c.fields["origin_message_id"])
        readers.setdefault(claim.topic_key, {})[claim.message_id] = None
    return tuple(Claim(key, first(*found)) for key, found in readers.items())


#: The origin claims a message can make, in precedence order (see ``context.origin_claims``).
ORIGIN_CLAIMS: tuple[Claim, ...] = _origin_claims()
#: Property keys that name the origin topic, one per claim.
ORIGIN_TOPIC_KEYS: tuple[str, ...] = tuple(claim.topic_key for claim in ORIGIN_CLAIMS)
#: Every property the origin claims read: a message's origin identity depends on these alone.
ORIGIN_PROPERTY_KEYS: tuple[str, ...] = tuple(
    dict.fromkeys(key for claim in ORIGIN_CLAIMS for key in (claim.topic_key, *claim.message_id.keys))
)
#: Every property key a convention marks, requires or reads.
PROPERTY_KEYS: tuple[str, ...] = tuple(dict.fromkeys(key for c in CONVENTIONS for key in c.keys))
#: Keys a republish strips: every key of :data:`PROPERTY_KEYS` and every key under a namespace.
BOOKKEEPING_PREFIXES: tuple[str, ...] = tuple(dict.fromkeys(c.namespace for c in CONVENTIONS if c.namespace))
BOOKKEEPING_KEYS: frozenset[str] = frozenset(PROPERTY_KEYS)
