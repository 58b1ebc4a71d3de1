"""The ledger rows computed with DataFrame operations: the reference the record tasks' Arrow rows
(``spark_apps/dlq_replay/record.py``) are compared with."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_apps.dlq_replay import outcomes as oc

if TYPE_CHECKING:
    from datetime import datetime

    from pyspark.sql import DataFrame


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


def ledger_rows(outcomes: DataFrame, run_id: str, mode: str, recorded_at: datetime) -> DataFrame:
    """One ledger row per message of the run, from the decisions with publish results applied."""
    from pyspark.sql import functions as F

    return outcomes.select(
        "dlq_topic",
        "dlq_message_id",
        "replay_id",
        "signature",
        "rule",
        "action",
        "outcome",
        F.col("outcome").isin(*sorted(oc.FINAL_OUTCOMES)).alias("final"),
        "outcome_reason",
        "origin_topic",
        "target_topic",
        "published_message_id",
        "fix",
        "fix_error",
        "error_class",
        "publish_time",
        F.lit(mode).alias("mode"),
        F.lit(recorded_at).cast("timestamp").alias("recorded_at"),
        "error_template",
        "context_format",
        "reason",
        F.lit(run_id).alias("run_id"),
    )


def write_ledger(rows: DataFrame, staged: str) -> int:
    """Write ledger rows to ``staged`` as the record step stages its own (moved into the ledger by
    :func:`~spark_apps.dlq_replay.record.publish_staged`); returns the rows written."""
    from spark_apps.dlq_replay.record import LEDGER_FILE_SCHEMA
    from spark_apps.dlq_replay.task_parquet import row_tally, write_in_tasks

    tallies = write_in_tasks(rows, iter, LEDGER_FILE_SCHEMA, staged, row_tally, ("n",), int96_timestamps=True)
    return sum(t[0] or 0 for t in tallies)
