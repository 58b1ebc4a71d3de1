"""The report's groups computed with Spark queries over a run's outcomes and decisions: the reference the
record tasks' report parts (``spark_apps/dlq_replay/report_parts.py``) are compared with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.report_parts import (
    COMBO_KEYS,
    ERROR_CHARS,
    REP_COLUMNS,
    REP_ROWS,
    SAMPLE_ERRORS,
    SAMPLE_IDS,
    ReportParts,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: ISO 8601 with the session time zone's offset (the tests run with spark.sql.session.timeZone=UTC).
ISO_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"
#: Decision columns of a run's outcomes (outcome, context summary and ids; no payloads).
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


def dry_run_outcomes(decisions: DataFrame) -> DataFrame:
    """A dry run's outcomes: the decisions' outcome columns, nothing sent (no message id)."""
    from pyspark.sql import functions as F

    return decisions.select(*OUTCOME_COLUMNS).withColumn("published_message_id", F.lit(None).cast("string"))


def aggregate(outcomes: DataFrame) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """Aggregates per :data:`COMBO_KEYS` and each signature's first :data:`SAMPLE_IDS` message ids by
    (publish time, topic, message id), nulls first, across its combinations."""
    from pyspark.sql import functions as F

    first = F.struct("publish_time", "dlq_topic", "dlq_message_id")
    rows = (
        outcomes.groupBy(*COMBO_KEYS)
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.min("error_template").alias("template"),
            F.min("error_class").alias("error_class"),
            F.min("origin_topic").alias("origin_topic"),
            F.min("reason").alias("reason"),
            F.date_format(F.min("publish_time"), ISO_FORMAT).alias("first_seen"),
            F.date_format(F.max("publish_time"), ISO_FORMAT).alias("last_seen"),
            F.min_by(first, first, SAMPLE_IDS).alias("first_ids"),
        )
        .collect()
    )
    firsts: dict[str, list[Any]] = {}
    combos: list[dict[str, Any]] = []
    for row in rows:
        combo = row.asDict()
        firsts.setdefault(combo["signature"], []).extend(combo.pop("first_ids") or [])
        combos.append(combo)
    samples = {
        sig: [item["dlq_message_id"] for item in sorted(items, key=_nulls_first)[:SAMPLE_IDS]]
        for sig, items in firsts.items()
    }
    return combos, samples


def _nulls_first(item: Any) -> tuple[tuple[int, Any], ...]:
    return tuple((0, "") if value is None else (1, value) for value in item)


def _top(df: DataFrame, order: list[Any], limit: int) -> list[Any]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window = Window.partitionBy("signature").orderBy(*order)
    ranked = df.withColumn("_n", F.row_number().over(window)).filter(F.col("_n") <= limit)
    return sorted(ranked.collect(), key=lambda row: (row["signature"], row["_n"]))


def spark_parts(outcomes: DataFrame, decisions: DataFrame) -> ReportParts:
    """What the record tasks' parts hold, from Spark queries: the groups and samples of ``outcomes``,
    each signature's first :data:`REP_ROWS` representatives of ``decisions`` (preferring ones the
    playbook was applied to) and its first distinct error messages (oldest first)."""
    from pyspark.sql import functions as F

    combos, samples = aggregate(outcomes)
    columns = [
        F.substring(name, 1, ERROR_CHARS).alias(name) if name == "error_message" else F.col(name)
        for name in REP_COLUMNS
    ]
    unscoped = F.col("outcome").isin(*oc.UNSCOPED).cast("int")
    reps = [
        {name: row[name] for name in REP_COLUMNS}
        for row in _top(
            decisions.select(*columns), [unscoped, "publish_time", "dlq_topic", "dlq_message_id"], REP_ROWS
        )
    ]
    messages = (
        decisions.filter(F.col("error_message").isNotNull())
        .groupBy("signature", F.substring("error_message", 1, ERROR_CHARS).alias("message"))
        .agg(F.min("publish_time").alias("first"))
    )
    errors: dict[str, list[str]] = {}
    for row in _top(messages, ["first", "message"], SAMPLE_ERRORS):
        errors.setdefault(row["signature"], []).append(row["message"])
    return ReportParts(combos, samples, reps, errors)
