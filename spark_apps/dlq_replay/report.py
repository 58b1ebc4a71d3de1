"""Report step: per-signature groups, run totals and timings as JSON; the printed summary.

The groups come from the parts the record tasks wrote (:mod:`~spark_apps.dlq_replay.report_parts`): only
aggregates reach the driver (one row per group x outcome x action, and at most ``SAMPLE_IDS`` message
ids per group), never anything proportional to the number of messages.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pulsar_dlq_consumer.replay_options import SUMMARY_PREFIX
from spark_apps.dlq_replay import outcomes as oc

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_apps.dlq_replay.report_details import ReportContext
    from spark_apps.dlq_replay.report_parts import ReportParts
    from spark_apps.dlq_replay.run_context import Run

log = logging.getLogger("spark_apps.dlq_replay")

REPORT_FORMAT = 1
MAX_GROUPS = 200
TOTAL_KEYS: tuple[str, ...] = (
    "snapshot",
    oc.REPUBLISHED,
    oc.ARCHIVED,
    oc.DROPPED,
    oc.SKIPPED,
    oc.FIX_FAILED,
    oc.ORIGIN_REFUSED,
    oc.ORIGIN_CONFLICT,
    oc.MALFORMED,
    oc.LOOP_GUARDED,
    oc.ALREADY_FINAL,
    oc.DUPLICATE,
    "acked",
    "left_pending",
    oc.FILTERED,
    oc.PUBLISH_FAILED,
    "resent",
    oc.CANARY_FAILED,
)


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


def _label(outcome: str | None, mode: str) -> str:
    """Outcome as reported: a dry-run reports what it would do (``to_republish`` -> ``republished``)."""
    if outcome == oc.TO_REPUBLISH:
        return oc.REPUBLISHED if mode == oc.DRY_RUN else oc.PUBLISH_FAILED
    return outcome or "unknown"


#: Python errors whose message is only the value that failed (``str(KeyError("coupon"))`` is
#: ``'coupon'``, masked to ``<str>``): the report says what the value is.
_BARE_VALUE_ERRORS = {"KeyError": "missing key {}"}


def display_template(error_class: str | None, template: str) -> str:
    """The template as the report shows it: ``missing key <str>`` for a ``KeyError`` whose message is
    only the key (the signature keeps the plain template)."""
    simple = str(error_class or "").rsplit(".", 1)[-1]
    shape = _BARE_VALUE_ERRORS.get(simple)
    if shape is None or not template or shape.format("") in template:
        return template
    return shape.format(template)


def build_groups(
    combos: list[dict[str, Any]], samples: dict[str, list[str]], mode: str, max_groups: int = MAX_GROUPS
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Merge aggregates into report groups (largest first); groups past ``max_groups`` are summed."""
    groups: dict[str, dict[str, Any]] = {}
    for combo in combos:
        sig = combo["signature"]
        group = groups.setdefault(
            sig,
            {
                "signature": sig,
                "template": display_template(combo["error_class"], combo["template"] or ""),
                "error_class": combo["error_class"],
                "origin_topic": combo["origin_topic"],
                "reason": combo.get("reason"),
                "context_formats": [],
                "count": 0,
                "first_seen": None,
                "last_seen": None,
                "sample_message_ids": samples.get(sig, []),
                "action": None,
                "actions": {},
                "rules": [],
                "outcomes": {},
                "no_rule": 0,
            },
        )
        n = int(combo["n"])
        group["count"] += n
        for fmt in combo.get("context_formats") or []:
            if fmt not in group["context_formats"]:
                group["context_formats"].append(fmt)
        for key, pick in (("first_seen", min), ("last_seen", max)):
            value = combo[key]
            if value is not None:
                group[key] = value if group[key] is None else pick(group[key], value)
        if combo["action"]:
            group["actions"][combo["action"]] = group["actions"].get(combo["action"], 0) + n
        if combo["rule"] and combo["rule"] not in group["rules"]:
            group["rules"].append(combo["rule"])
        label = _label(combo["outcome"], mode)
        group["outcomes"][label] = group["outcomes"].get(label, 0) + n
        if combo["outcome"] == oc.SKIPPED and not combo["rule"]:
            group["no_rule"] += n  # no playbook rule matched (skip is the default)
    ordered = sorted(groups.values(), key=lambda g: (-g["count"], g["signature"]))
    for group in ordered:
        group["action"] = (
            max(group["actions"], key=lambda a: (group["actions"][a], a)) if group["actions"] else None
        )
        group["rules"].sort()
        # Every format the group's messages came in; one label only when they all agree.
        group["context_formats"].sort()
        formats = group["context_formats"]
        group["context_format"] = formats[0] if len(formats) == 1 else ("mixed" if formats else None)
        group["outcomes"] = {k: group["outcomes"][k] for k in sorted(group["outcomes"], key=_outcome_order)}
    kept, rest = ordered[:max_groups], ordered[max_groups:]
    other = {"groups": len(rest), "count": sum(g["count"] for g in rest)}
    return kept, other


