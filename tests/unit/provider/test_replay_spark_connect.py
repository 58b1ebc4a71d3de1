"""DlqReplayOperator on a ``spark_connect`` connection: the client's command and environment (the server's
URL, token and user id only in ``SPARK_REMOTE``), the connection checks, and a run of a stand-in client
(report, XCom, asset event, redacted log, ``on_kill`` by PID)."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_dlq.operators.replay import DlqReplayOperator
from airflow_provider_dlq.operators.spark_connect import (
    SPARK_REMOTE_ENV,
    SparkConnectClientError,
    SparkConnectConfigError,
    SparkRemote,
    check_client_installed,
    client_env,
    init_conf,
    spark_remote,
)
from pulsar_dlq_consumer.replay_options import TOKEN_ENV

PULSAR_TOKEN = "eyJhbGciOiJIUzI1NiJ9.cHVsc2Fy.pulsar-token-never-on-argv"
CONNECT_TOKEN = "connect-token-Zq81/never+logged"
CONNECT_USER = "dlq-connect-user-7f3a"
DLQ = "persistent://public/default/orders-DLQ"
SERVER = "spark-connect.example.com"


@pytest.fixture
def conns(monkeypatch):
    pulsar = {"conn_type": "pulsar", "host": "pulsar://broker:6650", "password": PULSAR_TOKEN}
    connect = {
        "conn_type": "spark_connect",
        "host": SERVER,
        "port": 15002,
        "login": CONNECT_USER,
        "password": CONNECT_TOKEN,
        "extra": {"use_ssl": True},
    }
    monkeypatch.setenv("AIRFLOW_CONN_PULSAR_DEFAULT", json.dumps(pulsar))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_PROD", json.dumps(connect))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))


def make_operator(tmp_path: Path, **kwargs) -> DlqReplayOperator:
    defaults = {
        "task_id": "replay",
        "topics": [DLQ],
        "output_dir": str(tmp_path / "out"),
        "mode": "replay",
        "origin_allowlist": "persistent://public/default/orders",
        "spark_conn_id": "spark_connect_prod",
        "conf": {"spark.sql.shuffle.partitions": "8", "spark.executor.memory": "1g"},
        "env_vars": {"FOO": "bar"},
    }
    defaults.update(kwargs)
    return DlqReplayOperator(**defaults)


def secrets_in(text: str) -> list[str]:
    return [s for s in (CONNECT_TOKEN, CONNECT_USER, PULSAR_TOKEN, "connect-token-Zq81%2F") if s in text]


def test_client_argv_is_the_apps_argv_and_the_url_goes_by_env_only(conns, tmp_path, monkeypatch):
    monkeypatch.setenv("MASTER", "local[4]")  # would make PySpark ask for a classic session
    monkeypatch.setenv("PYTHONPATH", "/opt/site")
    op = make_operator(tmp_path)
    remote = spark_remote("spark_connect_prod")
    assert remote is not None
    assert remote.address == f"sc://{SERVER}:15002"
    assert CONNECT_TOKEN not in repr(remote)
    pulsar = op.pulsar_hook.config
    args = op.replay_args("r1", pulsar)
    client = op.make_client(
        args, op.spark_env(pulsar, remote.address), remote, "/b/dlq_replay.zip", "/b/main.py", str(tmp_path)
    )
    # The same arguments spark-submit gives the app.
    submit_args = op.make_hook(args, {}, "/b/dlq_replay.zip")._application_args
    assert client.argv == [sys.executable, "/b/main.py", *submit_args]
    assert not secrets_in(" ".join(client.argv))
    env = client.env
    assert env[SPARK_REMOTE_ENV] == (
        f"sc://{SERVER}:15002/;user_id={CONNECT_USER};token=connect-token-Zq81%2Fnever%2Blogged;use_ssl=True"
    )
    assert env[TOKEN_ENV] == PULSAR_TOKEN
    assert env["FOO"] == "bar"
    assert env["PYTHONPATH"] == os.pathsep.join(["/b/dlq_replay.zip", "/opt/site"])
    assert "MASTER" not in env
    assert env["PYSPARK_REMOTE_INIT_CONF_LEN"] == "1"
    assert json.loads(env["PYSPARK_REMOTE_INIT_CONF_0"]) == {"spark.sql.shuffle.partitions": "8"}


def test_pyspark_reads_the_token_and_user_id_back_from_the_url(conns):
    from pyspark.sql.connect.client import DefaultChannelBuilder

    remote = spark_remote("spark_connect_prod")
    assert remote is not None
    builder = DefaultChannelBuilder(remote.url)  # a '/' left unquoted in the token would be a path
    assert (builder.host, builder.endpoint) == (SERVER, f"{SERVER}:15002")
    assert (builder.token, builder.userId, builder.use_ssl) == (CONNECT_TOKEN, CONNECT_USER, True)


def test_client_env_drops_what_would_start_a_local_server(tmp_path):
    remote = SparkRemote("c", "sc://h:15002", "sc://h:15002/")
    base = {
        "SPARK_LOCAL_REMOTE": "1",
        "PYSPARK_REMOTE_INIT_CONF_LEN": "2",
        "PYSPARK_REMOTE_INIT_CONF_1": "{}",
    }
    env = client_env(base, {}, remote, "/b.zip", {})
    assert env == {SPARK_REMOTE_ENV: "sc://h:15002/", "PYTHONPATH": "/b.zip"}
    assert init_conf({"spark.sql.ansi.enabled": True, "spark.dlq.x": 1}) == {"spark.sql.ansi.enabled": "True"}


def test_connection_checks_name_the_fix(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    assert spark_remote("spark_default") is None  # spark-submit
    assert spark_remote("no_such_connection") is None  # spark-submit's own default, as before
    monkeypatch.setenv("AIRFLOW_CONN_WRONG", json.dumps({"conn_type": "spark", "host": "sc://h:15002"}))
    with pytest.raises(SparkConnectConfigError, match=r"of type 'spark' .* type 'spark_connect'"):
        spark_remote("wrong")
    monkeypatch.setenv("AIRFLOW_CONN_EMPTY", json.dumps({"conn_type": "spark_connect"}))
    with pytest.raises(SparkConnectConfigError, match=r"has no Host; set it to the server"):
        spark_remote("empty")
    path = {"conn_type": "spark_connect", "host": f"sc://h:15002/;token={CONNECT_TOKEN}"}
    monkeypatch.setenv("AIRFLOW_CONN_PATH", json.dumps(path))
    with pytest.raises(SparkConnectConfigError, match=r"must name the server only") as err:
        spark_remote("path")
    assert CONNECT_TOKEN not in str(err.value)


def test_a_missing_connect_client_is_named_with_the_install(conns, tmp_path, monkeypatch):
    absent = {"grpc", "zstandard"}
    with monkeypatch.context() as patched:
        patched.setattr("importlib.util.find_spec", lambda m: None if m in absent else object())
        with pytest.raises(SparkConnectConfigError, match=r"client: grpcio, zstandard not installed"):
            check_client_installed(spark_remote_for_test())

    def no_grpc(module: str) -> object | None:
        return None if module == "grpc_status" else object()

    monkeypatch.setattr("importlib.util.find_spec", no_grpc)
    with pytest.raises(
        AirflowFailException, match=r"grpcio-status not installed. Install pyspark\[connect\]"
    ):
        make_operator(tmp_path).usage_checked("r1")


def test_spark_submit_kwargs_are_refused_on_a_connect_server(conns, tmp_path):
    op = make_operator(tmp_path, spark_submit_kwargs={"driver_memory": "2g"})
    with pytest.raises(
        AirflowFailException, match=r"spark_submit_kwargs \(driver_memory\) apply to spark-submit"
    ):
        op.usage_checked("r1")


def test_redact_hides_token_user_id_and_url_parameters():
    remote = spark_remote_for_test()
    line = f"failed sc://h:1/;user_id={CONNECT_USER};token=abc {CONNECT_TOKEN} and token=xyz"
    assert remote.redact(line) == "failed sc://h:1/;user_id=***;token=*** *** and token=***"


def spark_remote_for_test() -> SparkRemote:
    return SparkRemote("c", "sc://h:1", "sc://h:1/", (CONNECT_TOKEN, CONNECT_USER))


# A stand-in for dlq_replay_main.py: records its argv and environment, prints the server's URL (as a
# careless library might), writes the report and prints the summary line; FAKE_SLEEP makes it wait.
FAKE_MAIN = """
import json, os, sys, time
argv = sys.argv[1:]
opts = dict(zip(argv[::2], argv[1::2]))
with open(os.environ["FAKE_LOG"], "w") as log:
    json.dump({"argv": sys.argv, "remote": os.environ.get("SPARK_REMOTE"),
               "pythonpath": os.environ.get("PYTHONPATH"), "pid": os.getpid()}, log)
