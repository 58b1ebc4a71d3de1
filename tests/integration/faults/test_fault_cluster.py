"""Fault suite, cluster: the replay on a Spark standalone cluster (a master and two workers started from
the installed pyspark on loopback, ``spark_standalone``), submitted to ``spark://127.0.0.1:<port>``
with the bundle shipped by ``--py-files`` exactly as in production (the plain run on the cluster is in
``tests/integration/replay/test_replay_everywhere.py``).

- ``worker-killed-mid-apply``: a worker (and its executor) SIGKILLed while a wave is being sent; Spark
  retries the lost tasks on the other worker, the retried sends carry the same producer names and
  sequence ids, and Apache Pulsar's broker deduplication drops the ones already persisted: nothing
  reaches the origin twice, nothing is lost, the run exits 0 with exact totals.

Runs on the session broker (deduplication on); the worker kill leaves the cluster with one worker, so it
is the module's last test.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_support import FaultRow, check_exact_run, finish, start, state_of
from test_fault_kills import PLAYBOOK
from test_fault_mid_wave import build_dlqs as build_large_dlqs

from pulsar_standalone import free_port
from spark_standalone import SparkCluster

pytestmark = [pytest.mark.integration, pytest.mark.real_pulsar, pytest.mark.slow]

PRODUCERS = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[SparkCluster]:
    """Master + 2 workers x 1 core, 1 GiB for executors each; stopped by PID, temp dir removed."""
    cluster = SparkCluster()
    cluster.start(workers=2, cores=1, memory="1g")
    try:
        yield cluster
    finally:
        cluster.stop()


def cluster_conf(cluster: SparkCluster, ui_port: int | None = None) -> list[str]:
    """spark-submit options for the cluster (client deploy mode: the driver runs here, as in Airflow)."""
    ui = ["--conf", f"spark.ui.port={ui_port}"] if ui_port else ["--conf", "spark.ui.enabled=false"]
    return [
        "--master", cluster.master_url, "--deploy-mode", "client", "--driver-memory", "1g",
        "--executor-memory", "768m", "--executor-cores", "1", "--total-executor-cores", "2",
        "--conf", "spark.sql.shuffle.partitions=4", *ui,
    ]  # fmt: skip


def args(broker: Any, dlqs: list[str], out: Path, run_id: str, *extra: str) -> list[str]:
    return [
        "--run-id", run_id, "--mode", "replay", "--service-url", broker.service_url,
        "--admin-url", broker.admin_url, "--topics", ",".join(dlqs), "--output-dir", str(out),
        "--playbook", PLAYBOOK, "--origin-allowlist", "orders-*", "--idle-timeout-ms", "1500",
        "--parallelism", str(PRODUCERS), *extra,
    ]  # fmt: skip


def result_line(how: str, expected: dict[str, str], totals: dict[str, Any]) -> str:
    return (
        f"{how}: {len(expected)} messages, republished {totals['republished']}, archived "
        f"{totals['archived']}, acked {totals['acked']}, resent {totals['resent']}"
    )


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def executor_tasks(ui: str, executor_ids: list[str]) -> int:
    """Tasks running on ``executor_ids`` now (the driver's REST API)."""
    try:
        app = _get(f"{ui}/api/v1/applications")[0]["id"]
        executors = _get(f"{ui}/api/v1/applications/{app}/allexecutors")
    except (OSError, ValueError, IndexError, KeyError):
        return 0
    return sum(int(e.get("activeTasks", 0)) for e in executors if str(e.get("id")) in executor_ids)


def event_log_conf(events: Path) -> list[str]:
    """spark-submit options writing the driver's event log (listener events as JSON lines) to ``events``."""
    events.mkdir(parents=True, exist_ok=True)
    return [
        "--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir={events.as_uri()}",
        "--conf", "spark.eventLog.rolling.enabled=false", "--conf", "spark.eventLog.compress=false",
    ]  # fmt: skip


def lost_tasks(events: Path, executor_ids: list[str]) -> int:
    """Distinct tasks the driver ended with ``ExecutorLostFailure`` on ``executor_ids`` (event log)."""
    lost: set[int] = set()
    for log in (path for path in events.rglob("*") if path.is_file() and not path.name.startswith(".")):
        for line in log.read_text(errors="replace").splitlines():
            if '"SparkListenerTaskEnd"' not in line or "ExecutorLostFailure" not in line:
                continue
            event = json.loads(line)
            info = event["Task Info"]
            if (
                event["Task End Reason"].get("Reason") == "ExecutorLostFailure"
                and info["Executor ID"] in executor_ids
            ):
                lost.add(int(info["Task ID"]))
    return len(lost)


@pytest.mark.timeout(1800)
def test_worker_killed_mid_apply(cluster, pulsar_broker, pulsar_client, fault_bundle, fault_table, tmp_path):
    origins, dlqs, expected = build_large_dlqs(pulsar_client)
    out = tmp_path / "out"
    run_id = "cluster-worker-kill"
    ui_port = free_port()
    ui = f"http://127.0.0.1:{ui_port}"
    # 16,000 republishes in waves of 2000 sequence ids per producer (many batches each) at 2000 msg/s:
    # about 4 s a wave, 2 waves.
    slow = ("--wave-size", "2000", "--rate-limit", "2000")
    run_args = args(pulsar_broker, dlqs, out, run_id, *slow)
    events = tmp_path / "events"
    conf = [*cluster_conf(cluster, ui_port), *event_log_conf(events)]
    proc = start(fault_bundle, run_args, tmp_path, "run", conf)
    # Kill worker 0 while a wave is being sent and its executor runs one of the wave's tasks.
    deadline = time.monotonic() + 900
    killed_in_wave = None
    seen: list[str] = []
    while time.monotonic() < deadline and proc.poll() is None:
        apply = state_of(out, run_id).get("steps", {}).get("apply", {})
        if apply.get("status") == "running" and "wave_in_flight" in apply:
            executors = cluster.executor_ids(0)
            running = executor_tasks(ui, executors)
            note = f"wave {apply['wave_in_flight']}: executors {executors} of worker 0 run {running} task(s)"
            if not seen or seen[-1] != note:
                seen.append(note)
            # The REST answer can lag on a busy machine: kill only if the same wave is still in flight.
            now = state_of(out, run_id).get("steps", {}).get("apply", {})
            if running > 0 and now.get("wave_in_flight") == apply["wave_in_flight"]:
                killed_in_wave = apply["wave_in_flight"]
                cluster.kill_worker(0)
                break
        time.sleep(0.05)
    assert killed_in_wave is not None, f"no wave in flight on worker 0 (exit {proc.poll()}); seen: {seen}"
    summary = finish(proc, tmp_path, "run")
    err = (tmp_path / "run.err").read_text(errors="replace")
    assert re.search(r"Lost executor \d+ on 127\.0\.0\.1: worker lost", err), err[-4000:]
    # The driver ends the killed executor's running tasks with ExecutorLostFailure and retries them on the
    # other worker. The event log is the record: the driver logs those at INFO only (a lost worker is not
    # the task's fault), and the REST executor counters miss tasks ended after the executor was removed.
    failed = lost_tasks(events, executors)
    assert failed > 0, f"no task failed on the killed executor: the kill did not hit a running task\n{seen}"
    assert summary["totals"]["resent"] == 0  # Spark's task retries are not re-sends of a killed run
    state = check_exact_run(summary, out, pulsar_client, origins, dlqs, expected)
    fault_table.record(
        FaultRow(
            category="cluster",
            case="worker-killed-mid-apply",
            fault="a Spark worker and its executor SIGKILLed while a wave is being sent (20,000 DLQ "
            "messages, `--wave-size 2000`, `--rate-limit 2000`)",
            expected="Spark retries the lost tasks on the other worker; exit 0; exact totals; nothing "
            "doubled on the origin (broker dedup)",
            result=result_line(
                f"exit 0 on Apache Pulsar, {failed} task(s) lost in wave {killed_in_wave + 1} and retried",
                expected,
                summary["totals"],
            ),
            lost=state.lost,
            doubled=state.doubled,
            pending=state.pending,
        )
    )