def _outcome_order(name: str) -> tuple[int, str]:
    return (oc.OUTCOMES.index(name) if name in oc.OUTCOMES else len(oc.OUTCOMES), name)


def build_totals(counts: dict[str, int], commit: CommitTotals, mode: str) -> dict[str, int]:
    """Run totals from the outcome counts of all messages (groups past the cap included)."""
    totals = dict.fromkeys(TOTAL_KEYS, 0)
    for name, n in counts.items():
        if name in totals:
            totals[name] += n
    snapshot = sum(counts.values())
    totals["snapshot"] = snapshot
    totals["acked"] = commit.acked
    final = sum(n for name, n in counts.items() if name in oc.FINAL_OUTCOMES)
    totals["left_pending"] = snapshot if mode == oc.DRY_RUN else snapshot - final
    return totals


def outcome_counts(combos: list[dict[str, Any]], mode: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for combo in combos:
        label = _label(combo["outcome"], mode)
        counts[label] = counts.get(label, 0) + int(combo["n"])
    return counts


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
    max_groups: int = MAX_GROUPS,
    resend: dict[str, int] | None = None,
    context: ReportContext | None = None,
    spark: SparkSession | None = None,
    canary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The machine-readable report (stable schema, ``format`` 1); see ``docs/report.md``.

    ``resend``: what a resumed apply sent again because killed attempts had started its waves:
    ``resent`` messages (each wave once per such attempt), ``resent_held`` of them the broker already
    held and dropped (deduplication), and ``resend_bound`` (wave size x producers, once per such
    attempt), the most that can reach the origins twice without deduplication.
    ``parts``: the groups and representatives the record tasks gathered
    (:mod:`~spark_apps.dlq_replay.report_parts`); ``None`` for a run without a message (an empty window).
    With a ``context`` and ``spark`` the report also explains itself (configuration, per-group rule
    evaluation, fix and sample errors, refused origins, trend over the ledger, next steps; see
    :mod:`spark_apps.dlq_replay.report_details`). ``canary``: the canary's size and per-group verdicts (a
    canary run); the report adds its ``verdict`` (:func:`canary_verdict`), which the next steps explain.
    """
    combos, samples = (parts.combos, parts.samples) if parts is not None else ([], {})
    groups, other = build_groups(combos, samples, mode, max_groups)
    counts = outcome_counts(combos, mode)
    totals = build_totals(counts, commit, mode)
    resend = {"resent": 0, "resent_held": 0, "resend_bound": 0, **(resend or {})}
    totals["resent"] = resend["resent"]
    report = {
        "format": REPORT_FORMAT,
        "run_id": run_id,
        "mode": mode,
        "dry_run": mode == oc.DRY_RUN,
        "status": status,
        "started_at": started_at,
        "finished_at": finished_at,
        "totals": totals,
        "commit": {
            "acked": commit.acked,
            "left_pending_seen": commit.left_pending_seen,
            "beyond_window": commit.beyond_window,
            "unacked_final": commit.unacked_final,
            "final_in_partial_entries": commit.final_in_partial_entries,
            "read_mode": commit.read_mode,
            "reads_per_message": commit.reads_per_message,
        },
        "resend": resend,
        "groups": groups,
        "other_groups": other,
        "timings": timings,
        "paths": paths,
    }
    if canary is not None:
        report["canary"] = {**canary, **canary_verdict(canary.get("verdicts") or {}, counts)}
    if context is not None and spark is not None:
        from spark_apps.dlq_replay.report_details import add_details

        add_details(report, spark, context, parts)
    return report


def canary_verdict(verdicts: dict[str, dict[str, Any]], counts: dict[str, int]) -> dict[str, Any]:
    """The run's canary verdict: ``halted`` (some group's canary failed again; its other messages stay
    pending as ``canary_failed``), ``passed`` (every group's canary held) or ``not judged`` (no verdict
    yet)."""
    halted = sorted(s for s, v in verdicts.items() if v.get("decision") == "halted")
    verdict = "halted" if halted else "passed" if verdicts else "not judged"
    return {"verdict": verdict, "halted": halted, "held_back": int(counts.get(oc.CANARY_FAILED, 0))}


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The summary pushed to XCom and printed last: run_id, mode, status, totals, paths (and the Spark
    application when known)."""
    keys = ("run_id", "mode", "status", "totals", "paths", "spark", "canary")
    return {k: report[k] for k in keys if k in report}


