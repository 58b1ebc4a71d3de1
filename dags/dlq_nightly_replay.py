"""Nightly DLQ replay: wait for a backlog on the DLQ topics, replay them with Spark, report.

``wait_for_dlq_backlog`` (deferrable, ``soft_fail``) -> ``replay`` (``DlqReplayOperator``) -> ``report``.
With nothing pending the run ends *skipped* after the sensor timeout instead of failing.

Configuration (no addresses in this file):

* Connections ``pulsar_default`` (conn type ``pulsar``) and ``spark_default`` (conn type ``spark``).
* Airflow Variables, read when tasks run (``airflow variables set`` or ``AIRFLOW_VAR_<NAME>``):
  ``dlq_topics`` (comma-separated DLQ topics or globs), ``dlq_subscription``, ``dlq_playbook``,
  ``dlq_output_dir``, ``dlq_origin_allowlist``, ``dlq_nightly_mode`` (``replay``, ``dry-run`` or
  ``archive-only``). The defaults target the demo's ``orders`` service on the embedded broker.
* Environment, read when the DAG file is parsed (scheduling knobs only): ``DLQ_NIGHTLY_SCHEDULE`` (cron,
  default ``0 2 * * *``), ``DLQ_SENSOR_POLL_SECONDS`` (60), ``DLQ_SENSOR_TIMEOUT_SECONDS`` (900),
  ``DLQ_REPLAY_RETRIES`` (2), ``DLQ_REPLAY_RETRY_DELAY_SECONDS`` (120), ``DLQ_DATA_DIR`` (default output
  root when the variable is unset), ``DLQ_REPLAY_POOL`` (``dlq_replay``).
* The Airflow pool ``dlq_replay`` with **one** slot, shared with ``dlq_backfill``, so the two DAGs never
  replay at the same time (the replay app also refuses a second run on the same output directory or
  DLQ subscription): ``airflow pools set dlq_replay 1 "one DLQ replay at a time"``.

A retried ``replay`` task keeps its run id (derived from the DAG run), so it resumes the same replay.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Asset, task

from airflow_provider_dlq.operators.replay import DlqReplayOperator
from airflow_provider_dlq.operators.report import format_summary
from airflow_provider_dlq.sensors.backlog import DlqBacklogSensor
from airflow_provider_dlq.triggers.backlog import topics_from_backlog

DEFAULT_TOPICS = "persistent://public/default/orders-order-service-DLQ"
DEFAULT_ALLOWLIST = "persistent://public/default/orders"
DEFAULT_OUTPUT_DIR = os.environ.get("DLQ_DATA_DIR") or str(
    Path(os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))) / "dlq"
)
#: Updated by every replay run; the event's ``extra`` holds the run summary and the report paths.
REPORT_ASSET = Asset(name="dlq_replay_reports")
#: One slot, shared with ``dlq_backfill``: never two replays at once (create it with
#: ``airflow pools set dlq_replay 1 "one DLQ replay at a time"``; the docker stack's init does).
REPLAY_POOL = os.environ.get("DLQ_REPLAY_POOL", "dlq_replay")


def _var(name: str, default: str) -> str:
    """A Jinja expression: Variable ``name``, or ``default`` when unset or empty."""
    return f"{{{{ var.value.get('{name}', '') or '{default}' }}}}"


# [START howto_dlq_nightly_replay]
with DAG(
    dag_id="dlq_nightly_replay",
    description="Replay Pulsar DLQs nightly with Spark when they hold pending messages",
    schedule=os.environ.get("DLQ_NIGHTLY_SCHEDULE", "0 2 * * *"),
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={
        "retries": int(os.environ.get("DLQ_REPLAY_RETRIES", "2")),
        "retry_delay": timedelta(seconds=float(os.environ.get("DLQ_REPLAY_RETRY_DELAY_SECONDS", "120"))),
    },
    user_defined_filters={"topics_from_backlog": topics_from_backlog},
    tags=["dlq", "pulsar", "spark"],
    doc_md=__doc__,
) as dag:
    wait_for_backlog = DlqBacklogSensor(
        task_id="wait_for_dlq_backlog",
        topics=_var("dlq_topics", DEFAULT_TOPICS),
        subscription=_var("dlq_subscription", "dlq-replayer"),
        min_backlog=1,
        poll_interval=float(os.environ.get("DLQ_SENSOR_POLL_SECONDS", "60")),
        timeout=float(os.environ.get("DLQ_SENSOR_TIMEOUT_SECONDS", "900")),
        soft_fail=True,
        retries=0,
    )

    replay = DlqReplayOperator(
        task_id="replay",
        # Every watched topic (globs expanded by the sensor): stable when the task is retried.
        topics="{{ ti.xcom_pull(task_ids='wait_for_dlq_backlog') | topics_from_backlog }}",
        subscription=_var("dlq_subscription", "dlq-replayer"),
        mode=_var("dlq_nightly_mode", "replay"),
        playbook="{{ var.value.get('dlq_playbook', '') }}",
        output_dir=_var("dlq_output_dir", DEFAULT_OUTPUT_DIR),
        origin_allowlist=_var("dlq_origin_allowlist", DEFAULT_ALLOWLIST),
        outlets=[REPORT_ASSET],
        pool=REPLAY_POOL,
        pool_slots=1,
    )

    @task
    def report(summary: dict[str, object]) -> str:
        """Print the run's per-group summary and where its report, archive and ledger are."""
        text = format_summary(summary)
        print(text)
        return text

    wait_for_backlog >> replay
    report(replay.output)  # type: ignore[arg-type]  # an XComArg resolves to the summary at run time
# [END howto_dlq_nightly_replay]
