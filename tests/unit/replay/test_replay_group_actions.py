"""Approved per-group actions: parsing, the decide override and reusing a reviewed run's window."""

from __future__ import annotations

import json

import pytest
from test_replay_decide_batch import by_key, normalize_batch, ours, scoped, snapshot_batch

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.cli import parse_options
from spark_apps.dlq_replay.decide import DecideSettings, decide_batch
from spark_apps.dlq_replay.errors import ReplayConfigError
from spark_apps.dlq_replay.group_actions import (
    APPROVAL_RULE,
    parse_group_actions,
    reuse_window,
)
from spark_apps.dlq_replay.playbook import parse_playbook
from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow, windows_to_json
from spark_apps.dlq_replay.run_context import RunPaths
from spark_apps.dlq_replay.storage import RunStorage
from spark_apps.dlq_replay.topics import TopicMatcher

BASE = ["--run-id", "r2", "--service-url", "pulsar://x:6650", "--topics", "a-DLQ", "--output-dir", "/o"]
PLAYBOOK = """
rules:
  - name: retry-timeouts
    match: {error_class: Timeout}
    action: republish
  - name: archive-poison
    match: {error_class: Poison}
    action: archive
"""


def test_parse_inline_and_file(tmp_path):
    assert parse_group_actions('{"abc123": "replay", "def": "leave"}') == {"abc123": "replay", "def": "leave"}
    path = tmp_path / "actions.json"
    path.write_text(json.dumps({"s1": "archive"}))
    assert parse_group_actions(f"@{path}") == {"s1": "archive"}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("not json", "not valid JSON"),
        ('["a"]', "must be a JSON object"),
        ('{"bad sig!": "replay"}', "is not an error signature"),
        ("@/nonexistent/actions.json", "cannot be read"),
    ],
)
def test_parse_errors_name_the_problem(value, says):
    with pytest.raises(ReplayConfigError, match=says):
        parse_group_actions(value)


def test_cli_options_and_fingerprint():
    opts = parse_options([*BASE, "--group-actions", '{"s1": "replay"}', "--window-from", "dry-1"])
    assert opts.group_actions == {"s1": "replay"}
    assert opts.window_from == "dry-1"
    fingerprint = opts.fingerprint_options("d")
    assert fingerprint["group_actions"] == {"s1": "replay"}
    assert fingerprint["window_from"] == "dry-1"
    # Runs started without the new options keep the fingerprint they had.
    assert "group_actions" not in parse_options(BASE).fingerprint_options("d")
    with pytest.raises(ReplayConfigError, match="earlier run"):
        parse_options([*BASE, "--window-from", "r2"])
    with pytest.raises(ReplayConfigError, match="must each be one of replay, archive, leave"):
        parse_options([*BASE, "--group-actions", '{"a": "republish"}'])


def test_decide_override_acts_only_on_the_approved_action():
    rows = [
        (b"t", ours("Timeout", "slow")),  # k0: playbook republish, approved replay -> republish (rule kept)
        (b"p", ours("Poison", "x")),  # k1: playbook archive, approved leave -> skipped
        (b"o", ours("Other", "y")),  # k2: no playbook rule, approved replay -> republish as-is
        (b"q", ours("Queue", "z")),  # k3: no playbook rule, approved archive -> archived
        (b"t", ours("Poison", "x", origin="persistent://public/default/admin")),  # k4: no action given
    ]
    batch = normalize_batch(snapshot_batch(rows))
    sigs = batch.column("signature").to_pylist()
    actions = {sigs[0]: "replay", sigs[1]: "leave", sigs[2]: "replay", sigs[3]: "archive"}
    settings = DecideSettings(
        run_id="r",
        mode=oc.REPLAY,
        allowlist=TopicMatcher.parse(["orders"]),
        group_actions=actions,
    )
    out = by_key(decide_batch(scoped(batch), parse_playbook(PLAYBOOK), settings))
    assert {k: (v["outcome"], v["rule"]) for k, v in out.items()} == {
        "k0": (oc.TO_REPUBLISH, "retry-timeouts"),
        "k1": (oc.SKIPPED, APPROVAL_RULE),
        "k2": (oc.TO_REPUBLISH, APPROVAL_RULE),
        "k3": (oc.ARCHIVED, APPROVAL_RULE),
        "k4": (oc.ARCHIVED, "archive-poison"),  # not in the approval: the playbook decides
    }
    assert out["k1"]["outcome_reason"] == "left pending by the approval"
    assert dict(out["k2"]["out_properties"])["REPLAY_RUN_ID"] == "r"


def test_reuse_window_reads_the_reviewed_plan_and_refuses_other_topics(tmp_path):
    window = [PartitionWindow("persistent://public/default/a-DLQ", -1, "1:2:-1:-1")]
    plan = {"topics": ["a-DLQ"], "subscription": "dlq-replayer", "window": windows_to_json(window)}
    RunStorage().write_text(RunPaths(str(tmp_path), "dry-1").plan, json.dumps(plan))
    args = ["--run-id", "r2", "--service-url", "pulsar://x:6650", "--output-dir", str(tmp_path)]

    def reuse(topics: str, window_from: str) -> list[PartitionWindow]:
        return reuse_window(parse_options([*args, "--topics", topics, "--window-from", window_from]))

    assert reuse("persistent://public/default/a-DLQ", "dry-1") == window
    with pytest.raises(ReplayConfigError, match="Use the same --topics"):
        reuse("b-DLQ", "dry-1")
    with pytest.raises(ReplayConfigError, match="does not exist"):
        reuse("a-DLQ", "nope")
