"""The contract between ``operators/spark_submit.py`` and the installed Spark provider's
``SparkSubmitHook``: every private member the adapter touches, checked against whatever provider version
is installed (5.5 to 6.x), with a stand-in spark-submit and, for Spark provider 6.x's standalone status
polling, a stand-in master REST endpoint on loopback. Fails when the provider renames or reshapes them."""

from __future__ import annotations

import inspect
import json
import os
import stat
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowException

from airflow_provider_dlq.operators.spark_submit import (
    DRIVER_ENDED,
    ReplaySubmitHook,
    SparkDriverError,
    spark_target,
)
from pulsar_dlq_consumer.replay_options import SUMMARY_PREFIX

DRIVER_ID = "driver-20261128101500-0007"
SPARK_PROVIDER = version("apache-airflow-providers-apache-spark")

# Submits (prints the app's summary line, or the standalone master's reply naming the driver) and, for
# `--status <driver>` (Spark provider 5.x polls this way), prints the next state from FAKE_STATES.
FAKE_SPARK_SUBMIT = """#!{python}
import json, os, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_CALLS"], "a") as calls:
    calls.write(json.dumps(argv) + "\\n")
if "--status" in argv:
    states = os.environ["FAKE_STATES"]
    with open(states) as f:
        pending = f.read().split()
    with open(states, "w") as f:
        f.write(" ".join(pending[1:] or pending))
    print('{{\\n  "action" : "SubmissionStatusResponse",\\n  "driverState" : "%s",' % pending[0])
    print('  "submissionId" : "{driver}",\\n  "success" : true\\n}}')
    sys.exit(0)
if "cluster" in argv:
    print("26/11/28 10:15:00 INFO RestSubmissionClient: Submission successfully created as {driver}.")
else:
    print("some Spark chatter")
    print('{prefix}{{"run_id": "r1", "status": "succeeded"}}')
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""


@pytest.fixture
def fake_spark(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "spark-submit"
    script.write_text(
        FAKE_SPARK_SUBMIT.format(python=sys.executable, driver=DRIVER_ID, prefix=SUMMARY_PREFIX)
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CALLS", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("FAKE_STATES", str(tmp_path / "states"))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    return tmp_path


@pytest.fixture
def standalone_master(fake_spark, monkeypatch):
    """A standalone master's REST status endpoint on loopback (Spark provider 6.x polls it with curl),
    answering the same states as the stand-in spark-submit's --status; the connection points at it."""
    states = fake_spark / "states"
    polled: list[str] = []

    class Status(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            polled.append(self.path)
            pending = states.read_text().split()
            states.write_text(" ".join(pending[1:] or pending))
            body = (
                '{\n  "action" : "SubmissionStatusResponse",\n'
                f'  "driverState" : "{pending[0]}",\n  "submissionId" : "{DRIVER_ID}",\n'
                '  "success" : true\n}\n'
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Status)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    conn = {
        "conn_type": "spark",
        "host": "spark://127.0.0.1",
        "port": 7077,
        "extra": {"deploy-mode": "cluster", "rest-port": str(server.server_address[1])},
    }
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_STANDALONE", json.dumps(conn))
    yield states, polled
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_the_private_members_the_adapter_touches_are_there():
    """Names and shapes, read from the installed SparkSubmitHook; the tests below exercise them."""
    for method in ("_process_spark_submit_log", "_process_spark_status_log"):
        assert list(inspect.signature(getattr(SparkSubmitHook, method)).parameters) == ["self", "itr"], method
    assert list(inspect.signature(SparkSubmitHook._build_track_driver_status_command).parameters) == ["self"]
    assert callable(SparkSubmitHook._start_driver_status_tracking)
    assert "deploy_mode" in inspect.signature(SparkSubmitHook.__init__).parameters
    hook = SparkSubmitHook(conn_id="spark_default")
    assert {"master", "deploy_mode"} <= set(hook._connection)
    for name in ("_submit_sp", "_driver_id", "_driver_status"):
        assert getattr(hook, name) is None, name
    assert hook._should_track_driver_status is False


def test_run_reads_the_summary_line_and_exposes_the_process(fake_spark):
    hook = ReplaySubmitHook(conn_id="spark_default", name="dlq-replay-r1")
    assert hook.target.master == "local[2]"
    assert hook.process is None
    hook.run("/b/dlq_replay_main.py")
    assert hook.summary_line == f'{SUMMARY_PREFIX}{{"run_id": "r1", "status": "succeeded"}}'
    assert hook.process is not None
    assert hook.process.returncode == 0
    (argv,) = [json.loads(line) for line in (fake_spark / "calls.jsonl").read_text().splitlines()]
    assert argv[-1] == "/b/dlq_replay_main.py"


def test_a_failed_spark_submit_fails_the_run(fake_spark, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "3")
    hook = ReplaySubmitHook(conn_id="spark_default")
    with pytest.raises(AirflowException, match="Error code is: 3"):
        hook.run("/b/dlq_replay_main.py")


def test_the_target_is_the_resolved_master_and_deploy_mode(standalone_master):
    assert spark_target("spark_default").env_goes_on_argv is False
    standalone = spark_target("spark_standalone")
    assert (standalone.master, standalone.deploy_mode) == ("spark://127.0.0.1:7077", "cluster")
    assert standalone.env_goes_on_argv is True
    assert spark_target("spark_default", "client").deploy_mode == "client"


@pytest.mark.parametrize(
    ("states", "ends"), [("RUNNING RUNNING FINISHED", "FINISHED"), ("RUNNING FAILED", "FAILED")]
)
def test_run_waits_for_a_standalone_cluster_driver_on_every_provider_version(standalone_master, states, ends):
    """Spark provider 5.x's submit() polls the driver itself (spark-submit --status); 6.1+ returns once the
    master accepted it, and the adapter polls (6.x: the master's REST endpoint). Either way run() returns
    only after the driver ended, and fails unless it FINISHED."""
    state_file, polled = standalone_master
    state_file.write_text(states)
    hook = ReplaySubmitHook(conn_id="spark_standalone", status_poll_interval=0)
    assert hook._should_track_driver_status is True
    if ends == "FINISHED":
        hook.run("/b/dlq_replay_main.py")
    else:
        error = SparkDriverError if int(SPARK_PROVIDER.split(".")[0]) >= 6 else AirflowException
        with pytest.raises(error, match=f"{DRIVER_ID}.*{ends}"):
            hook.run("/b/dlq_replay_main.py")
    assert hook._driver_id == DRIVER_ID
    assert hook._driver_status == ends
    assert ends in DRIVER_ENDED
    calls = (standalone_master[0].parent / "calls.jsonl").read_text().splitlines()
    status_queries = len(polled) + sum("--status" in json.loads(line) for line in calls)
    assert status_queries == len(states.split())
