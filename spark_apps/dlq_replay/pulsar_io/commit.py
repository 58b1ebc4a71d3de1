"""Commit: ack exactly the DLQ messages whose disposition is final, nothing else.

For each DLQ topic partition a Shared consumer on the replayer subscription receives the frozen window
again and acks (from the consumer that received them, correct on every broker) exactly the given ids.
Other messages of the window stay pending; messages beyond the window end are neither counted as
pending nor acked.

Without batch-index acks (the default), the broker removes a batched entry only when every message
of the batch is acked; a batch with some messages still pending is redelivered whole by the next run,
whose ledger marks the acked ones as already final.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf, get_client
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError, WindowError
from spark_apps.dlq_replay.pulsar_io.ids import in_window, message_id_key
from spark_apps.dlq_replay.pulsar_io.window_consumer import (
    DEFAULT_IDLE_TIMEOUT_MS,
    DEFAULT_RECEIVER_QUEUE_SIZE,
    WindowPasses,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pyspark.sql import DataFrame

    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow

log = logging.getLogger(__name__)

COMMIT_INPUT_SCHEMA = "dlq_topic string, dlq_message_id string"
COMMIT_RESULT_SCHEMA = "dlq_topic string, acked long, left_pending long, beyond_window long"


class CommitFn:
    """Acks the given ids of each ``dlq_topic`` in a ``pyarrow.Table``; see :func:`make_commit_fn`.

    Input rows: ``dlq_topic`` (a partition's full topic name, as in the source's ``topic`` column) and
    ``dlq_message_id`` (readable id) of the messages to ack. One output row per ``dlq_topic``.
    """

    def __init__(
        self,
        conf: PulsarConf,
        windows: Sequence[PartitionWindow],
        subscription: str,
        idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
        *,
        batch_index_ack: bool = False,
        receiver_queue_size: int = DEFAULT_RECEIVER_QUEUE_SIZE,
    ) -> None:
        if not subscription:
            raise PulsarConfigError("subscription is required, e.g. 'dlq-replayer'")
        if idle_timeout_ms <= 0:
            raise PulsarConfigError(f"idle_timeout_ms must be > 0; got {idle_timeout_ms}")
        self.conf = conf
        self.windows = {w.topic: w for w in windows}
        self.subscription = subscription
        self.idle_timeout_ms = int(idle_timeout_ms)
        self.batch_index_ack = batch_index_ack
        self.receiver_queue_size = int(receiver_queue_size)

    def __call__(self, table: Any) -> Any:
        import pyarrow as pa

        missing = [c for c in ("dlq_topic", "dlq_message_id") if c not in table.column_names]
        if missing:
            raise PulsarConfigError(f"commit input lacks columns {missing}; select {COMMIT_INPUT_SCHEMA}")
        wanted: dict[str, set[str]] = {}
        for topic, msg_id in zip(
            table.column("dlq_topic").to_pylist(), table.column("dlq_message_id").to_pylist(), strict=True
        ):
            if topic is None or msg_id is None:
                raise PulsarConfigError("commit input has a null dlq_topic or dlq_message_id; drop such rows")
            wanted.setdefault(topic, set()).add(msg_id)
        rows = [self.commit_topic(topic, ids) for topic, ids in wanted.items()]
        return pa.table(
            {
                "dlq_topic": pa.array([r[0] for r in rows], pa.string()),
                "acked": pa.array([r[1] for r in rows], pa.int64()),
                "left_pending": pa.array([r[2] for r in rows], pa.int64()),
                "beyond_window": pa.array([r[3] for r in rows], pa.int64()),
            }
        )

    def commit_topic(self, topic: str, ids: set[str]) -> tuple[str, int, int, int]:
        """Ack ``ids`` of one topic partition; returns ``(topic, acked, left_pending, beyond_window)``."""
        window = self.windows.get(topic)
        if window is None:
            raise WindowError(
                f"dlq_topic {topic!r} is not in the run's frozen window; commit only messages read from "
                f"that window (known: {sorted(self.windows)})"
            )
        end = window.end_key
        outside = {i for i in ids if not in_window(*_entry(i), end)}
        if outside:
            log.warning("commit %s: %d ids lie beyond the window end and are not acked", topic, len(outside))
        remaining = ids - outside
        if not remaining:
            return topic, 0, 0, 0
        # Reaching the window end means every pending message was delivered: final ids not seen were
        # acked by an earlier commit. An idle stop may be a stall: read again while that finds more.
        reader = WindowPasses(
            get_client(self.conf),
            window,
            self.subscription,
            role="commit",
            idle_timeout_ms=self.idle_timeout_ms,
            receiver_queue_size=self.receiver_queue_size,
            batch_index_ack=self.batch_index_ack,
        )
        acked = left = 0
        for id_str, msg, _, consumer in reader.messages():
            if id_str in remaining:
                consumer.acknowledge(msg)
                remaining.discard(id_str)
                acked += 1
            else:
                left += 1
        beyond, passes = reader.stats.beyond_window, reader.passes
        log.info(
            "commit %s: acked %d, left pending %d, beyond window %d, %d final ids not received "
            "(already acked), %d pass(es)",
            topic,
            acked,
            left,
            beyond,
            len(remaining),
            passes,
        )
        return topic, acked, left, beyond


def _entry(msg_id: str) -> tuple[int, int, int]:
    ledger, entry, _, batch = message_id_key(msg_id)
    return ledger, entry, batch


def make_commit_fn(
    conf: PulsarConf,
    windows: Sequence[PartitionWindow],
    subscription: str,
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
    *,
    batch_index_ack: bool = False,
) -> Callable[[Any], Any]:
    """The function for ``ledger_df.groupBy("dlq_topic").applyInArrow(fn, COMMIT_RESULT_SCHEMA)``.

    ``batch_index_ack=True`` acks single messages inside a batch; it needs a broker with
    ``acknowledgmentAtBatchIndexLevelEnabled`` (pulsar-lite acks the whole batch instead: never use it there).
    """
    committer = CommitFn(conf, windows, subscription, idle_timeout_ms, batch_index_ack=batch_index_ack)

    # A plain one-argument function: Spark picks the ``pyarrow.Table -> pyarrow.Table`` form by arity
    # (a callable object would count ``self`` and receive the grouping key too).
    def commit(table: Any) -> Any:
        return committer(table)

    return commit


def commit_final_messages(
    final_df: DataFrame,
    *,
    conf: PulsarConf,
    windows: Sequence[PartitionWindow],
    subscription: str,
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
) -> DataFrame:
    """Ack the messages of ``final_df`` (``dlq_topic``, ``dlq_message_id``); one result row per topic."""
    from spark_apps.dlq_replay.arrow_compat import apply_in_arrow

    fn = make_commit_fn(conf, windows, subscription, idle_timeout_ms)
    grouped = final_df.select("dlq_topic", "dlq_message_id").groupBy("dlq_topic")
    return apply_in_arrow(grouped, fn, COMMIT_RESULT_SCHEMA)
