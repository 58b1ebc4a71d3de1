"""Recipes: the DLQ replay on managed Spark, one DAG per service (docs/managed-spark.md).

Each DAG is ``spec`` -> ``replay`` -> ``report``:

* ``spec`` builds the service's job spec at run time with :mod:`airflow_provider_dlq.recipes` (the
  same argument builder as ``DlqReplayOperator``) from the ``pulsar_default`` connection and Variables;
  the run id is ``<dag_id>.replay.<run_id>``, the same on every try, so a retry resumes the run;
* ``replay`` submits it with the service's own Airflow operator and waits for it;
* ``report`` reads ``<dlq_output_dir>/runs/<run id>/report.json`` from object storage (connection
  ``dlq_storage_conn_id``) and returns the summary, as ``DlqReplayOperator`` does.

The services' providers are not dependencies of this provider. Without the one a DAG needs, the DAG
still parses and its ``replay`` task fails at once, naming the package to install:
``apache-airflow-providers-cncf-kubernetes``, ``-databricks``, ``-amazon`` or ``-google``.

Variables (read when the tasks run): ``dlq_topics``, ``dlq_output_dir`` (an object-store URI such as
``s3a://bucket/dlq``), ``dlq_mode`` (default ``dry-run``), ``dlq_origin_allowlist``, ``dlq_playbook``,
``dlq_app_root`` (where ``dlq_replay_main.py`` and ``dlq_replay.zip`` were uploaded),
``dlq_auth_token_file`` (the token file the service mounts), ``dlq_storage_conn_id``; per service:
``dlq_k8s_image``, ``dlq_k8s_namespace``; ``dlq_databricks_spark_version``, ``dlq_databricks_node_type``;
``dlq_emr_application_id``, ``dlq_emr_role_arn``, ``dlq_emr_python_env``; ``dlq_gcp_project``,
``dlq_gcp_region``, ``dlq_dataproc_cluster``.
"""

from __future__ import annotations

import importlib
import json
from typing import TYPE_CHECKING, Any

import pendulum
from airflow.sdk import DAG, BaseOperator, Variable, get_current_context, task

from airflow_provider_dlq import recipes

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

REPLAY_POOL = "dlq_replay"
PULSAR_CONN_ID = "pulsar_default"
#: Variable -> default (``None``: required).
SETTINGS: dict[str, str | None] = {
    "dlq_topics": None,
    "dlq_output_dir": None,
    "dlq_app_root": None,
    "dlq_mode": "dry-run",
    "dlq_origin_allowlist": "",
    "dlq_playbook": "",
    "dlq_auth_token_file": "",
    "dlq_storage_conn_id": "",
}


def replay_argv(run_id: str, settings: Mapping[str, str]) -> list[str]:
    """The app's arguments for one run (validated; secrets only as file paths)."""
    # [START howto_dlq_replay_argv]
    return recipes.replay_argv(
        run_id=run_id,
        mode=settings["dlq_mode"],
        service_url=settings["service_url"],
        admin_url=settings.get("admin_url"),
        topics=settings["dlq_topics"],
        output_dir=settings["dlq_output_dir"],
        origin_allowlist=settings.get("dlq_origin_allowlist"),
        playbook=settings.get("dlq_playbook"),
        auth_token_file=settings.get("dlq_auth_token_file"),
    )
    # [END howto_dlq_replay_argv]


def kubernetes_spec(run_id: str, settings: Mapping[str, str]) -> str:
    """``application_file`` of ``SparkKubernetesOperator``: the SparkApplication as JSON."""
    spec = recipes.spark_application(
        f"dlq-replay-{run_id}",
        recipes.AppFiles.under(settings["dlq_app_root"]),
        replay_argv(run_id, settings),
        image=settings.get("dlq_k8s_image") or "apache/spark-py:latest",
        namespace=settings.get("dlq_k8s_namespace") or "default",
        # A Kubernetes secret with the token file, mounted at /etc/pulsar: dlq_auth_token_file points there.
        secret="pulsar-token",
    )
    return json.dumps(spec, sort_keys=True)


def databricks_spec(run_id: str, settings: Mapping[str, str]) -> dict[str, Any]:
    """``json`` of ``DatabricksSubmitRunOperator``."""
    return recipes.databricks_run(
        f"dlq-replay-{run_id}",
        recipes.AppFiles.under(settings["dlq_app_root"]),
        replay_argv(run_id, settings),
        new_cluster={
            "spark_version": settings.get("dlq_databricks_spark_version") or "16.4.x-scala2.13",
            "node_type_id": settings.get("dlq_databricks_node_type") or "i3.xlarge",
            "num_workers": 2,
        },
    )


def emr_serverless_spec(run_id: str, settings: Mapping[str, str]) -> dict[str, Any]:
    """``job_driver`` of ``EmrServerlessStartJobOperator``."""
    return recipes.emr_serverless_job(
        recipes.AppFiles.under(settings["dlq_app_root"]),
        replay_argv(run_id, settings),
        python_env=settings.get("dlq_emr_python_env") or f"{settings['dlq_app_root']}/pyenv.tar.gz",
    )


