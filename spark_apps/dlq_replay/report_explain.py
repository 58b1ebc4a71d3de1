"""What a report says besides counts (pure functions): rule verdicts, masked payload snippets, suggested
rules, the run's configuration and next steps; never a property's value (``docs/report.md``)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.playbook import MATCH_CONDITIONS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from spark_apps.dlq_replay.playbook import MatchInput, Playbook, PropertyCondition, Rule

SNIPPET_CHARS = 240
MAX_LISTED = 3
#: Longest topic quoted in the next steps (a refused origin is untrusted input): start and end are kept.
MAX_TOPIC_CHARS = 120
#: Error words that suggest a transient failure (a republish may then succeed as is).
_TRANSIENT = re.compile(
    r"timeout|timed out|unavailable|temporar|connection|refused|throttl|too many requests|"
    r"\b503\b|\b429\b|retry",
    re.IGNORECASE,
)
_SLUG = re.compile(r"[^a-z0-9]+")

MATCHED, NO_MATCH, NOT_REACHED = "matched", "no match", "not reached"


def _listed(values: Sequence[str]) -> str:
    shown = ", ".join(sorted(values)[:MAX_LISTED])
    return shown + (f" (+{len(values) - MAX_LISTED} more)" if len(values) > MAX_LISTED else "")


def clipped(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, keeping its start and end."""
    if len(text) <= limit:
        return text
    half = (limit - 1) // 2
    return f"{text[:half]}…{text[-(limit - 1 - half) :]}"


def outcome_order(name: str) -> tuple[int, str]:
    """Outcomes in :data:`~spark_apps.dlq_replay.outcomes.OUTCOMES` order, unknown ones last."""
    return (oc.OUTCOMES.index(name) if name in oc.OUTCOMES else len(oc.OUTCOMES), name)


def pattern_text(regex: re.Pattern[str]) -> str:
    """The playbook's pattern(s) of a compiled rule regex (``(?:a)|(?:b)`` shows as ``/a/ or /b/``)."""
    text = regex.pattern
    if text.startswith("(?:") and text.endswith(")"):
        return " or ".join(f"/{part}/" for part in text[3:-1].split(")|(?:"))
    return f"/{text}/"


#: A rule's ``match:`` conditions but ``properties``: how the configuration shows the rule's value, and why
#: a record fails it (``value``: the record's; the error message itself is never quoted).
_CONDITIONS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "signature": (sorted, "signature {value} is not in [{listed}]"),
    "error_class": (pattern_text, "error class {value!r} does not match {shown}"),
    "error_message": (pattern_text, "error message does not match {shown}"),
    "origin_topic": (lambda m: list(m.patterns), "origin topic {value!r} does not match {listed}"),
    "context_format": (sorted, "context format {value!r} is not {listed}"),
}


def _miss(rule: Rule, record: MatchInput, failed: str | PropertyCondition) -> str:
    """Why ``record`` fails one condition of ``rule`` (a property's value is never shown)."""
    if isinstance(failed, str):
        show, why = _CONDITIONS[failed]
        shown = show(getattr(rule, MATCH_CONDITIONS[failed][0]))
        listed = _listed(shown) if isinstance(shown, list) else shown
        return why.format(value=getattr(record, failed) or "(none)", shown=shown, listed=listed)
    if record.properties.get(failed.key) is None:
        return f"property {failed.key!r} is missing"
    wanted = f"/{failed.regex.pattern}/" if failed.regex is not None else repr(failed.exact)
    return f"property {failed.key!r} does not match {wanted}"


def explain_rules(playbook: Playbook, record: MatchInput) -> list[dict[str, Any]]:
    """Each rule in order with its verdict for ``record`` (first match wins) and why it did not match."""
    explained: list[dict[str, Any]] = []
    for rule in playbook.rules:
        entry: dict[str, Any] = {"rule": rule.name, "action": rule.action, "line": rule.line}
        if explained and explained[-1]["verdict"] != NO_MATCH:  # an earlier rule matched
            entry.update(verdict=NOT_REACHED, reasons=["an earlier rule matched first"])
        else:
            misses = [_miss(rule, record, failed) for failed in rule.failed_conditions(record)]
            entry.update(verdict=NO_MATCH if misses else MATCHED, reasons=misses)
        explained.append(entry)
    return explained


def _mask_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _mask_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_json(v) for v in value[:5]] + (["…"] if len(value) > 5 else [])
    if isinstance(value, str):
        return f"<string {len(value)}>"
    return {bool: "<bool>", int: "<number>", float: "<number>"}.get(type(value), value)


def mask_payload(payload: bytes | None, limit: int = SNIPPET_CHARS) -> str:
    """A payload's shape, not its content: JSON values their type, text ``x`` and ``9``, binary its size."""
    if payload is None:
        return "(no payload)"
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(payload)} bytes, not UTF-8>"
    try:
        masked = json.dumps(_mask_json(json.loads(text)), ensure_ascii=False)
    except ValueError:
        masked = re.sub(r"[0-9]", "9", re.sub(r"[^\W\d_]", "x", text))
    return masked if len(masked) <= limit else masked[: limit - 1] + "…"


