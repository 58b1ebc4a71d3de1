"""The real Airflow stack and the browser the UI tests rely on: healthy components, the UI renders."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


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
