"""DlqReplayOperator: the exact spark-submit command (no secret in it), run ids, validation, report."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_provider_dlq.errors import DlqProviderError
from airflow_provider_dlq.operators.replay import DlqReplayOperator, output_asset
from airflow_provider_dlq.operators.replay_cli import (
    ReplayArgumentError,
    build_replay_args,
    compact_summary,
    default_run_id,
    report_json,
)
from airflow_provider_dlq.operators.spark_submit import spark_target
from pulsar_dlq_consumer.replay_options import TOKEN_ENV

TOKEN = "eyJhbGciOiJIUzI1NiJ9.dG9wLXNlY3JldA.never-on-argv"
DLQ = "persistent://public/default/orders-DLQ"


@pytest.fixture
def conns(monkeypatch):
    pulsar = {
        "conn_type": "pulsar",
        "host": "pulsar+ssl://broker:6651",
        "password": TOKEN,
        "extra": {
            "metrics_url": "http://broker:8080/metrics",
            "admin_url": "https://broker:8443",
            "tls_trust_certs_file_path": "/etc/ca.pem",
        },
    }
    monkeypatch.setenv("AIRFLOW_CONN_PULSAR_DEFAULT", json.dumps(pulsar))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", json.dumps({"conn_type": "spark", "host": "yarn"}))


def make_operator(tmp_path, **kwargs):
    defaults = {
        "task_id": "replay",
        "topics": [DLQ, "persistent://public/default/pay-DLQ"],
        "output_dir": str(tmp_path / "out"),
        "mode": "replay",
        "origin_allowlist": "persistent://public/default/orders,persistent://public/default/pay",
        "playbook": "/opt/dlq/playbook.yaml",
        "since": "2024-05-01",
        "until": "2024-05-02T00:00:00Z",
        "max_messages": "500",
        "rate_limit": 250,
        "parallelism": 2,
        "archive_payload": False,
        "conf": {"spark.executor.memory": "1g"},
        "env_vars": {"FOO": "bar"},
    }
    defaults.update(kwargs)
    return DlqReplayOperator(**defaults)


def test_exact_spark_submit_command_and_token_only_in_env(conns, tmp_path):
    op = make_operator(tmp_path)
    pulsar = op.pulsar_hook.config
    args = op.replay_args("dlq_nightly.replay.manual__2024-05-02T00_00_00_00_00", pulsar)
    env = op.spark_env(pulsar, "local[2]")
    hook = op.make_hook(args, env, "/tmp/b/dlq_replay.zip")
    cmd = hook._build_spark_submit_command("/tmp/b/dlq_replay_main.py")
    out = str(tmp_path / "out")
    assert cmd == [
        "spark-submit",
        "--master", "local[2]",
        "--conf", "spark.sql.session.timeZone=UTC",
        "--conf", "spark.ui.showConsoleProgress=false",
        "--conf", "spark.log.level=WARN",
        "--conf", "spark.executor.memory=1g",
        "--py-files", "/tmp/b/dlq_replay.zip",
        "--name", "dlq-replay-dlq_nightly.replay.manual__2024-05-02T00_00_00_00_00",
        "/tmp/b/dlq_replay_main.py",
        "--run-id", "dlq_nightly.replay.manual__2024-05-02T00_00_00_00_00",
        "--mode", "replay",
        "--service-url", "pulsar+ssl://broker:6651",
        "--topics", f"{DLQ},persistent://public/default/pay-DLQ",
        "--subscription", "dlq-replayer",
        "--output-dir", out,
        "--tls-trust-certs-file", "/etc/ca.pem",
        "--admin-url", "https://broker:8443",
        "--playbook", "/opt/dlq/playbook.yaml",
        "--origin-allowlist", "persistent://public/default/orders,persistent://public/default/pay",
        "--since", "2024-05-01T00:00:00+00:00",
        "--until", "2024-05-02T00:00:00+00:00",
        "--max-messages", "500",
        "--max-replays", "3",
        "--rate-limit", "250",
        "--parallelism", "2",
        "--archive-payload", "off",
        "--idle-timeout-ms", "3000",
        "--subscription-lease", "on",
    ]  # fmt: skip
    assert TOKEN not in " ".join(cmd)
    assert env[TOKEN_ENV] == TOKEN
    assert env["FOO"] == "bar"
    assert TOKEN not in json.dumps(op.env_vars)


def test_token_file_replaces_the_env_token(conns, tmp_path):
    op = make_operator(tmp_path, auth_token_file="/run/secrets/pulsar-token")
    pulsar = op.pulsar_hook.config
    args = op.replay_args("r1", pulsar)
    assert args.to_argv()[args.to_argv().index("--auth-token-file") + 1] == "/run/secrets/pulsar-token"
    assert TOKEN_ENV not in op.spark_env(pulsar, "yarn")


def test_yarn_without_token_file_refuses_to_put_the_token_on_argv(conns, tmp_path):
    op = make_operator(tmp_path, spark_conn_id="spark_yarn")
    pulsar = op.pulsar_hook.config
    env = op.spark_env(pulsar, "yarn")
    target = spark_target("spark_yarn")
    with pytest.raises(ReplayArgumentError, match="set auth_token_file"):
        op._check_env_stays_off_argv(target, env)


OAUTH_SECRET = "oauth-client-secret-never-on-argv"


@pytest.fixture
def oauth_mtls_conn(monkeypatch):
    """OAuth2 client credentials (Login/Password) over mutual TLS (client certificate and key files)."""
    pulsar = {
        "conn_type": "pulsar",
        "host": "pulsar+ssl://broker:6651",
        "login": "replayer",
        "password": OAUTH_SECRET,
        "extra": {
            "tls_trust_certs_file_path": "/etc/ca.pem",
            "tls_cert_file_path": "/etc/pulsar/client.pem",
            "tls_key_file_path": "/etc/pulsar/client.key",
            "oauth2_issuer_url": "https://auth.example.com/",
            "oauth2_audience": "urn:pulsar:prod",
        },
    }
    monkeypatch.setenv("AIRFLOW_CONN_PULSAR_OAUTH", json.dumps(pulsar))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", json.dumps({"conn_type": "spark", "host": "yarn"}))


def test_oauth2_secret_goes_by_env_and_certificates_by_path(oauth_mtls_conn, tmp_path):
    from pulsar_dlq_consumer.replay_options import OAUTH2_CREDENTIALS_ENV

    op = make_operator(tmp_path, pulsar_conn_id="pulsar_oauth")
    pulsar = op.pulsar_hook.config
    args = op.replay_args("r1", pulsar)
    argv = args.to_argv()
    env = op.spark_env(pulsar, "local[2]")
    assert argv[argv.index("--tls-cert-file") + 1] == "/etc/pulsar/client.pem"
    assert argv[argv.index("--tls-key-file") + 1] == "/etc/pulsar/client.key"
    assert argv[argv.index("--oauth2-issuer-url") + 1] == "https://auth.example.com"
    assert argv[argv.index("--oauth2-audience") + 1] == "urn:pulsar:prod"
    assert OAUTH_SECRET not in " ".join(argv)
    assert json.loads(env[OAUTH2_CREDENTIALS_ENV]) == {"client_id": "replayer", "client_secret": OAUTH_SECRET}
    assert TOKEN_ENV not in env  # the Password is the OAuth2 client secret, not a token
    hook = op.make_hook(args, env, "/b.zip")
    assert OAUTH_SECRET not in " ".join(hook._build_spark_submit_command("/b/main.py"))
    with_file = make_operator(
        tmp_path, pulsar_conn_id="pulsar_oauth", oauth2_credentials_file="/run/oauth.json"
    )
    assert OAUTH2_CREDENTIALS_ENV not in with_file.spark_env(pulsar, "yarn")
    file_argv = with_file.replay_args("r1", pulsar).to_argv()
    assert file_argv[file_argv.index("--oauth2-credentials-file") + 1] == "/run/oauth.json"
    yarn = make_operator(tmp_path, pulsar_conn_id="pulsar_oauth", spark_conn_id="spark_yarn")
    yarn_env = yarn.spark_env(pulsar, "yarn")
    with pytest.raises(ReplayArgumentError, match="oauth2_credentials_file"):
        yarn._check_env_stays_off_argv(spark_target("spark_yarn"), yarn_env)
    with pytest.raises(ReplayArgumentError, match="must not carry PULSAR_OAUTH2_CREDENTIALS"):
        make_operator(tmp_path, env_vars={OAUTH2_CREDENTIALS_ENV: "x"}).spark_env(pulsar, "local[2]")


def test_report_settings_reach_spark_conf(conns, tmp_path):
    op = make_operator(tmp_path, report_payload_snippets=True)
    pulsar = op.pulsar_hook.config
    hook = op.make_hook(op.replay_args("r1", pulsar), {}, "/b.zip", expected=1234)
    cmd = " ".join(hook._build_spark_submit_command("/b/main.py"))
    assert "spark.dlq.report.payloadSnippets=true" in cmd
    assert "spark.dlq.progress.expectedMessages=1234" in cmd
    plain = make_operator(tmp_path).make_hook(op.replay_args("r1", pulsar), {}, "/b.zip")
    assert "payloadSnippets" not in " ".join(plain._build_spark_submit_command("/b/main.py"))


def test_quick_jit_joins_the_driver_jvm_options_before_the_class_data_archive(conns, tmp_path):
    from airflow_provider_dlq.class_data import ArchivePlan
    from airflow_provider_dlq.driver_footprint import QUICK_JIT_OPTION

    op = make_operator(tmp_path, conf={"spark.driver.extraJavaOptions": "-Dmine=1"})
    args = op.replay_args("r1", op.pulsar_hook.config)
    archive = ArchivePlan("java", tmp_path / "a.jsa")
    hook = op.make_hook(args, {}, "/b.zip", expected=500, archive=archive, quick_jit=True)
    options = hook._conf["spark.driver.extraJavaOptions"].split()
    assert options[:2] == ["-Dmine=1", QUICK_JIT_OPTION]
    assert options[-1] == f"-XX:SharedArchiveFile={tmp_path / 'a.jsa'}"
    plain = op.make_hook(args, {}, "/b.zip", expected=500)
    assert QUICK_JIT_OPTION not in plain._conf["spark.driver.extraJavaOptions"]
    with pytest.raises(DlqProviderError, match=r"quick_jit must be True, False or 'auto'; got 'always'"):
        make_operator(tmp_path, quick_jit="always")


def test_extra_links_point_at_the_report_endpoint_storage_or_spark_history(conns, tmp_path):
    from airflow_provider_dlq.operators.links import (
        DlqReplayReportLink,
        SparkApplicationLink,
        report_endpoint,
    )

    ti = SimpleNamespace(dag_id="dlq backfill", run_id="manual__2024-05-01T00:00:00+00:00", task_id="replay",
                         map_index=-1)  # fmt: skip
    op = make_operator(tmp_path)
    assert DlqReplayReportLink().get_link(op, ti_key=ti) == ""  # no report yet: no link
    assert SparkApplicationLink().get_link(op, ti_key=ti) == ""
    op.report_html_uri = "s3a://bucket/dlq/runs/r1/report.html"
    op.spark_application = {"application_id": "app-20240501-0001", "ui_url": "http://driver:4040"}
    assert DlqReplayReportLink().get_link(op, ti_key=ti) == (
        "/dlq-replay/reports/dlq%20backfill/manual__2024-05-01T00%3A00%3A00%2B00%3A00/replay/-1"
    )
    assert report_endpoint("d", "r", "t", 2, base="https://airflow.example.com") == (
        "https://airflow.example.com/dlq-replay/reports/d/r/t/2"
    )
    assert SparkApplicationLink().get_link(op, ti_key=ti) == ""  # the live UI ended with the app: no link
    op.spark_history_url = "http://history:18080/"
    assert SparkApplicationLink().get_link(op, ti_key=ti) == "http://history:18080/history/app-20240501-0001/"
    op.report_url = "https://console.example.com/browse?path={report_html}"
    assert DlqReplayReportLink().get_link(op, ti_key=ti) == (
        "https://console.example.com/browse?path=s3a://bucket/dlq/runs/r1/report.html"
    )


def test_token_in_env_vars_is_refused(conns, tmp_path):
    op = make_operator(tmp_path, env_vars={TOKEN_ENV: "x"})
    with pytest.raises(ReplayArgumentError, match="must not carry PULSAR_AUTH_TOKEN"):
        op.spark_env(op.pulsar_hook.config, "local[2]")


def test_default_run_id_is_stable_and_path_safe():
    rid = default_run_id("dlq_nightly_replay", "replay", "scheduled__2024-05-02T02:00:00+00:00")
    assert rid == "dlq_nightly_replay.replay.scheduled__2024-05-02T02_00_00_00_00"
    assert rid == default_run_id("dlq_nightly_replay", "replay", "scheduled__2024-05-02T02:00:00+00:00")
    assert default_run_id("d", "t", "r", map_index=3) == "d.t.r.3"
    long = default_run_id("d" * 100, "t", "manual__x" * 10)
    assert len(long) == 120
    assert long != default_run_id("d" * 100, "t", "manual__y" * 10)


def test_run_id_from_context_survives_retries(conns, tmp_path):
    op = make_operator(tmp_path)
    ti = SimpleNamespace(
        dag_id="dag", task_id="replay", run_id="manual__2024-01-01T00:00:00+00:00", map_index=-1
    )
    first = op.resolve_run_id({"ti": ti})
    ti.try_number = 2
    assert op.resolve_run_id({"ti": ti}) == first == "dag.replay.manual__2024-01-01T00_00_00_00_00"
    assert make_operator(tmp_path, run_id="fixed-run").resolve_run_id({"ti": ti}) == "fixed-run"


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"mode": "wipe"}, "mode must be one of dry-run, replay, archive-only"),
        ({"topics": " , "}, "--topics is required.*Variable dlq_topics"),
        (
            {"mode": "replay", "origin_allowlist": None},
            "--origin-allowlist is required.*dlq_origin_allowlist",
        ),
        ({"since": "yesterday"}, "since is not an ISO 8601 date"),
        ({"since": "2024-05-03", "until": "2024-05-02"}, "must be before --until"),
        ({"max_messages": "ten"}, r"max_messages must be a number \(int\)"),
        ({"max_messages": 0}, "--max-messages must be >= 1"),
        ({"rate_limit": -5}, "--rate-limit must be > 0"),
        ({"run_id": "a/b"}, "run_id must be 1-120 characters"),
        ({"output_dir": ""}, "--output-dir is required"),
        ({"archive_payload": "maybe"}, "archive_payload must be on/off"),
    ],
)
def test_rendered_values_are_validated_with_the_fix(change, fragment):
    values = {
        "run_id": "r1",
        "mode": "replay",
        "service_url": "pulsar://h:6650",
        "topics": DLQ,
        "output_dir": "/data/dlq",
        "origin_allowlist": "persistent://public/default/*",
    }
    values.update(change)
    with pytest.raises(ReplayArgumentError, match=fragment):
        build_replay_args(values)


def test_no_topics_is_said_before_a_missing_connection(tmp_path):
    """A first-time user has neither: the task names the empty topics first (the trigger form's field)."""
    from airflow.sdk.exceptions import AirflowFailException

    op = make_operator(tmp_path, topics="", pulsar_conn_id="no_such_pulsar_conn")
    with pytest.raises(AirflowFailException, match=r"--topics is required.*Variable dlq_topics.*not retried"):
        op.usage_checked("r1")


def test_templated_blanks_become_absent_options():
    args = build_replay_args(
        {
            "run_id": "r1",
            "mode": "dry-run",
            "service_url": "pulsar://h:6650",
            "topics": [DLQ],
            "output_dir": "relative/out",
            "max_messages": "None",
            "since": "",
            "playbook": None,
        }
    )
    argv = args.to_argv()
    for flag in ("--max-messages", "--since", "--playbook", "--origin-allowlist", "--auth-token-file"):
        assert flag not in argv
    assert args.output_dir == os.path.abspath("relative/out")
    assert report_json(args) == os.path.abspath("relative/out") + "/runs/r1/report.json"


def test_operator_rejects_bad_static_arguments(tmp_path):
    with pytest.raises(ReplayArgumentError, match="mode must be one of"):
        make_operator(tmp_path, mode="everything")
    with pytest.raises(ReplayArgumentError, match="--max-replays must be >= 1"):
        build_replay_args(
            {"run_id": "r", "service_url": "s", "topics": "t", "output_dir": "/o", "max_replays": 0}
        )
    with pytest.raises(ReplayArgumentError, match=r"must not set \['application_args'\]"):
        make_operator(tmp_path, spark_submit_kwargs={"application_args": ["--x"]})


def test_template_fields_and_default_outlet(tmp_path):
    op = make_operator(tmp_path)
    assert {"topics", "mode", "run_id", "playbook", "since", "until", "signatures", "error_class"} <= set(
        op.template_fields
    )
    assert all(isinstance(f, str) for f in op.template_fields)
    assert op.outlets == [output_asset(str(tmp_path / "out"))]
    assert op.outlets[0].uri == (tmp_path / "out").as_uri()
    templated = make_operator(tmp_path, output_dir="{{ var.value.dlq_output_dir }}")
    assert templated.outlets == []


def test_compact_summary_keeps_totals_paths_and_top_groups():
    report = {
        "run_id": "r1",
        "mode": "replay",
        "status": "succeeded",
        "totals": {"snapshot": 3, "republished": 2},
        "paths": {"report_json": "/o/runs/r1/report.json"},
        "groups": [
            {"signature": f"s{i}", "count": 1, "template": "x" * 500, "outcomes": {}} for i in range(25)
        ],
        "other_groups": {"groups": 5, "count": 5},
        "timings": {"plan": 1.0},
    }
    summary = compact_summary(report)
    assert summary["group_count"] == 30
    assert len(summary["groups"]) == 20
    assert len(summary["groups"][0]["template"]) == 160
    assert summary["totals"] == {"snapshot": 3, "republished": 2}


FAKE_SPARK_SUBMIT = """#!{python}
import json, os, sys
argv = sys.argv[1:]
app = argv.index("--run-id")
opts = dict(zip(argv[app::2], argv[app + 1 :: 2]))
run = os.path.join(opts["--output-dir"], "runs", opts["--run-id"])
os.makedirs(run, exist_ok=True)
with open(os.path.join(os.environ["FAKE_LOG"]), "w") as log:
    json.dump({{"argv": argv, "token": os.environ.get("PULSAR_AUTH_TOKEN")}}, log)
report = {{"run_id": opts["--run-id"], "mode": opts["--mode"], "status": "succeeded",
          "totals": {{"snapshot": 2, "republished": 2}}, "groups": [], "other_groups": {{"groups": 0}},
          "paths": {{"report_json": os.path.join(run, "report.json")}}}}
with open(os.path.join(run, "report.json"), "w") as f:
    json.dump(report, f)
print("DLQ_REPLAY_SUMMARY " + json.dumps(report))
"""


def stand_in_spark_submit(tmp_path: Path, monkeypatch, script: str) -> Path:
    """Put ``script`` on PATH as ``spark-submit`` (it logs what it got to ``$FAKE_LOG``); returns an
    empty bundle zip to pass as ``bundle_path``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "spark-submit"
    fake.write_text(script.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "fake.json"))
    bundle = tmp_path / "dlq_replay.zip"
    bundle.write_bytes(b"")
    return bundle


def test_execute_with_a_stand_in_spark_submit(conns, tmp_path, monkeypatch):
    """execute(): token via env only, report read, summary returned and set as the asset event extra."""
    bundle = stand_in_spark_submit(tmp_path, monkeypatch, FAKE_SPARK_SUBMIT)
    op = make_operator(tmp_path, bundle_path=str(bundle), application=str(tmp_path / "main.py"))
    ti = SimpleNamespace(dag_id="d", task_id="replay", run_id="manual__1", map_index=-1)
    events: defaultdict[object, SimpleNamespace] = defaultdict(lambda: SimpleNamespace(extra={}))
    summary = op.execute({"ti": ti, "outlet_events": events})
    seen = json.loads((tmp_path / "fake.json").read_text())
    assert seen["token"] == TOKEN
    assert TOKEN not in " ".join(seen["argv"])
    assert summary["run_id"] == "d.replay.manual__1"
    assert summary["status"] == "succeeded"
    assert summary["totals"] == {"snapshot": 2, "republished": 2}
    assert TOKEN not in json.dumps(summary)
    extra = events[op.outlets[0]].extra
    assert extra["run_id"] == "d.replay.manual__1"
    assert extra["totals"]["republished"] == 2
    assert Path(summary["paths"]["report_json"]).is_file()


ARCHIVE_WRITING_SPARK_SUBMIT = (
    FAKE_SPARK_SUBMIT
    + """
for item in argv:
    if item.startswith("spark.driver.extraJavaOptions="):
        with open(os.environ["FAKE_LOG"] + ".jvm", "a") as seen:
            seen.write(item + "\\n")
        options = item.split("=", 1)[1].split()
        if any(o.startswith("-XX:ArchiveClassesAtExit=") for o in options):  # the driver JVM at exit
            import subprocess
            subprocess.run(["java", *options, "-version"], check=True, capture_output=True)
"""
)


def test_the_driver_jvm_gets_a_class_data_archive_written_once_then_mapped(conns, tmp_path, monkeypatch):
    """First run: the driver JVM writes the archive, installed after exit 0; the next run maps it.
    Off with class_data_archive=False and with deploy_mode="cluster" (the driver runs elsewhere)."""
    bundle = stand_in_spark_submit(tmp_path, monkeypatch, ARCHIVE_WRITING_SPARK_SUBMIT)
    cds = tmp_path / "cds"
    ti = SimpleNamespace(dag_id="d", task_id="replay", run_id="manual__1", map_index=-1)
    seen = tmp_path / "fake.json.jvm"

    def run(**kwargs) -> list[str]:
        seen.unlink(missing_ok=True)
        op = make_operator(tmp_path, bundle_path=str(bundle), application=str(tmp_path / "main.py"), **kwargs)
        op.execute({"ti": ti})
        return seen.read_text().splitlines() if seen.exists() else []

    first = run(class_data_archive=str(cds))
    assert len(first) == 1
    assert "-XX:ArchiveClassesAtExit=" in first[0]
    installed = list(cds.glob("*.jsa"))
    assert len(installed) == 1
    assert not list(cds.glob("*.tmp"))
    (mapped,) = run(class_data_archive=str(cds))
    # The lean driver's collector and the C1-only JIT (a local master) come first, the archive's after them.
    lean = "-XX:+UseSerialGC -XX:NewRatio=7 -XX:TieredStopAtLevel=1"
    assert mapped.startswith(f"spark.driver.extraJavaOptions={lean} -Xlog:disable ")
    assert mapped.endswith(f" -XX:SharedArchiveFile={installed[0]}")
    assert run(class_data_archive=False) == [f"spark.driver.extraJavaOptions={lean}"]
    assert (
        run(
            class_data_archive=str(cds),
            spark_conn_id="spark_yarn",
            spark_submit_kwargs={"deploy_mode": "cluster"},
            auth_token_file="/etc/dlq/token",  # cluster mode takes the token from a file, not the env
            env_vars={},
        )
        == []
    )


def test_a_local_master_gets_the_lean_driver_and_a_cluster_master_does_not(conns, tmp_path, monkeypatch):
    from airflow_provider_dlq.driver_footprint import LEAN_YOUNG_OPTION, MALLOC_ARENA_MAX, SERIAL_GC_OPTION

    monkeypatch.delenv(MALLOC_ARENA_MAX, raising=False)
    op = make_operator(tmp_path, conf={"spark.driver.extraJavaOptions": "-Dmine=1"})
    pulsar = op.pulsar_hook.config
    args = op.replay_args("r1", pulsar)
    env = op.spark_env(pulsar, "local[2]")
    assert env[MALLOC_ARENA_MAX] == "2"
    hook = op.make_hook(args, env, "/b.zip", master="local[2]")
    cmd = hook._build_spark_submit_command("/b/main.py")
    assert "spark.driver.memory=512m" in cmd
    assert f"spark.driver.extraJavaOptions=-Dmine=1 {SERIAL_GC_OPTION} {LEAN_YOUNG_OPTION}" in cmd
    assert MALLOC_ARENA_MAX not in op.spark_env(pulsar, "yarn")
    cluster = op.make_hook(args, {}, "/b.zip", master="spark://127.0.0.1:7077")
    assert "spark.driver.memory" not in cluster._conf
    assert cluster._conf["spark.driver.extraJavaOptions"] == "-Dmine=1"
    mine = make_operator(tmp_path, conf={"spark.driver.memory": "2g"})
    assert mine.make_hook(args, {}, "/b.zip", master="local[2]")._conf["spark.driver.memory"] == "2g"


def test_usage_errors_fail_at_once_naming_the_variable(conns, tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    op = make_operator(tmp_path, topics="")
    with pytest.raises(AirflowFailException, match="Variable dlq_topics") as err:
        op.usage_checked("r1")
    assert "Param topics" in str(err.value)
    op = make_operator(tmp_path, mode="replay", origin_allowlist="")
    with pytest.raises(AirflowFailException, match="Variable dlq_origin_allowlist"):
        op.usage_checked("r1")


def test_a_halted_canary_fails_the_task_after_pushing_the_summary():
    from airflow_provider_dlq.operators.replay import canary_halt_message

    summary = {"run_id": "r1", "canary": {"verdict": "halted", "halted": ["s1"], "held_back": 7}}
    message = canary_halt_message(summary)
    assert message is not None
    assert "Canary halted 1 error group(s) of replay run r1: s1" in message
    assert "7 message(s) stay pending as canary_failed" in message
    assert canary_halt_message({"canary": {"verdict": "passed", "halted": []}}) is None
    assert canary_halt_message({}) is None


def test_malformed_group_actions_fail_the_task_without_retries(tmp_path):
    """A bad approval value fails every try alike: the task fails at once, as other usage errors do."""
    from airflow.sdk.exceptions import AirflowFailException

    op = make_operator(tmp_path, group_actions="[not json", run_id="r1")
    with pytest.raises(AirflowFailException, match=r"group_actions must be a mapping.*not retried"):
        op.execute({})


def test_an_approval_that_leaves_every_group_skips_the_task(tmp_path):
    from airflow.sdk.exceptions import AirflowSkipException

    op = make_operator(tmp_path, group_actions='{"3f1c9a0b2d4e6f81": "leave"}', run_id="r1")
    with pytest.raises(AirflowSkipException, match="left every group pending"):
        op.execute({})
