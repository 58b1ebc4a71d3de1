"""DlqReplayOperator after its task process is SIGKILLed mid-run, for real: the session's Apache Pulsar
standalone broker, spark-submit on ``local[2]`` (client mode) or the session's Spark Connect server (the
app as its client), the operator in a child Python process like an Airflow task process.

The first try runs in the child and is SIGKILLed (the child only, as a lost worker or a killed task
runner) while the replay's driver sends at ``rate_limit``: spark-submit, its JVM and the Python driver
keep running and hold the run's output lock. The next try (same run id) finds that earlier attempt of its
own run, waits for it, then runs the run id again and returns its report: exact totals, every message on
the origin once, no process left behind. A different run holding the lock fails the task at once.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from topic_keys import keys_on

from airflow_provider_dlq.operators.reattach import OtherRunHoldsError
from airflow_provider_dlq.operators.replay import DlqReplayOperator

pytestmark = [pytest.mark.integration, pytest.mark.real_pulsar]

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = str(REPO / "examples" / "playbooks" / "orders.yaml")
N = 240
RATE = 20.0  # messages per second: the apply step takes about 12 s

TASK = """
import json, sys
from types import SimpleNamespace
from airflow_provider_dlq.operators.replay import DlqReplayOperator

spec = json.loads(sys.argv[1])
op = DlqReplayOperator(task_id="replay", **spec["operator"])
ti = SimpleNamespace(dag_id="dlq_reattach", task_id="replay", run_id=spec["dag_run_id"], map_index=-1)
summary = op.execute({"ti": ti, "outlet_events": None})
print("TASK_RESULT " + json.dumps(summary), flush=True)
"""


def fill_dlq(client: Any) -> tuple[str, str]:
    u = uuid.uuid4().hex[:8]
    orders = f"persistent://public/default/orders-{u}"
    dlq = f"persistent://public/default/orders-{u}-sub-DLQ"
    producer = client.create_producer(dlq, batching_enabled=False)
    for n in range(N):
        properties = {
            "REAL_TOPIC": orders,
            "ORIGIN_MESSAGE_ID": f"9:{n}:-1:-1",
            "__dlq.errors.topic": orders,
            "__dlq.errors.subscription": "orders-sub",
            "__dlq.errors.reason": "term",
            "__dlq.errors.exception.class": "TimeoutError",
            "__dlq.errors.exception.message": "timed out",
            "__dlq.errors.failed.at": "1714521600000",
        }
        producer.send(b'{"order_id": %d}' % n, properties=properties, partition_key=f"k-{n}")
    producer.close()
    return orders, dlq


def apply_running(out: Path, run_id: str) -> bool:
    try:
        state = json.loads((out / "runs" / run_id / "state.json").read_text())
    except (OSError, ValueError):
        return False
    return state.get("steps", {}).get("apply", {}).get("status") == "running"


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def stop_pids(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(procs, timeout=30)


def spark_connection(deploy: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """``spark_default`` for ``deploy``: spark-submit on ``local[2]`` (client mode), or the session's
    Spark Connect server (the operator then runs the app as its client)."""
    if deploy == "client":
        return {"conn_type": "spark", "host": "local[2]"}
    server = request.getfixturevalue("spark_connect_server")
    return {"conn_type": "spark_connect", "host": "localhost", "port": server.port}


@pytest.mark.parametrize("deploy", ["client", "connect"])
def test_the_next_try_waits_for_the_killed_tries_driver_and_finishes_the_run(
    deploy, pulsar_broker, pulsar_client, tmp_path, monkeypatch, caplog, capsys, request
):
    orders, dlq = fill_dlq(pulsar_client)
    monkeypatch.setenv(
        "AIRFLOW_CONN_PULSAR_DEFAULT", json.dumps({"conn_type": "pulsar", "host": pulsar_broker.service_url})
    )
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(spark_connection(deploy, request)))
    out = tmp_path / "out"
    dag_run_id = f"manual__{uuid.uuid4().hex[:6]}"
    run_id = f"dlq_reattach.replay.{dag_run_id}"
    operator = {
        "topics": [dlq],
        "output_dir": str(out),
        "mode": "replay",
        "playbook": PLAYBOOK,
        "origin_allowlist": "orders-*",
        "rate_limit": RATE,
        "conf": {"spark.sql.shuffle.partitions": "2"},
        "reattach_timeout": 600,
    }
    script = tmp_path / "task.py"
    script.write_text(TASK)
    spec = json.dumps({"operator": operator, "dag_run_id": dag_run_id})
    first_log = (tmp_path / "first-try.log").open("w")
    task = subprocess.Popen([sys.executable, str(script), spec], stdout=first_log, stderr=subprocess.STDOUT)
    orphans: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while not apply_running(out, run_id):
            assert task.poll() is None, (tmp_path / "first-try.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first try never reached the apply step"
            time.sleep(0.2)
        orphans = psutil.Process(task.pid).children(recursive=True)
        os.kill(task.pid, signal.SIGKILL)  # the task process only: its driver keeps running
        task.wait(timeout=30)
        killed_at = time.monotonic()
        sent_before = len(keys_on(pulsar_client, orders))
        drivers = [p for p in orphans if alive(p) and "dlq_replay_main.py" in " ".join(cmdline(p))]
        assert drivers, "the driver died with the task process"  # (Spark's Python workers come and go)
        assert sent_before < N, "the run finished before the kill"

        ti = SimpleNamespace(dag_id="dlq_reattach", task_id="replay", run_id=dag_run_id, map_index=-1)
        with caplog.at_level(logging.INFO):
            summary = DlqReplayOperator(task_id="replay", **operator).execute(
                {"ti": ti, "outlet_events": None}
            )
        finished_at = time.monotonic()
        log = caplog.text + capsys.readouterr().out

        assert f"An earlier attempt of replay run {run_id} is still running" in log
        waited = log.split("ended after ", 1)[1].split(" s", 1)[0]
        assert "running the same run id again" in log
        # Waited: the earlier attempt was not stopped (process_tree logs every stop).
        assert not re.search(r"Stopped .* \(pid \d+\) and \d+ child processes", log)
        assert summary["run_id"] == run_id
        assert summary["status"] == "succeeded", summary
        assert summary["totals"]["republished"] == N, summary["totals"]
        on_origin = keys_on(pulsar_client, orders)
        assert len(on_origin) == N, len(on_origin)  # nothing doubled
        assert len(set(on_origin)) == N, len(set(on_origin))  # nothing lost
        assert not any(alive(p) for p in orphans), "the earlier attempt's processes are still there"
        print(
            f"reattach ({deploy}): killed with {sent_before}/{N} on the origin; waited {waited} s for the "
            "earlier attempt; "
            f"finished {finished_at - killed_at:.1f} s after the kill; origin holds {len(on_origin)} "
            f"messages, {len(set(on_origin))} distinct"
        )
    finally:
        first_log.close()
        if task.poll() is None:
            task.kill()
            task.wait(timeout=30)
        stop_pids([p for p in orphans if alive(p)])


def test_a_different_run_holding_the_output_lock_fails_the_task_at_once(pulsar_broker, tmp_path, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_PULSAR_DEFAULT", json.dumps({"conn_type": "pulsar", "host": pulsar_broker.service_url})
    )
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    out = tmp_path / "out"
    (out / "locks").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        now = time.time()
        lock = {
            "format": 1, "run_id": "nightly-other", "host": socket.gethostname(), "pid": holder.pid,
            "pid_start": None, "acquired_at": now, "heartbeat_at": now, "ttl_s": 60.0,
        }  # fmt: skip
        (out / "locks" / "replay.lock.1").write_text(json.dumps(lock))
        op = DlqReplayOperator(
            task_id="replay",
            topics=["orders-x-sub-DLQ"],
            output_dir=str(out),
            mode="dry-run",
            reattach_timeout=600,
        )
        ti = SimpleNamespace(dag_id="dlq_reattach", task_id="replay", run_id="manual__other", map_index=-1)
        started = time.monotonic()
        with pytest.raises(OtherRunHoldsError, match="run 'nightly-other'"):
            op.execute({"ti": ti, "outlet_events": None})
        assert time.monotonic() - started < 60
        assert not (out / "runs").exists()
    finally:
        holder.kill()
        holder.wait(timeout=30)
