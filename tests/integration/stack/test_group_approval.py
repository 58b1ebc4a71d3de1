"""Human approval per error group in the real Airflow stack, on Apache Pulsar: ``dlq_backfill`` runs a
dry-run, shows its groups in the human-in-the-loop form (with the messages whose fix fails), a person
answers through the REST API, and the replay republishes exactly the groups approved for replay (count
per group, less the message its fix refuses); a request that times out approves nothing and the DLQ is
left as it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest
from browser import screenshot_dir
from stack_helpers import (
    OrdersService,
    delete_variable,
    pending,
    put_connection,
    put_variable,
    replayed_groups,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(2400)]

DAG_ID = "dlq_backfill"
PLAYBOOK = """\
version: 1
fix_files: [timeout_fixes.py]
rules:
  - name: retry-timeouts
    match: {error_class: TimeoutError}
    action: republish
    fix: timeout_fixes:mark_retried
    fix_version: "1"
  - name: archive-bad-orders
    match: {error_class: ValueError}
    action: archive
"""  # KeyErrors match no rule (the playbook would skip them)
FIXES = """\
import json


def mark_retried(record):
    order = json.loads(record.payload)
    if order["order"] == 0:  # the first timeout: its fix fails, in the dry-run and in the replay
        raise ValueError("order 0 cannot be retried")
    return record.payload