print("connecting to " + os.environ["SPARK_REMOTE"], flush=True)
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
run = os.path.join(opts["--output-dir"], "runs", opts["--run-id"])
os.makedirs(run, exist_ok=True)
report = {"run_id": opts["--run-id"], "mode": opts["--mode"], "status": "succeeded",
          "totals": {"snapshot": 3, "republished": 2, "skipped": 1}, "groups": [],
          "paths": {"report_json": run + "/report.json", "report_html": run + "/report.html"},
          "spark": {"application_id": "local-1700000000000", "master": "local[2]", "ui_url": None}}
with open(os.path.join(run, "report.json"), "w") as f:
    json.dump(report, f)
print("DLQ_REPLAY_SUMMARY " + json.dumps(report), flush=True)
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""


def stand_in(tmp_path: Path, monkeypatch) -> dict[str, str]:
    main = tmp_path / "fake_main.py"
    main.write_text(FAKE_MAIN)
    bundle = tmp_path / "dlq_replay.zip"
    bundle.write_bytes(b"")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "fake.json"))
    return {"bundle_path": str(bundle), "application": str(main)}


def test_execute_runs_the_client_and_publishes_the_report(conns, tmp_path, monkeypatch, caplog, capsys):
    op = make_operator(tmp_path, **stand_in(tmp_path, monkeypatch), spark_history_url="http://history:18080")
    ti = SimpleNamespace(dag_id="d", task_id="replay", run_id="manual__1", map_index=-1)
    events: defaultdict[object, SimpleNamespace] = defaultdict(lambda: SimpleNamespace(extra={}))
    with caplog.at_level(logging.DEBUG):
        summary = op.execute({"ti": ti, "outlet_events": events})
    seen = json.loads((tmp_path / "fake.json").read_text())
    assert seen["argv"][1:3] == ["--run-id", "d.replay.manual__1"]
    assert seen["remote"].startswith(f"sc://{SERVER}:15002/;user_id=")
    assert seen["pythonpath"].split(os.pathsep)[0] == str(tmp_path / "dlq_replay.zip")
    assert summary["totals"] == {"snapshot": 3, "republished": 2, "skipped": 1}
    assert events[op.outlets[0]].extra["totals"]["republished"] == 2
    assert op.spark_application == {
        "application_id": "local-1700000000000",
        "master": "local[2]",
        "ui_url": None,
    }
    log = caplog.text + capsys.readouterr().out  # the task log, wherever Airflow's logging sends it
    assert f"connecting to sc://{SERVER}:15002/;user_id=***;token=***" in log
    assert "as a Spark Connect client of sc://spark-connect.example.com:15002" in log
    assert "spark.executor.memory do not reach the session" in log
    for text in (
        " ".join(seen["argv"]),
        log,
        json.dumps(summary),
        json.dumps(events[op.outlets[0]].extra),
    ):
        assert not secrets_in(text)


