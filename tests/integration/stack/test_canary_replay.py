"""Canary replay with auto-halt, in the real Airflow stack on Apache Pulsar.

The orders service fails group A (card declined) again on purpose and processes group B (timeouts). The
replay DAG's first try is killed during the canary wait; the retry resumes the same run id. Group A
halts as ``canary_failed`` (left pending), group B is replayed in full, nothing is sent twice and the
canary's messages are counted once.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import psutil
import pulsar
import pytest
from stack_helpers import OrdersService, add_dag_file, pending, stack_connections, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(2400)]

PER_GROUP = 10
CANARY = 3
PLAYBOOK = """\
version: 1
rules:
  - name: retry-all
    match: {error_class: [PermissionError, TimeoutError]}
    action: republish
"""


class ReplayedOrders:
    """The service's consumer after the fix: declined cards still fail (term), timeouts now succeed."""

    def __init__(self, service: OrdersService) -> None:
        self.service = service.service
        self.received: list[tuple[str, str, str]] = []  # (group, REPLAY_ID, REPLAY_RUN_ID)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                msg = self.service.receive(timeout_millis=500)
            except pulsar.Timeout:
                continue
            props = msg.properties()
            group = json.loads(msg.data())["group"]
            self.received.append((group, props.get("REPLAY_ID", ""), props.get("REPLAY_RUN_ID", "")))
            if group == "PermissionError":
                self.service.term(msg, PermissionError("card declined again"))
            else:
                self.service.acknowledge(msg)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def spark_submit_of(dag_id: str) -> list[psutil.Process]:
    """The spark-submit processes (and their trees) of this DAG's replay (this test started them)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "dlq_replay_main.py" in cmd and dag_id in cmd:
            found.append(proc)
    return found


def kill_trees(procs: list[psutil.Process]) -> None:
    everything = list(procs)
    for proc in procs:
        try:
            everything += proc.children(recursive=True)
        except psutil.Error:
            continue
    for proc in everything:
        try:
            proc.kill()
        except psutil.Error:
            continue


def run_state(out: Path) -> dict:
    for path in out.glob("runs/*/state.json"):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
    return {}


def show_the_halt_in_the_ui(stack, browser, dag_id: str, run_id: str, tmp_path: Path) -> None:
    """The failed task's page names the halt; its report link opens the canary verdict."""
    from urllib.parse import quote

    from browser import screenshot_dir

    shots = screenshot_dir(tmp_path)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(120_000)
    run = quote(run_id, safe="")
    page.goto(f"{stack.base_url}/dags/{dag_id}/runs/{run}/tasks/replay", wait_until="networkidle")
    page.get_by_text("Canary halted 1 error group(s)", exact=False).first.wait_for()
    page.screenshot(path=str(shots / "canary-halt-task-failed.png"))
    links = stack.api("GET", f"/dags/{dag_id}/dagRuns/{run}/taskInstances/replay/links")["extra_links"]
    response = page.goto(links["DLQ replay report"], wait_until="load")
    assert response is not None
    assert response.status == 200
    page.get_by_text("Canary verdict", exact=False).first.wait_for()
    assert page.get_by_text("Canary halted group", exact=False).count() >= 1
    assert page.get_by_text("Nothing to do", exact=False).count() == 0
    page.screenshot(path=str(shots / "canary-halt-report.png"), full_page=True)


