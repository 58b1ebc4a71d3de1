"""Report groups, totals, summary line and the HTML page (pure functions)."""

from __future__ import annotations

import json

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.report import (
    SUMMARY_PREFIX,
    TOTAL_KEYS,
    CommitTotals,
    build_groups,
    build_report,
    display_template,
    summary_line,
)
from spark_apps.dlq_replay.report_html import render_html
from spark_apps.dlq_replay.report_parts import ReportParts

T1 = "2024-05-01T00:00:00.000Z"
T2 = "2024-05-02T00:00:00.000Z"


def combo(sig, outcome, n, action="republish", rule="r1", t=T1, template="bad <num>", fmt="ours"):
    return {
        "signature": sig, "outcome": outcome, "action": action, "rule": rule, "n": n, "template": template,
        "error_class": "E", "origin_topic": "persistent://p/d/orders", "context_format": fmt,
        "reason": "max-reconsumes", "first_seen": t, "last_seen": t,
    }  # fmt: skip


COMBOS = [
    combo("a", oc.REPUBLISHED, 5),
    combo("a", oc.FIX_FAILED, 2, t=T2),
    combo("b", oc.ARCHIVED, 3, action="archive", rule="r2"),
    combo("c", oc.MALFORMED, 1, action=None, rule=None, template="<script>alert(1)</script>"),
    combo("d", oc.ALREADY_FINAL, 4, action=None, rule=None),
]


def test_groups_merge_outcomes_sorted_by_count():
    groups, other = build_groups(COMBOS, {"a": ["1:1:-1:-1"]}, oc.REPLAY)
    assert [g["signature"] for g in groups] == ["a", "d", "b", "c"]
    a = groups[0]
    assert a["count"] == 7
    assert a["outcomes"] == {oc.REPUBLISHED: 5, oc.FIX_FAILED: 2}
    assert a["first_seen"] == T1
    assert a["last_seen"] == T2
    assert a["action"] == "republish"
    assert a["actions"] == {"republish": 7}
    assert a["rules"] == ["r1"]
    assert a["sample_message_ids"] == ["1:1:-1:-1"]
    assert a["no_rule"] == 0
    unmatched, _ = build_groups([combo("u", oc.SKIPPED, 4, action="skip", rule=None)], {}, oc.REPLAY)
    assert unmatched[0]["no_rule"] == 4
    assert other == {"groups": 0, "count": 0}
    capped, other = build_groups(COMBOS, {}, oc.REPLAY, max_groups=2)
    assert len(capped) == 2
    assert other == {"groups": 2, "count": 4}


def test_group_labels_are_never_wrong_for_a_mixed_group():
    combos = [
        combo("m", oc.SKIPPED, 3, fmt="tdmq"),
        combo("m", oc.SKIPPED, 2, fmt="java_retry"),
        combo("m", oc.ARCHIVED, 1, action="archive", fmt="java_retry"),
        combo("o", oc.SKIPPED, 1),
    ]
    groups, _ = build_groups(combos, {}, oc.REPLAY)
    mixed, single = groups
    assert mixed["context_formats"] == ["java_retry", "tdmq"]
    assert mixed["context_format"] == "mixed"
    assert mixed["reason"] == "max-reconsumes"
    assert single["context_formats"] == ["ours"]
    assert single["context_format"] == "ours"
    html = render_html(
        {"run_id": "r", "mode": oc.REPLAY, "status": "succeeded", "totals": {}, "groups": groups,
         "other_groups": {"groups": 0, "count": 0}, "timings": {}, "paths": {}, "started_at": "",
         "finished_at": "", "commit": {}}
    )  # fmt: skip
    assert "java_retry, tdmq<br>max-reconsumes" in html


def report_of(combos, mode=oc.REPLAY, commit=None, samples=None, **over):
    return build_report(
        ReportParts(combos, samples or {}, []), run_id="r<1>", mode=mode, status="succeeded", started_at="s",
        finished_at="f", commit=commit or CommitTotals(), timings={"plan": 0.5},
        paths={"report_html": "x/report.html"}, **over,
    )  # fmt: skip


