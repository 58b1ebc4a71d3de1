"""Helpers for tests that drive the real Airflow stack against Apache Pulsar (connections, DLQs, waits)."""

from __future__ import annotations

import contextlib
import json
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pulsar
from airflow_stack import AirflowApiError

from pulsar_dlq_consumer import DeadLetterPolicy, DlqConsumer

SUB = "dlq-replayer"


def _create_or_replace(stack: Any, collection: str, key: str, body: dict[str, Any]) -> None:
    """POST ``body`` to ``/<collection>``; if ``key`` exists (409: an earlier test made it), PATCH it."""
    try:
        stack.api("POST", f"/{collection}", body)
    except AirflowApiError as exc:
        if exc.status != 409:
            raise
        stack.api("PATCH", f"/{collection}/{quote(key)}", body)


def put_connection(stack: Any, conn_id: str, conn_type: str, host: str, extra: dict | None = None) -> None:
    """Create (or replace) a connection through the REST API, as a user would."""
    body = {"connection_id": conn_id, "conn_type": conn_type, "host": host, "extra": json.dumps(extra or {})}
    _create_or_replace(stack, "connections", conn_id, body)


def put_variable(stack: Any, key: str, value: str) -> None:
    _create_or_replace(stack, "variables", key, {"key": key, "value": value})


def delete_variable(stack: Any, key: str) -> None:
    with contextlib.suppress(Exception):
        stack.api("DELETE", f"/variables/{key}")


def stack_connections(stack: Any, broker: Any) -> str:
    """``spark_default`` (local[2]) and a fresh ``pulsar`` connection with the admin URL; returns its id."""
    put_connection(stack, "spark_default", "spark", "local[2]")
    conn_id = f"pulsar_{uuid.uuid4().hex[:8]}"
    put_connection(stack, conn_id, "pulsar", broker.service_url, {"admin_url": broker.admin_url})
    return conn_id


def add_dag_file(stack: Any, name: str, source: str) -> Path:
    """Drop a DAG file into the stack's DAGs folder (the header passes Airflow's DAG discovery safe mode)."""
    path = Path(stack.env["AIRFLOW__CORE__DAGS_FOLDER"]) / f"{name}.py"
    path.write_text("# An Airflow DAG file written by a test.\n" + textwrap.dedent(source))
    return path


class OrdersService:
    """An 'orders' service on ``origin`` that dead-letters orders with chosen errors (our library)."""

    def __init__(self, client: Any, origin: str) -> None:
        self.client = client
        self.origin = origin
        self.service = DlqConsumer(
            client,
            origin,
            "orders-service",
            dead_letter_policy=DeadLetterPolicy(initial_subscription_name=SUB),
            initial_position=pulsar.InitialPosition.Earliest,
        )
        self.dlq = str(self.service.dead_letter_topic)
        self.producer = client.create_producer(origin)
        self.sent = 0

    def fail(self, errors: list[BaseException]) -> None:
        """Publish one order per error, receive each and term it with that error (into the DLQ)."""
        for error in errors:
            body = {"order": self.sent, "group": type(error).__name__}
            self.producer.send(json.dumps(body).encode(), properties={"n": str(self.sent)})
            self.sent += 1
            msg = self.service.receive(timeout_millis=10_000)
            self.service.term(msg, error)
        self.service.flush()

    def close(self) -> None:
        self.producer.close()
        self.service.close()


def ensure_subscription(client: Any, topic: str, subscription: str = SUB) -> None:
    """Create the durable subscription (and topic) with nothing pending, then let go of it."""
    client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared).close()


def topic_stats(admin_url: str, topic: str) -> dict[str, Any]:
    tenant, namespace, name = topic.split("://", 1)[1].split("/", 2)
    url = f"{admin_url}/admin/v2/persistent/{tenant}/{namespace}/{quote(name, safe='')}/stats"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return dict(json.loads(resp.read()))


def replayed_groups(client: Any, origin: str, subscription: str, expect: int, timeout_s: float = 30) -> dict:
    """Count the replayed messages (``REPLAY_ID`` set) on ``origin`` per payload ``group``."""
    consumer = client.subscribe(
        origin,
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    counts: dict[str, int] = {}
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                msg = consumer.receive(timeout_millis=1500 if len(seen) >= expect else 3000)
            except pulsar.Timeout:
                if len(seen) >= expect:
                    break
                continue
            consumer.acknowledge(msg)
            props = msg.properties()
            if "REPLAY_ID" in props:
                seen.add(props["REPLAY_ID"] + "/" + props.get("REPLAY_RUN_ID", ""))
                group = json.loads(msg.data())["group"]
                counts[group] = counts.get(group, 0) + 1
    finally:
        consumer.close()
    return counts


def pending(client: Any, topic: str, subscription: str = SUB) -> int:
    """Messages pending on ``subscription`` (received unacked, then the consumer closes)."""
    consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared)
    count = 0
    try:
        while True:
            consumer.receive(timeout_millis=3000)
            count += 1
    except pulsar.Timeout:
        return count
    finally:
        consumer.close()


def dag_runs(stack: Any, dag_id: str) -> list[dict[str, Any]]:
    return list(stack.api("GET", f"/dags/{dag_id}/dagRuns?order_by=run_after")["dag_runs"])


def asset_events(stack: Any, asset_name: str, dag_id: str, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """The asset's events, oldest first.

    Airflow 3.3.0-3.3.2 answers HTTP 500 on ``/assets/events`` while a DAG run an event created is still
    queued: the response model requires the run's ``start_date``, null until the run starts
    (apache/airflow#71360). Only then, while a run of ``dag_id`` is queued without a start date (or has
    just started), this asks again; any other error is raised.
    """
    deadline = time.monotonic() + timeout_s
    path = f"/assets/events?name_pattern={quote(asset_name)}&order_by=timestamp"
    unexplained = 0
    while True:
        try:
            return list(stack.api("GET", path)["asset_events"])
        except AirflowApiError as exc:
            if exc.status != 500 or time.monotonic() > deadline:
                raise
            runs = dag_runs(stack, dag_id)
            # The run can start between the two requests, so one 500 without an unstarted run is asked
            # again; two in a row are raised.
            queued = any(run["state"] == "queued" and not run.get("start_date") for run in runs)
            unexplained = 0 if queued else unexplained + 1
            if unexplained >= 2:
                raise
        time.sleep(0.5)


def wait_for(what: str, check: Any, timeout_s: float, interval_s: float = 0.5) -> Any:
    """Poll ``check()`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def parse_time(value: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
