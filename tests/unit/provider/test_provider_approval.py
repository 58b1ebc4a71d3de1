"""DlqGroupApprovalOperator (the form it builds, the decision it returns) and the replay's group actions."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from airflow_provider_dlq.operators.approval import (
    DlqGroupApprovalOperator,
    approval_body,
    group_params,
    load_groups,
)
from airflow_provider_dlq.operators.replay_cli import ReplayArgumentError, build_replay_args

GROUPS = [
    {
        "signature": "aaaa000011112222",
        "count": 4,
        "error_class": "TimeoutError",
        "template": "payment timed out after <num>s",
        "origin_topic": "persistent://public/default/orders",
        "first_seen": "2024-05-01T00:00:00.000Z",
        "last_seen": "2024-05-01T00:01:00.000Z",
        "sample_message_ids": ["1:0:-1:-1", "1:1:-1:-1"],
        "action": "republish",
        "outcomes": {"republished": 4},
    },
    {
        "signature": "bbbb000011112222",
        "count": 2,
        "error_class": "KeyError",
        "template": "| [click](http://evil) `x` *y*",
        "origin_topic": "persistent://public/default/orders",
        "action": None,
        "outcomes": {"skipped": 2},
    },
]
SUMMARY = {
    "run_id": "dlq_backfill.dry_run.manual_1",
    "mode": "dry-run",
    "totals": {"snapshot": 6},
    "paths": {"report_html": "/out/runs/x/report.html"},
    "groups": GROUPS,
}


def test_form_fields_default_to_leave_and_show_count_and_template():
    params = group_params(GROUPS)
    assert list(params) == ["aaaa000011112222", "bbbb000011112222"]
    first = params["aaaa000011112222"].serialize()
    assert first["value"] == "leave"
    assert first["schema"]["enum"] == ["replay", "archive", "leave"]
    assert first["schema"]["title"] == "4 x TimeoutError: payment timed out after <num>s"
    assert "proposes 'replay'" in first["description"]


def test_body_is_a_table_with_untrusted_values_escaped():
    body = approval_body(SUMMARY, GROUPS, shown=1)
    # The decision's columns come right after the group's error: proposal (the fields' words), fix failures.
    assert (
        "| 1 | `aaaa000011112222` | 4 | TimeoutError | payment timed out after &lt;num>s | replay | 0 |"
        in body
    )
    failing = [{**GROUPS[0], "outcomes": {"would_republish": 3, "fix_failed": 1}}]
    assert "&lt;num>s | replay | **1** (stay pending) |" in approval_body(SUMMARY, failing, shown=1)
    assert "1 of its messages fails the playbook's fix and stays pending." in str(
        group_params(failing)["aaaa000011112222"].description
    )
    assert "1:0:-1:-1, 1:1:-1:-1" in body
    assert "1 smaller groups (2 messages)" in body
    escaped = approval_body(SUMMARY, GROUPS, shown=2)
    assert "\\| \\[click\\](http://evil) 'x' \\*y\\*" in escaped


def test_groups_come_from_the_report_file_when_readable(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"groups": [*GROUPS, {"signature": "c", "count": 1}]}))
    assert len(load_groups({**SUMMARY, "paths": {"report_json": str(report)}})) == 3
    assert len(load_groups({**SUMMARY, "paths": {"report_json": "s3a://b/report.json"}})) == 2


def make_op(**kwargs) -> DlqGroupApprovalOperator:
    return DlqGroupApprovalOperator(task_id="approve", dry_run_summary=SUMMARY, **kwargs)


class _Skipped(Exception):
    """What the Task SDK's ``skip`` does: end the task by raising (DownstreamTasksSkipped)."""


def context(skipped: list, xcoms: dict | None = None) -> dict:
    downstream = [SimpleNamespace(task_id="replay", is_teardown=False)]
    task = SimpleNamespace(get_direct_relatives=lambda upstream: downstream)
    pushed = xcoms if xcoms is not None else {}
    return {"task": task, "ti": SimpleNamespace(xcom_push=lambda key, value: pushed.__setitem__(key, value))}


