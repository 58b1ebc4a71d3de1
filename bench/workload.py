"""The benchmark workload: N DLQ messages over 4 origin topics and 20 error signatures.

Everything every contender needs to agree on lives here, once: topic names, the 20 signatures and
what the playbook does with each (16 republish after a fix, 4 archive: 80% / 20%), the 1 KiB JSON
payloads, the DLQ context properties (written with the consumer library's own
:func:`~pulsar_dlq_consumer.context.build_context_properties`) and the counts a correct
run must end with. The fix itself is in :mod:`bench.bench_fixes`.

Message ``i`` has signature ``i % 20``; signature ``k`` fails on origin topic ``k % 4``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pulsar_dlq_consumer.context import (
    KEY_EXCEPTION_CLASS,
    KEY_EXCEPTION_STACKTRACE,
    REAL_TOPIC,
    build_context_properties,
)

NAMESPACE = "bench/orders"
ORIGIN_COUNT = 4
ORIGIN_SUBSCRIPTION = "billing"
#: The durable subscription every contender drains the DLQs through (the replay app's default).
DLQ_SUBSCRIPTION = "dlq-replayer"
#: Subscription created on the origin topics before a run, so republished messages are retained
#: (on Apache Pulsar a topic without subscriptions keeps nothing) and can be counted afterwards.
VERIFY_SUBSCRIPTION = "bench-verify"
PAYLOAD_BYTES = 1024
REPUBLISH = "republish"
ARCHIVE = "archive"
#: Application properties the failed message carried before it was dead-lettered.
APP_PROPERTIES = {"tenant": "acme", "schema": "order.v1"}
#: Fixed base for synthetic clocks, so a data set is the same in every run.
EPOCH_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def origin_topic(index: int) -> str:
    """The origin (business) topic number ``index``."""
    return f"persistent://{NAMESPACE}/orders-{index}"


def dlq_topic(index: int) -> str:
    """The DLQ of origin ``index``, named by the Pulsar convention ``<topic>-<subscription>-DLQ``."""
    return f"{origin_topic(index)}-{ORIGIN_SUBSCRIPTION}-DLQ"


ORIGIN_TOPICS: tuple[str, ...] = tuple(origin_topic(i) for i in range(ORIGIN_COUNT))
DLQ_TOPICS: tuple[str, ...] = tuple(dlq_topic(i) for i in range(ORIGIN_COUNT))
#: Regex allowlist for the replay app (``re:`` prefix): the origin topics and nothing else.
ORIGIN_ALLOWLIST = "re:^persistent://bench/orders/orders-[0-9]+$"


@dataclass(frozen=True)
class Signature:
    """One error signature: exception class, message template, origin and the playbook's action."""

    index: int
    error_class: str
    template: str
    action: str

    @property
    def origin(self) -> str:
        return origin_topic(self.index % ORIGIN_COUNT)

    @property
    def dlq(self) -> str:
        return dlq_topic(self.index % ORIGIN_COUNT)


