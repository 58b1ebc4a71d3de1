"""Republish final rows to their origin topics from ``df.mapInArrow``, every send confirmed; batches are
cut alike on every attempt, so deduplication holds or drops a re-sent one whole (``docs/reliability.md``).
The publisher cuts them itself, one receipt each: a Python callback per message costs more than the send."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from itertools import count, islice
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf, get_client
from spark_apps.dlq_replay.pulsar_io.errors import RepublishError

if TYPE_CHECKING:
    from collections.abc import Iterator

log = logging.getLogger(__name__)

#: ``row``: the caller's number for the row, returned with its result (e.g. its place in a file).
REPUBLISH_INPUT_SCHEMA = (
    "replay_id string, target_topic string, producer_name string, sequence_id long, value binary, "
    "key string, ordering_key string, event_time timestamp, properties map<string,string>, row long"
)
REPUBLISH_INPUT_COLUMNS = tuple(part.split()[0] for part in REPUBLISH_INPUT_SCHEMA.split(", "))
REPUBLISH_RESULT_SCHEMA = (
    "replay_id string, published boolean, published_message_id string, error string, row long"
)

#: A producer's batches never span two blocks of this many sequence ids.
BATCH_BLOCK = 2000
#: Messages per batch at most; a block holds a whole number of full batches.
BATCH_MAX_MESSAGES = 1000
#: Payload bytes per batch: a batch ends with the message that reaches this, or before one that would
#: pass it (the client's own default cut); a larger message is a batch of its own.
BATCH_MAX_BYTES = 128 * 1024
#: The client's batch limit, beyond any batch the publisher cuts, so that only the publisher cuts them.
_CLIENT_BATCH_BYTES = 64 * 1024 * 1024
#: The client's batch timer, set beyond any run (a timer cuts batches differently on each attempt).
_NO_BATCH_TIMER_MS = 24 * 3600 * 1000
_CONFIRM_GRACE_S = 10.0
#: Producer creation is retried this long on these errors (broker restart, topic moving, a killed task's
#: connection still holding the producer name); others (authorisation, invalid topic) fail at once.
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


#: A row's result key: its replay id and row number.
_Key = tuple[str, int]
#: A row in a batch: its key, sequence id and message.
_Row = tuple[_Key, int, Any]


@dataclass
class _ProducerState:
    """One named producer of this task."""

    name: str
    target: str
    producer: Any = None
    #: The broker's last sequence id for this name when the producer was created (-1: none, or no
    #: deduplication): the first sequence id of the last batch an earlier attempt stored.
    held: int = -1
    error: str | None = None  # first failure: later rows of this producer are not sent
    block: int | None = None  # the block of sequence ids of the batch being filled
    batch: list[_Row] = field(default_factory=list)  # the open batch
    batch_bytes: int = 0


def _epoch_ms(column: Any) -> list[int | None]:
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_null(column.type):
        return [None] * len(column)
    if not pa.types.is_timestamp(column.type):
        raise RepublishError(f"republish column event_time must be a timestamp; got {column.type}")
    unit = column.type.unit
    if unit in ("s", "ms"):  # exact in milliseconds (a cast that overflows raises)
        return column.cast(pa.timestamp("ms", column.type.tz)).cast(pa.int64()).to_pylist()
    raw = column.cast(pa.int64())
    per_ms = 1000 if unit == "us" else 1_000_000
    lowest = pc.min(raw).as_py()
    if lowest is None or lowest >= 0:  # Arrow's integer division truncates: the floor from 0 up
        return pc.divide(raw, per_ms).to_pylist()
    return [None if v is None else v // per_ms for v in raw.to_pylist()]


def _properties(column: Any) -> list[dict[str, str] | None]:
    import numpy as np
    import pyarrow as pa

    if pa.types.is_null(column.type):
        return [None] * len(column)
    if not pa.types.is_map(column.type):
        raise RepublishError(f"republish column properties must be a map<string,string>; got {column.type}")
    # offsets index the unsliced key/item children, also for a sliced column
    offsets = column.offsets.to_pylist()
    # one Python str per distinct key (property names are few), indexed by the dictionary-encoded keys
    encoded = column.keys.dictionary_encode()
    keys = np.array(encoded.dictionary.to_pylist(), dtype=object)[encoded.indices.to_numpy()].tolist()
    values = column.items.to_pylist()
    spans = zip(offsets, islice(offsets, 1, None), strict=False)  # (start, end) of each row's entries
    out: list[dict[str, str] | None]
    if column.items.null_count:  # a property without a value is left out
        out = [{k: v for k, v in zip(keys[s:e], values[s:e], strict=True) if v is not None} for s, e in spans]
    else:
        out = [dict(zip(keys[s:e], values[s:e], strict=True)) for s, e in spans]
    if column.null_count:
        out = [row if valid else None for row, valid in zip(out, column.is_valid().to_pylist(), strict=True)]
    return out


def _by_producer(batch: Any, errors: list[str | None]) -> dict[tuple[str, str], list[int]]:
    """The rows of each ``(producer_name, target_topic)`` in order; an incomplete row gets an error."""
    import pyarrow.compute as pc

    groups: dict[tuple[str, str], list[int]] = {}
    names, targets = batch.column("producer_name").to_pylist(), batch.column("target_topic").to_pylist()
    for i, key in enumerate(zip(names, targets, strict=True)):
        groups.setdefault(key, []).append(i)
    lacking = "row lacks producer_name, target_topic, sequence_id or value; not sent"
    for key in [key for key in groups if not key[0] or not key[1]]:
        for i in groups.pop(key):
            errors[i] = lacking
    sequences, values = batch.column("sequence_id"), batch.column("value")
    if sequences.null_count or values.null_count:
        complete = pc.and_(sequences.is_valid(), values.is_valid()).to_pylist()
        for i in [i for i, ok in enumerate(complete) if not ok]:
            errors[i] = lacking
        groups = {key: [i for i in rows if complete[i]] for key, rows in groups.items()}
    return {key: rows for key, rows in groups.items() if rows}


class _Publisher:
    """The producers of one task; results come as receipts arrive, the rest from :meth:`finish`."""

    def __init__(self, conf: PulsarConf, rate_limit_per_s: float | None, send_timeout_ms: int) -> None:
        if send_timeout_ms <= 0:
            raise RepublishError(f"send_timeout_ms must be > 0; got {send_timeout_ms}")
        if rate_limit_per_s is not None and rate_limit_per_s <= 0:
            raise RepublishError(f"rate_limit_per_s must be > 0 or None; got {rate_limit_per_s}")
        self.client = get_client(conf)
        self.rate = rate_limit_per_s
        self.started = time.monotonic()
        self.send_timeout_ms = int(send_timeout_ms)
        self.producers: dict[str, _ProducerState] = {}
        self.awaiting: dict[int, tuple[list[_Row], _ProducerState]] = {}  # slot -> sent batch, no receipt yet
        self.receipts: dict[int, tuple[Any, Any]] = {}  # slot -> (result, last message's id), from the client
        self.slots = count()  # each sent batch's receipt slot
        self.next_row = 0  # sends so far (the rate limit's clock)
        # results ready to emit: (row key, message id text (None: not published), error)
        self.ready: list[tuple[_Key, str | None, str | None]] = []
        self.sent = 0
        self.failed = 0

    def _producer(self, name: str, target: str) -> _ProducerState:
        """The producer of ``name``, created on first use (a failure is kept in its ``error``)."""
        import pulsar

        state = self.producers.get(name)
        if state is not None:
            if state.target != target:
                raise RepublishError(
                    f"producer_name {name!r} is used for two target topics ({state.target!r} and "
                    f"{target!r}); give each (target topic, bucket) its own producer name"
                )
            return state
        state = self.producers[name] = _ProducerState(name=name, target=target)
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
                    batching_max_messages=BATCH_MAX_MESSAGES,
                    batching_max_allowed_size_in_bytes=_CLIENT_BATCH_BYTES,
                    batching_max_publish_delay_ms=_NO_BATCH_TIMER_MS,
                    max_pending_messages=5000,
                )
                state.held = int(state.producer.last_sequence_id())
                return state
            except pulsar.PulsarException as exc:
                reason = f"{type(exc).__name__}: {exc}"
                if type(exc).__name__ not in _TRANSIENT_CREATE_ERRORS or time.monotonic() + pause >= deadline:
                    state.error = f"cannot create producer {name!r} on {target!r}: {reason}"
                    log.warning("%s", state.error)
                    return state
                log.info("producer %r on %r: %s; retrying in %.1f s", name, target, reason, pause)
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    def publish(self, batch: Any) -> Any:
        missing = [c for c in REPUBLISH_INPUT_COLUMNS if c not in batch.schema.names]
        if missing:
            raise RepublishError(
                f"republish input lacks columns {missing}; select exactly {REPUBLISH_INPUT_SCHEMA} "
                "before mapInArrow(republish_batches, REPUBLISH_RESULT_SCHEMA)"
            )
        errors: list[str | None] = [None] * batch.num_rows
        groups = [(self._producer(*key), rows) for key, rows in _by_producer(batch, errors).items()]
        col = batch.column
        keys = list(zip(col("replay_id").cast("string").to_pylist(), col("row").to_pylist(), strict=True))
        columns = (
            keys,
            col("sequence_id").to_pylist(),
            col("value").to_pylist(),
            _properties(col("properties")),
            col("key").to_pylist(),
            col("ordering_key").to_pylist(),
            _epoch_ms(col("event_time")),
        )
        for state, rows in groups:  # a producer that failed only reports its rows
            if state.error is None:
                self._send(state, rows, columns)
            else:
                for i in rows:
                    errors[i] = f"not sent: {state.error}"
        self.ready += [(keys[i], None, error) for i, error in enumerate(errors) if error is not None]
        self._collect()
        return self._emit()

    def finish(self) -> Any:
        """Send the open batches, flush and wait for the receipts (up to the send timeout); the rest."""
        for state in self.producers.values():
            self._send_batch(state)
        self._each_producer("flush")  # a failure's cause is in the receipts
        # A flush returns once its sends completed, callbacks included; else wait up to the timeout.
        deadline = time.monotonic() + self.send_timeout_ms / 1000 + _CONFIRM_GRACE_S
        while len(self.receipts) < len(self.awaiting) and time.monotonic() < deadline:
            time.sleep(0.005)
        self._collect()
        if self.awaiting:
            rows = [row for batch, _ in self.awaiting.values() for row in batch]
            log.warning("%d sends unconfirmed", len(rows))
            error = f"send not confirmed within {self.send_timeout_ms} ms"
            for _, state in self.awaiting.values():
                state.error = state.error or error
            self.ready += [(key, None, error) for key, _, _ in rows]
            self.failed += len(rows)
            self.awaiting.clear()
        return self._emit()

    def _send(self, state: _ProducerState, rows: list[int], columns: Any) -> None:
        """Add ``rows`` (indexes into ``columns``, as :meth:`publish` builds them) to the batches of one
        producer, sending each batch once it is cut: by block, count or bytes, never where ``rows`` end."""
        import _pulsar

        row_keys, sequences, values, props, keys, ordering, events = columns
        new_builder = _pulsar.MessageBuilder
        rate = self.rate
        for i in rows:
            seq, value = sequences[i], values[i]
            block = seq // BATCH_BLOCK
            if block != state.block or state.batch_bytes + len(value) > BATCH_MAX_BYTES:
                self._send_batch(state)  # a block's last batch ends here, and one with no room for it
                state.block = block
            builder = new_builder()
            builder.content(value)
            # Raw builder: pulsar.Producer.send_async ignores sequence_id 0, which would let the client
            # pick another id and defeat broker deduplication.
            builder.sequence_id(seq)
            if properties := props[i]:
                builder.properties(properties)
            if key := keys[i]:
                builder.partition_key(key)
            if ordering_key := ordering[i]:
                builder.ordering_key(ordering_key)
            if event_ms := events[i]:
                builder.event_timestamp(event_ms)
            if rate is not None:  # sleep until this send is due
                time.sleep(max(0.0, self.started + (self.next_row + 1) / rate - time.monotonic()))
            self.next_row += 1
            state.batch.append((row_keys[i], seq, builder.build()))
            state.batch_bytes += len(value)
            if len(state.batch) >= BATCH_MAX_MESSAGES or state.batch_bytes >= BATCH_MAX_BYTES:
                self._send_batch(state)

    def _send_batch(self, state: _ProducerState) -> None:
        """Send the producer's open batch as one batch of the client: the receipt on its last message."""
        batch, state.batch, state.batch_bytes = state.batch, [], 0
        if not batch:
            return
        if state.error is not None:  # a receipt failed while the batch was filling
            self.ready += [(key, None, f"not sent: {state.error}") for key, _, _ in batch]
            return
        raw = state.producer._producer
        for _, _, message in islice(batch, len(batch) - 1):
            raw.send_async(message, None)
        slot = next(self.slots)
        self.awaiting[slot] = (batch, state)
        raw.send_async(batch[-1][2], partial(self._on_sent, slot))
        raw.flush_async(lambda result: None)  # the batch goes now; its outcome comes with its receipt

    def _on_sent(self, slot: int, result: Any, msg_id: Any) -> None:
        self.receipts[slot] = (result, msg_id)

    def _collect(self) -> None:
        import _pulsar

        ok = _pulsar.Result.Ok.value
        for slot in [slot for slot in self.awaiting if slot in self.receipts]:
            rows, state = self.awaiting.pop(slot)
            result, msg_id = self.receipts.pop(slot)
            if result.value == ok:
                self._stored(rows, state, msg_id)
                continue
            if result.name == "MessageTooBig":  # refused before sending: the producer goes on
                error = f"send refused: {result}"
            else:
                error = f"send failed: {result}"
                state.error = state.error or f"an earlier send failed ({result})"
            self.failed += len(rows)
            self.ready += [(key, None, error) for key, _, _ in rows]

    def _stored(self, rows: list[_Row], state: _ProducerState, msg_id: Any) -> None:
        """The results of a batch the broker stored or dropped as a duplicate: its last message's id is
        ``msg_id``; the others differ in their batch index only."""
        last = msg_id.batch_index()
        entry = f"({msg_id.ledger_id()},{msg_id.entry_id()},{msg_id.partition()},"
        if len(rows) > 1 and last != len(rows) - 1:
            raise RepublishError(
                f"producer {state.name!r}: {len(rows)} messages sent as one batch came back as batch index "
                f"{last}, so the others' ids are unknown: the broker refused one under {BATCH_MAX_BYTES} "
                "bytes (raise its maxMessageSize, 5 MB by default) or this pulsar-client cuts batches "
                "otherwise; re-run the same --run-id once fixed to resume"
            )
        first = last - len(rows) + 1
        for index, (key, seq, _) in enumerate(rows, first):
            error = _unheld_drop(seq, index, state) if entry.startswith("(-1,") else None
            if error is None:
                self.sent += 1
                self.ready.append((key, f"{entry}{index})", None))
            else:
                self.failed += 1
                self.ready.append((key, None, error))

    def _emit(self) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        keys, msg_ids, errors = zip(*self.ready, strict=True) if self.ready else ((), (), ())
        self.ready = []
        # the "(ledger,entry,partition,batch)" texts of :meth:`_stored` as readable ids
        ids = pc.replace_substring(pc.utf8_slice_codeunits(pa.array(msg_ids, pa.string()), 1, -1), ",", ":")
        replay_ids, rows = zip(*keys, strict=True) if keys else ((), ())
        return pa.RecordBatch.from_arrays(
            [
                pa.array(replay_ids, pa.string()),
                ids.is_valid(),
                ids,
                pa.array(errors, pa.string()),
                pa.array(rows, pa.int64()),
            ],
            names=["replay_id", "published", "published_message_id", "error", "row"],
        )

    def _each_producer(self, action: str) -> None:
        for state in self.producers.values():
            if state.producer is not None:
                try:
                    getattr(state.producer, action)()
                except Exception as exc:
                    log.warning("%s of producer %s failed: %s", action, state.name, type(exc).__name__)

    def close(self) -> None:
        self._each_producer("close")
        log.info(
            "republished %d messages with %d producers; %d not published",
            self.sent,
            len(self.producers),
            self.failed,
        )


def _unheld_drop(seq: int, batch_index: int, state: _ProducerState) -> str | None:
    """Why the duplicate drop (ledger -1) of ``seq`` does not prove it stored, else ``None``."""
    if seq - max(0, batch_index) <= state.held:  # its batch starts where the broker holds
        return None
    return (
        f"the broker dropped sequence id {seq} as a duplicate, but reported holding sequence ids of "
        f"producer {state.name!r} only up to {state.held}; not counted as published"
    )


def republish_batches(
    batches: Iterator[Any],
    *,
    conf: PulsarConf,
    rate_limit_per_s: float | None = None,
    send_timeout_ms: int = 30000,
) -> Iterator[Any]:
    """Publish every row; yield one :data:`REPUBLISH_RESULT_SCHEMA` row per input row as receipts arrive
    (``df.mapInArrow(partial(republish_batches, conf=conf), REPUBLISH_RESULT_SCHEMA)``)."""
    publisher = _Publisher(conf, rate_limit_per_s, send_timeout_ms)
    try:
        for batch in batches:
            if batch.num_rows and (results := publisher.publish(batch)).num_rows:
                yield results
        if (results := publisher.finish()).num_rows:
            yield results
    finally:
        publisher.close()
