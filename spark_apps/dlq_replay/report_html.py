"""The report as one self-contained HTML page: no scripts, no external assets, every value HTML-escaped
(``docs/report.md``); chart labels are text beside CSS bars, so long labels wrap instead of overlapping."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.report_explain import clipped, outcome_order

if TYPE_CHECKING:
    from collections.abc import Iterable

CHART_GROUPS = 30
#: A chart label's template, and its error class and origin topic, are cut to these (``docs/report.md``).
LABEL_TEMPLATE_CHARS = 160
LABEL_PART_CHARS = 100
OPEN_DETAILS = 3
#: Each outcome's colour, in :data:`~spark_apps.dlq_replay.outcomes.OUTCOMES` order (``canary_failed``: grey).
_PALETTE = (
    "#2e7d32 #1565c0 #6d4c41 #9e9e9e #c62828 #ad1457 #f06292 #ef6c00 #6a1b9a #00838f #4dd0e1 #b0bec5 #b71c1c"
)
COLORS: dict[str, str] = dict(zip(oc.OUTCOMES, _PALETTE.split(), strict=False))
_GROUP_HEAD = (
    "signature|template|error class|origin topic|format / reason|count|first / last seen|action|rules|"
    "outcomes|sample message ids"
)
_ERROR_LISTS = (("fix_errors", "Fix errors", "error"), ("sample_errors", "Sample error messages", "message"))
SEVERITY_COLORS = {"action": "#c62828", "info": "#1565c0", "ok": "#2e7d32"}
_STYLE = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;padding:24px;
max-width:1200px;color:#1f2328;line-height:1.45}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:32px 0 10px;border-bottom:1px solid #d8dee4;
padding-bottom:4px}h3{font-size:14px;margin:14px 0 6px}
table{border-collapse:collapse;font-size:13px;margin:4px 0}td,th{border:1px solid #d8dee4;padding:4px 8px;
vertical-align:top;text-align:left}th{background:#f6f8fa}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
pre{background:#f6f8fa;border:1px solid #d8dee4;padding:8px;overflow-x:auto;white-space:pre-wrap;margin:6px 0}
.num{text-align:right;font-variant-numeric:tabular-nums}.muted{color:#59636e}.small{font-size:12px}
.meta span{margin-right:14px}
.badge{display:inline-block;font-style:normal;padding:1px 8px;border-radius:10px;font-size:12px;
color:#fff;background:#59636e}
.steps{list-style:none;padding:0;margin:0}.steps li{border-left:4px solid #59636e;background:#f6f8fa;
padding:8px 12px;margin:8px 0;overflow-wrap:anywhere}.steps b{display:block}
.chips{display:flex;flex-wrap:wrap;gap:8px}.chip{border:1px solid #d8dee4;border-radius:6px;padding:6px 10px;
min-width:110px}.chip b{display:block;font-size:18px;font-variant-numeric:tabular-nums}
.legend{margin:6px 0 10px}.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle;
border-radius:2px}
.bars{display:grid;grid-template-columns:minmax(220px,38%) 1fr 64px;gap:6px 12px;align-items:center}
.bar-label{font-size:12px;overflow-wrap:anywhere}.bar-label code{font-weight:600}
.bar-track{display:flex;height:18px;background:#f6f8fa;border-radius:3px;overflow:hidden}
.bar-track span{display:block;height:100%}
details{border:1px solid #d8dee4;border-radius:6px;padding:6px 12px;margin:10px 0}
summary{cursor:pointer;font-weight:600;overflow-wrap:anywhere}
.yes{color:#2e7d32;font-weight:600}.no{color:#59636e}.skip{color:#8c959f}
dl.config{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;font-size:13px}
dl.config dt{font-weight:600}dl.config dd{margin:0;overflow-wrap:anywhere}
th.run{min-width:110px;max-width:180px;overflow-wrap:anywhere;font-weight:600}
table.trend th:first-child{min-width:260px;max-width:420px;overflow-wrap:anywhere}
"""


def _color(outcome: str) -> str:
    return COLORS.get(outcome, "#757575")


def _e(value: Any) -> str:
    return escape("" if value is None else str(value))


def _fmt(n: Any) -> str:
    return f"{int(n):,}" if isinstance(n, (int, float)) else _e(n)


def _outcome_text(group: dict[str, Any]) -> str:
    return ", ".join(f"{o}: {n}" for o, n in group["outcomes"].items())


def _formats(group: dict[str, Any]) -> str:
    return ", ".join(group.get("context_formats") or [group.get("context_format") or ""])


def _table(head: str, rows: Iterable[str]) -> str:
    """A table of ``rows`` (each a row's ``<td>`` cells) under the header cells ``head`` (``|``-separated)."""
    cells = "".join(f"<th>{_e(name)}</th>" for name in head.split("|"))
    return f"<table><tr>{cells}</tr>{''.join(f'<tr>{row}</tr>' for row in rows)}</table>"


