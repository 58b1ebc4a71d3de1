"""The decisions' outcome columns, and a dry run's outcomes (nothing sent).

The apply step sends from the decide tasks' files (:mod:`~spark_apps.dlq_replay.task_sends`) and the
record tasks apply the send results (:mod:`~spark_apps.dlq_replay.ledger_files`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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


def dry_run_outcomes(decisions: DataFrame) -> DataFrame:
    """A dry run's outcomes: the decisions' :data:`OUTCOME_COLUMNS`, nothing sent (no message id)."""
    from pyspark.sql import functions as F

    return decisions.select(*OUTCOME_COLUMNS).withColumn("published_message_id", F.lit(None).cast("string"))