def summary_line(report: dict[str, Any]) -> str:
    """The last stdout line of a run: ``DLQ_REPLAY_SUMMARY <json>``."""
    return SUMMARY_PREFIX + json.dumps(summary(report), sort_keys=True, separators=(",", ":"))


def summary_text(report: dict[str, Any]) -> str:
    """A human-readable summary: totals, then the largest groups."""
    totals = report["totals"]
    lines = [
        f"DLQ replay run {report['run_id']} ({report['mode']}): {report['status']}",
        "  " + "  ".join(f"{k}={totals[k]}" for k in TOTAL_KEYS if k in totals),
    ]
    for group in report["groups"][:10]:
        outs = ", ".join(f"{k}={v}" for k, v in group["outcomes"].items())
        lines.append(f"  [{group['signature']}] x{group['count']} {group['template'][:80]!r} -> {outs}")
    if report["other_groups"]["groups"]:
        lines.append(
            f"  ... and {report['other_groups']['groups']} smaller groups "
            f"({report['other_groups']['count']} messages)"
        )
    lines.append(f"  report: {report['paths'].get('report_html', '')}")
    return "\n".join(lines)


def _recorded_at(run: Run) -> datetime | None:
    """When this run's record step wrote its ledger rows (``None`` before it, or in a dry-run)."""
    value = run.state.info("record").get("recorded_at")
    return datetime.fromisoformat(str(value)) if value else None


def _report_parts(run: Run) -> ReportParts | None:
    """The record tasks' report parts (:mod:`~spark_apps.dlq_replay.report_parts`); ``None`` for an
    empty window (no record task ran)."""
    if run.state.info("snapshot").get("empty_window"):
        return None
    from spark_apps.dlq_replay.report_parts import read_parts

    return read_parts(run.paths.report_parts)


def run_report(run: Run, started_wall: datetime) -> dict[str, Any]:
    """Write the run's report (``report.json``, ``report.html``) from the record tasks' parts and the
    steps' counts."""
    from spark_apps.dlq_replay.report_details import ReportContext
    from spark_apps.dlq_replay.report_html import render_html

    options = run.options
    playbook = run.playbook
    started = time.monotonic()
    run.step("report")
    commit_info = run.state.info("commit")
    snapshot_reads = int(run.state.info("snapshot").get("dlq_reads", 0))
    failed = int(run.state.info("apply").get("publish_failed", 0))
    parts = _report_parts(run)
    report = build_report(
        parts,
        run_id=options.run_id,
        mode=options.mode,
        status="partial" if failed or int(commit_info.get("unacked_final", 0)) else "succeeded",
        started_at=run.state.started_at,
        finished_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        commit=CommitTotals(
            acked=int(commit_info.get("acked", 0)),
            left_pending_seen=int(commit_info.get("left_pending_seen", 0)),
            beyond_window=int(commit_info.get("beyond_window", 0)),
            unacked_final=int(commit_info.get("unacked_final", 0)),
            final_in_partial_entries=int(commit_info.get("final_in_partial_entries", 0)),
            read_mode=str(run.state.info("plan").get("read_mode", "consumer")),
            reads_per_message=float(commit_info.get("reads_per_message", 1.0 if snapshot_reads else 0.0)),
        ),
        timings=dict(run.state.timings),
        paths=run.paths.public(),
        resend={
            key: int(run.state.info("apply").get(key, 0)) for key in ("resent", "resent_held", "resend_bound")
        },
        context=ReportContext(
            options,
            playbook,
            run.paths.decisions,
            run.paths.snapshot,
            run.paths.ledger,
            recorded_at=_recorded_at(run),
        ),
        spark=run.spark,
        canary=(
            {"size": options.canary.label, **(run.state.info("apply").get("canary") or {})}
            if options.canary
            else None
        ),
    )
    report["timings"]["report"] = round(time.monotonic() - started, 3)  # the aggregation included
    run.storage.write_text(run.paths.report_json, json.dumps(report, indent=2, sort_keys=True))
    run.storage.write_text(run.paths.report_html, render_html(report))
    run.done("report", started, status=report["status"])
    log.info(
        "run %s %s in %.1fs: %s",
        options.run_id,
        report["status"],
        (datetime.now(UTC) - started_wall).total_seconds(),
        " ".join(f"{k}={v}" for k, v in report["totals"].items()),
    )
    return report