def dataproc_spec(run_id: str, settings: Mapping[str, str]) -> dict[str, Any]:
    """``job`` of ``DataprocSubmitJobOperator``."""
    return recipes.dataproc_pyspark_job(
        recipes.AppFiles.under(settings["dlq_app_root"]),
        replay_argv(run_id, settings),
        project_id=settings.get("dlq_gcp_project") or "",
        cluster_name=settings.get("dlq_dataproc_cluster") or "dlq-replay",
    )


def run_settings(extra: Mapping[str, str | None]) -> dict[str, str]:
    """Variables and the Pulsar connection's URLs, read when a task runs."""
    from airflow_provider_dlq.hooks.pulsar import PulsarHook

    wanted = {**SETTINGS, **extra}
    values = {name: Variable.get(name, default="") or (default or "") for name, default in wanted.items()}
    missing = [name for name, default in wanted.items() if default is None and not values[name]]
    if missing:
        raise ValueError(f"set Variable(s) {', '.join(missing)} (Admin > Variables; docs/managed-spark.md)")
    config = PulsarHook(PULSAR_CONN_ID).config
    return {**values, "service_url": config.service_url, "admin_url": config.admin_url or ""}


def current_run_id() -> str:
    context = get_current_context()
    return recipes.default_run_id(context["dag"].dag_id, "replay", context["run_id"])


class ProviderMissing(BaseOperator):
    """Stands in for a service's operator whose provider is not installed: fails, naming the package."""

    def __init__(self, *, operator: str, package: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.message = f"{operator} needs {package}: pip install {package} (see docs/managed-spark.md)"

    def execute(self, context: Any) -> None:
        raise RuntimeError(self.message)


def submit(task_id: str, operator_path: str, package: str, **kwargs: Any) -> BaseOperator:
    """The service's operator, or (its provider missing) a task that fails naming the package."""
    module, _, name = operator_path.rpartition(".")
    try:
        operator: type[BaseOperator] = getattr(importlib.import_module(module), name)
    except ImportError:
        return ProviderMissing(task_id=task_id, pool=REPLAY_POOL, operator=name, package=package)
    return operator(task_id=task_id, pool=REPLAY_POOL, **kwargs)


def recipe_dag(
    dag_id: str,
    build: Callable[[str, Mapping[str, str]], Any],
    extra: Mapping[str, str | None],
    make_submit: Callable[[Any], BaseOperator],
) -> DAG:
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        tags=["dlq", "pulsar", "managed-spark"],
        doc_md=__doc__,
    ) as dag:

        @task(task_id="spec")
        def spec() -> Any:
            return build(current_run_id(), run_settings(extra))

        @task(task_id="report")
        def report() -> dict[str, Any]:
            settings = run_settings({})
            conn_id = settings["dlq_storage_conn_id"] or None
            return recipes.read_replay_report(settings["dlq_output_dir"], current_run_id(), conn_id)

        spec_output = spec()
        replay = make_submit(spec_output)
        spec_output >> replay >> report()
    return dag


# [START howto_dlq_managed_kubernetes]
kubernetes_dag = recipe_dag(
    "dlq_managed_kubernetes",
    kubernetes_spec,
    {"dlq_k8s_image": "", "dlq_k8s_namespace": ""},
    lambda spec: submit(
        "replay",
        "airflow.providers.cncf.kubernetes.operators.spark_kubernetes.SparkKubernetesOperator",
        "apache-airflow-providers-cncf-kubernetes",
        application_file=spec,
        namespace="{{ var.value.get('dlq_k8s_namespace', '') or 'default' }}",
    ),
)
# [END howto_dlq_managed_kubernetes]

# [START howto_dlq_managed_databricks]
databricks_dag = recipe_dag(
    "dlq_managed_databricks",
    databricks_spec,
    {"dlq_databricks_spark_version": "", "dlq_databricks_node_type": ""},
    lambda spec: submit(
        "replay",
        "airflow.providers.databricks.operators.databricks.DatabricksSubmitRunOperator",
        "apache-airflow-providers-databricks",
        json=spec,
    ),
)
# [END howto_dlq_managed_databricks]

# [START howto_dlq_managed_emr_serverless]
emr_serverless_dag = recipe_dag(
    "dlq_managed_emr_serverless",
    emr_serverless_spec,
    {"dlq_emr_python_env": ""},
    lambda spec: submit(
        "replay",
        "airflow.providers.amazon.aws.operators.emr.EmrServerlessStartJobOperator",
        "apache-airflow-providers-amazon",
        application_id="{{ var.value.dlq_emr_application_id }}",
        execution_role_arn="{{ var.value.dlq_emr_role_arn }}",
        job_driver=spec,
        configuration_overrides={},
    ),
)
# [END howto_dlq_managed_emr_serverless]

# [START howto_dlq_managed_dataproc]
dataproc_dag = recipe_dag(
    "dlq_managed_dataproc",
    dataproc_spec,
    {"dlq_gcp_project": None, "dlq_dataproc_cluster": ""},
    lambda spec: submit(
        "replay",
        "airflow.providers.google.cloud.operators.dataproc.DataprocSubmitJobOperator",
        "apache-airflow-providers-google",
        job=spec,
        region="{{ var.value.dlq_gcp_region }}",
        project_id="{{ var.value.dlq_gcp_project }}",
    ),
)
# [END howto_dlq_managed_dataproc]