_R, _A = REPUBLISH, ARCHIVE
_SPECS: tuple[tuple[str, str, str], ...] = (
    ("orders.errors.InvalidAmount", "amount '{amount}' is not a decimal number (order {order})", _R),
    ("orders.errors.MissingCurrency", "field currency is missing in order {order}", _R),
    ("ValueError", "could not convert string to float: '{amount}'", _R),
    ("KeyError", "currency key not found for customer {customer}", _R),
    ("orders.errors.SchemaVersionError", "schema version 1 is no longer accepted for order {order}", _R),
    ("orders.errors.PricingTimeout", "pricing service timed out after {ms} ms for order {order}", _R),
    ("orders.errors.TaxLookupFailed", "tax lookup failed for region {region} on order {order}", _R),
    ("orders.errors.InventoryUnavailable", "inventory service unavailable (attempt {n}) for sku {sku}", _R),
    ("psycopg.errors.DeadlockDetected", "deadlock detected while updating order {order}", _R),
    ("orders.errors.DuplicateCheckFailed", "duplicate check failed for event {event}", _R),
    ("requests.exceptions.ConnectionError", "connection reset calling payments for order {order}", _R),
    ("orders.errors.FxRateMissing", "no FX rate for '{currency}' on day {day}", _R),
    ("json.decoder.JSONDecodeError", "Expecting property name: line 1 column {n} (char {ms})", _R),
    ("orders.errors.AddressValidation", "postcode {n} does not match country for customer {customer}", _R),
    ("TimeoutError", "ledger write timed out after {ms} ms", _R),
    ("orders.errors.RateLimited", "rate limited by fulfilment API, retry after {n} s", _R),
    ("orders.errors.CustomerDeleted", "customer {customer} was deleted (GDPR erasure)", _A),
    ("orders.errors.UnknownSku", "sku {sku} does not exist in the catalogue", _A),
    ("orders.errors.FraudSuspected", "order {order} blocked by fraud rule {n}", _A),
    ("orders.errors.OrderCancelled", "order {order} was cancelled before fulfilment", _A),
)

SIGNATURES: tuple[Signature, ...] = tuple(
    Signature(index, cls, template, action) for index, (cls, template, action) in enumerate(_SPECS)
)
SIGNATURE_COUNT = len(SIGNATURES)
ARCHIVE_CLASSES: frozenset[str] = frozenset(s.error_class for s in SIGNATURES if s.action == ARCHIVE)


def signature_of(i: int) -> Signature:
    """The signature of message ``i``."""
    return SIGNATURES[i % SIGNATURE_COUNT]


@dataclass(frozen=True)
class Expected:
    """What a correct replay of ``n`` messages ends with."""

    total: int
    republish: int
    archive: int
    per_origin: dict[str, int]


def expected_counts(n: int) -> Expected:
    """Exact outcome counts for a data set of ``n`` messages (no sampling, no rounding)."""
    if n < 0:
        raise ValueError(f"the number of messages must be >= 0; got {n}")
    full, rest = divmod(n, SIGNATURE_COUNT)
    per_sig = [full + (1 if k < rest else 0) for k in range(SIGNATURE_COUNT)]
    per_origin = dict.fromkeys(ORIGIN_TOPICS, 0)
    for sig, count in zip(SIGNATURES, per_sig, strict=True):
        if sig.action == REPUBLISH:
            per_origin[sig.origin] += count
    republish = sum(per_origin.values())
    return Expected(total=n, republish=republish, archive=n - republish, per_origin=per_origin)


def backlog_per_dlq(n: int) -> dict[str, int]:
    """How many of the ``n`` messages each DLQ topic holds (what topic stats would tell a user)."""
    full, rest = divmod(n, SIGNATURE_COUNT)
    counts = dict.fromkeys(DLQ_TOPICS, 0)
    for sig in SIGNATURES:
        counts[sig.dlq] += full + (1 if sig.index < rest else 0)
    return counts


# --------------------------------------------------------------------------- payloads and properties


def _fields(i: int) -> dict[str, Any]:
    order = 1_000_000 + i
    return {
        "order": order,
        "amount": f"{(i * 37) % 100_000 // 100},{i % 100:02d}",
        "customer": f"c-{i % 50_000:05d}",
        "sku": f"SKU-{i % 9_973:05d}",
        "ms": 500 + i % 4_500,
        "region": f"EU-{i % 27:02d}",
        "n": 1 + i % 9,
        "event": f"evt-{i:09d}",
        "currency": ("PLN", "HUF", "SEK")[i % 3],
        "day": 1 + i % 28,
    }