def test_totals_sum_up_and_pending_is_what_is_not_final():
    report = report_of(COMBOS, commit=CommitTotals(acked=12, read_mode="reader"), resend={"resent": 2})
    totals = report["totals"]
    assert list(totals) == list(TOTAL_KEYS)
    assert totals["snapshot"] == 15
    assert totals[oc.REPUBLISHED] == 5
    assert totals[oc.ALREADY_FINAL] == 4
    assert totals["acked"] == 12
    assert totals["left_pending"] == 15 - 5 - 3 - 4
    assert totals["resent"] == 2
    assert report["resend"] == {"resent": 2, "resent_held": 0, "resend_bound": 0}
    assert report["commit"]["acked"] == 12
    assert report["commit"]["read_mode"] == "reader"
    assert (report["format"], report["dry_run"], report["other_groups"]) == (
        1,
        False,
        {"groups": 0, "count": 0},
    )
    assert "canary" not in report


def test_dry_run_reports_planned_republish_and_nothing_acked():
    report = report_of([combo("a", oc.TO_REPUBLISH, 5)], mode=oc.DRY_RUN)
    totals = report["totals"]
    assert totals[oc.REPUBLISHED] == 5
    assert totals["left_pending"] == 5
    assert totals["acked"] == 0
    assert report["dry_run"] is True
    assert report["groups"][0]["outcomes"] == {oc.REPUBLISHED: 5}
    assert report_of([combo("a", oc.TO_REPUBLISH, 5)])["totals"][oc.PUBLISH_FAILED] == 5  # never sent


def test_canary_verdict_names_halted_groups_and_what_they_hold_back():
    combos = [combo("a", oc.CANARY_FAILED, 4), combo("a", oc.REPUBLISHED, 3), combo("b", oc.REPUBLISHED, 2)]
    verdicts = {"a": {"decision": "halted"}, "b": {"decision": "replay"}}
    canary = report_of(combos, canary={"size": "3", "verdicts": verdicts})["canary"]
    assert canary == {"size": "3", "verdicts": verdicts, "verdict": "halted", "halted": ["a"], "held_back": 4}
    assert report_of(combos, canary={"size": "3", "verdicts": {"b": {}}})["canary"]["verdict"] == "passed"
    assert report_of(combos, canary={"size": "3"})["canary"]["verdict"] == "not judged"


def report_dict():
    return report_of(COMBOS, samples={"c": ["<b>id</b>"]})


def test_summary_line_is_one_json_line():
    line = summary_line(report_dict())
    assert line.startswith(SUMMARY_PREFIX)
    assert "\n" not in line
    data = json.loads(line[len(SUMMARY_PREFIX) :])
    assert set(data) == {"run_id", "mode", "status", "totals", "paths"}
    with_spark = {
        **report_dict(),
        "spark": {"application_id": "local-1", "master": "local[2]", "ui_url": None},
    }
    data = json.loads(summary_line(with_spark)[len(SUMMARY_PREFIX) :])
    assert data["spark"]["application_id"] == "local-1"


def test_html_is_self_contained_escaped_and_has_a_bar_per_group():
    page = render_html(report_dict())
    assert page.startswith("<!DOCTYPE html>")
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
    assert "<b>id</b>" not in page
    assert "r&lt;1&gt;" in page
    assert page.count('class="bar-track"') == 4  # one bar per group, labels are wrapping HTML text
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "src=" not in page
    assert "<link" not in page


def test_a_key_error_template_says_a_key_is_missing():
    assert display_template("KeyError", "<str>") == "missing key <str>"
    assert display_template("builtins.KeyError", "'currency of order <num>'") == (
        "missing key 'currency of order <num>'"
    )
    assert display_template("ValueError", "<str>") == "<str>"
    assert display_template("KeyError", "missing key <str>") == "missing key <str>"


def test_representatives_of_groups_past_the_detailed_ones_are_left_out(monkeypatch):
    from types import SimpleNamespace

    from spark_apps.dlq_replay import report

    monkeypatch.setattr(report, "snapshot_messages", lambda *args: {})
    reps = [
        {"signature": sig, "dlq_topic": "t", "dlq_message_id": f"{sig}{i}"} for sig in "ab" for i in (1, 2)
    ]
    ctx = SimpleNamespace(payload_snippets=False, snapshot_path="/nowhere")
    got = report._representatives(None, ctx, ReportParts([], {}, reps), ["a", "c"])
    assert got == {"a": [(reps[0], None)], "c": []}  # b is not shown; one representative without snippets