def suggested_rule(group: Mapping[str, Any]) -> str:
    """A playbook rule (YAML) for a group that no rule matched, to paste and adjust."""
    error_class, template = str(group.get("error_class") or ""), str(group.get("template") or "")
    simple = error_class.rsplit(".", 1)[-1] or "unknown"
    name = _SLUG.sub("-", f"{simple}-{str(group.get('signature', ''))[:8]}".lower()).strip("-")
    lines = [
        f"  - name: {name}",
        f"    # {_plural(int(group.get('count') or 0), 'message')} like: {json.dumps(template[:100])}",
        "    match:",
        f"      signature: {group.get('signature')}",
    ]
    if error_class:
        lines.append(f"      error_class: {json.dumps('^' + re.escape(error_class) + '$')}")
    if _TRANSIENT.search(f"{error_class} {template}"):
        lines.append("    action: republish    # the error looks transient: replay as is (or add a fix:)")
    else:
        lines.append("    action: archive      # or republish with a fix: module:function and fix_version")
    return "\n".join(lines)


#: Options the configuration shows as they are set.
_SHOWN_AS_SET = ("mode", "service_url", "subscription", "max_replays", "archive_payload", "rate_limit")


def _rule_summary(rule: Rule) -> dict[str, Any]:
    given = {key: getattr(rule, MATCH_CONDITIONS[key][0]) for key in _CONDITIONS}  # None: not given
    match = {key: _CONDITIONS[key][0](value) for key, value in given.items() if value is not None}
    if rule.properties:
        match["properties"] = {
            c.key: (f"re:{c.regex.pattern}" if c.regex is not None else c.exact) for c in rule.properties
        }
    fix = rule.fix_label or None
    return {"name": rule.name, "line": rule.line, "action": rule.action, "match": match, "fix": fix}


def run_config(options: Any, playbook: Playbook) -> dict[str, Any]:
    """The settings that shaped the run (no secret: service URL, topics, playbook digest, filters)."""

    def opt(name: str) -> Any:
        value: Any = getattr(options, name, None)
        return value.isoformat() if hasattr(value, "isoformat") else value

    return {
        **{name: opt(name) for name in _SHOWN_AS_SET},
        "parallelism": opt("parallelism"),
        "topics": list(opt("topics") or []),
        "origin_allowlist": list(opt("origin_allowlist") or []) or None,
        "filters": {
            "signatures": list(opt("signatures") or []) or None,
            **{name: opt(name) for name in ("error_class", "since", "until", "max_messages")},
            "group_actions": dict(opt("group_actions") or {}) or None,
        },
        "playbook": {
            "path": playbook.path,
            "sha256": playbook.digest,
            "fix_files": list(playbook.fix_files),
            "rules": [_rule_summary(rule) for rule in playbook.rules],
        },
    }


def _step(severity: str, title: str, detail: str = "", code: str | None = None) -> dict[str, Any]:
    return {"severity": severity, "title": title, "detail": detail, **({"code": code} if code else {})}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


#: Steps for a count of the totals (or of the commit, or a dry run's snapshot): severity, title, detail.
_COUNTED = {
    oc.PUBLISH_FAILED: (
        "action",
        "{n} could not be published and stay pending",
        "They stay pending on the DLQ, and the next run sends them again once the origin topics accept "
        "messages (the ledger's outcome_reason says why each failed). A message refused as MessageTooBig is "
        "refused again: make its fix's output smaller, or archive its group.",
    ),
    "unacked_final": (
        "info",
        "{n} with a final outcome could not be acknowledged",
        "They are recorded in the ledger; the next run acknowledges them without acting again.",
    ),
    oc.MALFORMED: (
        "info",
        "{n} are malformed and stay pending",
        "No known DLQ property convention (or a fix found the record unreadable). Inspect them in the run's "
        "snapshot; they show up in every run until someone handles them.",
    ),
    oc.LOOP_GUARDED: (
        "info",
        "{n} hit the loop guard and were archived",
        "They had been replayed {max_replays} times already: the consumer keeps failing them, so the fix "
        "does not address the cause.",
    ),
    oc.DRY_RUN: (
        "info",
        "Dry run: nothing was published, archived, recorded or acknowledged",
        "Check the outcomes above, then run with mode replay to apply them (it needs the origin allowlist). "
        "In Airflow: Variable dlq_nightly_mode for dlq_nightly_replay, dlq_event_driven_mode for "
        "dlq_event_driven_replay, Param mode for dlq_backfill.",
    ),
}
_URGENCY = {"action": 0, "info": 1, "ok": 2}
_HALTED_DETAIL = (
    "The consumer still fails these messages, so the rest of the group was not sent. Fix the consumer (or "
    "the playbook's fix for this group, and raise its fix_version), then run again: the next run replays "
    "the pending messages and the canaries the consumer dead-lettered again."
)


