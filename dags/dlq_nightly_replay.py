"""Nightly DLQ replay: check the configuration, wait for a backlog on the DLQ topics, replay, report.

``check_configuration`` -> ``wait_for_dlq_backlog`` (deferrable, ``soft_fail``) -> ``replay``
(``DlqReplayOperator``) -> ``report``. With nothing pending the run ends *skipped* after the sensor
timeout instead of failing.

**Safe by default.** Unpausing this DAG with no configuration republishes nothing: without Variable
``dlq_topics`` every run is skipped with a message saying what to set, and until Variable
``dlq_nightly_mode`` is ``replay`` the runs are dry-runs (they report what a replay would do and change
nothing). ``replay`` also needs Variable ``dlq_origin_allowlist``; a run without it fails before it
waits. Going live: set ``dlq_topics``, ``dlq_playbook``, ``dlq_origin_allowlist``, check a dry-run's
report, then set ``dlq_nightly_mode`` to ``replay`` (``docs/dags.md``, "Going live").

Configuration (no addresses in this file):

* Connections ``pulsar_default`` (conn type ``pulsar``) and ``spark_default`` (conn type ``spark``).
* Airflow Variables, read when tasks run (``airflow variables set`` or ``AIRFLOW_VAR_<NAME>``):
  ``dlq_topics`` (comma-separated DLQ topics or globs), ``dlq_subscription``, ``dlq_playbook``,
  ``dlq_output_dir``, ``dlq_origin_allowlist``, ``dlq_nightly_mode`` (``dry-run`` by default, ``replay``
  or ``archive-only``), ``spark_history_url`` (optional: the Spark history server for the task's link).
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

import logging
import os
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Asset, task
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_dlq.operators.replay import DlqReplayOperator
from airflow_provider_dlq.operators.report import format_summary
from airflow_provider_dlq.sensors.backlog import DlqBacklogSensor
from airflow_provider_dlq.triggers.backlog import topics_from_backlog

MODES = ("dry-run", "replay", "archive-only")
GO_LIVE = (
    "To go live set the Variables dlq_topics (DLQ topics or globs), dlq_playbook, dlq_origin_allowlist, "
    "check a dry-run's report, then set dlq_nightly_mode=replay (docs/dags.md, 'Going live')."
)
DEFAULT_OUTPUT_DIR = os.environ.get("DLQ_DATA_DIR") or str(
    Path(os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))) / "dlq"
)
#: Updated by every replay run; the event's ``extra`` holds the run summary and the report paths.
REPORT_ASSET = Asset(name="dlq_replay_reports")
#: The task log (a logger's lines come in order with Airflow's own; ``print`` can land after them).
log = logging.getLogger("airflow.task")
#: One slot, shared with ``dlq_backfill``: never two replays at once (create it with
#: ``airflow pools set dlq_replay 1 "one DLQ replay at a time"``; the docker stack's init does).
REPLAY_POOL = os.environ.get("DLQ_REPLAY_POOL", "dlq_replay")


def _var(name: str, default: str = "") -> str:
    """A Jinja expression: Variable ``name``, or ``default`` when unset or empty."""
    return f"{{{{ var.value.get('{name}', '') or '{default}' }}}}"


def readiness(topics: str, mode: str, allowlist: str) -> str:
    """What a run will do with this configuration; skips when unconfigured, fails when unsafe.

    Raises ``AirflowSkipException`` without topics and ``ValueError`` for a bad mode or ``replay``
    without an origin allowlist, before anything waits or runs.
    """
    mode = mode.strip() or "dry-run"
    if not topics.strip():
        raise AirflowSkipException(f"Variable dlq_topics is not set, so there is nothing to watch. {GO_LIVE}")
    if mode not in MODES:
        raise ValueError(f"Variable dlq_nightly_mode must be one of {', '.join(MODES)}; got {mode!r}.")
    if mode == "replay" and not allowlist.strip():
        raise ValueError(
            "Variable dlq_nightly_mode is replay but dlq_origin_allowlist is empty: a replay republishes to "
            "origin topics named by message properties, so it needs the topics it may write to (globs or "
            "re:<regex>). Set dlq_origin_allowlist, or set dlq_nightly_mode=dry-run."
        )
    if mode == "dry-run":
        return f"dry-run on {topics}: the run reports what a replay would do and changes nothing. {GO_LIVE}"
    return f"{mode} on {topics}, republishing only to {allowlist or '(archive-only: nowhere)'}"


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

    @task(retries=0)
    def check_configuration(topics: str, mode: str, allowlist: str) -> str:
        """Skip when dlq_topics is unset; fail early when the mode is unsafe; log what the run will do.

        The reason comes first in the task's log (not only in the collapsed post-execute section)."""
        try:
            plan = readiness(topics, mode, allowlist)
        except AirflowSkipException as skip:
            log.warning("Skipped: %s", skip)
            raise
        except ValueError as error:
            log.error("Not started: %s", error)
            raise
        log.info("%s", plan)
        return plan

    checked = check_configuration(
        _var("dlq_topics"), _var("dlq_nightly_mode", "dry-run"), _var("dlq_origin_allowlist")
    )

    wait_for_backlog = DlqBacklogSensor(
        task_id="wait_for_dlq_backlog",
        topics=_var("dlq_topics"),
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
        mode=_var("dlq_nightly_mode", "dry-run"),
        playbook="{{ var.value.get('dlq_playbook', '') }}",
        output_dir=_var("dlq_output_dir", DEFAULT_OUTPUT_DIR),
        origin_allowlist=_var("dlq_origin_allowlist"),
        spark_history_url=_var("spark_history_url"),
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

    checked >> wait_for_backlog >> replay
    report(replay.output)  # type: ignore[arg-type]  # an XComArg resolves to the summary at run time
# [END howto_dlq_nightly_replay]
