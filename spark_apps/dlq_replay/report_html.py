"""Self-contained HTML page of a run report: totals, an inline SVG bar chart of groups by outcome, a table.

No scripts, no external assets. Every value that came from a message (templates, classes, topics, ids)
is HTML-escaped.
"""

from __future__ import annotations

from html import escape
from typing import Any

from spark_apps.dlq_replay import outcomes as oc

CHART_GROUPS = 30
COLORS: dict[str, str] = {
    oc.REPUBLISHED: "#2e7d32",
    oc.ARCHIVED: "#1565c0",
    oc.DROPPED: "#6d4c41",
    oc.SKIPPED: "#9e9e9e",
    oc.FIX_FAILED: "#c62828",
    oc.ORIGIN_REFUSED: "#ad1457",
    oc.MALFORMED: "#ef6c00",
    oc.LOOP_GUARDED: "#6a1b9a",
    oc.ALREADY_FINAL: "#00838f",
    oc.DUPLICATE: "#4dd0e1",
    oc.ORIGIN_CONFLICT: "#f06292",
    oc.FILTERED: "#cfd8dc",
    oc.PUBLISH_FAILED: "#b71c1c",
}
_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:4px 8px;vertical-align:top}
th{background:#f5f5f5;text-align:left}code{font-size:12px}.num{text-align:right}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
.note{color:#555;font-size:13px}
"""


def _color(outcome: str) -> str:
    return COLORS.get(outcome, "#757575")


def bar_chart_svg(groups: list[dict[str, Any]], *, width: int = 900, bar_height: int = 18) -> str:
    """A horizontal stacked bar per group (count split by outcome), largest groups first."""
    shown = groups[:CHART_GROUPS]
    if not shown:
        return '<p class="note">No messages in this run.</p>'
    label_width, gap = 260, 6
    plot_width = width - label_width - 70
    biggest = max(g["count"] for g in shown) or 1
    height = len(shown) * (bar_height + gap) + 10
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="groups by count and outcome">'
    ]
    for row, group in enumerate(shown):
        y = 5 + row * (bar_height + gap)
        label = f"{group['signature']} {group['template']}"
        short = label if len(label) <= 42 else label[:41] + "\u2026"
        parts.append(
            f'<text x="0" y="{y + bar_height - 5}" font-size="11" font-family="monospace">'
            f"<title>{escape(label)}</title>{escape(short)}</text>"
        )
        x = float(label_width)
        for outcome, n in group["outcomes"].items():
            w = plot_width * n / biggest
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{bar_height}" '
                f'fill="{_color(outcome)}"><title>{escape(outcome)}: {n}</title></rect>'
            )
            x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + bar_height - 5}" font-size="11">{group["count"]}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _legend(outcomes: list[str]) -> str:
    items = "".join(f'<span><i style="background:{_color(o)}"></i>{escape(o)}</span>' for o in outcomes)
    return f'<div class="legend">{items}</div>'


def render_html(report: dict[str, Any]) -> str:
    """The report page (one self-contained HTML document)."""
    totals = report["totals"]
    groups = report["groups"]
    used = sorted(
        {o for g in groups for o in g["outcomes"]},
        key=lambda o: (oc.OUTCOMES.index(o) if o in oc.OUTCOMES else 99, o),
    )
    title = f"DLQ replay {report['run_id']}"
    dry = (
        '<p class="note"><b>Dry-run:</b> the outcomes are what a replay would do; nothing was published, '
        "archived, recorded or acknowledged.</p>"
        if report.get("dry_run")
        else ""
    )
    total_rows = "".join(f"<tr><th>{escape(k)}</th><td class='num'>{v}</td></tr>" for k, v in totals.items())
    timing_rows = "".join(
        f"<tr><th>{escape(k)}</th><td class='num'>{v:.2f} s</td></tr>" for k, v in report["timings"].items()
    )
    group_rows = []
    for g in groups:
        outs = ", ".join(f"{escape(k)}: {v}" for k, v in g["outcomes"].items())
        samples = "<br>".join(f"<code>{escape(s)}</code>" for s in g["sample_message_ids"])
        group_rows.append(
            "<tr>"
            f"<td><code>{escape(g['signature'])}</code></td>"
            f"<td>{escape(g['template'] or '')}</td>"
            f"<td>{escape(g['error_class'] or '')}</td>"
            f"<td>{escape(g['origin_topic'] or '')}</td>"
            f"<td>{escape(', '.join(g.get('context_formats') or [g.get('context_format') or '']))}"
            f"<br>{escape(g.get('reason') or '')}</td>"
            f"<td class='num'>{g['count']}</td>"
            f"<td>{escape(g['first_seen'] or '')}<br>{escape(g['last_seen'] or '')}</td>"
            f"<td>{escape(g['action'] or '')}</td>"
            f"<td>{escape(', '.join(g['rules']))}</td>"
            f"<td>{outs}</td>"
            f"<td>{samples}</td>"
            "</tr>"
        )
    other = report.get("other_groups", {})
    other_note = (
        f'<p class="note">{other["groups"]} smaller groups ({other["count"]} messages) are not listed.</p>'
        if other.get("groups")
        else ""
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1>"
        f"<p>mode <b>{escape(report['mode'])}</b> &middot; status <b>{escape(report['status'])}</b> &middot; "
        f"{escape(report['started_at'])} &rarr; {escape(report['finished_at'])}</p>{dry}"
        "<h2>Groups by count and outcome</h2>"
        f"{_legend(used)}{bar_chart_svg(groups)}"
        f"<h2>Totals</h2><table>{total_rows}</table>"
        "<h2>Groups</h2><table><tr><th>signature</th><th>template</th><th>error class</th>"
        "<th>origin topic</th><th>format / reason</th><th>count</th><th>first / last seen</th><th>action</th>"
        "<th>rules</th><th>outcomes</th>"
        f"<th>sample message ids</th></tr>{''.join(group_rows)}</table>{other_note}"
        f"<h2>Timings</h2><table>{timing_rows}</table>"
        "</body></html>"
    )
