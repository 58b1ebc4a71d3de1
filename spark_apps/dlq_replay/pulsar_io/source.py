"""``spark.read.format("pulsar")``: a frozen window's unacked messages (``docs/pulsar-data-source.md``)."""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import asdict, dataclass
from itertools import accumulate, chain
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf, get_client
from spark_apps.dlq_replay.pulsar_io.cursor import EntryRange, split_for_readers
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError, WindowError
from spark_apps.dlq_replay.pulsar_io.read import (
    DEFAULT_IDLE_TIMEOUT_MS,
    DEFAULT_READER_QUEUE_SIZE,
    DEFAULT_RECEIVER_QUEUE_SIZE,
    ShareReader,
    WindowPasses,
)
from spark_apps.dlq_replay.pulsar_io.window import (
    PartitionWindow,
    freeze,
    parse_topics,
    windows_from_json,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

SOURCE_SCHEMA = (
    "topic string, partition int, message_id binary, message_id_str string, key string, "
    "ordering_key string, value binary, properties map<string,string>, publish_time timestamp, "
    "event_time timestamp, redelivery_count int, producer_name string, batch_size int"
)
SOURCE_COLUMNS = [part.split()[0] for part in SOURCE_SCHEMA.split(", ")]
DEFAULT_MAX_BATCH_ROWS = 2_000  # as the app's Arrow batches (cli.ARROW_BATCH_ROWS)
#: A Reader gets at least this many entries before a partition's window is split further.
DEFAULT_MIN_ENTRIES_PER_READER = 5000
#: The column :func:`read_tasks` adds with ``mark_entries``: true on the first row of each entry.
ENTRY_FIRST = "_entry_first"
# Set on a row whose properties or key could not be decoded as UTF-8 (the message is kept, never dropped).
UNDECODABLE_PROPERTY = "__dlq.replay.undecodable"
#: Messages :class:`_BatchBuilder` reads column by column at a time (at least; an entry is never split).
_CHUNK_ROWS = 64


def ddl_struct(ddl: str) -> StructType:
    """A flat DDL schema such as :data:`SOURCE_SCHEMA` as a ``StructType``, built without a SparkSession."""
    from pyspark.sql import types as T

    text = T.StringType()
    types = {
        "string": text,
        "int": T.IntegerType(),
        "long": T.LongType(),
        "boolean": T.BooleanType(),
        "binary": T.BinaryType(),
        "timestamp": T.TimestampType(),
        "map<string,string>": T.MapType(text, text),
    }
    return T.StructType([T.StructField(name, types[kind]) for name, kind in map(str.split, ddl.split(", "))])


def _int_option(opts: Mapping[str, str], name: str, default: int) -> int:
    raw = opts.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise PulsarConfigError(f"option {name!r} must be an integer >= 1; got {raw!r}") from None
    if value < 1:
        raise PulsarConfigError(f"option {name!r} must be >= 1; got {value}")
    return value


@dataclass
class PulsarInputPartition(InputPartition):
    """One task's part of a partition window (picklable): a consumer ``slot`` or a reader ``share``."""

    window: PartitionWindow
    slot: int
    share: list[EntryRange] | None = None


class PulsarDataSourceReader(DataSourceReader):
    """Plans one input partition per (topic partition, consumer slot) and reads it."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        self.conf = PulsarConf.from_options(opts)
        self.subscription = (opts.get("subscription") or "").strip()
        if not self.subscription:
            raise PulsarConfigError(
                "option 'subscription' is required: the durable Shared subscription to read through, "
                "e.g. .option('subscription', 'dlq-replayer'); messages are never acked by this source"
            )
        topics_text = opts.get("topics", "").strip()
        self.topics = parse_topics(topics_text) if topics_text else []
        if not self.topics and not opts.get("window"):
            raise PulsarConfigError(
                "option 'topics' is required unless 'window' is given, e.g. .option('topics', 'orders-DLQ')"
            )
        # parsed at load time: a bad window fails before any read
        self.windows = windows_from_json(opts["window"]) if opts.get("window") else None
        self.parallelism = _int_option(opts, "parallelism", 1)
        self.idle_timeout_ms = _int_option(opts, "idle.timeout.ms", DEFAULT_IDLE_TIMEOUT_MS)
        self.receiver_queue_size = _int_option(opts, "receiver.queue.size", DEFAULT_RECEIVER_QUEUE_SIZE)
        # Readers prefetch more by default (fewer flow round trips); consumers keep 1000 (pulsar-lite).
        self.reader_queue_size = _int_option(opts, "receiver.queue.size", DEFAULT_READER_QUEUE_SIZE)
        self.max_batch_rows = _int_option(opts, "max.batch.rows", DEFAULT_MAX_BATCH_ROWS)
        self.reader_min_entries = _int_option(opts, "reader.min.entries", DEFAULT_MIN_ENTRIES_PER_READER)
        self.schema = schema

    def _windows(self) -> list[PartitionWindow]:
        if self.windows is None:
            return freeze(self.conf, self.topics, self.subscription).windows
        if not self.topics:
            return self.windows
        missing = [t for t in self.topics if not any(t in (w.parent_topic, w.topic) for w in self.windows)]
        if missing:
            raise WindowError(
                f"topics {missing} have no entry in the 'window' option; freeze a window that covers "
                "them (window.freeze) or drop the 'topics' option"
            )
        return [w for w in self.windows if w.parent_topic in self.topics or w.topic in self.topics]

    def partitions(self) -> list[PulsarInputPartition]:
        parts: list[PulsarInputPartition] = []
        for w in self._windows():
            if w.end_message_id is None:
                continue
            bare = PartitionWindow(w.topic, w.partition, w.end_message_id)  # its share is all a task needs
            shares: Sequence[list[EntryRange] | None] = [None] * self.parallelism  # consumer slots
            if w.pending is not None:
                shares = split_for_readers(w.pending, self.parallelism, self.reader_min_entries)
            parts += [PulsarInputPartition(bare, slot, share) for slot, share in enumerate(shares)]
        # Spark needs at least one partition; an empty window reads nothing.
        return parts or [PulsarInputPartition(PartitionWindow("persistent://public/default/-", -1, None), 0)]

    def read(self, partition: InputPartition, mark_entries: bool = False) -> Iterator[pa.RecordBatch]:
        """One input partition's Arrow batches of whole entries (``mark_entries``: :data:`ENTRY_FIRST`)."""
        assert isinstance(partition, PulsarInputPartition)
        window = partition.window
        if window.end_message_id is None:
            return
        from pyspark.sql.pandas.types import to_arrow_schema

        builder = _BatchBuilder(window, to_arrow_schema(self.schema, timezone="UTC"), mark_entries)
        started = time.monotonic()
        reader: ShareReader | WindowPasses
        if partition.share is not None:
            reader = ShareReader(
                get_client(self.conf),
                window,
                partition.share,
                idle_timeout_ms=self.idle_timeout_ms,
                receiver_queue_size=self.reader_queue_size,
            )
            entries = ((entry.messages, entry.size) for entry in reader.entries())
        else:
            # Only the sole consumer of a partition resumes after an idle stop (else others hold the rest).
            reader = WindowPasses(
                get_client(self.conf),
                window,
                self.subscription,
                role="read",
                idle_timeout_ms=self.idle_timeout_ms,
                receiver_queue_size=self.receiver_queue_size,
                resume=self.parallelism == 1,
            )
            entries = ((group, _batch_size(group)) for group in _by_entry(reader.messages()))
        for messages, batch_size in entries:
            if builder.add_entry(messages, batch_size) >= self.max_batch_rows:
                yield builder.flush()
        if builder.rows:
            yield builder.flush()
        how = "reader" if isinstance(reader, ShareReader) else f"consumer, {reader.passes} pass(es)"
        counts = ", ".join(f"{name} {value}" for name, value in asdict(reader.stats).items())
        elapsed = time.monotonic() - started
        log.info("read %s slot %d (%s): %s in %.2fs", window.topic, partition.slot, how, counts, elapsed)


def _by_entry(messages: Iterator[tuple[str, Any, Any, Any]]) -> Iterator[list[tuple[str, Any, Any]]]:
    """Group consecutive messages of one entry (a batch arrives unpacked, its messages together)."""
    group: list[tuple[str, Any, Any]] = []
    entry: tuple[int, int] | None = None
    for id_str, msg, mid, _ in messages:
        key = (mid.ledger_id(), mid.entry_id())
        if key != entry and group:
            yield group
            group = []
        entry = key
        group.append((id_str, msg, mid))
    if group:
        yield group


def _batch_size(group: list[tuple[str, Any, Any]]) -> int:
    """Messages of the entry a group came from: 1 unless batched, else the highest batch index + 1."""
    return max(1, max(mid.batch_index() for _, _, mid in group) + 1)


class _BatchBuilder:
    """Accumulates whole entries' messages into Arrow record batches, reading :data:`_CHUNK_ROWS` at a time
    with one list comprehension per column (fewer Python steps per message, the chunk still in cache)."""

    def __init__(self, window: PartitionWindow, arrow_schema: pa.Schema, mark_entries: bool = False) -> None:
        self.window = window
        self.arrow_schema = arrow_schema
        self.mark_entries = mark_entries
        self._reset()

    def _reset(self) -> None:
        self.rows = 0
        self._pending: list[tuple[str, Any, Any]] = []
        self._entry_starts: list[int] = []
        self.batch_sizes: list[int] = []
        self.columns: list[list[Any]] = [[] for _ in range(12)]

    def add_entry(self, messages: Sequence[tuple[str, Any, Any]], batch_size: int) -> int:
        """Add one entry's ``(id_str, message, message_id)``; returns the rows buffered."""
        if messages:
            self._entry_starts.append(self.rows)
            self.batch_sizes.extend([batch_size] * len(messages))
            self.rows += len(messages)
            pending = self._pending
            pending.extend(messages)
            if len(pending) >= _CHUNK_ROWS:
                self._take(pending)
                pending.clear()
        return self.rows

    def _take(self, chunk: Sequence[tuple[str, Any, Any]]) -> None:
        id_strs, msgs, mids = zip(*chunk, strict=True)
        keys, props = _text_columns(msgs)
        values = (
            [mid.serialize() for mid in mids],
            id_strs,
            keys,
            [_text_or_none(m.ordering_key()) for m in msgs],
            [m.data() for m in msgs],
            map(len, props),
            chain.from_iterable(props),
            chain.from_iterable(map(dict.values, props)),
            [m.publish_timestamp() for m in msgs],
            [m.event_timestamp() or None for m in msgs],
            [m.redelivery_count() for m in msgs],
            [m.producer_name() for m in msgs],
        )
        for column, taken in zip(self.columns, values, strict=True):
            column.extend(taken)

    def flush(self) -> pa.RecordBatch:
        import pyarrow as pa

        if self._pending:
            self._take(self._pending)
        schema = self.arrow_schema
        n = self.rows
        ts_ms = pa.timestamp("ms", tz="UTC")
        ts_type = schema.field("publish_time").type
        ids, id_strs, keys, ordering, values, counts, prop_keys, prop_values = self.columns[:8]
        publish, event, redelivery, producers = self.columns[8:]
        arrays = [
            pa.array([self.window.topic] * n, pa.string()),
            pa.array([self.window.partition] * n, pa.int32()),
            pa.array(ids, pa.binary()),
            pa.array(id_strs, pa.string()),
            pa.array(keys, pa.string()),
            pa.array(ordering, pa.string()),
            pa.array(values, pa.binary()),
            pa.MapArray.from_arrays(
                pa.array(list(accumulate(counts, initial=0)), pa.int32()),
                pa.array(prop_keys, pa.string()),
                pa.array(prop_values, pa.string()),
                type=schema.field("properties").type,
            ),
            pa.array(publish, ts_ms).cast(ts_type),
            pa.array(event, ts_ms).cast(ts_type),
            pa.array(redelivery, pa.int32()),
            pa.array(producers, pa.string()),
            pa.array(self.batch_sizes, pa.int32()),
        ]
        if self.mark_entries:
            marks = [False] * n
            for start in self._entry_starts:
                marks[start] = True
            arrays.append(pa.array(marks, pa.bool_()))
            schema = schema.append(pa.field(ENTRY_FIRST, pa.bool_()))
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        self._reset()
        return batch


def _text_columns(msgs: Sequence[Any]) -> tuple[list[str | None], list[dict[str, str]]]:
    """The keys and properties of ``msgs``; one not UTF-8 is dropped and flagged (UNDECODABLE_PROPERTY)."""
    try:
        return [m.partition_key() or None for m in msgs], [m.properties() for m in msgs]
    except UnicodeDecodeError:
        pass
    keys: list[str | None] = []
    props: list[dict[str, str]] = []
    for msg in msgs:
        bad_text = False
        try:
            key = msg.partition_key() or None
        except UnicodeDecodeError:
            key, bad_text = None, True
        try:
            found = msg.properties()
        except UnicodeDecodeError:
            found, bad_text = {}, True
        if bad_text:
            # Never drop a malformed DLQ message: keep it, flagged, so it is reported and stays pending.
            found = {**found, UNDECODABLE_PROPERTY: "properties or key are not valid UTF-8"}
        keys.append(key)
        props.append(found)
    return keys, props


def _text_or_none(text: str | bytes) -> str | None:
    """An ordering key as text (bytes decoded, invalid UTF-8 replaced); empty is ``None``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return text or None


class PulsarDataSource(DataSource):
    """Batch source ``pulsar``: the pending messages of a frozen window, read without acking."""

    @classmethod
    def name(cls) -> str:
        return "pulsar"

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        names = [f.name for f in schema.fields]
        if names != SOURCE_COLUMNS:
            raise PulsarConfigError(
                f"the pulsar source has a fixed schema ({SOURCE_SCHEMA}); got columns {names}. "
                "Drop .schema(...) and select the columns you need after load()."
            )
        return PulsarDataSourceReader(self.options, schema)


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def read_tasks(
    spark: SparkSession, options: Mapping[str, str], mark_entries: bool = False
) -> tuple[DataFrame, Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], str]:
    """``(input frame, task function, output schema DDL)``: task i of a ``mapInArrow`` over
    ``spark.range`` reads input partition i, planned here in the driver (no Python planner process)."""
    reader = PulsarDataSourceReader(options, ddl_struct(SOURCE_SCHEMA))
    parts = reader.partitions()

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from reader.read(parts[index], mark_entries)

    schema = SOURCE_SCHEMA + (f", {ENTRY_FIRST} boolean" if mark_entries else "")
    return spark.range(len(parts), numPartitions=len(parts)), read, schema


def register(spark: SparkSession) -> None:
    """Register the ``pulsar`` format on ``spark``; calling it again for the same session does nothing."""
    if spark not in _registered:
        spark.dataSource.register(PulsarDataSource)
        _registered.add(spark)
