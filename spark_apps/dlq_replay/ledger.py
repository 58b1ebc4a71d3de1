"""The ledger: Parquet, one row per DLQ message per run with its outcome, partitioned by ``run_id``;
the source of truth for re-runs (``already_final``, ``duplicate``) and for the commit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from spark_apps.dlq_replay.schemas import LEDGER_SCHEMA
from spark_apps.dlq_replay.task_parquet import read_frame

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pyspark.sql import DataFrame, SparkSession

    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow
    from spark_apps.dlq_replay.storage import RunStorage


def read_ledger(spark: SparkSession, storage: RunStorage, ledger_root: str) -> DataFrame | None:
    """The whole ledger, or ``None`` before the first recorded run."""
    if not storage.list_names(ledger_root):
        return None
    return read_frame(spark, ledger_root, LEDGER_SCHEMA)


def final_ids(ledger: DataFrame | None, *, exclude_run_id: str) -> DataFrame | None:
    """``replay_id, dlq_topic, dlq_message_id, run_id`` of the final rows of runs but ``exclude_run_id``."""
    if ledger is None:
        return None
    return ledger.filter(F.col("final") & (F.col("run_id") != F.lit(exclude_run_id))).select(
        "replay_id", "dlq_topic", "dlq_message_id", "run_id"
    )


@dataclass(frozen=True)
class SettledEnd:
    """A partition whose window end an earlier run made final: read up to ``end_message_id`` (or nothing)."""

    topic: str
    frozen_end: str
    end_message_id: str | None
    settled_by: tuple[str, ...]


def settled_ends(
    ledger: DataFrame, windows: Sequence[PartitionWindow], commit_done: Callable[[str], bool]
) -> list[SettledEnd]:
    """The partitions of ``windows`` whose last message an earlier run made final and acked (``commit_done``),
    which a Shared consumer never receives: they end at the last message earlier runs left pending."""
    ends = {w.topic: key for w in windows if (key := w.end_key) is not None}
    if not ends:
        return []
    parts = F.split(F.col("dlq_message_id"), ":")
    rows = ledger.filter(F.col("dlq_topic").isin(*sorted(ends))).select(
        "dlq_topic",
        "dlq_message_id",
        F.col("final").cast("int").alias("final"),
        "run_id",
        parts.getItem(0).cast("long").alias("_ledger"),
        parts.getItem(1).cast("long").alias("_entry"),
    )
    is_end = F.lit(False)
    for topic, key in ends.items():
        is_end = is_end | (
            (F.col("dlq_topic") == topic) & (F.col("_ledger") == key[0]) & (F.col("_entry") == key[1])
        )
    end_rows = (  # per partition: all its end entry's messages final, and the runs that made them so
        rows.filter(is_end)
        .groupBy("dlq_topic", "dlq_message_id")
        .agg(
            F.max(F.coalesce("final", F.lit(0))).alias("final"),  # 0: not final in any run
            F.collect_set(F.when(F.col("final") == 1, F.col("run_id"))).alias("runs"),
        )
        .groupBy("dlq_topic")
        .agg(F.min("final").alias("final"), F.array_distinct(F.flatten(F.collect_list("runs"))).alias("runs"))
    )
    settled = {
        row["dlq_topic"]: set(row["runs"]) for row in end_rows.collect() if row["final"] and row["runs"]
    }
    settled = {t: runs for t, runs in settled.items() if all(commit_done(r) for r in runs)}
    if not settled:
        return []
    last_pending = (
        rows.filter(F.col("dlq_topic").isin(*sorted(settled)))
        .groupBy("dlq_topic", "dlq_message_id", "_ledger", "_entry")
        .agg(F.max("final").alias("final"))
        .filter(F.col("final") == 0)
        .groupBy("dlq_topic")
        .agg(F.max(F.struct("_ledger", "_entry")).alias("last"))
        .collect()
    )
    found = {r["dlq_topic"]: f"{r['last']['_ledger']}:{r['last']['_entry']}" for r in last_pending}
    out = []
    for w in windows:
        if w.topic in settled and w.end_message_id is not None:  # never None once settled (for the type)
            end = f"{found[w.topic]}:{w.partition}:-1" if w.topic in found else None
            out.append(SettledEnd(w.topic, w.end_message_id, end, tuple(sorted(settled[w.topic]))))
    return out
