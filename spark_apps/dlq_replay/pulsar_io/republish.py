"""Republish final rows to their origin topics from ``df.mapInArrow``, every send confirmed.

Input rows (columns :data:`REPUBLISH_INPUT_COLUMNS`) are already final: lineage properties added and
DLQ bookkeeping removed by the pipeline. Rows arrive sorted by ``(producer_name, sequence_id)`` and all
rows of one ``producer_name`` are in the same Spark partition. Each ``producer_name`` gets one producer
with that name, and every message carries its explicit ``sequence_id``, so Apache Pulsar with broker
deduplication drops what an earlier attempt already persisted (its receipt then has ledger -1).

Sends are batched and asynchronous (``block_if_queue_full=True``); after each input batch the producers
are flushed and the send receipt of every row is checked before its result is emitted. After the first
failed send of a producer, its remaining rows are not sent (reported with an error), so a retry resends
them in order.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf, get_client
from spark_apps.dlq_replay.pulsar_io.errors import PublishError

if TYPE_CHECKING:
    from collections.abc import Iterator

log = logging.getLogger(__name__)

REPUBLISH_INPUT_COLUMNS = (
    "replay_id",
    "target_topic",
    "producer_name",
    "sequence_id",
    "value",
    "key",
    "ordering_key",
    "event_time",
    "properties",
)
REPUBLISH_INPUT_SCHEMA = (
    "replay_id string, target_topic string, producer_name string, sequence_id long, value binary, "
    "key string, ordering_key string, event_time timestamp, properties map<string,string>"
)
REPUBLISH_RESULT_SCHEMA = "replay_id string, published boolean, published_message_id string, error string"

_CONFIRM_GRACE_S = 10.0
#: Producer creation is retried this long when the broker is unreachable or not ready (a broker
#: restart, a topic moving between brokers, the old connection of a killed task still holding the
#: producer name); other errors (authorisation, invalid topic) fail at once.
CREATE_RETRY_S = 90.0
_TRANSIENT_CREATE_ERRORS = frozenset(
    {
        "ConnectError",
        "Timeout",
        "ServiceUnitNotReady",
        "BrokerPersistenceError",
        "BrokerMetadataError",
        "ProducerBusy",
        "TooManyLookupRequestException",
        "LookupError",
        "NotConnected",
    }
)
_UNKNOWN = 1 << 62


@dataclass
class _ProducerState:
    """One named producer of this task and the receipts of its sends, in send order."""

    name: str
    target: str
    producer: Any = None
    error: str | None = None  # first failure: later rows of this producer are not sent
    rows: list[int] = field(default_factory=list)  # row indexes sent since the last confirmation
    receipts: list[tuple[Any, Any]] = field(default_factory=list)
    expected: int = _UNKNOWN
    done: threading.Event = field(default_factory=threading.Event)

    def on_sent(self, result: Any, msg_id: Any) -> None:
        # Called on a client thread; Pulsar completes the sends of one producer in send order.
        self.receipts.append((result, msg_id))
        if len(self.receipts) >= self.expected:
            self.done.set()

    def expect(self) -> None:
        """All rows of this round are sent: wake the waiter once every receipt is in."""
        self.expected = len(self.rows)
        if len(self.receipts) >= self.expected:
            self.done.set()


class _RateLimiter:
    def __init__(self, rate_per_s: float | None) -> None:
        if rate_per_s is not None and rate_per_s <= 0:
            raise PublishError(f"rate_limit_per_s must be > 0 or None; got {rate_per_s}")
        self.rate = rate_per_s
        self.started = time.monotonic()
        self.count = 0

    def wait(self) -> None:
        if self.rate is None:
            return
        self.count += 1
        due = self.started + self.count / self.rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def _check_columns(names: list[str]) -> None:
    missing = [c for c in REPUBLISH_INPUT_COLUMNS if c not in names]
    if missing:
        raise PublishError(
            f"republish input lacks columns {missing}; select exactly {REPUBLISH_INPUT_SCHEMA} "
            "before mapInArrow(republish_batches, REPUBLISH_RESULT_SCHEMA)"
        )


def _epoch_ms(column: Any) -> list[int | None]:
    import pyarrow as pa

    if pa.types.is_null(column.type):
        return [None] * len(column)
    if not pa.types.is_timestamp(column.type):
        raise PublishError(f"republish column event_time must be a timestamp; got {column.type}")
    per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[column.type.unit]
    raw = column.cast(pa.int64()).to_pylist()
    if per_ms is None:
        return [None if v is None else v * 1000 for v in raw]
    return [None if v is None else v // per_ms for v in raw]


def _properties(column: Any) -> list[dict[str, str] | None]:
    import pyarrow as pa

    if pa.types.is_null(column.type):
        return [None] * len(column)
    if not pa.types.is_map(column.type):
        raise PublishError(f"republish column properties must be a map<string,string>; got {column.type}")
    # offsets index the unsliced key/item children, also for a sliced column
    offsets = column.offsets.to_pylist()
    keys = column.keys.to_pylist()
    values = column.items.to_pylist()
    valid = column.is_valid().to_pylist()
    out: list[dict[str, str] | None] = []
    for i, ok in enumerate(valid):
        if not ok:
            out.append(None)
            continue
        start, end = offsets[i], offsets[i + 1]
        out.append({k: v for k, v in zip(keys[start:end], values[start:end], strict=True) if v is not None})
    return out


class _Publisher:
    """Owns the producers of one task and turns input batches into result batches."""

    def __init__(self, conf: PulsarConf, rate_limit_per_s: float | None, send_timeout_ms: int) -> None:
        if send_timeout_ms <= 0:
            raise PublishError(f"send_timeout_ms must be > 0; got {send_timeout_ms}")
        self.client = get_client(conf)
        self.limiter = _RateLimiter(rate_limit_per_s)
        self.send_timeout_ms = int(send_timeout_ms)
        self.producers: dict[str, _ProducerState] = {}
        self.sent = 0
        self.failed = 0

    def _producer(self, name: str, target: str) -> _ProducerState:
        state = self.producers.get(name)
        if state is not None:
            if state.target != target:
                raise PublishError(
                    f"producer_name {name!r} is used for two target topics ({state.target!r} and "
                    f"{target!r}); give each (target topic, bucket) its own producer name"
                )
            return state
        import pulsar

        state = _ProducerState(name=name, target=target)
        deadline = time.monotonic() + CREATE_RETRY_S
        pause = 0.5
        while True:
            try:
                state.producer = self.client.create_producer(
                    target,
                    producer_name=name,
                    send_timeout_millis=self.send_timeout_ms,
                    block_if_queue_full=True,
                    batching_enabled=True,
                    batching_max_messages=1000,
                    batching_max_publish_delay_ms=5,
                    max_pending_messages=5000,
                )
                break
            except pulsar.PulsarException as exc:
                reason = f"{type(exc).__name__}: {exc}"
                if type(exc).__name__ in _TRANSIENT_CREATE_ERRORS and time.monotonic() + pause < deadline:
                    log.info("producer %r on %r: %s; retrying in %.1f s", name, target, reason, pause)
                    time.sleep(pause)
                    pause = min(pause * 2, 5.0)
                    continue
                state.error = f"cannot create producer {name!r} on {target!r}: {reason}"
                log.warning("%s", state.error)
                break
        self.producers[name] = state
        return state

    def publish(self, batch: Any) -> Any:
        import _pulsar
        import pyarrow as pa

        _check_columns(batch.schema.names)
        n = batch.num_rows
        col = batch.column
        replay_ids = col("replay_id").to_pylist()
        targets = col("target_topic").to_pylist()
        names = col("producer_name").to_pylist()
        sequences = col("sequence_id").to_pylist()
        values = col("value").to_pylist()
        keys = col("key").to_pylist()
        ordering = col("ordering_key").to_pylist()
        events = _epoch_ms(col("event_time"))
        props = _properties(col("properties"))

        published: list[bool] = [False] * n
        message_ids: list[str | None] = [None] * n
        errors: list[str | None] = [None] * n
        active: list[_ProducerState] = []
        for i in range(n):
            name, target, seq = names[i], targets[i], sequences[i]
            if not name or not target or seq is None or values[i] is None:
                errors[i] = "row lacks producer_name, target_topic, sequence_id or value; not sent"
                continue
            state = self._producer(name, target)
            if state.error is not None:
                errors[i] = f"not sent: {state.error}"
                continue
            builder = _pulsar.MessageBuilder()
            builder.content(values[i])
            # Raw builder: pulsar.Producer.send_async ignores sequence_id 0, which would let the client
            # pick another id and defeat broker deduplication.
            builder.sequence_id(int(seq))
            if props[i]:
                builder.properties(props[i])
            if keys[i]:
                builder.partition_key(keys[i])
            if ordering[i]:
                builder.ordering_key(ordering[i])
            event_ms = events[i]
            if event_ms:
                builder.event_timestamp(event_ms)
            self.limiter.wait()
            if not state.rows:
                state.done.clear()
                state.expected = _UNKNOWN
                active.append(state)
            state.rows.append(i)
            state.producer._producer.send_async(builder.build(), state.on_sent)

        self._confirm(active, published, message_ids, errors)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(replay_ids, pa.string()),
                pa.array(published, pa.bool_()),
                pa.array(message_ids, pa.string()),
                pa.array(errors, pa.string()),
            ],
            names=["replay_id", "published", "published_message_id", "error"],
        )

    def _confirm(
        self,
        active: list[_ProducerState],
        published: list[bool],
        message_ids: list[str | None],
        errors: list[str | None],
    ) -> None:
        import _pulsar

        for state in active:
            try:
                state.producer.flush()
            except Exception as exc:  # the per-message receipts below carry the cause
                log.warning("flush of producer %s failed: %s", state.name, type(exc).__name__)
        deadline = time.monotonic() + self.send_timeout_ms / 1000 + _CONFIRM_GRACE_S
        for state in active:
            state.expect()
            if not state.done.wait(max(0.0, deadline - time.monotonic())):
                missing = len(state.rows) - len(state.receipts)
                log.warning("producer %s: %d sends unconfirmed", state.name, missing)
            receipts = list(state.receipts)
            for pos, row in enumerate(state.rows):
                if pos >= len(receipts):
                    errors[row] = f"send not confirmed within {self.send_timeout_ms} ms"
                    state.error = state.error or errors[row]
                    continue
                result, msg_id = receipts[pos]
                if result == _pulsar.Result.Ok:
                    published[row] = True
                    message_ids[row] = (
                        f"{msg_id.ledger_id()}:{msg_id.entry_id()}:{msg_id.partition()}:{msg_id.batch_index()}"
                    )
                else:
                    errors[row] = f"send failed: {result}"
                    state.error = state.error or f"an earlier send failed ({result})"
            self.sent += sum(1 for row in state.rows if published[row])
            self.failed += sum(1 for row in state.rows if not published[row])
            state.rows = []
            state.receipts = []
            state.expected = _UNKNOWN

    def close(self) -> None:
        for state in self.producers.values():
            if state.producer is not None:
                try:
                    state.producer.close()
                except Exception as exc:
                    log.warning("closing producer %s failed: %s", state.name, type(exc).__name__)
        log.info(
            "republished %d messages with %d producers; %d not published",
            self.sent,
            len(self.producers),
            self.failed,
        )


def republish_batches(
    batches: Iterator[Any],
    *,
    conf: PulsarConf,
    rate_limit_per_s: float | None = None,
    send_timeout_ms: int = 30000,
) -> Iterator[Any]:
    """Publish every row and yield one result row per input row (:data:`REPUBLISH_RESULT_SCHEMA`).

    ``published`` is true once the broker confirmed the send; ``published_message_id`` is its
    readable id (ledger -1 when a deduplicating broker dropped it as already persisted). ``error``
    says why a row was not published. ``rate_limit_per_s`` applies per Spark task.

    Use with ``functools.partial``::

        df.mapInArrow(partial(republish_batches, conf=conf), REPUBLISH_RESULT_SCHEMA)
    """
    publisher = _Publisher(conf, rate_limit_per_s, send_timeout_ms)
    try:
        for batch in batches:
            if batch.num_rows:
                yield publisher.publish(batch)
    finally:
        publisher.close()
