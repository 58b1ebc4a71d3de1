"""The decisions' outcome columns and the send results applied to them as DataFrame operations.

The apply step sends from the decide tasks' files (:mod:`~spark_apps.dlq_replay.task_sends`) and the
record tasks apply the results (:mod:`~spark_apps.dlq_replay.ledger_files`); a dry run's report reads
:func:`with_publish_results` of its decisions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_apps.dlq_replay import outcomes as oc

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


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
