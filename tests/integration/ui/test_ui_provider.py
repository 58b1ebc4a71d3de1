"""The provider as users meet it in a real Airflow 3 UI (API server, scheduler, DAG processor, triggerer on
loopback) driven by headless Chromium: the backfill trigger form with its defaults, the run's report link
served by the provider's plugin, the report itself, and the connection form's Test button.

Screenshots go to ``DLQ_TEST_SCREENSHOTS`` (kept) or the test's temp dir.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from urllib.parse import quote

import pulsar
import pytest

from pulsar_dlq_consumer import DeadLetterPolicy, DlqConsumer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SUB = "dlq-replayer"
SHOTS: list = []  # the screenshot folder of the running test
PLAYBOOK = """\
version: 1
rules:
  - name: retry-timeouts
    match: {error_class: TimeoutError}
    action: republish
  - name: archive-bad-orders
    match: {error_class: ValueError}
    action: archive
"""


def fill_dlq(client, origin: str, timeouts: int, bad: int, unknown: int) -> str:
    """Term orders to the DLQ: TimeoutErrors, ValueErrors and KeyErrors (which no rule matches)."""
    service = DlqConsumer(
        client,
        origin,
        "orders-service",
        dead_letter_policy=DeadLetterPolicy(initial_subscription_name=SUB),
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = client.create_producer(origin)
    total = timeouts + bad + unknown
    for i in range(total):
        producer.send(
            json.dumps({"order": i, "email": f"c{i}@example.com"}).encode(), properties={"n": str(i)}
        )
    producer.close()
    for _ in range(total):
        msg = service.receive(timeout_millis=10_000)
        n = int(msg.properties()["n"])
        if n < timeouts:
            error: Exception = TimeoutError(f"payment service timed out after {n}s")
        elif n < timeouts + bad:
            error = ValueError(f"order {n} has no customer id")
        else:
            error = KeyError(f"currency of order {n}")
        service.term(msg, error)
    service.flush()
    topic = service.dead_letter_topic
    service.close()
    return topic


def wait_for_run(stack, dag_id: str, run_id: str, timeout_s: float = 1800) -> dict:
    """Like ``stack.wait_for_run`` but patient with an API server slowed down by the run itself."""
    from airflow_stack import AirflowApiError

    deadline = time.monotonic() + timeout_s
    run: dict = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, AirflowApiError):
            run = stack.api("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}", timeout=60)
            if run.get("state") in ("success", "failed"):
                return run
        time.sleep(3)
    raise AssertionError(f"run {dag_id}/{run_id} not finished within {timeout_s:.0f} s: {run}")


def put(stack, kind: str, key: str, body: dict) -> None:
    """Create or replace a connection / variable through the REST API, as a user of the UI would."""
    from airflow_stack import AirflowApiError

    path = {"connections": "/connections", "variables": "/variables"}[kind]
    with contextlib.suppress(AirflowApiError):
        stack.api("DELETE", f"{path}/{quote(key, safe='')}")
    stack.api("POST", path, body)


@pytest.mark.timeout(2400)  # a Spark run under LocalExecutor on a shared 2-core machine
def test_backfill_from_the_ui_form_then_the_report_link(
    airflow_stack, browser, tmp_path, pulsar_broker, pulsar_client, topic_factory
):
    from browser import screenshot_dir

    shots = screenshot_dir(tmp_path)
    dlq = fill_dlq(pulsar_client, topic_factory("orders"), timeouts=3, bad=2, unknown=2)
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(PLAYBOOK)
    out = tmp_path / "out"
    put(airflow_stack, "connections", "pulsar_default", {
        "connection_id": "pulsar_default", "conn_type": "pulsar", "host": pulsar_broker.service_url,
        "extra": json.dumps({"admin_url": pulsar_broker.admin_url}),
    })  # fmt: skip
    put(airflow_stack, "connections", "spark_default",
        {"connection_id": "spark_default", "conn_type": "spark", "host": "local[2]"})  # fmt: skip
    for key, value in {"dlq_topics": dlq, "dlq_playbook": str(playbook), "dlq_output_dir": str(out)}.items():
        put(airflow_stack, "variables", key, {"key": key, "value": value})
    airflow_stack.wait_for_dag("dlq_backfill")

    # 1. The trigger form: nothing required, Trigger enabled, every field says what empty means.
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(120_000)  # the UI is slow while Spark runs on the same two cores
    page.goto(f"{airflow_stack.base_url}/dags/dlq_backfill", wait_until="networkidle")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Run Parameters").wait_for(timeout=30_000)
    assert dialog.locator('[aria-required="true"]').count() == 0
    for text in (
        "Empty: the topics in Variable dlq_topics",
        "Empty: Variable dlq_playbook",
        "Empty: no limit",
    ):
        assert dialog.get_by_text(text, exact=False).count() >= 1, text
    page.screenshot(path=str(shots / "backfill-trigger-form.png"))
    trigger = dialog.get_by_role("button", name="Trigger")
    trigger.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "backfill-trigger-button.png"))
    assert trigger.is_enabled()
    before = {r["dag_run_id"] for r in airflow_stack.api("GET", "/dags/dlq_backfill/dagRuns")["dag_runs"]}
    trigger.click()
    run_id = None
    deadline = time.monotonic() + 60
    while run_id is None and time.monotonic() < deadline:
        runs = airflow_stack.api("GET", "/dags/dlq_backfill/dagRuns")["dag_runs"]
        new = [r["dag_run_id"] for r in runs if r["dag_run_id"] not in before]
        run_id = new[0] if new else None
        time.sleep(1)
    assert run_id, "the form did not start a run"
    run = wait_for_run(airflow_stack, "dlq_backfill", run_id)
    assert run["state"] == "success", airflow_stack.task_log("dlq_backfill", run_id, "dry_run")
    assert run["conf"] in ({}, None) or all(v in (None, "dry-run") for v in run["conf"].values())

    # 2. The task's extra links: the report through the provider's endpoint, and the Spark application.
    links = airflow_stack.api(
        "GET", f"/dags/dlq_backfill/dagRuns/{quote(run_id, safe='')}/taskInstances/dry_run/links"
    )
    report_link = links["extra_links"]["DLQ replay report"]
    # No Spark history server configured: no "Spark application" link (the live UI ended with the run).
    assert not links["extra_links"].get("Spark application"), links
    assert report_link.startswith(f"{airflow_stack.base_url}/dlq-replay/reports/dlq_backfill/")
    # 2b. The report, served by the plugin to the logged-in user: it explains, and runs no script.
    response = page.goto(report_link, wait_until="load")
    assert response is not None
    assert response.status == 200, response.text()
    assert "default-src 'none'" in response.all_headers().get("content-security-policy", "")  # no script
    body = page.content()
    assert "<script" not in body
    assert page.get_by_text("What to do next").count() == 1
    assert page.get_by_text("match no playbook rule", exact=False).count() >= 1
    assert page.get_by_text("Playbook rules for one message of this group").count() >= 1
    # A KeyError group says what failed: a missing key, not only "<str>".
    assert page.get_by_text("missing key", exact=False).count() >= 1
    page.screenshot(path=str(shots / "report.png"), full_page=True)

    # 3. The task instance's Details tab in the UI lists the link under "Extra Links".
    task_page = f"{airflow_stack.base_url}/dags/dlq_backfill/runs/{quote(run_id, safe='')}/tasks/dry_run"
    page.goto(task_page, wait_until="networkidle")
    page.get_by_role("tab", name="Details").or_(page.get_by_text("Details", exact=True)).first.click()
    page.screenshot(path=str(shots / "task-page.png"))
    named = re.compile("DLQ replay report")
    button = page.get_by_role("link", name=named).or_(page.get_by_role("button", name=named)).first
    button.wait_for(timeout=120_000)
    page.screenshot(path=str(shots / "task-extra-link.png"))
    assert "localhost:4040" not in page.content()  # no dead Spark UI link
    href = button.get_attribute("href")
    if href:
        assert href == report_link
    else:  # rendered as a button that opens the link in a new window
        with page.expect_popup() as popup:
            button.click()
        assert popup.value.url == report_link
    # (This stack's all-admins auth manager authorises every request; that the endpoint refuses a
    # request without credentials is tested on Airflow's API app in test_report_plugin_auth.py.)


def add_pulsar_connection_in_the_ui(page, base_url: str, conn_id: str, service_url: str, port: int) -> None:
    """Fill the Add Connection form as a user does: id, type, Service URL, Broker port; Save."""
    page.goto(f"{base_url}/connections", wait_until="networkidle")
    page.get_by_role("button", name="Add Connection").click()
    dialog = page.get_by_role("dialog")
    dialog.locator("input[name=connection_id]").fill(conn_id)
    dialog.get_by_role("combobox").first.click()
    page.keyboard.type("Apache Pulsar")
    page.get_by_role("option", name="Apache Pulsar").first.click()
    dialog.get_by_text("Service URL", exact=True).wait_for()
    # Port says why to fill it (Airflow's Test button needs it), with no greyed bare number as a hint.
    dialog.get_by_text("Broker port (the Test button needs it)", exact=True).wait_for()
    assert dialog.get_by_placeholder("6650", exact=True).count() == 0
    dialog.get_by_placeholder("pulsar://broker:6650", exact=False).fill(service_url)
    dialog.get_by_placeholder("required for Test", exact=False).fill(str(port))
    page.screenshot(path=str(SHOTS[0] / f"connection-form-{conn_id}.png"))
    dialog.get_by_role("button", name="Save").click()
    page.get_by_role("row").filter(has_text=conn_id).first.wait_for(timeout=30_000)


def press_test(page, conn_id: str) -> dict:
    """Press the row's Test Connection button; returns the API's answer (HTTP status and JSON)."""
    with page.expect_response(lambda r: r.url.endswith("/api/v2/connections/test"), timeout=120_000) as info:
        page.get_by_role("row").filter(has_text=conn_id).get_by_role("button", name="Test Connection").click()
    response = info.value
    return {"http": response.status, **response.json()}


@pytest.mark.timeout(1200)
def test_connection_form_and_test_button(airflow_stack, browser, tmp_path, pulsar_broker):
    from browser import screenshot_dir

    from pulsar_standalone import free_port

    shots = screenshot_dir(tmp_path)
    SHOTS[:] = [shots]
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(120_000)
    port = int(pulsar_broker.service_url.rsplit(":", 1)[1])
    add_pulsar_connection_in_the_ui(
        page, airflow_stack.base_url, "pulsar_ui_live", pulsar_broker.service_url, port
    )
    live = press_test(page, "pulsar_ui_live")
    assert live["http"] == 200, live
    assert live["status"] is True, live
    assert live.get("message", "").startswith(f"broker {pulsar_broker.service_url} ok"), live
    page.mouse.move(5, 5)
    page.screenshot(path=str(shots / "connection-test-ok.png"))

    dead_port = free_port()  # nothing listens there
    dead_url = f"pulsar://127.0.0.1:{dead_port}"
    add_pulsar_connection_in_the_ui(page, airflow_stack.base_url, "pulsar_ui_dead", dead_url, dead_port)
    dead = press_test(page, "pulsar_ui_dead")
    assert dead["http"] == 200, dead  # an answer with a message, not HTTP 400
    assert dead["status"] is False, dead
    assert dead["message"].startswith(f"cannot reach {dead_url}: connection refused"), dead
    page.get_by_role("row").filter(has_text="pulsar_ui_dead").get_by_role(
        "button", name="Test Connection"
    ).hover()
    page.wait_for_timeout(1000)
    page.screenshot(path=str(shots / "connection-test-dead-broker.png"))

    # A bad port is a bad port (named with the user's connection id, not the Test button's random one).
    add_pulsar_connection_in_the_ui(
        page, airflow_stack.base_url, "pulsar_ui_badport", "pulsar://127.0.0.1:abc", 6650
    )
    bad = press_test(page, "pulsar_ui_badport")
    assert bad["http"] == 200, bad
    assert bad["status"] is False, bad
    assert bad["message"].startswith(
        "Connection 'pulsar_ui_badport': Service URL 'pulsar://127.0.0.1:abc' has port 'abc'"
    ), bad
    page.wait_for_timeout(500)
    page.screenshot(path=str(shots / "connection-test-bad-port.png"))

    # OAuth2 with an issuer nobody answers: reported as the issuer, not as the broker refusing credentials.
    dead_issuer = f"http://127.0.0.1:{free_port()}"
    put(airflow_stack, "connections", "pulsar_ui_oauth", {
        "connection_id": "pulsar_ui_oauth", "conn_type": "pulsar", "host": pulsar_broker.service_url,
        "port": port, "login": "orders-client", "password": "not-a-secret",
        "extra": json.dumps({"oauth2_issuer_url": dead_issuer}),
    })  # fmt: skip
    page.reload(wait_until="networkidle")
    oauth = press_test(page, "pulsar_ui_oauth")
    assert oauth["http"] == 200, oauth
    assert oauth["status"] is False, oauth
    assert oauth["message"].startswith(f"OAuth2 issuer {dead_issuer}"), oauth
    assert "unreachable" in oauth["message"], oauth
    assert "refused the credentials" not in oauth["message"], oauth
    page.wait_for_timeout(500)
    page.screenshot(path=str(shots / "connection-test-dead-issuer.png"))
