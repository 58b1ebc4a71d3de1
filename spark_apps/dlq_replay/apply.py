"""Apply step: republish the fixed messages (pure DataFrame functions over the decisions).

Republish hands rows to the Pulsar I/O layer's ``republish_batches`` (``mapInArrow``), one task per
group of producers, rows sorted by (producer, sequence id). The archive is written by the decide tasks
(:mod:`~spark_apps.dlq_replay.archive_files`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_apps.dlq_replay import outcomes as oc

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql import DataFrame

    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf


def republish_input(
    decisions: DataFrame, partitions: int, sequence_range: tuple[int, int] | None = None
) -> DataFrame:
    """The rows to send, in the layout ``republish_batches`` expects.

    One producer's rows land in one partition, sorted by sequence id. ``sequence_range`` (``[lo, hi)``)
    selects one wave.
    """
    from pyspark.sql import functions as F

    sending = decisions.filter(F.col("outcome") == oc.TO_REPUBLISH)
    if sequence_range is not None:
        lo, hi = sequence_range
        sending = sending.filter((F.col("sequence_id") >= lo) & (F.col("sequence_id") < hi))
    rows = sending.select(
        "replay_id",
        "target_topic",
        F.col("replay_producer").alias("producer_name"),
        "sequence_id",
        F.col("out_value").alias("value"),
        "key",
        "ordering_key",
        "event_time",
        F.col("out_properties").alias("properties"),
    )
    return rows.repartition(max(1, partitions), "producer_name").sortWithinPartitions(
        "producer_name", "sequence_id"
    )


#: Column of :func:`prepare_sends` naming the wave a row is sent in.
WAVE_COLUMN = "wave"


def prepare_sends(decisions: DataFrame, wave_size: int) -> DataFrame:
    """The rows to send with their wave (``sequence_id // wave_size``): written once, partitioned by
    wave, so each wave reads only its own rows."""
    from pyspark.sql import functions as F

    sending = decisions.filter(F.col("outcome") == oc.TO_REPUBLISH)
    return sending.select(
        "replay_id",
        "target_topic",
        F.col("replay_producer").alias("producer_name"),
        "sequence_id",
        F.col("out_value").alias("value"),
        "key",
        "ordering_key",
        "event_time",
        F.col("out_properties").alias("properties"),
        F.floor(F.col("sequence_id") / F.lit(int(wave_size))).cast("long").alias(WAVE_COLUMN),
    )


def send_rows(
    rows: DataFrame, conf: PulsarConf, *, partitions: int, rate_limit_per_s: float | None = None
) -> DataFrame:
    """Send rows laid out as :func:`republish_input` selects them (one wave of :func:`prepare_sends`);
    one result row per message (``REPUBLISH_RESULT_SCHEMA``)."""
    from spark_apps.dlq_replay.pulsar_io.republish import REPUBLISH_RESULT_SCHEMA

    per_task = rate_limit_per_s / max(1, partitions) if rate_limit_per_s else None

    def send(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from spark_apps.dlq_replay.pulsar_io.republish import republish_batches

        yield from republish_batches(batches, conf=conf, rate_limit_per_s=per_task)

    from spark_apps.dlq_replay.arrow_compat import map_in_arrow

    laid_out = rows.drop(WAVE_COLUMN).repartition(max(1, partitions), "producer_name")
    return map_in_arrow(
        laid_out.sortWithinPartitions("producer_name", "sequence_id"), send, REPUBLISH_RESULT_SCHEMA
    )


def republish(
    decisions: DataFrame,
    conf: PulsarConf,
    *,
    partitions: int,
    rate_limit_per_s: float | None = None,
    sequence_range: tuple[int, int] | None = None,
) -> DataFrame:
    """Send every ``to_republish`` row; one result row per message (``REPUBLISH_RESULT_SCHEMA``).

    ``rate_limit_per_s`` is the total for the run, shared evenly by the ``partitions`` tasks.
    """
    from spark_apps.dlq_replay.pulsar_io.republish import REPUBLISH_RESULT_SCHEMA

    per_task = rate_limit_per_s / max(1, partitions) if rate_limit_per_s else None

    def send(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from spark_apps.dlq_replay.pulsar_io.republish import republish_batches

        yield from republish_batches(batches, conf=conf, rate_limit_per_s=per_task)

    from spark_apps.dlq_replay.arrow_compat import map_in_arrow

    return map_in_arrow(republish_input(decisions, partitions, sequence_range), send, REPUBLISH_RESULT_SCHEMA)


#: Decision columns the record and report steps read (outcome, context summary and ids; no payloads).
OUTCOME_COLUMNS: tuple[str, ...] = (
    "dlq_topic",
    "dlq_message_id",
    "replay_id",
    "signature",
    "error_template",
    "error_class",
    "origin_topic",
    "context_format",
    "reason",
    "publish_time",
    "rule",
    "action",
    "outcome",
    "outcome_reason",
    "target_topic",
    "fix",
    "fix_error",
)


def with_publish_results(decisions: DataFrame, results: DataFrame | None) -> DataFrame:
    """Turn ``to_republish`` into ``republished`` or ``publish_failed`` using the republish results."""
    from pyspark.sql import functions as F

    if results is None:
        return decisions.withColumn("published_message_id", F.lit(None).cast("string"))
    res = results.select(
        "replay_id",
        F.col("published").alias("_published"),
        "published_message_id",
        F.col("error").alias("_publish_error"),
    )
    # A sort-merge join (Spark's choice), not a hashed one: it spills where the driver's heap is small.
    # A shuffle_hash hint ran 1 s faster at 1M with a 1 GiB heap but could not build its hash map in
    # the app's 512 MiB.
    joined = decisions.join(res, on="replay_id", how="left")
    sending = F.col("outcome") == oc.TO_REPUBLISH
    ok = sending & F.coalesce(F.col("_published"), F.lit(False))
    failure = F.concat(F.lit("publish failed: "), F.coalesce("_publish_error", F.lit("no send result")))
    # One withColumns: every expression reads the decided outcome (not one rewritten before it).
    return joined.withColumns(
        {
            "outcome": F.when(ok, F.lit(oc.REPUBLISHED))
            .when(sending, F.lit(oc.PUBLISH_FAILED))
            .otherwise(F.col("outcome")),
            "outcome_reason": F.when(sending & ~ok, failure).otherwise(F.col("outcome_reason")),
            # Only the row sent has a message id (not another copy of its original).
            "published_message_id": F.when(sending, F.col("published_message_id")),
        }
    ).drop("_published", "_publish_error")
