"""Human-readable text of a replay summary (the ``DlqReplayOperator`` XCom), for logs and the demo."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

_TOTAL_ORDER = (
    "snapshot",
    "republished",
    "archived",
    "dropped",
    "skipped",
    "fix_failed",
    "origin_refused",
    "malformed",
    "loop_guarded",
    "already_final",
    "publish_failed",
    "filtered",
    "acked",
    "left_pending",
)


def format_summary(summary: Mapping[str, Any]) -> str:
    """A few lines: run, status, totals, one line per error group, and where the files are."""
    totals = dict(summary.get("totals") or {})
    keys = [k for k in _TOTAL_ORDER if k in totals] + sorted(k for k in totals if k not in _TOTAL_ORDER)
    lines = [
        f"DLQ replay run {summary.get('run_id')} (mode {summary.get('mode')}): {summary.get('status')}",
        "  totals: " + ", ".join(f"{k}={totals[k]}" for k in keys if totals[k]) if totals else "  totals: -",
    ]
    groups = list(summary.get("groups") or [])
    count = int(summary.get("group_count") or len(groups))
    lines.append(f"  error groups: {count}" + (f" (top {len(groups)} shown)" if count > len(groups) else ""))
    for group in groups:
        outcomes = ", ".join(f"{k}={v}" for k, v in (group.get("outcomes") or {}).items())
        lines.append(
            f"    [{group.get('signature')}] x{group.get('count')} {group.get('error_class') or '-'}: "
            f"{group.get('template')!r} from {group.get('origin_topic') or '?'} "
            f"-> {group.get('action') or 'skip'} ({outcomes})"
        )
    paths = dict(summary.get("paths") or {})
    for label, key in (
        ("report (JSON)", "report_json"),
        ("report (HTML)", "report_html"),
        ("archive", "archive"),
        ("ledger", "ledger"),
        ("snapshot", "snapshot"),
    ):
        if paths.get(key):
            lines.append(f"  {label:<14} {paths[key]}")
    return "\n".join(lines)
