"""The explaining parts of the report: rule evaluation, masked payloads, suggested rules, next steps,
configuration, and the HTML that shows them (pure functions)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import yaml

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.playbook import MatchInput, parse_playbook
from spark_apps.dlq_replay.report_explain import (
    MATCHED,
    NO_MATCH,
    NOT_REACHED,
    explain_rules,
    mask_payload,
    next_steps,
    run_config,
    suggested_rule,
)
from spark_apps.dlq_replay.report_html import render_html

PLAYBOOK = parse_playbook(
    """\
version: 1
rules:
  - name: only-payments
    match: {origin_topic: "persistent://public/default/payments", error_class: TimeoutError}
    action: republish
  - name: tagged
    match: {properties: {TEAM: "re:^(a|b)$"}}
    action: archive
  - name: timeouts
    match: {error_class: "Timeout", error_message: "timed out"}
    action: republish
  - name: catch-all
    action: skip
""",
    path="pb.yaml",
)


def record(**over):
    fields = {
        "signature": "abc123",
        "error_class": "TimeoutError",
        "error_message": "payment service timed out after 3s",
        "origin_topic": "persistent://public/default/orders",
        "context_format": "ours",
        "properties": {"TEAM": "secret-team-value"},
    }
    fields.update(over)
    return MatchInput(**fields)


def test_rules_say_which_matched_why_others_did_not_and_hide_property_values():
    explained = explain_rules(PLAYBOOK, record())
    verdicts = [(e["rule"], e["verdict"]) for e in explained]
    assert verdicts == [
        ("only-payments", NO_MATCH),
        ("tagged", NO_MATCH),
        ("timeouts", MATCHED),
        ("catch-all", NOT_REACHED),
    ]
    first = explained[0]["reasons"]
    assert first == [
        "origin topic 'persistent://public/default/orders' does not match persistent://public/default/payments"
    ]
    assert explained[1]["reasons"] == ["property 'TEAM' does not match /^(a|b)$/"]
    assert "secret-team-value" not in json.dumps(explained)
    assert explained[2]["reasons"] == []
    missing = explain_rules(PLAYBOOK, record(properties={}, error_class="KeyError", error_message="x"))
    assert missing[1]["reasons"] == ["property 'TEAM' is missing"]
    assert missing[2]["reasons"] == [
        "error class 'KeyError' does not match /Timeout/",
        "error message does not match /timed out/",
    ]
    assert missing[3]["verdict"] == MATCHED


def test_payload_masking_shows_shape_not_content():
    masked = mask_payload(json.dumps({"order": 42, "email": "jane@example.com", "paid": True}).encode())
    assert json.loads(masked) == {"order": "<number>", "email": "<string 16>", "paid": "<bool>"}
    assert "jane" not in masked
    assert mask_payload(b"card 4111-1111 ok") == "xxxx 9999-9999 xx"
    assert mask_payload(b"\xff\xfe\x00") == "<3 bytes, not UTF-8>"
    assert mask_payload(None) == "(no payload)"
    assert len(mask_payload(b"a" * 1000)) == 240


def test_suggested_rule_is_valid_playbook_yaml_for_the_group():
    group = {"signature": "9f8e7d6c5b", "error_class": "java.net.SocketTimeoutException",
             "template": "read timed out after <num> ms", "count": 12}  # fmt: skip
    text = suggested_rule(group)
    rules = parse_playbook("version: 1\nrules:\n" + text)
    (rule,) = rules.rules
    assert rule.action == "republish"  # a timeout looks transient
    assert rule.signatures == frozenset({"9f8e7d6c5b"})
    assert rule.error_class.search("java.net.SocketTimeoutException")
    permanent = suggested_rule({**group, "error_class": "ValueError", "template": "no customer id"})
    assert yaml.safe_load("rules:\n" + permanent)["rules"][0]["action"] == "archive"


def make_report(**over):
    report = {
        "run_id": "r1", "mode": oc.REPLAY, "dry_run": False, "status": "succeeded",
        "started_at": "2024-05-01T00:00:00Z", "finished_at": "2024-05-01T00:01:00Z",
        "totals": {"snapshot": 25, oc.REPUBLISHED: 5, oc.FIX_FAILED: 4, oc.ORIGIN_REFUSED: 4,
                   oc.SKIPPED: 12, "acked": 5, "left_pending": 20},
        "commit": {"unacked_final": 0},
        "groups": [
            {"signature": "u1", "template": "no rule <num>", "error_class": "KeyError", "origin_topic": "o",
             "context_format": "ours", "count": 12, "first_seen": "a", "last_seen": "b",
             "sample_message_ids": ["1:2:-1:-1"], "action": "skip", "actions": {"skip": 12}, "rules": [],
             "outcomes": {oc.SKIPPED: 12}, "no_rule": 12},
            {"signature": "f1", "template": "bad <script>", "error_class": "E", "origin_topic": "o",
             "context_format": "ours", "count": 4, "first_seen": "a", "last_seen": "b",
             "sample_message_ids": [], "action": "republish", "actions": {}, "rules": ["fixit"],
             "outcomes": {oc.FIX_FAILED: 4}, "no_rule": 0,
             "fix_errors": [{"error": "KeyError: 'currency'", "count": 4}],
             "sample_errors": [{"message": "<img src=x onerror=alert(1)>", "count": 4}],
             "explanation": {"message_id": "1:1:-1:-1", "outcome": oc.FIX_FAILED,
                             "outcome_reason": "fix f failed", "matched_rule": "fixit", "note": None,
                             "rules": [{"rule": "fixit", "action": "republish", "line": 3, "verdict": MATCHED,
                                        "reasons": []}]},
             "payload_samples": [{"message_id": "1:1:-1:-1", "snippet": '{"a": "<string 3>"}'}]},
        ],
        "other_groups": {"groups": 0, "count": 0},
        "refused_origins": [{"topic": "persistent://evil/ns/t", "reason": "not in allowlist", "count": 4}],
        "config": {"origin_allowlist": ["persistent://public/default/orders"], "max_replays": 3},
        "timings": {"plan": 0.1},
        "paths": {},
    }  # fmt: skip
    report.update(over)
    return report


def test_next_steps_name_counts_causes_and_a_suggested_rule():
    steps = next_steps(make_report())
    titles = [s["title"] for s in steps]
    assert "4 messages of group f1: the fix of rule fixit failed" in titles
    assert "4 messages refused: their origin is not in the allowlist" in titles
    assert "12 messages in 1 group match no playbook rule" in titles
    refused = next(s for s in steps if "refused" in s["title"])
    assert "persistent://evil/ns/t (4)" in refused["detail"]
    assert "persistent://public/default/orders" in refused["detail"]
    fix = next(s for s in steps if "fix of rule" in s["title"])
    assert "KeyError: 'currency'" in fix["detail"]
    unmatched = next(s for s in steps if "no playbook rule" in s["title"])
    assert "signature: u1" in unmatched["code"]
    done = next_steps(make_report(totals={"snapshot": 3, oc.REPUBLISHED: 3}, groups=[]))
    assert done == [{"severity": "ok", "title": "Nothing to do: every message reached a final outcome",
                     "detail": ""}]  # fmt: skip
    dry = next_steps(make_report(dry_run=True, totals={"snapshot": 3, oc.REPUBLISHED: 3}, groups=[]))
    assert dry[0]["title"].startswith("Dry run")


def test_config_names_the_playbook_digest_allowlist_subscription_and_filters():
    options = SimpleNamespace(
        mode="replay", service_url="pulsar://b:6650", topics=("t-DLQ",), subscription="dlq-replayer",
        origin_allowlist=("persistent://public/default/orders",), signatures=None, error_class="E",
        since=None, until=None, max_messages=10, max_replays=3, archive_payload=True, rate_limit=None,
        parallelism=None,
    )  # fmt: skip
    config = run_config(options, PLAYBOOK)
    assert config["playbook"]["sha256"] == PLAYBOOK.digest
    assert [r["name"] for r in config["playbook"]["rules"]] == [
        "only-payments",
        "tagged",
        "timeouts",
        "catch-all",
    ]
    assert config["origin_allowlist"] == ["persistent://public/default/orders"]
    assert config["subscription"] == "dlq-replayer"
    assert config["filters"]["error_class"] == "E"
    assert config["filters"]["max_messages"] == 10
    json.dumps(config)  # JSON-safe


def test_html_shows_explanations_escaped_and_without_scripts():
    report = make_report()
    report["next_steps"] = next_steps(report)
    report["trend"] = {
        "runs": [{"run_id": "r0", "at": "2024-04-30T00:00", "messages": 30, "mode": "replay"},
                 {"run_id": "r1", "at": "2024-05-01T00:00", "messages": 25, "mode": "replay"}],
        "groups": [{"signature": "u1", "counts": [20, 12]}],
    }  # fmt: skip
    report["config"] = run_config(SimpleNamespace(mode="replay", topics=("t",)), PLAYBOOK)
    page = render_html(report)
    assert "<script" not in page
    assert "<img" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "What to do next" in page
    assert "KeyError: &#x27;currency&#x27;" in page
    assert "Trend over the last runs" in page
    assert "<polyline" in page
    assert PLAYBOOK.digest in page
    assert "Payload snippets (masked)" in page
    assert "src=" not in page.replace("&lt;img src=x", "")


def test_chart_labels_of_huge_templates_and_topics_stay_short():
    """A 2,000-character template or a 400-character origin topic (untrusted input) does not turn a chart
    label into a wall of text: both are cut (start and end kept), the whole template is the tooltip."""
    from spark_apps.dlq_replay.report_html import LABEL_PART_CHARS, LABEL_TEMPLATE_CHARS, bar_chart

    template = "slow " * 400
    topic = "persistent://public/default/orders-" + "x" * 400
    html = bar_chart(
        [{"signature": "s1", "template": template, "error_class": "TimeoutError", "origin_topic": topic,
          "count": 3, "outcomes": {oc.REPUBLISHED: 3}}]
    )  # fmt: skip
    label = html.split('<div class="bar-label"', 1)[1].split("</div>", 1)[0]
    visible = label.split(">", 1)[1]  # after the tooltip attribute
    assert f'title="{template}"' in label
    assert template not in visible
    assert topic not in visible
    assert "…" in visible
    assert len(visible) < LABEL_TEMPLATE_CHARS + LABEL_PART_CHARS + 200


def test_a_halted_canary_is_the_first_step_and_never_nothing_to_do():
    report = make_report(
        totals={"snapshot": 20, oc.REPUBLISHED: 13, oc.CANARY_FAILED: 7, "left_pending": 7},
        groups=[{"signature": "s1", "error_class": "PermissionError", "count": 10,
                 "outcomes": {oc.REPUBLISHED: 3, oc.CANARY_FAILED: 7}}],
    )  # fmt: skip
    report["canary"] = {"size": "3", "verdicts": {
        "s1": {"canary_sent": 3, "failed_again": 3, "failure_rate": 1.0, "decision": "halted"},
        "s2": {"canary_sent": 3, "failed_again": 0, "failure_rate": 0.0, "decision": "replay"},
    }, "verdict": "halted", "halted": ["s1"], "held_back": 7}  # fmt: skip
    titles = [s["title"] for s in next_steps(report)]
    assert titles[0] == (
        "Canary halted group s1 (PermissionError): 3 of 3 canaries failed again; 7 messages stay pending "
        "as canary_failed"
    )
    assert not any(t.startswith("Nothing to do") for t in titles)
    page = render_html({**report, "groups": [], "next_steps": next_steps(report)})
    assert "Canary verdict" in page
    assert ">halted<" in page


def test_pending_messages_are_never_nothing_to_do_and_unapproved_groups_are_named():
    pending = next_steps(make_report(totals={"snapshot": 3, "left_pending": 2, oc.REPUBLISHED: 1}, groups=[]))
    assert [s["title"] for s in pending] == ["2 messages stay pending"]
    report = make_report(totals={"snapshot": 5, oc.FILTERED: 3, oc.REPUBLISHED: 2}, groups=[])
    report["config"]["filters"] = {"group_actions": {"a1": "replay", "b2": "leave"}}
    titles = [s["title"] for s in next_steps(report)]
    assert "3 messages in groups not approved (b2) stay pending" in titles