def next_steps(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What to do about this run, most urgent first (``severity``: action, info or ok)."""
    totals = report.get("totals") or {}
    snapshot = int(totals.get("snapshot", 0))
    counts = {**(report.get("commit") or {}), **totals, oc.DRY_RUN: snapshot if report.get("dry_run") else 0}
    max_replays = (report.get("config") or {}).get("max_replays")
    steps = [
        _step(severity, title.format(n=_plural(n, "message")), detail.format(max_replays=max_replays))
        for key, (severity, title, detail) in _COUNTED.items()
        if (n := int(counts.get(key, 0)))
    ]
    steps += [*_group_steps(report, totals), *_canary_steps(report), *_filtered_steps(report)]
    if steps:
        return sorted(steps, key=lambda step: _URGENCY[step["severity"]])
    if not snapshot:
        return [_step("ok", "Nothing to do: the DLQ window was empty")]
    if pending := int(totals.get("left_pending", 0)):
        detail = "The groups above say why; the next run reads them again."
        return [_step("info", f"{_plural(pending, 'message')} stay pending", detail)]
    return [_step("ok", "Nothing to do: every message reached a final outcome")]


def _group_steps(report: Mapping[str, Any], totals: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Failed fixes per group, refused origins, and the messages no rule matched (with a suggested rule)."""
    groups = list(report.get("groups") or [])
    for group in [g for g in groups if g.get("outcomes", {}).get(oc.FIX_FAILED)][:5]:
        first = (group.get("fix_errors") or [{"error": "see the ledger's fix_error"}])[0]["error"]
        rules = ", ".join(group.get("rules") or []) or "?"
        count = group["outcomes"][oc.FIX_FAILED]
        yield _step(
            "action",
            f"{_plural(count, 'message')} of group {group['signature']}: the fix of rule {rules} failed",
            f"{first}. Correct the fix function, raise its fix_version and run again; these messages stay "
            "pending until then.",
        )
    if n := int(totals.get(oc.ORIGIN_REFUSED, 0)):
        refused = report.get("refused_origins") or []
        where = ", ".join(
            f"{clipped(r['topic'] or '(none)', MAX_TOPIC_CHARS)} ({r['count']})" for r in refused[:5]
        )
        allow = (report.get("config") or {}).get("origin_allowlist")
        allowed = ", ".join(allow) if allow else "not set, so nothing may be republished"
        yield _step(
            "action",
            f"{_plural(n, 'message')} refused: their origin is not in the allowlist",
            f"Origins: {where or 'see the groups'}. The allowlist is {allowed}. Add an origin to the "
            "allowlist only if it is a topic replays may write to; refused messages stay pending.",
        )
    if unmatched := [g for g in groups if int(g.get("no_rule", 0))]:
        total = sum(int(g["no_rule"]) for g in unmatched)
        yield _step(
            "action",
            f"{_plural(total, 'message')} in {_plural(len(unmatched), 'group')} match no playbook rule",
            "They stay pending. A rule for the largest group, to adapt and add under rules: in the playbook:",
            suggested_rule(unmatched[0]),
        )


def _canary_steps(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """One action per halted group, or one line saying every group's canary held."""
    canary = report.get("canary") or {}
    verdicts: Mapping[str, Mapping[str, Any]] = canary.get("verdicts") or {}
    if canary.get("verdict") == "passed":  # no group halted
        title = f"Canary passed: no canary of {_plural(len(verdicts), 'group')} failed again"
        yield _step("ok", title, "Every group was replayed in full after the canary wait.")
    groups = {str(g.get("signature")): g for g in report.get("groups") or []}
    for signature in (canary.get("halted") or [])[:5]:
        verdict, group = verdicts[signature], groups.get(signature, {})
        held = int((group.get("outcomes") or {}).get(oc.CANARY_FAILED, 0))
        title = (
            f"Canary halted group {signature} ({group.get('error_class') or '?'}): "
            f"{verdict.get('failed_again', 0)} of {verdict.get('canary_sent', 0)} canaries failed again; "
            f"{_plural(held, 'message')} stay pending as canary_failed"
        )
        yield _step("action", title, _HALTED_DETAIL)


def _filtered_steps(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Messages this run did not act on: of groups an approval did not approve, or outside its filters."""
    n = int((report.get("totals") or {}).get(oc.FILTERED, 0))
    if not n:
        return []
    filters = (report.get("config") or {}).get("filters") or {}
    actions: Mapping[str, str] = filters.get("group_actions") or {}
    if not actions:
        title = f"{_plural(n, 'message')} were outside this run's filters and stay pending"
        return [_step("info", title, "A run without these filters (or with other ones) acts on them.")]
    left = [s for s, a in actions.items() if a == "leave"]
    named = f" ({_listed(left)})" if left else ""
    detail = "The approval left these groups alone; approve them in a later run to act on them."
    return [_step("info", f"{_plural(n, 'message')} in groups not approved{named} stay pending", detail)]
