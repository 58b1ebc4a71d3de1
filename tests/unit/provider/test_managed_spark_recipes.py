"""Recipes for managed Spark: the public argument builder is the operator's, and each example DAG parses
and submits exactly the spec shown here (the services themselves cannot run in tests)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from airflow_provider_dlq import recipes
from airflow_provider_dlq.operators.replay import DlqReplayOperator

ROOT = Path(__file__).resolve().parents[3]
DAG_FILE = ROOT / "dags" / "dlq_managed_spark.py"
RUN_ID = "dlq_managed_dataproc.replay.manual__2024-05-02T02_00_00_00_00"
SETTINGS = {
    "service_url": "pulsar+ssl://broker:6651",
    "admin_url": "https://broker:8443",
    "dlq_topics": "persistent://public/default/orders-DLQ",
    "dlq_output_dir": "s3a://dlq-bucket/dlq",
    "dlq_app_root": "s3://dlq-bucket/app",
    "dlq_mode": "replay",
    "dlq_origin_allowlist": "persistent://public/default/orders*",
    "dlq_playbook": "/opt/dlq/app/playbook.yaml",
    "dlq_auth_token_file": "/etc/pulsar/token",
}
ARGV = [
    "--run-id", RUN_ID,
    "--mode", "replay",
    "--service-url", "pulsar+ssl://broker:6651",
    "--topics", "persistent://public/default/orders-DLQ",
    "--subscription", "dlq-replayer",
    "--output-dir", "s3a://dlq-bucket/dlq",
    "--auth-token-file", "/etc/pulsar/token",
    "--admin-url", "https://broker:8443",
    "--playbook", "/opt/dlq/app/playbook.yaml",
    "--origin-allowlist", "persistent://public/default/orders*",
    "--max-replays", "3",
    "--archive-payload", "on",
    "--idle-timeout-ms", "3000",
    "--subscription-lease", "on",
]  # fmt: skip
FILES = recipes.AppFiles("s3://dlq-bucket/app/dlq_replay_main.py", "s3://dlq-bucket/app/dlq_replay.zip")
CONF = {"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"}


@pytest.fixture(scope="module")
def module():
    return runpy.run_path(str(DAG_FILE))


def test_the_public_builder_is_the_operators(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_PULSAR_DEFAULT", json.dumps({"conn_type": "pulsar", "host": "pulsar://b:6650"})
    )
    op = DlqReplayOperator(
        task_id="replay", topics="t-DLQ", output_dir="s3a://b/dlq", mode="replay", origin_allowlist="t*"
    )
    config = op.pulsar_hook.config
    expected = op.replay_args("r1", config).to_argv()
    assert (
        recipes.replay_argv(
            run_id="r1",
            service_url=config.service_url,
            topics="t-DLQ",
            output_dir="s3a://b/dlq",
            mode="replay",
            origin_allowlist="t*",
        )
        == expected
    )
    assert (
        recipes.build_replay_args
        is __import__("airflow_provider_dlq.operators.replay_cli", fromlist=["x"]).build_replay_args
    )
    with pytest.raises(recipes.ReplayArgumentError, match="origin_allowlist"):
        recipes.replay_argv(
            run_id="r1", service_url="pulsar://b:6650", topics="t", output_dir="/o", mode="replay"
        )


def test_the_dags_parse_without_the_services_providers():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    ids = {
        "dlq_managed_kubernetes",
        "dlq_managed_databricks",
        "dlq_managed_emr_serverless",
        "dlq_managed_dataproc",
    }
    assert ids <= set(bag.dag_ids)
    for dag_id in ids:
        dag = bag.dags[dag_id]
        assert dag.max_active_runs == 1
        assert dag.get_task("replay").upstream_task_ids == {"spec"}
        assert dag.get_task("report").upstream_task_ids == {"replay"}
        assert dag.get_task("replay").pool == "dlq_replay"


def test_a_missing_provider_fails_the_task_naming_the_package(module):
    replay = module["databricks_dag"].get_task("replay")
    if type(replay).__name__ != "ProviderMissing":
        pytest.fail("the Databricks provider is installed here; this test expects it absent")
    with pytest.raises(RuntimeError, match=r"pip install apache-airflow-providers-databricks"):
        replay.execute({})


def test_argv_of_a_run(module):
    assert module["replay_argv"](RUN_ID, SETTINGS) == ARGV


def test_kubernetes_spark_application(module):
    spec = json.loads(module["kubernetes_spec"](RUN_ID, SETTINGS))
    name = spec["metadata"]["name"]
    assert len(name) <= 63
    assert name == "dlq-replay-dlq-managed-dataproc-replay-manual-2024-05-3b742074"
    assert name == recipes.kubernetes_name(f"dlq-replay-{RUN_ID}")
    assert spec == {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": "apache/spark-py:latest",
            "mainApplicationFile": FILES.main,
            "arguments": ARGV,
            "deps": {"pyFiles": [FILES.bundle]},
            "sparkVersion": "4.0.0",
            "sparkConf": CONF,
            "restartPolicy": {"type": "Never"},
            "driver": {
                "cores": 1,
                "memory": "1g",
                "secrets": [{"name": "pulsar-token", "path": "/etc/pulsar", "secretType": "Generic"}],
                "serviceAccount": "spark",
            },
            "executor": {
                "cores": 1,
                "memory": "1g",
                "secrets": [{"name": "pulsar-token", "path": "/etc/pulsar", "secretType": "Generic"}],
                "instances": 2,
            },
        },
    }


def test_databricks_spark_python_task(module):
    assert module["databricks_spec"](RUN_ID, SETTINGS) == {
        "run_name": f"dlq-replay-{RUN_ID}",
        "tasks": [
            {
                "task_key": "dlq_replay",
                "new_cluster": {
                    "spark_version": "16.4.x-scala2.13",
                    "node_type_id": "i3.xlarge",
                    "num_workers": 2,
                    "spark_conf": CONF,
                    "spark_env_vars": {"PYTHONPATH": FILES.bundle},
                },
                "spark_python_task": {"python_file": FILES.main, "parameters": ARGV},
                "libraries": [{"pypi": {"package": "pulsar-client>=3.9"}}],
            }
        ],
    }


def test_emr_serverless_job_driver(module):
    driver = module["emr_serverless_spec"](RUN_ID, SETTINGS)
    assert driver == {
        "sparkSubmit": {
            "entryPoint": FILES.main,
            "entryPointArguments": ARGV,
            "sparkSubmitParameters": (
                "--py-files s3://dlq-bucket/app/dlq_replay.zip"
                " --conf spark.sql.session.timeZone=UTC --conf spark.ui.showConsoleProgress=false"
                " --conf spark.archives=s3://dlq-bucket/app/pyenv.tar.gz#environment"
                " --conf spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON=./environment/bin/python"
                " --conf spark.emr-serverless.driverEnv.PYSPARK_PYTHON=./environment/bin/python"
                " --conf spark.executorEnv.PYSPARK_PYTHON=./environment/bin/python"
            ),
        }
    }


def test_dataproc_pyspark_job_and_batch(module):
    settings = {**SETTINGS, "dlq_gcp_project": "acme", "dlq_dataproc_cluster": "replay-cluster"}
    assert module["dataproc_spec"](RUN_ID, settings) == {
        "reference": {"project_id": "acme"},
        "placement": {"cluster_name": "replay-cluster"},
        "pyspark_job": {
            "main_python_file_uri": FILES.main,
            "python_file_uris": [FILES.bundle],
            "args": ARGV,
            "properties": CONF,
        },
    }
    assert recipes.dataproc_batch(FILES, ARGV, container_image="gcr.io/acme/dlq:1") == {
        "pyspark_batch": {
            "main_python_file_uri": FILES.main,
            "python_file_uris": [FILES.bundle],
            "args": ARGV,
        },
        "runtime_config": {"version": "2.3", "properties": CONF, "container_image": "gcr.io/acme/dlq:1"},
    }


def test_the_report_task_reads_the_summary_from_the_output_root(tmp_path):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    report = {"run_id": "r1", "mode": "dry-run", "status": "succeeded", "totals": {"snapshot": 4}}
    (run / "report.json").write_text(json.dumps(report))
    summary = recipes.read_replay_report(tmp_path.as_uri(), "r1")
    assert summary["totals"] == {"snapshot": 4}
    assert summary["status"] == "succeeded"
