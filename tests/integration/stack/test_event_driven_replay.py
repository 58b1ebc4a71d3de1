"""Event-driven replay end to end: Apache Pulsar DLQ -> ``pulsar`` scheme watcher in the real triggerer ->
asset event -> the DAG scheduled on the asset replays -> re-arm.

Checks that the watch fires when the backlog crosses the threshold (and measures the latency from the
backlog crossing to the asset event and the DAG run), never consumes or acks, does not fire again for
the same backlog (not even after a triggerer crash), and fires again for new messages once the run
re-armed it with what it left pending as the baseline. The DAG sets an origin allowlist but no mode:
its first run only dry-runs (its report, opened in the browser, says so), and the second replays once
Variable ``dlq_event_driven_mode`` is ``replay``.
"""

from __future__ import annotations

import time
import uuid
from urllib.parse import quote

import pytest
from stack_helpers import (
    OrdersService,
    add_dag_file,
    asset_events,
    dag_runs,
    delete_variable,
    ensure_subscription,
    parse_time,
    pending,
    put_variable,
    replayed_groups,
    stack_connections,
    topic_stats,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(2400)]

MIN_BACKLOG = 5
POLL_SECONDS = 1.0
PLAYBOOK = """\
version: 1
rules:
  - name: retry-timeouts
    match: {error_class: TimeoutError}
    action: republish
"""  # ValueErrors match no rule: the replay leaves them pending (the baseline)


def show_the_dry_run_in_the_ui(stack, browser, dag_id: str, run_id: str, tmp_path) -> None:
    """The run's report, opened from the replay task's link, says it was a dry-run."""
    from browser import screenshot_dir

    path = f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/replay/links"
    link = stack.api("GET", path)["extra_links"]["DLQ replay report"]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    response = page.goto(link, wait_until="load", timeout=120_000)
    assert response is not None
    assert response.status == 200
    page.get_by_text("nothing was published, archived", exact=False).first.wait_for(timeout=60_000)
    page.screenshot(path=str(screenshot_dir(tmp_path) / "event-driven-dry-run-report.png"))
    page.close()