def raising_skip(skipped: list):
    def skip(ti, tasks):
        skipped.extend(tasks)
        raise _Skipped

    return skip


def event(options, params_input, timedout=False, user="alice"):
    return {
        "chosen_options": options,
        "params_input": params_input,
        "responded_at": datetime(2024, 5, 1, tzinfo=UTC),
        "responded_by_user": None if user is None else {"id": user, "name": user},
        "timedout": timedout,
    }


def test_apply_returns_the_approved_actions_and_counts(monkeypatch):
    op = make_op()
    skipped: list = []
    monkeypatch.setattr(op, "skip", lambda ti, tasks: skipped.extend(tasks))
    answer = {"aaaa000011112222": "replay", "bbbb000011112222": "leave"}
    result = op.execute_complete(context(skipped), event([op.APPLY], answer))
    assert result["decision"] == "approved"
    assert result["actions"] == answer
    assert result["approved"] == {"replay": ["aaaa000011112222"], "archive": []}
    assert result["approved_messages"] == {"replay": 4, "archive": 0}
    assert result["responded_by"] == "alice"
    assert skipped == []
    args = build_replay_args(
        {
            "run_id": "r",
            "mode": "replay",
            "service_url": "pulsar://x:6650",
            "topics": "a-DLQ",
            "output_dir": "/o",
            "origin_allowlist": "orders",
            "group_actions": json.dumps(result["actions"]),
            "window_from": result["dry_run_id"],
        }
    )
    argv = args.to_argv()
    assert argv[argv.index("--signatures") + 1] == "aaaa000011112222"
    assert json.loads(argv[argv.index("--group-actions") + 1]) == answer
    assert argv[argv.index("--window-from") + 1] == "dlq_backfill.dry_run.manual_1"


def test_timeout_or_approve_nothing_leaves_everything_and_skips_the_replay(monkeypatch):
    op = make_op()
    skipped: list = []
    xcoms: dict = {}
    monkeypatch.setattr(op, "skip", raising_skip(skipped))
    defaults = {"aaaa000011112222": "leave", "bbbb000011112222": "leave"}
    with pytest.raises(_Skipped):
        op.execute_complete(context(skipped, xcoms), event([op.NOTHING], defaults, timedout=True, user=None))
    result = xcoms["return_value"]  # pushed before the skip ends the task
    assert result["decision"] == "nothing approved"
    assert result["timed_out"] is True
    assert [t.task_id for t in skipped] == ["replay"]
    # "Approve nothing" wins over answers given in the form.
    skipped.clear()
    with pytest.raises(_Skipped):
        op.execute_complete(context(skipped, xcoms), event([op.NOTHING], {"aaaa000011112222": "replay"}))
    result = xcoms["return_value"]
    assert set(result["actions"].values()) == {"leave"}
    with pytest.raises(ReplayArgumentError, match="approves no group"):
        build_replay_args(
            {
                "run_id": "r",
                "mode": "replay",
                "service_url": "pulsar://x:6650",
                "topics": "a",
                "output_dir": "/o",
                "origin_allowlist": "o",
                "group_actions": result["actions"],
            }
        )


def test_operator_validates_its_arguments():
    with pytest.raises(ValueError, match="sets 'options' itself"):
        make_op(options=["x"])
    with pytest.raises(ValueError, match="max_groups"):
        make_op(max_groups=0)
    op = make_op(response_timeout_seconds="soon")
    with pytest.raises(ValueError, match="positive number"):
        op._timeout()
    with pytest.raises(ValueError, match="must come from a dry-run"):
        DlqGroupApprovalOperator(task_id="a", dry_run_summary={**SUMMARY, "mode": "replay"})._summary()
    with pytest.raises(ValueError, match="one of replay, archive, leave"):
        make_op().validate_params_input({"aaaa000011112222": "delete"})
    with pytest.raises(ReplayArgumentError, match="must each be one of"):
        build_replay_args(
            {
                "run_id": "r",
                "service_url": "s",
                "topics": "a",
                "output_dir": "/o",
                "group_actions": {"a": "x"},
            }
        )