"""


def ti_state(stack, run_id: str, task_id: str) -> str | None:
    return stack.task_instances(DAG_ID, run_id).get(task_id, {}).get("state")


def xcom(stack, run_id: str, task_id: str) -> dict:
    path = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
    value = stack.api("GET", path)["value"]
    return json.loads(value) if isinstance(value, str) else value


def hitl_path(run_id: str) -> str:
    return f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/approve/-1/hitlDetails"


def answer_until_the_run_ends(stack, run_id: str, response: dict, timeout_s: float) -> tuple[dict, list[int]]:
    """Answer the approval request, and the request of any later try of the task, until the run ends.

    Airflow's scheduler can fail the resumed task when the answer lands before it has handled the exit of
    the process that paused the task (it logs "finished with state success, but the task instance's state
    attribute is queued" and marks the try up for retry). The next try asks again, as it would ask a
    person, who answers again. Returns the finished run and the tries answered.
    """
    answered: list[int] = []

    def answer_a_new_request() -> None:
        approve = stack.task_instances(DAG_ID, run_id).get("approve", {})
        if approve.get("state") == "awaiting_input" and approve["try_number"] not in answered:
            stack.api("PATCH", hitl_path(run_id), response)
            answered.append(approve["try_number"])

    return stack.wait_for_run(DAG_ID, run_id, timeout_s, on_poll=answer_a_new_request), answered


@pytest.fixture
def backfill_env(airflow_stack, pulsar_broker, tmp_path):
    stack = airflow_stack
    put_connection(stack, "spark_default", "spark", "local[2]")
    put_connection(
        stack, "pulsar_default", "pulsar", pulsar_broker.service_url, {"admin_url": pulsar_broker.admin_url}
    )
    put_variable(stack, "dlq_output_dir", str(tmp_path / "out"))
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(PLAYBOOK)
    (tmp_path / "timeout_fixes.py").write_text(FIXES)
    stack.wait_for_dag(DAG_ID)
    stack.unpause(DAG_ID)
    yield playbook
    delete_variable(stack, "dlq_output_dir")
    delete_variable(stack, "dlq_approval_timeout_seconds")


def test_replay_acts_only_on_the_groups_a_person_approved(
    airflow_stack, backfill_env, pulsar_client, topic_factory, browser, tmp_path, record_property
):
    stack = airflow_stack
    service = OrdersService(pulsar_client, topic_factory("orders"))
    service.fail(
        [TimeoutError(f"payment timed out after {n}s") for n in range(4)]
        + [ValueError(f"order {n} has no customer id") for n in range(3)]
        + [KeyError("coupon")] * 2
    )
    conf = {
        "topics": [service.dlq],
        "mode": "replay",
        "playbook": str(backfill_env),
        "origin_allowlist": service.origin,
    }
    run_id = stack.trigger(DAG_ID, conf)
    wait_for("the approval request", lambda: ti_state(stack, run_id, "approve") == "awaiting_input", 600)

    # The form shows each group: count, template, origin, samples, the playbook's proposal.
    detail = stack.api("GET", hitl_path(run_id))
    assert detail["options"] == ["Apply the chosen actions", "Approve nothing"]
    assert detail["defaults"] == ["Approve nothing"]
    fields = detail["params"]
    by_class = {}
    for signature, field in fields.items():
        assert field["value"] == "leave"
        assert field["schema"]["enum"] == ["replay", "archive", "leave"]
        by_class[field["schema"]["title"].split(": ")[0]] = signature
    assert set(by_class) == {"4 x TimeoutError", "3 x ValueError", "2 x KeyError"}
    body = detail["body"]
    # The report is a link (the dry-run task's report endpoint), not a worker path.
    report_link = f"{stack.base_url}/dlq-replay/reports/{DAG_ID}/{quote(run_id, safe='')}/dry_run/-1"
    assert f"[Open the dry-run's report]({report_link})" in body, body
    # The table uses the fields' words, and shows the fix failures per group.
    assert "| template | playbook proposes | fix fails |" in body
    rows = {
        line.split("|")[4].strip(): line
        for line in body.splitlines()
        if line.startswith("| ") and "`" in line
    }
    assert "&lt;num>s | replay | **1** (stay pending) |" in rows["TimeoutError"], rows
    assert "| archive | 0 |" in rows["ValueError"], rows
    assert "| leave | 0 |" in rows["KeyError"], rows
    assert "payment timed out after &lt;num>s" in body
    assert "order &lt;num> has no customer id" in body
    assert all(sig in body for sig in fields)
    field = fields[by_class["4 x TimeoutError"]]
    timeouts = field.get("description") or field["schema"].get("description", "")
    assert "1 of its messages fails the playbook's fix and stays pending" in timeouts, timeouts

    page = browser.new_page(viewport={"width": 1600, "height": 1100})
    page.goto(f"{stack.base_url}/dags/{DAG_ID}/runs/{run_id}/tasks/approve/required_actions")
    page.get_by_text("Approve the DLQ replay, group by group").first.wait_for(timeout=90_000)
    page.get_by_text("4 x TimeoutError").first.wait_for(timeout=30_000)
    page.get_by_text("(stay pending)").first.wait_for(timeout=30_000)  # the fix-fails column
    link = page.get_by_role("link", name="Open the dry-run's report").first
    link.wait_for(timeout=30_000)
    assert link.get_attribute("href") == report_link
    shot = screenshot_dir(tmp_path) / "approval-form.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000

    # Approve: replay the timeouts and the keys (which the playbook would skip); leave the bad orders.
    answer = {
        by_class["4 x TimeoutError"]: "replay",
        by_class["2 x KeyError"]: "replay",
        by_class["3 x ValueError"]: "leave",
    }
    response = {"chosen_options": ["Apply the chosen actions"], "params_input": answer}
    run, tries = answer_until_the_run_ends(stack, run_id, response, timeout_s=1500)
    instances = stack.task_instances(DAG_ID, run_id)
    states = {t: ti["state"] for t, ti in instances.items()}
    assert run["state"] == "success", states
    assert states == {
        t: "success" for t in ("dry_run", "report", "wants_replay", "approve", "replay", "replay_report")
    }
    assert tries[-1] == instances["approve"]["try_number"]  # the try that succeeded had our answer

    approval = xcom(stack, run_id, "approve")
    assert approval["decision"] == "approved"
    assert approval["responded_by"]
    replay = xcom(stack, run_id, "replay")
    assert replay["totals"]["republished"] == 5
    assert replay["totals"]["fix_failed"] == 1  # as the form said
    assert replay["totals"]["archived"] == 0
    replayed = replayed_groups(pulsar_client, service.origin, "verify", expect=5)
    assert replayed == {"TimeoutError": 3, "KeyError": 2}
    assert pending(pulsar_client, service.dlq) == 4  # the left ValueErrors, untouched, and the unfixed one
    # The replay's report names the group the approval left as not approved (not "outside filters").
    replay_report = json.loads(Path(replay["paths"]["report_json"]).read_text())
    titles = [step["title"] for step in replay_report["next_steps"]]
    left = by_class["3 x ValueError"]
    assert f"3 messages in groups not approved ({left}) stay pending" in titles, titles
    page.goto(
        f"{stack.base_url}/dlq-replay/reports/{DAG_ID}/{quote(run_id, safe='')}/replay/-1", wait_until="load"
    )
    page.get_by_text("in groups not approved", exact=False).first.wait_for(timeout=30_000)
    page.screenshot(path=str(screenshot_dir(tmp_path) / "replay-report-not-approved.png"), full_page=True)
    approved_counts = {
        cls: approval["counts"][sig] for cls, sig in by_class.items() if answer[sig] == "replay"
    }
    figures = {"approved": approved_counts, "replayed_per_group": replayed, "left_pending": 4, "tries": tries}
    record_property("approval", figures)
    print(f"APPROVAL FIGURES {figures}")

    # A request nobody answers times out to "nothing approved": the replay is skipped, nothing changes.
    put_variable(stack, "dlq_approval_timeout_seconds", "3")
    timeout_run = stack.trigger(DAG_ID, conf)
    finished = stack.wait_for_run(DAG_ID, timeout_run, timeout_s=1500)
    states = {t: ti["state"] for t, ti in stack.task_instances(DAG_ID, timeout_run).items()}
    assert finished["state"] == "success", states
    assert states["approve"] == "success"
    assert states["replay"] == "skipped"
    timed_out = xcom(stack, timeout_run, "approve")
    assert timed_out["decision"] == "nothing approved"
    assert timed_out["timed_out"] is True
    assert set(timed_out["actions"].values()) == {"leave"}
    assert replayed_groups(pulsar_client, service.origin, "verify", expect=0, timeout_s=5) == {}
    assert pending(pulsar_client, service.dlq) == 4
    service.close()