def test_backlog_fires_the_watch_once_and_the_scheduled_dag_replays(
    airflow_stack, pulsar_broker, pulsar_client, topic_factory, tmp_path, record_property, browser
):
    stack = airflow_stack
    delete_variable(stack, "dlq_event_driven_mode")  # replay is an opt-in: unset, the DAG dry-runs
    conn_id = stack_connections(stack, pulsar_broker)
    service = OrdersService(pulsar_client, topic_factory("orders"))
    ensure_subscription(pulsar_client, service.dlq)
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(PLAYBOOK)
    uid = uuid.uuid4().hex[:8]
    dag_id, asset = f"dlq_event_{uid}", f"pulsar_dlq_backlog_{uid}"
    add_dag_file(
        stack,
        dag_id,
        f"""
        from dlq_event_driven_replay import dlq_backlog_asset, event_driven_replay

        BACKLOG = dlq_backlog_asset(
            {asset!r}, topics=[{service.dlq!r}], pulsar_conn_id={conn_id!r},
            min_backlog={MIN_BACKLOG}, poll_interval={POLL_SECONDS},
        )
        dag = event_driven_replay(
            {dag_id!r}, BACKLOG, topics=[{service.dlq!r}], pulsar_conn_id={conn_id!r},
            playbook={str(playbook)!r}, output_dir={str(tmp_path / "out")!r},
            origin_allowlist={service.origin!r}, replay_kwargs={{"retries": 0}},
        )
        """,
    )
    stack.wait_for_dag(dag_id)
    stack.unpause(dag_id)
    triggerer_log = stack.home / "triggerer.log"
    watching = f"Watching the backlog of dlq-replayer on {service.dlq}"

    def watches() -> int:
        return triggerer_log.read_text(errors="replace").count(watching)

    wait_for("the watcher's trigger to run in the triggerer", watches, timeout_s=120)

    # Below the threshold: nothing fires, and the watch neither consumes nor acks.
    service.fail([TimeoutError("payment timed out after 3s")] * 2 + [ValueError("order 7 has no id")] * 2)
    time.sleep(6 * POLL_SECONDS)
    assert asset_events(stack, asset, dag_id) == []
    assert dag_runs(stack, dag_id) == []
    stats = topic_stats(pulsar_broker.admin_url, service.dlq)
    sub = stats["subscriptions"]["dlq-replayer"]
    assert (sub["msgBacklog"], stats["msgOutCounter"], sub["consumers"]) == (4, 0, [])
    assert set(stats["subscriptions"]) == {"dlq-replayer"}

    # The 5th message crosses the threshold: one asset event, one DAG run.
    service.fail([TimeoutError("payment timed out after 9s")])
    crossed = time.time()
    event = wait_for("the asset event", lambda: asset_events(stack, asset, dag_id), timeout_s=60)[0]
    run = wait_for("the DAG run", lambda: dag_runs(stack, dag_id), timeout_s=60)[0]
    event_latency = parse_time(event["timestamp"]) - crossed
    run_latency = parse_time(run["queued_at"]) - crossed
    assert event["extra"]["payload"]["backlog"] == MIN_BACKLOG
    assert event["extra"]["payload"]["reason"] == "min_backlog"

    # A triggerer crash while the run runs: the restarted watch remembers that it fired.
    stack.restart("triggerer", kill=True)
    finished = stack.wait_for_run(dag_id, run["dag_run_id"], timeout_s=1200)
    assert finished["state"] == "success", stack.task_instances(dag_id, run["dag_run_id"])
    states = {t: ti["state"] for t, ti in stack.task_instances(dag_id, run["dag_run_id"]).items()}
    assert states == {"replay": "success", "report": "success", "rearm_backlog_watch": "success"}
    # The allowlist is set but the mode is not: a dry-run, which republishes nothing.
    assert "(dry-run): succeeded" in stack.task_log(dag_id, run["dag_run_id"], "replay")
    show_the_dry_run_in_the_ui(stack, browser, dag_id, run["dag_run_id"], tmp_path)
    assert replayed_groups(pulsar_client, service.origin, "verify", expect=0, timeout_s=5) == {}
    assert pending(pulsar_client, service.dlq) == MIN_BACKLOG  # all left pending: the new baseline
    wait_for("the restarted triggerer to run the watch again", lambda: watches() >= 2, timeout_s=120)
    time.sleep(6 * POLL_SECONDS)
    assert len(asset_events(stack, asset, dag_id)) == 1, "fired again for the backlog the replay left pending"
    assert len(dag_runs(stack, dag_id)) == 1

    # Opted in; new messages above the baseline fire it again, after the restart, and this run replays.
    put_variable(stack, "dlq_event_driven_mode", "replay")
    service.fail([TimeoutError("payment timed out after 1s")] * MIN_BACKLOG)
    crossed_again = time.time()
    events = wait_for("the second asset event", lambda: asset_events(stack, asset, dag_id)[1:], timeout_s=60)
    second = events[0]["extra"]["payload"]
    expected = (2 * MIN_BACKLOG, MIN_BACKLOG, MIN_BACKLOG)
    assert (second["backlog"], second["baseline"], second["new_backlog"]) == expected
    runs = wait_for("the second DAG run", lambda: dag_runs(stack, dag_id)[1:], timeout_s=60)
    second_latency = parse_time(runs[0]["queued_at"]) - crossed_again
    figures = {
        "backlog_to_asset_event_s": round(event_latency, 2),
        "backlog_to_dag_run_queued_s": round(run_latency, 2),
        "after_triggerer_restart_backlog_to_dag_run_queued_s": round(second_latency, 2),
        "poll_interval_s": POLL_SECONDS,
    }
    record_property("event_driven_latency", figures)
    print(f"EVENT-DRIVEN LATENCY {figures}", flush=True)
    assert run_latency < 30
    assert second_latency < 30

    done = stack.wait_for_run(dag_id, runs[0]["dag_run_id"], timeout_s=1200)
    delete_variable(stack, "dlq_event_driven_mode")
    assert done["state"] == "success"
    assert "(replay): succeeded" in stack.task_log(dag_id, runs[0]["dag_run_id"], "replay")
    # Every timeout: the 3 the dry-run left and the 5 new ones; the ValueErrors match no rule.
    assert replayed_groups(pulsar_client, service.origin, "verify", expect=3 + MIN_BACKLOG) == {
        "TimeoutError": 3 + MIN_BACKLOG
    }
    assert pending(pulsar_client, service.dlq) == 2
    stack.api("PATCH", f"/dags/{dag_id}", {"is_paused": True})
    service.close()
