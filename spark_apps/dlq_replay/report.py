"""Report step: ``report.json``, ``report.html`` and the printed summary (``docs/report.md``)."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from itertools import groupby, islice
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.util import inheritable_thread_target

from pulsar_dlq_consumer.replay_options import BOOLEAN_WORDS, CONF_PAYLOAD_SNIPPETS, SUMMARY_PREFIX
from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.arrow_util import in_tasks
from spark_apps.dlq_replay.canary import halted as halted_in
from spark_apps.dlq_replay.playbook import MatchInput
from spark_apps.dlq_replay.report_explain import (
    explain_rules,
    mask_payload,
    next_steps,
    outcome_order,
    run_config,
)
from spark_apps.dlq_replay.report_html import render_html
from spark_apps.dlq_replay.report_parts import COUNT_SCHEMA, error_count_rows, read_parts, snapshot_messages
from spark_apps.dlq_replay.schemas import DECIDED_SCHEMA, LEDGER_SCHEMA
from spark_apps.dlq_replay.session import conf_value
from spark_apps.dlq_replay.storage import list_names
from spark_apps.dlq_replay.task_parquet import part_files, partition_folder, read_frame

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from spark_apps.dlq_replay.playbook import Playbook
    from spark_apps.dlq_replay.report_parts import ReportParts
    from spark_apps.dlq_replay.run_context import Run

log = logging.getLogger("spark_apps.dlq_replay")

REPORT_FORMAT = 1
MAX_GROUPS = 200
#: The totals in report order: the outcomes with the commit's and a resumed apply's counts among them.
_AT = oc.OUTCOMES.index(oc.FILTERED)
_TAIL = ("acked", "left_pending", *oc.OUTCOMES[_AT:-1], "resent", oc.CANARY_FAILED)
TOTAL_KEYS: tuple[str, ...] = ("snapshot", *oc.OUTCOMES[:_AT], *_TAIL)
#: Groups that get explanations (the largest first); the rest are listed with counts only.
DETAIL_GROUPS = 50
FIX_ERRORS = 3
PAYLOAD_SAMPLES = 2
TREND_RUNS = 8
TREND_GROUPS = 20
REFUSED_ORIGINS = 10


@dataclass(frozen=True)
class CommitTotals:
    """What the commit step did (zero in dry-run)."""

    acked: int = 0
    left_pending_seen: int = 0
    beyond_window: int = 0
    unacked_final: int = 0  # final messages a first commit attempt could not ack (status "partial")
    final_in_partial_entries: int = 0  # final, but their batched entry holds a pending one (stays pending)
    read_mode: str = ""  # reader (one DLQ read per message), consumer (two; one held); "" in a dry-run
    reads_per_message: float = 0.0  # DLQ reads of the run (snapshot + commit) per snapshot message


_COMMIT_COUNTS = ("acked", "left_pending_seen", "beyond_window", "unacked_final", "final_in_partial_entries")
#: What a resumed apply sent again (see :func:`build_report`).
_RESEND_COUNTS = ("resent", "resent_held", "resend_bound")


@dataclass(frozen=True)
class ReportContext:
    """Where a run's datasets are and what configured it (what the explanations are computed from)."""

    options: Any
    playbook: Playbook
    decisions_path: str
    snapshot_path: str
    ledger_path: str
    payload_snippets: bool = False  # masked payload snippets (opted in by CONF_PAYLOAD_SNIPPETS)
    recorded_at: datetime | None = None  # when the record step wrote this run's ledger rows


def _label(outcome: str | None, mode: str) -> str:
    """Outcome as reported: a dry-run reports what it would do (``to_republish`` -> ``republished``)."""
    if outcome == oc.TO_REPUBLISH:
        return oc.REPUBLISHED if mode == oc.DRY_RUN else oc.PUBLISH_FAILED
    return outcome or "unknown"


def display_template(error_class: str | None, template: str) -> str:
    """``missing key <str>`` for a ``KeyError`` whose message is only the key."""
    if str(error_class or "").rsplit(".", 1)[-1] != "KeyError" or not template or "missing key" in template:
        return template
    return f"missing key {template}"


def _extreme(combos: list[dict[str, Any]], key: str, pick: Callable[..., Any] = min) -> Any:
    return pick((combo[key] for combo in combos if combo.get(key) is not None), default=None)


