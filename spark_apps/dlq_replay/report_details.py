"""Collect the report's explanations with Spark: per group the fix errors, sample error messages, the
rule evaluation of a representative message and (opt-in) masked payload snippets; the refused origins;
the trend of each group over the ledger's last runs.

Only small aggregates reach the driver: at most a few rows per shown group and per recent run. A part
that cannot be computed (e.g. a dataset that an earlier version did not write) is logged and left out:
the counts of the report never depend on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.report_explain import explain_rules, mask_payload, next_steps, run_config
from spark_apps.dlq_replay.report_parts import ERROR_CHARS, SAMPLE_ERRORS
from spark_apps.dlq_replay.schemas import DECIDED_SCHEMA, LEDGER_SCHEMA

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from spark_apps.dlq_replay.playbook import Playbook
    from spark_apps.dlq_replay.report_parts import ReportParts

log = logging.getLogger("spark_apps.dlq_replay")

#: Groups that get explanations (the largest first); the rest are listed with counts only.
DETAIL_GROUPS = 50
FIX_ERRORS = 3
PAYLOAD_SAMPLES = 2
TREND_RUNS = 8
TREND_GROUPS = 20
REFUSED_ORIGINS = 10
#: Spark setting that opts a run in to masked payload snippets in its report (default false).
CONF_PAYLOAD_SNIPPETS = "spark.dlq.report.payloadSnippets"


@dataclass(frozen=True)
class ReportContext:
    """Where a run's datasets are and what configured it (what the explanations are computed from)."""

    options: Any
    playbook: Playbook
    decisions_path: str | None = None
    snapshot_path: str | None = None
    ledger_path: str | None = None
    payload_snippets: bool | None = None  # None: read CONF_PAYLOAD_SNIPPETS
    recorded_at: datetime | None = None  # when the record step wrote this run's ledger rows


def _read(spark: SparkSession, path: str | None, schema: StructType) -> DataFrame | None:
    if not path:
        return None
    try:
        from spark_apps.dlq_replay.storage import RunStorage
        from spark_apps.dlq_replay.task_parquet import read_frame

        if not RunStorage().has_data(path):  # e.g. no ledger before the first recorded run
            return None
        return read_frame(spark, path, schema)
    except Exception as exc:  # absent (empty run, older layout): explanations are optional
        log.info("report: %s not readable (%s); its explanations are left out", path, type(exc).__name__)
        return None


def _guarded(what: str, compute: Callable[[], Any], default: Any) -> Any:
    try:
        return compute()
    except Exception as exc:
        log.warning("report: could not compute %s (%s: %s); left out", what, type(exc).__name__, exc)
        return default


def spark_info(spark: SparkSession) -> dict[str, Any]:
    """The application id and master (what the operator's Spark link is built from), read from the
    session's settings: under Spark Connect they are the server's application. ``ui_url`` stays empty:
    no public API gives the live UI's address."""
    from spark_apps.dlq_replay.session import conf_value

    return {
        "application_id": conf_value(spark, "spark.app.id"),
        "master": conf_value(spark, "spark.master"),
        "ui_url": None,
    }


def payload_snippets_enabled(spark: SparkSession, ctx: ReportContext) -> bool:
    if ctx.payload_snippets is not None:
        return ctx.payload_snippets
    return str(spark.conf.get(CONF_PAYLOAD_SNIPPETS, "false")).strip().lower() in ("true", "1", "yes", "on")


# --------------------------------------------------------------------------- per group


def _top_per_signature(df: DataFrame, order: list[Any], limit: int) -> list[Any]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window = Window.partitionBy("signature").orderBy(*order)
    return df.withColumn("_n", F.row_number().over(window)).filter(F.col("_n") <= limit).collect()