def test_a_failed_client_fails_the_task_with_its_exit_code(conns, tmp_path, monkeypatch):
    op = make_operator(tmp_path, **stand_in(tmp_path, monkeypatch))
    monkeypatch.setenv("FAKE_EXIT", "2")
    ti = SimpleNamespace(dag_id="d", task_id="replay", run_id="manual__2", map_index=-1)
    with pytest.raises(SparkConnectClientError, match=r"exited with code 2; .* usage error") as err:
        op.execute({"ti": ti})
    assert not secrets_in(str(err.value))


def test_on_kill_stops_the_client_by_pid(conns, tmp_path, monkeypatch):
    op = make_operator(tmp_path, **stand_in(tmp_path, monkeypatch))
    monkeypatch.setenv("FAKE_SLEEP", "120")
    ti = SimpleNamespace(dag_id="d", task_id="replay", run_id="manual__3", map_index=-1)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            op.execute({"ti": ti})
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while not (tmp_path / "fake.json").exists():
        assert time.monotonic() < deadline, "the stand-in client did not start"
        time.sleep(0.05)
    pid = json.loads((tmp_path / "fake.json").read_text())["pid"]
    op.on_kill()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE

    assert len(errors) == 1
    assert isinstance(errors[0], SparkConnectClientError)
    assert "was stopped before it finished" in str(errors[0])
    assert not (tmp_path / "out" / "runs").exists()