def build_groups(
    combos: list[dict[str, Any]], samples: dict[str, list[str]], mode: str, max_groups: int = MAX_GROUPS
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Merge aggregates into report groups (largest first); groups past ``max_groups`` are summed."""
    groups = []
    for sig, rows in groupby(sorted(combos, key=itemgetter("signature")), itemgetter("signature")):
        mine = list(rows)
        error_class = _extreme(mine, "error_class")
        actions: Counter[str] = Counter()
        outcomes: Counter[str] = Counter()
        for combo in mine:
            if combo["action"]:
                actions[combo["action"]] += int(combo["n"])
            outcomes[_label(combo["outcome"], mode)] += int(combo["n"])
        formats = sorted({combo["context_format"] for combo in mine} - {None})
        groups.append(
            {
                "signature": sig,
                "template": display_template(error_class, _extreme(mine, "template") or ""),
                "error_class": error_class,
                "origin_topic": _extreme(mine, "origin_topic"),
                "reason": _extreme(mine, "reason"),
                "context_formats": formats,
                "context_format": formats[0] if len(formats) == 1 else ("mixed" if formats else None),
                "count": sum(outcomes.values()),
                "first_seen": _extreme(mine, "first_seen"),
                "last_seen": _extreme(mine, "last_seen", max),
                "sample_message_ids": samples.get(sig, []),
                "actions": dict(actions),
                "action": max(actions, key=lambda a: (actions[a], a)) if actions else None,
                "rules": sorted({combo["rule"] for combo in mine if combo["rule"]}),
                "outcomes": {k: outcomes[k] for k in sorted(outcomes, key=outcome_order)},
                # no playbook rule matched (skip is the default)
                "no_rule": sum(int(c["n"]) for c in mine if c["outcome"] == oc.SKIPPED and not c["rule"]),
            }
        )
    ordered = sorted(groups, key=lambda g: (-g["count"], g["signature"]))
    kept, rest = ordered[:max_groups], ordered[max_groups:]
    return kept, {"groups": len(rest), "count": sum(g["count"] for g in rest)}


def build_report(
    parts: ReportParts | None,
    *,
    run_id: str,
    mode: str,
    status: str,
    started_at: str,
    finished_at: str,
    commit: CommitTotals,
    timings: dict[str, float],
    paths: dict[str, str],
    resend: dict[str, int] | None = None,
    canary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The machine-readable report (``docs/report.md``); ``parts`` is ``None`` for an empty window."""
    combos, samples = (parts.combos, parts.samples) if parts is not None else ([], {})
    groups, other = build_groups(combos, samples, mode)
    counts: Counter[str] = Counter()
    for combo in combos:
        counts[_label(combo["outcome"], mode)] += int(combo["n"])
    resend = {**dict.fromkeys(_RESEND_COUNTS, 0), **(resend or {})}
    snapshot = sum(counts.values())
    pending = snapshot - (0 if mode == oc.DRY_RUN else sum(counts[name] for name in oc.FINAL_OUTCOMES))
    totals = {key: counts[key] for key in TOTAL_KEYS}
    totals.update(snapshot=snapshot, acked=commit.acked, left_pending=pending, resent=resend["resent"])
    report = {
        "format": REPORT_FORMAT,
        "run_id": run_id,
        "mode": mode,
        "dry_run": mode == oc.DRY_RUN,
        "status": status,
        "started_at": started_at,
        "finished_at": finished_at,
        "totals": totals,
        "commit": asdict(commit),
        "resend": resend,
        "groups": groups,
        "other_groups": other,
        "timings": timings,
        "paths": paths,
    }
    if canary is not None:  # halted: some group's canary failed again (its other messages stay pending)
        verdicts = canary.get("verdicts") or {}
        halted = halted_in(verdicts)
        verdict = "halted" if halted else "passed" if verdicts else "not judged"
        held_back = counts[oc.CANARY_FAILED]
        report["canary"] = {**canary, "verdict": verdict, "halted": halted, "held_back": held_back}
    return report


def summary_line(report: dict[str, Any]) -> str:
    """The last stdout line of a run, ``DLQ_REPLAY_SUMMARY <json>``, also pushed to XCom."""
    keys = ("run_id", "mode", "status", "totals", "paths", "spark", "canary")
    summary = {k: report[k] for k in keys if k in report}
    return SUMMARY_PREFIX + json.dumps(summary, sort_keys=True, separators=(",", ":"))


def summary_text(report: dict[str, Any]) -> str:
    """A human-readable summary: totals, then the largest groups."""
    totals, other = report["totals"], report["other_groups"]
    lines = [
        f"DLQ replay run {report['run_id']} ({report['mode']}): {report['status']}",
        "  " + "  ".join(f"{k}={totals[k]}" for k in TOTAL_KEYS if k in totals),
    ]
    for group in report["groups"][:10]:
        outs = ", ".join(f"{k}={v}" for k, v in group["outcomes"].items())
        lines.append(f"  [{group['signature']}] x{group['count']} {group['template'][:80]!r} -> {outs}")
    if other["groups"]:
        lines.append(f"  ... and {other['groups']} smaller groups ({other['count']} messages)")
    lines.append(f"  report: {report['paths'].get('report_html', '')}")
    return "\n".join(lines)


def _read(
    spark: SparkSession, path: str, schema: StructType, other_than: str | None = None
) -> DataFrame | None:
    """The dataset at ``path``; ``None`` when absent, unreadable or holding no run but ``other_than``."""
    try:
        names = list_names(path)
        if other_than is not None:
            mine = partition_folder("run_id", other_than)
            names = [name for name in names if name.startswith("run_id=") and name != mine]
        return read_frame(spark, path, schema) if names else None
    except Exception as exc:
        log.info("report: %s not readable (%s); its explanations are left out", path, type(exc).__name__)
        return None


def _guarded(what: str, default: Any, compute: Callable[..., Any], *args: Any) -> Any:
    try:
        return compute(*args)
    except Exception as exc:
        log.warning("report: could not compute %s (%s: %s); left out", what, type(exc).__name__, exc)
        return default


def spark_info(spark: SparkSession) -> dict[str, Any]:
    """The operator's Spark link (no public API gives the live UI's address: ``ui_url`` stays empty)."""
    app, master = conf_value(spark, "spark.app.id"), conf_value(spark, "spark.master")
    return {"application_id": app, "master": master, "ui_url": None}


def _errors(
    spark: SparkSession, parts: ReportParts, decisions_path: str, signatures: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(fix errors, sample errors)`` of the shown groups, the most frequent fix errors first."""
    wanted = {sig: parts.errors[sig] for sig in signatures if sig in parts.errors}
    files = part_files(decisions_path)
    work = partial(error_count_rows, files, wanted, tuple(signatures))
    counts: dict[bool, Counter[tuple[str, str]]] = {False: Counter(), True: Counter()}
    for row in in_tasks(spark, work, len(files), COUNT_SCHEMA).to_pylist():
        counts[row["fix"]][(row["signature"], row["text"])] += row["n"]
    errors = {
        sig: [{"message": message, "count": counts[False][(sig, message)]} for message in messages]
        for sig, messages in wanted.items()
    }
    ranked = sorted(counts[True].items(), key=lambda item: (item[0][0], -item[1], item[0][1]))
    fix_errors = {
        sig: [{"error": error, "count": n} for (_, error), n in islice(mine, FIX_ERRORS)]
        for sig, mine in groupby(ranked, key=lambda item: item[0][0])
    }
    return fix_errors, errors


def _representatives(
    spark: SparkSession, ctx: ReportContext, parts: ReportParts, signatures: list[str]
) -> dict[str, list[Any]]:
    """The shown groups' representatives, each paired with its snapshot row (or ``None``)."""
    per_group = PAYLOAD_SAMPLES if ctx.payload_snippets else 1
    first = {sig: list(rows)[:per_group] for sig, rows in groupby(parts.reps, itemgetter("signature"))}
    reps = {sig: first.get(sig, []) for sig in signatures}  # parts.reps: sorted by signature, then order
    keys = sorted({(r["dlq_topic"], r["dlq_message_id"]) for mine in reps.values() for r in mine})
    args = (spark, ctx.snapshot_path, keys, ctx.payload_snippets)
    found = _guarded("snapshot samples", {}, snapshot_messages, *args)
    return {
        sig: [(r, found.get((r["dlq_topic"], r["dlq_message_id"]))) for r in mine]
        for sig, mine in reps.items()
    }


def _explanation(playbook: Playbook, rep: Any, snap: Any) -> dict[str, Any]:
    """Each rule's verdict for a representative message (property values never shown)."""
    explained = {
        "message_id": rep["dlq_message_id"],
        "outcome": rep["outcome"],
        "outcome_reason": rep["outcome_reason"],
        "matched_rule": rep["rule"],
    }
    if rep["outcome"] in oc.UNSCOPED or rep["context_format"] == "none":
        return {**explained, "rules": [], "note": rep["outcome_reason"] or "the playbook was not applied"}
    fields = ("signature", "error_class", "error_message", "origin_topic", "context_format")
    properties = None if snap is None else dict(snap["properties"] or {})
    record = MatchInput(**{name: rep[name] for name in fields}, properties=properties or {})
    note = None
    if properties is None and any(rule.properties for rule in playbook.rules):
        note = "the message's properties were not available: property conditions show as missing"
    return {**explained, "rules": explain_rules(playbook, record), "note": note}


def _fill_groups(
    ctx: ReportContext, shown: list[dict[str, Any]], errors: tuple[dict[str, Any], dict[str, Any]], reps: Any
) -> None:
    def snippet(rep: Any, snap: Any) -> str:
        if not ctx.options.archive_payload or ctx.playbook.payload_off(rep["dlq_topic"], rep["origin_topic"]):
            return "(payload off for this topic)"
        return mask_payload(snap["value"])

    for group in shown:
        sig, mine = group["signature"], reps.get(group["signature"], [])
        group["fix_errors"], group["sample_errors"] = errors[0].get(sig, []), errors[1].get(sig, [])
        if mine:
            group["explanation"] = _explanation(ctx.playbook, *mine[0])
        if ctx.payload_snippets:
            samples = [(rep["dlq_message_id"], snippet(rep, snap)) for rep, snap in mine if snap is not None]
            group["payload_samples"] = [{"message_id": i, "snippet": text} for i, text in samples]


def refused_origins(decisions: DataFrame) -> list[dict[str, Any]]:
    """Origin topics the allowlist refused, with counts (largest first)."""
    topic = F.coalesce("target_topic", "origin_topic").alias("topic")
    refused = decisions.filter(F.col("outcome") == oc.ORIGIN_REFUSED).groupBy(topic, "outcome_reason").count()
    rows = refused.orderBy(F.desc("count"), "topic").limit(REFUSED_ORIGINS).collect()
    return [{"topic": r["topic"], "reason": r["outcome_reason"], "count": int(r["count"])} for r in rows]


def trend(spark: SparkSession, ctx: ReportContext, report: dict[str, Any]) -> dict[str, Any] | None:
    """Count per group over the ledger's last :data:`TREND_RUNS` runs; this run (maybe a dry-run) last."""
    run_id, shown = report["run_id"], report["groups"][:TREND_GROUPS]
    signatures = [g["signature"] for g in shown]
    counts = {(run_id, g["signature"]): int(g["count"]) for g in shown}
    ledger = _read(spark, ctx.ledger_path, LEDGER_SCHEMA, other_than=run_id)
    if ledger is None:
        return None
    earlier = ledger.filter(F.col("run_id") != F.lit(run_id))  # a partition filter: this run's not read
    per_run = (F.max("recorded_at").alias("at"), F.count(F.lit(1)).alias("messages"), F.first("mode"))
    latest = earlier.groupBy("run_id").agg(*per_run).orderBy(F.desc("at"), F.desc("run_id"))
    runs = [
        {"run_id": r[0], "at": r[1].isoformat() if r[1] else None, "messages": int(r[2]), "mode": r[3]}
        for r in reversed(latest.limit(TREND_RUNS - 1).collect())
    ]
    if not runs:
        return None
    if signatures:
        ids = [r["run_id"] for r in runs]
        mine = earlier.filter(F.col("run_id").isin(ids) & F.col("signature").isin(signatures))
        for row in mine.groupBy("run_id", "signature").count().collect():
            counts[(row["run_id"], row["signature"])] = int(row["count"])
    at = report.get("finished_at")
    if ctx.recorded_at is not None:  # as ``collect`` returns a timestamp: naive, in local time
        at = ctx.recorded_at.astimezone().replace(tzinfo=None).isoformat()
    messages = report["totals"].get("snapshot", 0)
    runs.append({"run_id": run_id, "at": at, "messages": messages, "mode": report.get("mode")})
    groups = [{"signature": s, "counts": [counts.get((r["run_id"], s), 0) for r in runs]} for s in signatures]
    return {"runs": runs, "groups": groups}


def run_concurrently(spark: SparkSession, *queries: Callable[[], Any]) -> list[Any]:
    """Each query's result, from a driver thread of its own inheriting the caller's job tags (a short job's
    time goes mostly to driver planning, leaving cores idle); the first error is raised once all ended."""
    if len(queries) <= 1:
        return [query() for query in queries]
    # Wrapped in the caller's thread: that is when the job group and description are captured.
    inherit = inheritable_thread_target(spark)
    with ThreadPoolExecutor(max_workers=len(queries), thread_name_prefix="dlq-query") as pool:
        futures = [pool.submit(inherit(query)) for query in queries]
    return [future.result() for future in futures]


def add_details(
    report: dict[str, Any], spark: SparkSession, ctx: ReportContext, parts: ReportParts | None
) -> None:
    """Add the configuration, explanations, refused origins, trend and next steps to ``report``."""
    report["config"] = run_config(ctx.options, ctx.playbook)
    report["spark"] = spark_info(spark)
    decisions = _read(spark, ctx.decisions_path, DECIDED_SCHEMA)
    shown = report["groups"][:DETAIL_GROUPS]
    signatures = [g["signature"] for g in shown]
    queries = {"trend": partial(_guarded, "the trend", None, trend, spark, ctx, report)}
    if decisions is not None and signatures and parts is not None:
        errors = (spark, parts, ctx.decisions_path, signatures)
        queries["errors"] = partial(_guarded, "sample errors", ({}, {}), _errors, *errors)
        queries["reps"] = partial(_representatives, spark, ctx, parts, signatures)
    if decisions is not None and report["totals"].get(oc.ORIGIN_REFUSED):
        queries["refused"] = partial(_guarded, "refused origins", [], refused_origins, decisions)
    results = dict(zip(queries, run_concurrently(spark, *queries.values()), strict=True))
    if "reps" in results:
        _fill_groups(ctx, shown, results["errors"], results["reps"])
    if "refused" in results:
        report["refused_origins"] = results["refused"]
    report["trend"] = results["trend"]
    report["next_steps"] = next_steps(report)


def run_report(run: Run, started_wall: datetime) -> dict[str, Any]:
    """Write ``report.json`` and ``report.html`` from the record tasks' parts and the steps' counts."""
    options, info, paths = run.options, run.state.info, run.paths
    started = time.monotonic()
    run.step("report")
    commit, apply = info("commit"), info("apply")
    recorded_at = info("record").get("recorded_at")  # none before the record step, or in a dry-run
    snapshot_reads = int(info("snapshot").get("dlq_reads", 0))
    failed = int(apply.get("publish_failed", 0)) or int(commit.get("unacked_final", 0))
    snippets = BOOLEAN_WORDS.get(str(conf_value(run.spark, CONF_PAYLOAD_SNIPPETS)).lower(), False)
    parts = None if info("snapshot").get("empty_window") else read_parts(paths.report_parts)
    report = build_report(
        parts,
        run_id=options.run_id,
        mode=options.mode,
        status="partial" if failed else "succeeded",
        started_at=run.state.started_at,
        finished_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        commit=CommitTotals(
            **{name: int(commit.get(name, 0)) for name in _COMMIT_COUNTS},
            read_mode=str(info("plan").get("read_mode", "consumer")),
            reads_per_message=float(commit.get("reads_per_message", 1.0 if snapshot_reads else 0.0)),
        ),
        timings=dict(run.state.timings),
        paths=paths.public(),
        resend={key: int(apply.get(key, 0)) for key in _RESEND_COUNTS},
        canary={"size": options.canary.label, **(apply.get("canary") or {})} if options.canary else None,
    )
    recorded = datetime.fromisoformat(str(recorded_at)) if recorded_at else None
    context = ReportContext(
        options, run.playbook, paths.decisions, paths.snapshot, paths.ledger, snippets, recorded
    )
    add_details(report, run.spark, context, parts)
    report["timings"]["report"] = round(time.monotonic() - started, 3)  # the aggregation included
    run.storage.write_text(paths.report_json, json.dumps(report, indent=2, sort_keys=True))
    run.storage.write_text(paths.report_html, render_html(report))
    run.done("report", started, status=report["status"])
    elapsed = (datetime.now(UTC) - started_wall).total_seconds()
    totals = " ".join(f"{k}={v}" for k, v in report["totals"].items())
    log.info("run %s %s in %.1fs: %s", options.run_id, report["status"], elapsed, totals)
    return report