def bar_chart(groups: list[dict[str, Any]]) -> str:
    """One row per group: a wrapping label, a bar stacked by outcome (scaled to the largest), the count."""
    shown = groups[:CHART_GROUPS]
    if not shown:
        return '<p class="muted">No messages in this run.</p>'
    biggest = max(g["count"] for g in shown) or 1
    rows = []
    for group in shown:
        segments = "".join(
            f'<span style="width:{100 * n / biggest:.2f}%;background:{_color(o)}" '
            f'title="{_e(o)}: {n}"></span>'
            for o, n in group["outcomes"].items()
        )
        parts = (group.get("error_class"), group.get("origin_topic"))
        where = " · ".join(_e(clipped(v, LABEL_PART_CHARS)) for v in parts if v)
        template = group["template"] or ""
        rows.append(
            f'<div class="bar-label" title="{_e(template)}"><code>{_e(group["signature"])}</code> '
            f'{_e(clipped(template, LABEL_TEMPLATE_CHARS))}<br><span class="muted">{where}</span></div>'
            f'<div class="bar-track" role="img" aria-label="{_e(_outcome_text(group))}">{segments}</div>'
            f'<div class="num small">{_fmt(group["count"])}</div>'
        )
    more = len(groups) - len(shown)
    note = f'<p class="muted small">{more} smaller groups are not charted.</p>' if more > 0 else ""
    return f'<div class="bars">{"".join(rows)}</div>{note}'


def sparkline(counts: list[int], *, width: int = 120, height: int = 24) -> str:
    """A tiny inline SVG line of ``counts`` (two or more, oldest left), the last point marked."""
    top, step = max(counts) or 1, width / (len(counts) - 1)
    points = [(i * step, height - 3 - (height - 6) * c / top) for i, c in enumerate(counts)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    x, y = points[-1]
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="counts {" ".join(str(c) for c in counts)}"><polyline points="{path}" fill="none" '
        f'stroke="#1565c0" stroke-width="1.5"/>'
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#1565c0"/></svg>'
    )


def _next_steps(steps: list[dict[str, Any]]) -> str:
    items = []
    for step in steps:
        color = SEVERITY_COLORS.get(step.get("severity", ""), "#59636e")
        code = f"<pre>{_e(step['code'])}</pre>" if step.get("code") else ""
        detail = f"<span>{_e(step.get('detail'))}</span>" if step.get("detail") else ""
        items.append(f'<li style="border-left-color:{color}"><b>{_e(step["title"])}</b>{detail}{code}</li>')
    return f'<h2 id="next">What to do next</h2><ul class="steps">{"".join(items)}</ul>' if items else ""


def _canary(canary: dict[str, Any] | None, groups: list[dict[str, Any]]) -> str:
    if not canary:
        return ""
    verdict = str(canary.get("verdict") or "not judged")
    color = {"halted": "#c62828", "passed": "#2e7d32"}.get(verdict, "#59636e")
    classes = {str(g.get("signature")): g.get("error_class") or "-" for g in groups}
    rows = [
        f"<td><code>{_e(sig)}</code></td><td>{_e(classes.get(sig, '-'))}</td>"
        f"<td class='num'>{_fmt(v.get('canary_sent'))}</td><td class='num'>{_fmt(v.get('failed_again'))}</td>"
        f"<td>{_e(v.get('decision'))}</td>"
        for sig, v in sorted((canary.get("verdicts") or {}).items())
    ]
    table = _table("group|error|canaries sent|failed again|decision", rows) if rows else ""
    held = int(canary.get("held_back") or 0)
    note = f" {held} messages of halted groups stay pending as canary_failed." if held else ""
    return (
        f"<h2 id='canary'>Canary verdict: <i class='badge' style='background:{color}'>{_e(verdict)}</i></h2>"
        f"<p class='muted'>Canary {_e(canary.get('size'))} per group.{_e(note)}</p>{table}"
    )


def _totals(totals: dict[str, Any], resend: dict[str, int] | None) -> str:
    chips = "".join(
        f'<div class="chip"><b>{_fmt(v)}</b><span class="small muted">{_e(k.replace("_", " "))}</span></div>'
        for k, v in totals.items()
        if v or k in ("snapshot", "left_pending")
    )
    html = f'<h2 id="totals">Totals</h2><div class="chips">{chips}</div>'
    if not resend or not resend.get("resent"):
        return html
    return (
        f"{html}<p class='muted'><b>Sent again after a kill:</b> {_fmt(resend['resent'])} messages of a wave "
        f"a killed attempt had started; the broker already held {_fmt(resend.get('resent_held', 0))} of them "
        "and dropped them (deduplication). Without deduplication at most "
        f"{_fmt(resend.get('resend_bound', 0))} (wave size x producers) can reach the origin twice, each "
        "with the same <code>REPLAY_ID</code>.</p>"
    )


