"""Run the replay app on managed Spark: its validated command line (:func:`replay_argv`), the job specs of
the services' own Airflow operators, and :func:`read_replay_report`. Secrets never enter the specs: give
file paths the service mounts from its secret store. See ``docs/managed-spark.md``."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_dlq.operators.replay_cli import ReplayArgumentError as ReplayArgumentError
from airflow_provider_dlq.operators.replay_cli import build_replay_args, compact_summary
from airflow_provider_dlq.operators.replay_cli import default_run_id as default_run_id
from airflow_provider_dlq.output_storage import read_run_report
from pulsar_dlq_consumer.replay_options import ReplayOptions as ReplayOptions

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

#: Spark settings the app relies on (DlqReplayOperator adds a quieter log level).
APP_CONF: dict[str, str] = {"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"}


def replay_argv(**values: Any) -> list[str]:
    """The replay app's validated arguments: the keyword arguments are those of ``DlqReplayOperator``
    plus ``run_id`` and ``service_url`` (and ``admin_url``, TLS file paths)."""
    return build_replay_args(values).to_argv()


@dataclass(frozen=True)
class AppFiles:
    """Where the uploaded ``dlq_replay_main.py`` (``main``) and ``dlq_replay.zip`` (``bundle``) are."""

    main: str
    bundle: str

    @classmethod
    def under(cls, root: str) -> AppFiles:
        """Both files uploaded to one folder, e.g. ``s3://bucket/dlq-app``."""
        root = root.rstrip("/")
        return cls(main=f"{root}/dlq_replay_main.py", bundle=f"{root}/dlq_replay.zip")


def _conf(conf: Mapping[str, str] | None) -> dict[str, str]:
    return {**APP_CONF, **{str(k): str(v) for k, v in (conf or {}).items()}}


def kubernetes_name(text: str) -> str:
    """A DNS-1123 name for ``text`` (lowercase, ``[a-z0-9-]``, at most 63 characters, unique by hash)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "dlq-replay"
    if len(name) > 63 or name != text:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        name = f"{name[:54].rstrip('-')}-{digest}"
    return name


def spark_application(
    name: str,
    files: AppFiles,
    argv: Sequence[str],
    *,
    image: str,
    namespace: str = "default",
    service_account: str = "spark",
    spark_version: str = "4.0.0",
    conf: Mapping[str, str] | None = None,
    secret: str | None = None,
    secret_path: str = "/etc/pulsar",
) -> dict[str, Any]:
    """A Spark Operator ``SparkApplication``; ``secret`` is mounted at ``secret_path`` on every pod."""
    pod: dict[str, Any] = {"cores": 1, "memory": "1g"}
    if secret:
        pod["secrets"] = [{"name": secret, "path": secret_path, "secretType": "Generic"}]
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": kubernetes_name(name), "namespace": namespace},
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": image,
            "mainApplicationFile": files.main,
            "arguments": list(argv),
            "deps": {"pyFiles": [files.bundle]},
            "sparkVersion": spark_version,
            "sparkConf": _conf(conf),
            "restartPolicy": {"type": "Never"},
            "driver": {**pod, "serviceAccount": service_account},
            "executor": {**pod, "instances": 2},
        },
    }


def databricks_run(
    run_name: str,
    files: AppFiles,
    argv: Sequence[str],
    *,
    new_cluster: Mapping[str, Any],
    conf: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``json`` of ``DatabricksSubmitRunOperator``: one ``spark_python_task`` on a new job cluster,
    the files on a Unity Catalog volume (the bundle on ``PYTHONPATH``)."""
    cluster = dict(new_cluster)
    cluster["spark_conf"] = {**_conf(conf), **dict(cluster.get("spark_conf") or {})}
    cluster["spark_env_vars"] = {**dict(cluster.get("spark_env_vars") or {}), "PYTHONPATH": files.bundle}
    return {
        "run_name": run_name,
        "tasks": [
            {
                "task_key": "dlq_replay",
                "new_cluster": cluster,
                "spark_python_task": {"python_file": files.main, "parameters": list(argv)},
                "libraries": [{"pypi": {"package": "pulsar-client>=3.9"}}],
            }
        ],
    }


def emr_serverless_job(
    files: AppFiles, argv: Sequence[str], *, python_env: str, conf: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``job_driver`` of ``EmrServerlessStartJobOperator``; ``python_env`` is a venv-pack archive."""
    settings = {
        **_conf(conf),
        "spark.archives": f"{python_env}#environment",
        "spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON": "./environment/bin/python",
        "spark.emr-serverless.driverEnv.PYSPARK_PYTHON": "./environment/bin/python",
        "spark.executorEnv.PYSPARK_PYTHON": "./environment/bin/python",
    }
    parameters = [f"--py-files {files.bundle}"] + [f"--conf {k}={v}" for k, v in settings.items()]
    return {
        "sparkSubmit": {
            "entryPoint": files.main,
            "entryPointArguments": list(argv),
            "sparkSubmitParameters": " ".join(parameters),
        }
    }


def _dataproc_files(files: AppFiles, argv: Sequence[str]) -> dict[str, Any]:
    return {"main_python_file_uri": files.main, "python_file_uris": [files.bundle], "args": list(argv)}


def dataproc_pyspark_job(
    files: AppFiles,
    argv: Sequence[str],
    *,
    project_id: str,
    cluster_name: str,
    conf: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``job`` of ``DataprocSubmitJobOperator`` (a ``pyspark_job`` on an existing cluster)."""
    return {
        "reference": {"project_id": project_id},
        "placement": {"cluster_name": cluster_name},
        "pyspark_job": {**_dataproc_files(files, argv), "properties": _conf(conf)},
    }


def dataproc_batch(
    files: AppFiles,
    argv: Sequence[str],
    *,
    container_image: str | None = None,
    runtime_version: str = "2.3",
    conf: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``batch`` of ``DataprocCreateBatchOperator`` (Dataproc Serverless)."""
    runtime: dict[str, Any] = {"version": runtime_version, "properties": _conf(conf)}
    if container_image:
        runtime["container_image"] = container_image
    return {"pyspark_batch": _dataproc_files(files, argv), "runtime_config": runtime}


def read_replay_report(output_dir: str, run_id: str, conn_id: str | None = None) -> dict[str, Any]:
    """The run's summary, as ``DlqReplayOperator`` returns it, from its ``report.json``."""
    location = f"{output_dir.rstrip('/')}/runs/{run_id}/report.json"
    return compact_summary(read_run_report(location, run_id, None, conn_id, logging.getLogger(__name__)))