def test_canary_halts_the_group_that_fails_again_and_replays_the_other(
    airflow_stack, pulsar_broker, pulsar_client, topic_factory, tmp_path, record_property, browser
):
    stack = airflow_stack
    conn_id = stack_connections(stack, pulsar_broker)
    service = OrdersService(pulsar_client, topic_factory("orders"))
    service.fail(
        [PermissionError(f"card {n} declined") for n in range(PER_GROUP)]
        + [TimeoutError(f"payment timed out after {n}s") for n in range(PER_GROUP)]
    )
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(PLAYBOOK)
    out = tmp_path / "out"
    dag_id = f"dlq_canary_{uuid.uuid4().hex[:8]}"
    add_dag_file(
        stack,
        dag_id,
        f"""
        from datetime import timedelta

        from dlq_canary_replay import canary_replay

        dag = canary_replay(
            {dag_id!r}, canary="{CANARY}", canary_wait_seconds=20, canary_max_failure_rate=0.0,
            topics=[{service.dlq!r}], playbook={str(playbook)!r}, output_dir={str(out)!r},
            origin_allowlist={service.origin!r}, pulsar_conn_id={conn_id!r},
            retries=3, retry_delay=timedelta(seconds=1),
        )
        """,
    )
    consumer = ReplayedOrders(service)
    stack.wait_for_dag(dag_id)
    stack.unpause(dag_id)
    run_id = stack.trigger(dag_id)

    # Kill the first try during the canary wait (canary sent, no verdict yet).
    def in_canary_wait():
        canary = run_state(out).get("steps", {}).get("apply", {}).get("canary", {})
        return "sent_at" in canary and "verdicts" not in canary and spark_submit_of(dag_id)

    procs = wait_for("the canary wait", in_canary_wait, timeout_s=1200)
    sent_at = run_state(out)["steps"]["apply"]["canary"]["sent_at"]
    killed_try = stack.task_instances(dag_id, run_id)["replay"]["try_number"]
    kill_trees(procs)
    run = stack.wait_for_run(dag_id, run_id, timeout_s=1500)
    ti = stack.task_instances(dag_id, run_id)["replay"]
    # A halted canary needs a person: the task fails (no retry: the verdict is final for this run id).
    assert run["state"] == "failed", ti
    assert ti["state"] == "failed", ti
    assert ti["try_number"] > killed_try  # a later try resumed the run and finished it
    log = stack.task_log(dag_id, run_id, "replay", ti["try_number"])
    assert "Canary halted 1 error group(s)" in log
    assert f"{PER_GROUP - CANARY} message(s) stay pending as canary_failed" in log
    consumer_deadline = time.monotonic() + 20
    while time.monotonic() < consumer_deadline and len(consumer.received) < CANARY + PER_GROUP:
        time.sleep(0.5)
    consumer.close()

    state = run_state(out)
    canary = state["steps"]["apply"]["canary"]
    assert canary["sent_at"] == sent_at, "the canary was sent again after the kill"
    report = json.loads(next(out.glob("runs/*/report.json")).read_text())
    groups = {g["error_class"]: g for g in report["groups"]}
    declined, timeouts = groups["PermissionError"], groups["TimeoutError"]
    verdicts = report["canary"]["verdicts"]
    assert verdicts[declined["signature"]] == {
        "canary_sent": CANARY,
        "failed_again": CANARY,
        "failure_rate": 1.0,
        "decision": "halted",
    }
    assert verdicts[timeouts["signature"]]["decision"] == "replay"
    assert verdicts[timeouts["signature"]]["failed_again"] == 0
    assert declined["outcomes"] == {"republished": CANARY, "canary_failed": PER_GROUP - CANARY}
    assert timeouts["outcomes"] == {"republished": PER_GROUP}
    assert report["totals"]["canary_failed"] == PER_GROUP - CANARY
    assert report["totals"]["republished"] == CANARY + PER_GROUP
    # The report's verdict and next steps: the halted group first, never "Nothing to do".
    assert report["canary"]["verdict"] == "halted"
    assert report["canary"]["halted"] == [declined["signature"]]
    titles = [step["title"] for step in report["next_steps"]]
    assert titles[0].startswith(f"Canary halted group {declined['signature']} (PermissionError)"), titles
    assert not any(t.startswith("Nothing to do") for t in titles), titles
    show_the_halt_in_the_ui(stack, browser, dag_id, run_id, tmp_path)

    # The consumer saw each replayed message exactly once: nothing doubled.
    replays = [(g, rid) for g, rid, _ in consumer.received if rid]
    assert len(replays) == len(set(replays))
    per_group = {g: sum(1 for x, _ in replays if x == g) for g in ("PermissionError", "TimeoutError")}
    assert per_group == {"PermissionError": CANARY, "TimeoutError": PER_GROUP}
    # Pending on the DLQ: the halted group's 7 + its 3 canaries, dead-lettered again (new messages).
    assert pending(pulsar_client, service.dlq) == PER_GROUP
    service.close()

    figures = {
        "canary_per_group": CANARY,
        "verdicts": {
            "PermissionError (fails again)": verdicts[declined["signature"]],
            "TimeoutError (fixed)": verdicts[timeouts["signature"]],
        },
        "outcomes": {"PermissionError": declined["outcomes"], "TimeoutError": timeouts["outcomes"]},
        "killed_try": killed_try,
        "resumed_try": ti["try_number"],
    }
    record_property("canary", figures)
    print(f"CANARY FIGURES {json.dumps(figures)}")