def _group_table(groups: list[dict[str, Any]], other: dict[str, Any]) -> str:
    rows = []
    for index, g in enumerate(groups):
        samples = "<br>".join(f"<code>{_e(s)}</code>" for s in g["sample_message_ids"])
        name = f"<code>{_e(g['signature'])}</code>"
        name = f'<a href="#g{index}">{name}</a>' if "explanation" in g else name
        rows.append(
            f"<td>{name}</td><td>{_e(g['template'])}</td><td>{_e(g['error_class'])}</td>"
            f"<td>{_e(g['origin_topic'])}</td><td>{_e(_formats(g))}<br>{_e(g.get('reason') or '')}</td>"
            f"<td class='num'>{_fmt(g['count'])}</td>"
            f"<td class='small'>{_e(g['first_seen'])}<br>{_e(g['last_seen'])}</td>"
            f"<td>{_e(g['action'])}</td><td>{_e(', '.join(g['rules']))}</td><td>{_e(_outcome_text(g))}</td>"
            f"<td class='small'>{samples}</td>"
        )
    smaller = f"{other.get('groups')} smaller groups ({other.get('count')} messages)"
    note = f'<p class="muted">{smaller} are not listed.</p>' if other.get("groups") else ""
    return f'<h2 id="groups">Groups</h2>{_table(_GROUP_HEAD, rows)}{note}'


def _rules_table(explanation: dict[str, Any]) -> str:
    rules = explanation.get("rules") or []
    reason = explanation.get("outcome_reason")
    html = (
        f"<p class='small'>Message <code>{_e(explanation.get('message_id'))}</code>: outcome "
        f"<b>{_e(explanation.get('outcome'))}</b>{f' ({_e(reason)})' if reason else ''}</p>"
    )
    rows = []
    for r in rules:
        css = {"matched": "yes", "no match": "no"}.get(r["verdict"], "skip")
        why = "<br>".join(_e(x) for x in r.get("reasons") or []) or "all conditions hold"
        rows.append(
            f"<td><code>{_e(r['rule'])}</code> <span class='muted small'>line {_e(r['line'])}</span></td>"
            f"<td>{_e(r['action'])}</td><td class='{css}'>{_e(r['verdict'])}</td><td class='small'>{why}</td>"
        )
    html += _table("rule (in order)|action|verdict|why", rows) if rows else ""
    note = explanation.get("note") or ("" if rules else "The playbook has no rules: everything is skipped.")
    return html + (f"<p class='muted small'>{_e(note)}</p>" if note else "")


def _group_detail(index: int, g: dict[str, Any]) -> str:
    parts = [
        f"<p class='small'>{_fmt(g['count'])} messages · error class "
        f"<code>{_e(g['error_class'] or '-')}</code> · origin <code>{_e(g['origin_topic'] or '-')}</code> "
        f"· format {_e(_formats(g))} · {_e(_outcome_text(g))}</p>"
    ]
    for key, title, text in _ERROR_LISTS:
        if g.get(key):
            items = "".join(f"<li><code>{_e(x[text])}</code> &times;{_fmt(x['count'])}</li>" for x in g[key])
            parts.append(f"<h3>{title}</h3><ul>{items}</ul>")
    if g.get("explanation"):
        parts.append("<h3>Playbook rules for one message of this group</h3>" + _rules_table(g["explanation"]))
    if "payload_samples" in g:
        items = "".join(
            f"<li><code>{_e(p['message_id'])}</code><pre>{_e(p['snippet'])}</pre></li>"
            for p in g["payload_samples"]
        )
        parts.append(f"<h3>Payload snippets (masked)</h3><ul>{items or '<li>none available</li>'}</ul>")
    opened = " open" if index < OPEN_DETAILS else ""
    return (
        f'<details id="g{index}"{opened}><summary><code>{_e(g["signature"])}</code> {_e(g["template"])} '
        f"({_fmt(g['count'])})</summary>{''.join(parts)}</details>"
    )