def make_payload(i: int) -> bytes:
    """A JSON order of exactly :data:`PAYLOAD_BYTES` bytes, as it failed: the amount is a string
    with a decimal comma and the currency is missing (what the fix repairs)."""
    f = _fields(i)
    doc: dict[str, Any] = {
        "event_id": i,
        "order_id": f["order"],
        "customer": f["customer"],
        "amount": f["amount"],
        "items": [
            {"sku": f["sku"], "qty": 1 + i % 5, "price": f["amount"]},
            {"sku": f"SKU-{(i * 7) % 9_973:05d}", "qty": 1, "price": "0,99"},
        ],
        "created_at_ms": EPOCH_MS + i,
        "channel": ("web", "app", "pos")[i % 3],
        "note": "",
    }
    raw = json.dumps(doc, separators=(",", ":"))
    pad = PAYLOAD_BYTES - len(raw.encode())
    if pad < 0:  # pragma: no cover - guarded by a unit test on the largest index
        raise ValueError(f"payload {i} is {len(raw)} bytes before padding; shorten make_payload()")
    doc["note"] = "x" * pad
    return json.dumps(doc, separators=(",", ":")).encode()


def _stack_trace(sig: Signature) -> str:
    """A short stack trace of the kind our consumer library records (same text per signature)."""
    return (
        "Traceback (most recent call last):\n"
        '  File "/app/orders/consumer.py", line 88, in handle\n'
        "    billing.process(order)\n"
        f'  File "/app/orders/billing.py", line {100 + sig.index}, in process\n'
        f"    raise {sig.error_class.rpartition('.')[2]}(...)\n"
        f"{sig.error_class}: {sig.template}\n"
    )


def _exception_type(qualified: str) -> type[Exception]:
    module, _, name = qualified.rpartition(".")
    return type(name, (Exception,), {"__module__": module or "builtins"})


_EXCEPTION_TYPES: dict[str, type[Exception]] = {
    s.error_class: _exception_type(s.error_class) for s in SIGNATURES
}
_STACKS: tuple[str, ...] = tuple(_stack_trace(s) for s in SIGNATURES)


def make_properties(i: int) -> dict[str, str]:
    """The properties our consumer library writes when it dead-letters message ``i`` (plus the
    application's own properties, which a replay must keep)."""
    sig = signature_of(i)
    error = _EXCEPTION_TYPES[sig.error_class](sig.template.format(**_fields(i)))
    props = dict(APP_PROPERTIES)
    props.update(
        build_context_properties(
            origin_topic=sig.origin,
            origin_message_id=f"{7 + i // 50_000}:{i % 50_000}:-1:0",
            subscription=ORIGIN_SUBSCRIPTION,
            reason="max-redeliveries" if i % 2 else "term",
            delivery_count=1 + i % 4,
            error=error,
            consumer=f"billing-worker-{i % 3}",
            failed_at=EPOCH_MS + 60_000 + i,
        )
    )
    props[KEY_EXCEPTION_STACKTRACE] = _STACKS[sig.index]
    return props


@dataclass(frozen=True)
class DlqMessage:
    """One generated DLQ message, ready to produce."""

    index: int
    dlq_topic: str
    payload: bytes
    properties: dict[str, str]
    partition_key: str
    event_timestamp: int


def generate(n: int) -> Iterator[DlqMessage]:
    """Yield the ``n`` DLQ messages of the data set, deterministically."""
    for i in range(n):
        sig = signature_of(i)
        yield DlqMessage(
            index=i,
            dlq_topic=sig.dlq,
            payload=make_payload(i),
            properties=make_properties(i),
            partition_key=f"order-{1_000_000 + i}",
            event_timestamp=EPOCH_MS + i,
        )


# --------------------------------------------------------------------------- decide and fix


def decide(properties: dict[str, str]) -> str:
    """The playbook as a hand-written script would code it: archive four error classes, republish
    the rest."""
    return ARCHIVE if properties.get(KEY_EXCEPTION_CLASS) in ARCHIVE_CLASSES else REPUBLISH


def origin_of(properties: dict[str, str]) -> str:
    """Origin topic named by a DLQ message (the Pulsar standard key)."""
    return properties[REAL_TOPIC]
