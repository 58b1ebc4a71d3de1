"""The ledger: Parquet, one row per DLQ message per run with its outcome; the source of truth for re-runs.

Partitioned by ``run_id`` and written with dynamic partition overwrite, so redoing the record step of a
run replaces that run's rows and never duplicates them. A message whose outcome is final in the ledger
of any run is never acted on again (``already_final``) and is acked by the commit step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_apps.dlq_replay import outcomes as oc

if TYPE_CHECKING:
    from datetime import datetime

    from pyspark.sql import DataFrame, SparkSession

    from spark_apps.dlq_replay.storage import RunStorage


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
        F.lit(run_id).alias("run_id"),
    )


def write_ledger(rows: DataFrame, ledger_root: str) -> None:
    """Write (or rewrite) this run's ledger partition."""
    rows.write.mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy("run_id").parquet(
        ledger_root
    )


def read_ledger(spark: SparkSession, storage: RunStorage, ledger_root: str) -> DataFrame | None:
    """The whole ledger, or ``None`` before the first recorded run."""
    if not storage.has_data(ledger_root):
        return None
    from spark_apps.dlq_replay.schemas import LEDGER_SCHEMA

    return spark.read.schema(LEDGER_SCHEMA).parquet(ledger_root)


def run_outcomes(ledger: DataFrame, run_id: str) -> DataFrame:
    """The ledger rows of one run: the outcomes the report aggregates (read back, not recomputed)."""
    from pyspark.sql import functions as F

    return ledger.filter(F.col("run_id") == F.lit(run_id))


def final_ids(ledger: DataFrame | None, *, exclude_run_id: str) -> DataFrame | None:
    """``replay_id`` of messages final in the ledger of any run other than ``exclude_run_id``."""
    if ledger is None:
        return None
    from pyspark.sql import functions as F

    return (
        ledger.filter(F.col("final") & (F.col("run_id") != F.lit(exclude_run_id)))
        .select("replay_id")
        .distinct()
    )