def fix_errors(decisions: DataFrame, signatures: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The most frequent fix errors (``Class: message``) per group, with counts."""
    from pyspark.sql import functions as F

    counted = (
        decisions.filter(F.col("fix_error").isNotNull() & F.col("signature").isin(signatures))
        .groupBy("signature", F.substring("fix_error", 1, ERROR_CHARS).alias("error"))
        .agg(F.count(F.lit(1)).alias("count"))
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for row in _top_per_signature(counted, [F.desc("count"), "error"], FIX_ERRORS):
        out.setdefault(row["signature"], []).append({"error": row["error"], "count": int(row["count"])})
    return out


def sample_errors(decisions: DataFrame, signatures: list[str]) -> dict[str, list[dict[str, Any]]]:
    """A few distinct error messages per group (oldest first), with how often each occurs."""
    from pyspark.sql import functions as F

    counted = (
        decisions.filter(F.col("error_message").isNotNull() & F.col("signature").isin(signatures))
        .groupBy("signature", F.substring("error_message", 1, ERROR_CHARS).alias("message"))
        .agg(F.min("publish_time").alias("first"), F.count(F.lit(1)).alias("count"))
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for row in _top_per_signature(counted, ["first", "message"], SAMPLE_ERRORS):
        out.setdefault(row["signature"], []).append({"message": row["message"], "count": int(row["count"])})
    return out


def _explanation(playbook: Playbook, rep: Any, properties: dict[str, str] | None) -> dict[str, Any]:
    from spark_apps.dlq_replay.playbook import MatchInput

    outcome = rep["outcome"]
    base = {
        "message_id": rep["dlq_message_id"],
        "outcome": outcome,
        "outcome_reason": rep["outcome_reason"],
        "matched_rule": rep["rule"],
    }
    if outcome in oc.UNSCOPED or rep["context_format"] == "none":
        return {**base, "rules": [], "note": rep["outcome_reason"] or "the playbook was not applied"}
    record = MatchInput(
        signature=rep["signature"],
        error_class=rep["error_class"],
        error_message=rep["error_message"],
        origin_topic=rep["origin_topic"],
        context_format=rep["context_format"],
        properties=properties or {},
    )
    note = None
    if properties is None and any(rule.properties for rule in playbook.rules):
        note = "the message's properties were not available: property conditions show as missing"
    return {**base, "rules": explain_rules(playbook, record), "note": note}


def _errors_from_parts(
    ctx: ReportContext, parts: ReportParts | None, decisions: DataFrame, signatures: list[str]
) -> Callable[[], tuple[dict[str, Any], dict[str, Any]]] | None:
    """What :func:`fix_errors` and :func:`sample_errors` give, from the record tasks' parts: the sample
    messages they kept, counted in one pass over the decisions' files (:func:`~spark_apps.dlq_replay.
    report_parts.error_counts`), and the fix errors queried only when that pass saw one. ``None`` without
    such parts."""
    from spark_apps.dlq_replay.report_parts import error_counts

    folder = ctx.decisions_path
    if parts is None or parts.errors is None or folder is None:
        return None
    found = parts.errors
    wanted = {sig: found[sig] for sig in signatures if sig in found}

    def compute() -> tuple[dict[str, Any], dict[str, Any]]:
        counts, fixed = error_counts(folder, wanted)
        errors = {
            sig: [{"message": message, "count": counts[(sig, message)]} for message in messages]
            for sig, messages in wanted.items()
        }
        return (fix_errors(decisions, signatures) if fixed else {}), errors

    return compute


def representatives_from_parts(
    ctx: ReportContext, parts: ReportParts, signatures: list[str], snippets: bool
) -> tuple[list[Any], dict[tuple[str, str], Any]]:
    """The representative messages of the shown groups from the record tasks' parts (a group's first,
    preferring ones the playbook was applied to), and those messages' snapshot rows (properties, and the
    payload with ``snippets``) read with pyarrow, by (topic, message id)."""
    from spark_apps.dlq_replay.report_parts import snapshot_messages

    per_group = max(1, PAYLOAD_SAMPLES) if snippets else 1
    shown, taken = set(signatures), dict.fromkeys(signatures, 0)
    reps = []
    for rep in parts.reps:  # sorted by signature, then order
        sig = rep["signature"]
        if sig in shown and taken[sig] < per_group:
            reps.append(rep)
            taken[sig] += 1
    folder = ctx.snapshot_path
    if folder is None or not reps:
        return reps, {}
    keys = sorted({(r["dlq_topic"], r["dlq_message_id"]) for r in reps})
    return reps, _guarded("snapshot samples", lambda: snapshot_messages(folder, keys, snippets), {})


def fill_group_details(
    ctx: ReportContext,
    shown: list[dict[str, Any]],
    fixes: dict[str, list[dict[str, Any]]],
    errors: dict[str, list[dict[str, Any]]],
    reps: list[Any],
    found: dict[tuple[str, str], Any],
    snippets: bool,
) -> None:
    """Add ``fix_errors``, ``sample_errors``, ``explanation`` and (with ``snippets``) ``payload_samples``
    to the ``shown`` groups, in place, from what the queries collected."""
    by_sig: dict[str, list[Any]] = {}
    for rep in reps:
        by_sig.setdefault(rep["signature"], []).append(rep)
    archive_default = bool(getattr(ctx.options, "archive_payload", True))
    for group in shown:
        sig = group["signature"]
        group["fix_errors"] = fixes.get(sig, [])
        group["sample_errors"] = errors.get(sig, [])
        mine = by_sig.get(sig, [])
        if mine:
            first = mine[0]
            snap = found.get((first["dlq_topic"], first["dlq_message_id"]))
            props = dict(snap["properties"] or {}) if snap is not None else None
            group["explanation"] = _explanation(ctx.playbook, first, props)
        if snippets:
            samples = []
            for rep in mine[:PAYLOAD_SAMPLES]:
                snap = found.get((rep["dlq_topic"], rep["dlq_message_id"]))
                if snap is None:
                    continue
                if not archive_default or ctx.playbook.payload_off(rep["dlq_topic"], rep["origin_topic"]):
                    samples.append(
                        {"message_id": rep["dlq_message_id"], "snippet": "(payload off for this topic)"}
                    )
                    continue
                value = snap["value"]
                samples.append({"message_id": rep["dlq_message_id"], "snippet": mask_payload(value)})
            group["payload_samples"] = samples


def refused_origins(decisions: DataFrame) -> list[dict[str, Any]]:
    """Origin topics the allowlist refused, with counts (largest first)."""
    from pyspark.sql import functions as F

    rows = (
        decisions.filter(F.col("outcome") == oc.ORIGIN_REFUSED)
        .groupBy(F.coalesce("target_topic", "origin_topic").alias("topic"), "outcome_reason")
        .agg(F.count(F.lit(1)).alias("count"))
        .orderBy(F.desc("count"), "topic")
        .limit(REFUSED_ORIGINS)
        .collect()
    )
    return [{"topic": r["topic"], "reason": r["outcome_reason"], "count": int(r["count"])} for r in rows]


# --------------------------------------------------------------------------- trend


def trend(
    spark: SparkSession, ledger_path: str | None, report: dict[str, Any], recorded_at: datetime | None = None
) -> dict[str, Any] | None:
    """Count per group over the ledger's last :data:`TREND_RUNS` runs, this run last.

    This run's column comes from the report itself (its groups are its ledger rows, and a dry-run is
    not in the ledger), so the queries read only the other runs' partitions. ``recorded_at``: when this
    run's record step wrote its rows (its time in the trend, as the ledger gives it to later runs);
    without it, the report's finish.
    """
    from pyspark.sql import functions as F

    run_id = report["run_id"]
    signatures = [g["signature"] for g in report["groups"][:TREND_GROUPS]]
    ledger = _read(spark, ledger_path, LEDGER_SCHEMA) if _other_runs(ledger_path, run_id) else None
    runs: list[dict[str, Any]] = []
    counts: dict[tuple[str, str], int] = {}
    if ledger is not None:
        earlier = ledger.filter(F.col("run_id") != F.lit(run_id))  # a partition filter: this run's not read
        recent = (
            earlier.groupBy("run_id")
            .agg(
                F.max("recorded_at").alias("at"), F.count(F.lit(1)).alias("n"), F.first("mode").alias("mode")
            )
            .orderBy(F.desc("at"), F.desc("run_id"))
            .limit(TREND_RUNS - 1)
            .collect()
        )
        runs = [
            {"run_id": r["run_id"], "at": r["at"].isoformat() if r["at"] else None, "messages": int(r["n"]),
             "mode": r["mode"]}
            for r in reversed(recent)
        ]  # fmt: skip
        ids = [r["run_id"] for r in runs]
        if ids and signatures:
            for row in (
                earlier.filter(F.col("run_id").isin(ids) & F.col("signature").isin(signatures))
                .groupBy("run_id", "signature")
                .agg(F.count(F.lit(1)).alias("n"))
                .collect()
            ):
                counts[(row["run_id"], row["signature"])] = int(row["n"])
    at = report.get("finished_at") if recorded_at is None else as_collected(recorded_at).isoformat()
    runs.append(
        {
            "run_id": run_id,
            "at": at,
            "messages": report["totals"].get("snapshot", 0),
            "mode": report.get("mode"),
        }
    )
    for group in report["groups"][:TREND_GROUPS]:
        counts[(run_id, group["signature"])] = int(group["count"])
    if len(runs) < 2:
        return None
    return {
        "runs": runs,
        "groups": [
            {"signature": sig, "counts": [counts.get((r["run_id"], sig), 0) for r in runs]}
            for sig in signatures
        ],
    }


def _other_runs(ledger_path: str | None, run_id: str) -> bool:
    """Might the ledger hold runs other than ``run_id``: has it another run's partition folder (the first
    run's report then queries nothing)?"""
    from spark_apps.dlq_replay.storage import list_names
    from spark_apps.dlq_replay.task_parquet import partition_folder

    if not ledger_path:
        return False
    try:
        names = list_names(ledger_path)
    except OSError:
        return False
    mine = partition_folder("run_id", run_id)
    return any(name.startswith("run_id=") and name != mine for name in names)


def as_collected(value: datetime) -> datetime:
    """A timestamp as PySpark's ``collect`` returns a ``TimestampType`` value: naive, in local time."""
    from datetime import UTC, datetime, timedelta

    micros = (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    return datetime.fromtimestamp(micros // 1_000_000).replace(microsecond=micros % 1_000_000)


# --------------------------------------------------------------------------- all of it


def add_details(
    report: dict[str, Any], spark: SparkSession, ctx: ReportContext, parts: ReportParts | None = None
) -> None:
    """Add ``config``, ``spark``, per-group explanations (the first :data:`DETAIL_GROUPS` groups),
    ``refused_origins``, ``trend`` and ``next_steps`` to ``report`` (in place). The queries behind them
    are independent and run side by side (:mod:`~spark_apps.dlq_replay.concurrent_queries`). With the
    record tasks' ``parts`` (``None``: an empty window, no group), the representatives come from them."""
    from spark_apps.dlq_replay.concurrent_queries import run_concurrently

    report["config"] = run_config(ctx.options, ctx.playbook)
    report["spark"] = _guarded("the Spark application", lambda: spark_info(spark), None)
    decisions = _read(spark, ctx.decisions_path, DECIDED_SCHEMA)
    shown = report["groups"][:DETAIL_GROUPS]
    signatures = [g["signature"] for g in shown]
    snippets = payload_snippets_enabled(spark, ctx)
    at = ctx.recorded_at
    queries: dict[str, Callable[[], Any]] = {
        "trend": partial(_guarded, "the trend", partial(trend, spark, ctx.ledger_path, report, at), None)
    }
    if decisions is not None and signatures and parts is not None:
        from_parts = _errors_from_parts(ctx, parts, decisions, signatures)
        if from_parts is not None:  # the record tasks' parts and one pass over two columns of decisions
            queries["errors_and_fixes"] = partial(_guarded, "sample errors", from_parts, ({}, {}))
        else:  # a message without a publish time: the parts kept no sample errors
            queries["fixes"] = partial(_guarded, "fix errors", partial(fix_errors, decisions, signatures), {})
            errors = partial(sample_errors, decisions, signatures)
            queries["errors"] = partial(_guarded, "sample errors", errors, {})
        queries["reps"] = partial(representatives_from_parts, ctx, parts, signatures, snippets)
    if decisions is not None and report["totals"].get(oc.ORIGIN_REFUSED):
        queries["refused"] = partial(_guarded, "refused origins", partial(refused_origins, decisions), [])
    results = dict(zip(queries, run_concurrently(spark, *queries.values()), strict=True))
    if "errors_and_fixes" in results:
        results["fixes"], results["errors"] = results.pop("errors_and_fixes")
    if "reps" in results:
        reps, found = results["reps"]
        fill_group_details(ctx, shown, results["fixes"], results["errors"], reps, found, snippets)
    if "refused" in results:
        report["refused_origins"] = results["refused"]
    report["trend"] = results["trend"]
    report["next_steps"] = next_steps(report)
