"""DlqReplayOperator as a Spark Connect client, for real: the session's Apache Pulsar standalone broker, the
loopback Spark Connect server (``spark_connect_server``) and a ``spark_connect`` connection defined by
``AIRFLOW_CONN_...`` with a user id and a token.

The operator runs the replay app's main with the worker's Python (no ``java`` on ``PATH``, no
``JAVA_HOME``): the report's totals reach the returned summary (XCom) and the asset event, the Spark
application is the server's, the republished messages are on their origin topic once each, the skipped
one stays pending, and the token and user id are in neither the client's argv, the task log, XCom nor the
asset event.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from topic_keys import keys_on

from airflow_provider_dlq.operators.replay import DlqReplayOperator

pytestmark = [pytest.mark.integration, pytest.mark.real_pulsar]

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = str(REPO / "examples" / "playbooks" / "orders.yaml")
TOKEN = "sc-token-9Qm2/never+in-argv"
USER = "dlq-connect-it-user"


def context_of(origin: str, n: int, cls: str, message: str) -> dict[str, str]:
    """Our consumer library's DLQ context for one original message of ``origin``."""
    return {
        "REAL_TOPIC": origin,
        "ORIGIN_MESSAGE_ID": f"9:{n}:-1:-1",
        "__dlq.errors.topic": origin,
        "__dlq.errors.subscription": "orders-sub",
        "__dlq.errors.reason": "term",
        "__dlq.errors.exception.class": cls,
        "__dlq.errors.exception.message": message,
        "__dlq.errors.failed.at": "1714521600000",
    }


def small_dlq(client: Any) -> tuple[str, str, dict[str, str]]:
    """3 timeouts (republished), 2 non-JSON payloads (archived), 1 unknown error (skipped)."""
    u = uuid.uuid4().hex[:8]
    orders = f"persistent://public/default/orders-{u}"
    dlq = f"persistent://public/default/orders-{u}-sub-DLQ"
    items = [
        *[(f"t-{i}", b'{"order_id": %d}' % i, "TimeoutError", "timed out", "republished") for i in range(3)],
        *[
            (f"a-{i}", b"<xml/>", "json.decoder.JSONDecodeError", "Expecting value", "archived")
            for i in range(2)
        ],
        ("s-0", b'{"order_id": 9}', "RuntimeError", "unknown", "skipped"),
    ]
    producer = client.create_producer(dlq, batching_enabled=False)
    for n, (key, payload, cls, message, _) in enumerate(items):
        producer.send(payload, properties=context_of(orders, n, cls, message), partition_key=key)
    producer.close()
    return orders, dlq, {key: outcome for key, _, _, _, outcome in items}


def pending_keys(client: Any, topic: str) -> list[str]:
    """The keys the replayer's subscription still has (received without acks, bounded waits)."""
    import pulsar

    consumer = client.subscribe(
        topic, "dlq-replayer", consumer_type=pulsar.ConsumerType.Shared, consumer_name=f"check-{uuid.uuid4()}"
    )
    keys = []
    try:
        while True:
            try:
                keys.append(consumer.receive(timeout_millis=2000).partition_key())
            except pulsar.Timeout:
                break
    finally:
        consumer.close()
    return sorted(keys)


def test_the_operator_replays_as_a_spark_connect_client(
    pulsar_broker, pulsar_client, spark_connect_server, tmp_path, monkeypatch, caplog, capsys
):
    orders, dlq, expected = small_dlq(pulsar_client)
    pulsar_conn = {
        "conn_type": "pulsar",
        "host": pulsar_broker.service_url,
        "extra": {"admin_url": pulsar_broker.admin_url},
    }
    # localhost: PySpark sends a token over local credentials there (elsewhere it requires TLS).
    connect_conn = {
        "conn_type": "spark_connect",
        "host": "localhost",
        "port": spark_connect_server.port,
        "login": USER,
        "password": TOKEN,
    }
    monkeypatch.setenv("AIRFLOW_CONN_PULSAR_DEFAULT", json.dumps(pulsar_conn))
    monkeypatch.setenv("AIRFLOW_CONN_DLQ_SPARK_CONNECT", json.dumps(connect_conn))
    # No Java for the client: only the virtualenv's programs on PATH, no JAVA_HOME.
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    monkeypatch.delenv("JAVA_HOME", raising=False)

    op = DlqReplayOperator(
        task_id="replay",
        topics=[dlq],
        output_dir=str(tmp_path / "out"),
        mode="replay",
        playbook=PLAYBOOK,
        origin_allowlist="orders-*",
        spark_conn_id="dlq_spark_connect",
        conf={"spark.sql.shuffle.partitions": "4"},
    )
    ti = SimpleNamespace(
        dag_id="dlq_connect", task_id="replay", run_id=f"manual__{uuid.uuid4().hex[:6]}", map_index=-1
    )
    events: defaultdict[object, SimpleNamespace] = defaultdict(lambda: SimpleNamespace(extra={}))
    with caplog.at_level(logging.INFO):
        summary = op.execute({"ti": ti, "outlet_events": events})
    log = caplog.text + capsys.readouterr().out

    want: dict[str, int] = {}
    for outcome in expected.values():
        want[outcome] = want.get(outcome, 0) + 1
    assert summary["status"] == "succeeded", summary
    assert {k: summary["totals"].get(k) for k in want} == want, summary["totals"]
    assert summary["run_id"] == f"dlq_connect.replay.{ti.run_id}"
    assert events[op.outlets[0]].extra["totals"] == summary["totals"]
    assert summary["spark"]["application_id"] == spark_connect_server.application_id  # the server's
    assert Path(summary["paths"]["report_json"]).is_file()
    assert keys_on(pulsar_client, orders) == sorted(k for k, v in expected.items() if v == "republished")
    assert pending_keys(pulsar_client, dlq) == ["s-0"]

    assert op._client is not None
    assert op._client.argv[0] == sys.executable
    assert "Spark Connect: the app's code (dlq_replay.zip) added to the session's Python files" in log
    assert f"as a Spark Connect client of sc://localhost:{spark_connect_server.port}" in log
    shown = [
        " ".join(op._client.argv),
        log,
        json.dumps(summary),
        json.dumps(events[op.outlets[0]].extra),
        Path(summary["paths"]["report_json"]).read_text(),
    ]
    for text in shown:
        for secret in (TOKEN, USER, "sc-token-9Qm2%2F"):
            assert secret not in text
