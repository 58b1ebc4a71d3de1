"""Republish final rows to their origin topics from ``df.mapInArrow``, every send confirmed.

Input rows (columns :data:`REPUBLISH_INPUT_COLUMNS`) are already final: lineage properties added and
DLQ bookkeeping removed by the pipeline. Rows arrive sorted by ``(producer_name, sequence_id)`` and all
rows of one ``producer_name`` are in the same Spark partition. Each ``producer_name`` gets one producer
with that name, and every message carries its explicit ``sequence_id``, so Apache Pulsar with broker
deduplication drops what an earlier attempt already persisted (its receipt then has ledger -1).

Sends are batched and asynchronous (``block_if_queue_full=True``). Each input batch's columns become
Python values once, its rows are grouped by producer (each group in row order, its sequence order) and
sent group by group, each with a callback that only records its receipt; then the producers are flushed
and the receipt of every row is checked before its result is emitted (its message id text is turned
into ``ledger:entry:partition:batch_index`` for the whole batch at once). After the first failed send of
a producer, its remaining rows are not sent (reported with an error), so a retry resends them in order.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf, get_client
from spark_apps.dlq_replay.pulsar_io.errors import PublishError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

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
_RECEIPT_POLL_S = 0.005
#: The client's text of a message id, ``(ledger,entry,partition,batch_index)``.
_ID_TEXT = r"^\(-?[0-9]+,-?[0-9]+,-?[0-9]+,-?[0-9]+\)$"


@dataclass
class _ProducerState:
    """One named producer of this task and the receipts of its sends, in send order."""

    name: str
    target: str
    producer: Any = None
    error: str | None = None  # first failure: later rows of this producer are not sent
    rows: list[int] = field(default_factory=list)  # row indexes sent since the last confirmation
    receipts: list[tuple[Any, Any]] = field(default_factory=list)  # (result, message id) per send

    def callbacks(self) -> tuple[Callable[[Any, Any], None], Callable[[Any, Any], None]]:
        """Start a round of sends: fresh receipts, and the send callbacks that fill them (the first
        send's callback also keeps its thread's Python state, see :func:`_keep_thread_state`).

        Pulsar completes the sends of one producer in send order, on a client thread, so the k-th
        receipt is the k-th send's. A round gets its own list: a receipt that arrives after its round
        gave up waiting cannot be taken for a later send's.
        """
        receipts: list[tuple[Any, Any]] = []
        self.receipts = receipts
        record = receipts.append

        def on_sent(result: Any, msg_id: Any) -> None:
            record((result, msg_id))

        def on_first_sent(result: Any, msg_id: Any) -> None:
            record((result, msg_id))
            _keep_thread_state()

        return on_first_sent, on_sent


#: ``(pid, thread id)`` of the client threads whose Python thread state is kept.
_KEPT_THREADS: set[tuple[int, int]] = set()


def _keep_thread_state() -> None:
    """Keep the Python thread state of the client thread running this send callback.

    The client calls send callbacks from its own C++ threads. Such a thread has no Python thread state
    of its own, so every callback made one and threw it away again when it released the GIL: a thread
    state, a frame stack mapped and unmapped, per message sent (most of the system CPU of a send).
    One ``PyGILState_Ensure`` that is never released, the C API's way for a foreign thread that calls
    into Python again and again, keeps that state for the life of the thread (measured: about a quarter
    less CPU per message sent). Runs under the GIL; only where the state running it is the thread's own
    (``PyGILState_Check``), where ``PyGILState_Ensure`` just counts one more use of it.
    """
    thread = (os.getpid(), threading.get_ident())
    if thread in _KEPT_THREADS:
        return
    _KEPT_THREADS.add(thread)
    if sys.implementation.name == "cpython":
        from ctypes import pythonapi

        if pythonapi.PyGILState_Check():
            pythonapi.PyGILState_Ensure()


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
    import pyarrow.compute as pc

    if pa.types.is_null(column.type):
        return [None] * len(column)
    if not pa.types.is_timestamp(column.type):
        raise PublishError(f"republish column event_time must be a timestamp; got {column.type}")
    raw = column.cast(pa.int64())
    unit = column.type.unit
    if unit == "ms":
        return raw.to_pylist()
    if unit == "s":
        return pc.multiply_checked(raw, 1000).to_pylist()
    per_ms = 1000 if unit == "us" else 1_000_000
    lowest = pc.min(raw).as_py()
    if lowest is None or lowest >= 0:  # Arrow's integer division truncates: the floor from 0 up
        return pc.divide(raw, per_ms).to_pylist()
    return [None if v is None else v // per_ms for v in raw.to_pylist()]


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
    spans = zip(offsets, islice(offsets, 1, None), strict=False)  # (start, end) of each row's entries
    out: list[dict[str, str] | None]
    if column.items.null_count:  # a property without a value is left out
        out = [{k: v for k, v in zip(keys[s:e], values[s:e], strict=True) if v is not None} for s, e in spans]
    else:
        out = [dict(zip(keys[s:e], values[s:e], strict=True)) for s, e in spans]
    if column.null_count:
        for i, valid in enumerate(column.is_valid().to_pylist()):
            if not valid:
                out[i] = None
    return out


def _by_producer(batch: Any, errors: list[str | None]) -> dict[tuple[str, str], list[int]]:
    """The rows to send of each ``(producer_name, target_topic)``, in row order; a row lacking what a
    send needs gets its error instead."""
    import pyarrow.compute as pc

    groups: dict[tuple[str, str], list[int]] = {}
    names, targets = batch.column("producer_name").to_pylist(), batch.column("target_topic").to_pylist()
    for i, key in enumerate(zip(names, targets, strict=True)):
        rows = groups.get(key)
        if rows is None:
            rows = groups[key] = []
        rows.append(i)
    lacking = "row lacks producer_name, target_topic, sequence_id or value; not sent"
    for key in [key for key in groups if not key[0] or not key[1]]:
        for i in groups.pop(key):
            errors[i] = lacking
    sequences, values = batch.column("sequence_id"), batch.column("value")
    if sequences.null_count or values.null_count:
        complete = pc.and_(sequences.is_valid(), values.is_valid()).to_pylist()
        for key, rows in groups.items():
            for i in rows:
                if not complete[i]:
                    errors[i] = lacking
            groups[key] = [i for i in rows if complete[i]]
    return {key: rows for key, rows in groups.items() if rows}


def _id_texts(ids: list[str | None]) -> Any:
    """``ledger:entry:partition:batch_index`` from the client's text of each message id,
    ``(ledger,entry,partition,batch_index)``; None when one does not read so."""
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = pa.array(ids, pa.string())
    if texts.null_count == len(texts):
        return texts
    if not pc.all(pc.match_substring_regex(texts, _ID_TEXT)).as_py():
        return None
    return pc.replace_substring(pc.utf8_slice_codeunits(texts, 1, -1), ",", ":")


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
        import pyarrow as pa

        _check_columns(batch.schema.names)
        n = batch.num_rows
        message_ids: list[str | None] = [None] * n  # the client's text of each confirmed send's id
        errors: list[str | None] = [None] * n
        groups = [(self._producer(*key), rows) for key, rows in _by_producer(batch, errors).items()]
        sending = [(state, rows) for state, rows in groups if state.error is None]
        for state, rows in groups:
            if state.error is not None:
                error = f"not sent: {state.error}"
                for i in rows:
                    errors[i] = error
        if sending:
            col = batch.column
            columns = (
                col("sequence_id").to_pylist(),
                col("value").to_pylist(),
                _properties(col("properties")),
                col("key").to_pylist(),
                col("ordering_key").to_pylist(),
                _epoch_ms(col("event_time")),
            )
            for state, rows in sending:
                self._send(state, rows, *columns)
            ids = self._confirm([state for state, _ in sending], message_ids, errors)
        else:
            ids = pa.nulls(n, pa.string())
        replay_ids = batch.column("replay_id")
        if replay_ids.type != pa.string():
            replay_ids = replay_ids.cast(pa.string())
        return pa.RecordBatch.from_arrays(
            [replay_ids, ids.is_valid(), ids, pa.array(errors, pa.string())],
            names=["replay_id", "published", "published_message_id", "error"],
        )

    def _send(
        self,
        state: _ProducerState,
        rows: list[int],
        sequences: list[int],
        values: list[bytes],
        props: list[dict[str, str] | None],
        keys: list[str | None],
        ordering: list[str | None],
        events: list[int | None],
    ) -> None:
        """Send ``rows`` with ``state``'s producer, in order, each with its callback."""
        import _pulsar

        new_builder = _pulsar.MessageBuilder
        send = state.producer._producer.send_async
        wait = self.limiter.wait if self.limiter.rate is not None else None
        callback, on_sent = state.callbacks()
        state.rows = rows
        for i in rows:
            builder = new_builder()
            builder.content(values[i])
            # Raw builder: pulsar.Producer.send_async ignores sequence_id 0, which would let the client
            # pick another id and defeat broker deduplication.
            builder.sequence_id(sequences[i])
            properties = props[i]
            if properties:
                builder.properties(properties)
            key = keys[i]
            if key:
                builder.partition_key(key)
            ordering_key = ordering[i]
            if ordering_key:
                builder.ordering_key(ordering_key)
            event_ms = events[i]
            if event_ms:
                builder.event_timestamp(event_ms)
            if wait is not None:
                wait()
            send(builder.build(), callback)
            callback = on_sent

    def _confirm(
        self, active: list[_ProducerState], message_ids: list[str | None], errors: list[str | None]
    ) -> Any:
        """Wait for the receipts of the round's sends and note each row's outcome: the
        ``published_message_id`` column (null where the row was not published)."""
        import _pulsar
        import pyarrow as pa

        for state in active:
            try:
                state.producer.flush()
            except Exception as exc:  # the per-message receipts below carry the cause
                log.warning("flush of producer %s failed: %s", state.name, type(exc).__name__)
        # A flush returns once its producer's earlier sends completed, callbacks included: the receipts
        # are normally all in by now. Otherwise wait for them, up to the send timeout and a grace.
        deadline = time.monotonic() + self.send_timeout_ms / 1000 + _CONFIRM_GRACE_S
        ok = _pulsar.Result.Ok.value
        confirmed: list[tuple[list[int], list[tuple[Any, Any]]]] = []
        for state in active:
            rows = state.rows
            while len(state.receipts) < len(rows) and time.monotonic() < deadline:
                time.sleep(_RECEIPT_POLL_S)
            receipts = state.receipts[: len(rows)]  # a receipt arriving from now on is not counted
            state.rows, state.receipts = [], []
            confirmed.append((rows, receipts))
            if len(receipts) == len(rows) and [result.value for result, _ in receipts].count(ok) == len(rows):
                for row, (_, msg_id) in zip(rows, receipts, strict=True):
                    message_ids[row] = str(msg_id)
                self.sent += len(rows)
                continue
            if len(receipts) < len(rows):
                log.warning("producer %s: %d sends unconfirmed", state.name, len(rows) - len(receipts))
            for pos, row in enumerate(rows):
                if pos >= len(receipts):
                    errors[row] = f"send not confirmed within {self.send_timeout_ms} ms"
                    state.error = state.error or errors[row]
                    self.failed += 1
                    continue
                result, msg_id = receipts[pos]
                if result.value == ok:
                    message_ids[row] = str(msg_id)
                    self.sent += 1
                else:
                    errors[row] = f"send failed: {result}"
                    state.error = state.error or f"an earlier send failed ({result})"
                    self.failed += 1
        texts = _id_texts(message_ids)
        if texts is not None:
            return texts
        for rows, receipts in confirmed:  # not the client's usual text of an id: ask each id its parts
            for row, (_, msg_id) in zip(rows, receipts, strict=False):
                if message_ids[row] is not None:
                    message_ids[row] = (
                        f"{msg_id.ledger_id()}:{msg_id.entry_id()}:{msg_id.partition()}:{msg_id.batch_index()}"
                    )
        return pa.array(message_ids, pa.string())

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
