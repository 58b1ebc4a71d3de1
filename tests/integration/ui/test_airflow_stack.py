"""The real Airflow stack and the browser the UI tests rely on: healthy components, the UI renders; and
what a first-time user meets before any replay runs: the replay pool exists, a backfill without topics
fails at once naming the Variable to set, the unconfigured nightly run says why it skipped.
"""

from __future__ import annotations

import contextlib
import time
from urllib.parse import quote

import pytest

pytestmark = pytest.mark.integration


def _wait_for_state(stack, dag_id: str, run_id: str, task_id: str, states: set[str], timeout_s: float = 180):
    deadline = time.monotonic() + timeout_s
    ti: dict = {}
    while time.monotonic() < deadline:
        ti = stack.task_instances(dag_id, run_id).get(task_id, {})
        if ti.get("state") in states:
            return ti
        time.sleep(1)
    raise AssertionError(f"{dag_id}/{task_id} not in {states} within {timeout_s:.0f} s: {ti}")


def test_stack_components_are_healthy_and_the_ui_lists_the_dags(airflow_stack, browser, tmp_path):
    from browser import screenshot_dir

    health = airflow_stack.health()
    for part in ("metadatabase", "scheduler", "triggerer", "dag_processor"):
        assert health[part]["status"] == "healthy", health
    airflow_stack.wait_for_dag("dlq_backfill")
    page = browser.new_page()
    page.goto(f"{airflow_stack.base_url}/dags", wait_until="networkidle")
    page.get_by_text("dlq_backfill").first.wait_for(timeout=60_000)
    page.screenshot(path=str(screenshot_dir(tmp_path) / "dags-list.png"), full_page=True)
    assert page.get_by_text("dlq_nightly_replay").count() >= 1


def test_first_steps_pool_usage_error_and_skip_reason(airflow_stack, browser, tmp_path):
    """Nothing configured, as a first-time user starts: no manual pool, no Variables."""
    from browser import screenshot_dir

    shots = screenshot_dir(tmp_path)
    stack = airflow_stack
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)

    # The provider created the one-slot replay pool when the scheduler started (no `airflow pools set`).
    pool = stack.api("GET", "/pools/dlq_replay")
    assert pool["slots"] == 1, pool
    assert "airflow-provider-dlq" in (pool.get("description") or ""), pool
    page.goto(f"{stack.base_url}/pools", wait_until="networkidle")
    page.get_by_text("dlq_replay").first.wait_for()
    page.screenshot(path=str(shots / "pool-created-by-provider.png"))

    # A backfill with no topics (form and Variable empty) fails at once: no retry, the message says
    # which Variable / Param to set. Its task ran in the pool, so the pool works too.
    for dag_id in ("dlq_backfill", "dlq_nightly_replay"):
        stack.wait_for_dag(dag_id)
        stack.unpause(dag_id)
    with contextlib.suppress(Exception):  # absent already is fine
        stack.api("DELETE", "/variables/dlq_topics")
    run_id = stack.trigger("dlq_backfill", {})
    ti = _wait_for_state(stack, "dlq_backfill", run_id, "dry_run", {"failed", "up_for_retry"})
    assert ti["state"] == "failed", ti  # not up_for_retry
    assert ti["try_number"] == 1, ti
    assert ti["pool"] == "dlq_replay", ti
    log = stack.task_log("dlq_backfill", run_id, "dry_run")
    assert "--topics is required" in log
    assert "Variable dlq_topics" in log
    assert "Param topics" in log
    assert "not retried" in log
    stack.wait_for_run("dlq_backfill", run_id, timeout_s=120)
    page.goto(
        f"{stack.base_url}/dags/dlq_backfill/runs/{quote(run_id, safe='')}/tasks/dry_run",
        wait_until="networkidle",
    )
    page.get_by_text("Variable dlq_topics", exact=False).first.wait_for()
    page.screenshot(path=str(shots / "backfill-no-topics-fails-at-once.png"))

    # The unconfigured nightly run skips, and says why in the first lines of the log, visible as it opens.
    nightly = stack.trigger("dlq_nightly_replay", {})
    ti = _wait_for_state(stack, "dlq_nightly_replay", nightly, "check_configuration", {"skipped", "failed"})
    assert ti["state"] == "skipped", ti
    page.goto(
        f"{stack.base_url}/dags/dlq_nightly_replay/runs/{quote(nightly, safe='')}/tasks/check_configuration",
        wait_until="networkidle",
    )
    reason = page.get_by_text("Skipped: Variable dlq_topics is not set", exact=False).first
    reason.wait_for(timeout=120_000)  # the log loads after the page, slowly on a busy machine
    assert reason.is_visible()  # not folded into a collapsed log group
    page.screenshot(path=str(shots / "nightly-skip-reason.png"))
    stack.api("PATCH", "/dags/dlq_nightly_replay", {"is_paused": True})