def _trend(trend: dict[str, Any] | None, groups: list[dict[str, Any]]) -> str:
    if not trend:
        return ""
    runs = trend["runs"]
    templates = {g["signature"]: g["template"] for g in groups}
    head = "".join(
        f"<th class='small run' title='{_e(r['run_id'])}'>{_e((r.get('at') or '')[:16].replace('T', ' '))}"
        f"<br><span class='muted'>{_e(clipped(r['run_id'], 28))} · {_e(r.get('mode') or '')}</span></th>"
        for r in runs
    )
    series = [("all messages", [int(r["messages"]) for r in runs])]
    for g in trend["groups"]:
        full = templates.get(g["signature"], "")
        title = f"<span class='small' title='{_e(full)}'>{_e(clipped(full, 60))}</span>"
        series.append((f"<code>{_e(g['signature'])}</code> {title}", g["counts"]))
    rows = []
    for label, counts in series:
        cells = "".join(f"<td class='num'>{_fmt(c)}</td>" for c in counts)
        rows.append(f"<tr><th>{label}</th>{cells}<td>{sparkline(counts)}</td></tr>")
    return (
        '<h2 id="trend">Trend over the last runs</h2><p class="muted small">Messages per group in each run '
        "recorded in the ledger (dry-runs are not recorded; this run is the last column).</p>"
        f"<table class='trend'><tr><th>group</th>{head}<th>trend</th></tr>{''.join(rows)}</table>"
    )


def _config(config: dict[str, Any] | None, spark: dict[str, Any] | None) -> str:
    if not config:
        return ""
    playbook = config.get("playbook") or {}
    filters = {k: v for k, v in (config.get("filters") or {}).items() if v not in (None, [], "")}
    allow = config.get("origin_allowlist")
    entries = [
        ("mode", config.get("mode")),
        ("DLQ topics", ", ".join(config.get("topics") or [])),
        ("subscription", config.get("subscription")),
        ("service URL", config.get("service_url")),
        ("origin allowlist", ", ".join(allow) if allow else "not set: nothing may be republished"),
        ("filters", ", ".join(f"{k}={v}" for k, v in filters.items()) or "none"),
        ("max replays (loop guard)", config.get("max_replays")),
        ("archive payloads", config.get("archive_payload")),
        ("playbook", playbook.get("path") or "none: every message is skipped"),
        ("playbook sha256", playbook.get("sha256")),
    ]
    if spark:
        entries.append(("Spark application", f"{spark.get('application_id')} on {spark.get('master')}"))
    body = "".join(f"<dt>{_e(k)}</dt><dd>{_e('-' if v in (None, '') else v)}</dd>" for k, v in entries)
    rules = [
        f"<td><code>{_e(r['name'])}</code></td><td class='num'>{_e(r['line'])}</td><td>{_e(r['action'])}</td>"
        f"<td class='small'>{_e(', '.join(f'{k}: {v}' for k, v in r['match'].items()) or 'everything')}</td>"
        f"<td class='small'>{_e(r.get('fix') or '')}</td>"
        for r in playbook.get("rules") or []
    ]
    table = f"<h3>Playbook rules (first match wins)</h3>{_table('rule|line|action|match|fix', rules)}"
    return f'<h2 id="config">Run configuration</h2><dl class="config">{body}</dl>' + (table if rules else "")


def render_html(report: dict[str, Any]) -> str:
    """The report page (one self-contained HTML document)."""
    groups = report["groups"]
    used = sorted({o for g in groups for o in g["outcomes"]}, key=outcome_order)
    legend = "".join(f'<span><i style="background:{_color(o)}"></i>{escape(o)}</span>' for o in used)
    explained = [(i, g) for i, g in enumerate(groups) if "explanation" in g or g.get("sample_errors")]
    details = "".join(_group_detail(i, g) for i, g in explained)
    if details:
        details = f'<h2 id="details">Why, per group</h2>{details}'
    title = f"DLQ replay {report['run_id']}"
    status = str(report["status"])
    status_color = {"succeeded": "#2e7d32", "partial": "#ef6c00"}.get(status, "#c62828")
    if (report.get("canary") or {}).get("verdict") == "halted":  # the run ended, but a group was halted
        status, status_color = f"{status}, canary halted", "#c62828"
    timing_rows = "".join(
        f"<tr><th>{escape(k)}</th><td class='num'>{v:.2f} s</td></tr>" for k, v in report["timings"].items()
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{_e(title)}</h1>"
        f"<p class='meta'><span>mode <b>{_e(report['mode'])}</b></span>"
        f"<span><i class='badge' style='background:{status_color}'>{_e(status)}</i></span>"
        f"<span class='muted'>{_e(report['started_at'])} &rarr; {_e(report['finished_at'])}</span></p>"
        f"{_next_steps(report.get('next_steps') or [])}"
        f"{_canary(report.get('canary'), groups)}"
        f"{_totals(report['totals'], report.get('resend'))}"
        f"<h2 id='chart'>Groups by count and outcome</h2><div class=\"legend\">{legend}</div>"
        f"{bar_chart(groups)}{details}{_group_table(groups, report.get('other_groups', {}))}"
        f"{_trend(report.get('trend'), groups)}"
        f"{_config(report.get('config'), report.get('spark'))}"
        f"<h2 id='timings'>Timings</h2><table>{timing_rows}</table>"
        "</body></html>"
    )
