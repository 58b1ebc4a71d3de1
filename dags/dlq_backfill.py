"""Manual DLQ backfill: replay chosen DLQ topics with chosen filters; ``dry-run`` unless you say otherwise.

Trigger it from the UI form (every field may stay empty: the form says what empty means) or
``airflow dags trigger dlq_backfill -c '{"topics": [...], "mode": "replay"}'``. Every field is validated
against its ``Param`` schema before the run starts; the operator validates the combination (topics
given here or in Variable ``dlq_topics``; ``replay`` needs an origin allowlist; ``since`` before
``until``).

An empty field falls back to the Airflow Variable of ``dlq_nightly_replay`` (``dlq_topics``,
``dlq_playbook``, ``dlq_origin_allowlist``; also ``dlq_output_dir`` and ``dlq_subscription``); retries
come from ``DLQ_REPLAY_RETRIES`` / ``DLQ_REPLAY_RETRY_DELAY_SECONDS`` (environment, read at parse time).
A retried ``replay`` task keeps its run id, so it resumes the same replay. The task's *DLQ replay report*
link opens the run's report. The ``dry_run`` and ``replay`` tasks run in the one-slot pool
``dlq_replay`` shared with the other replay DAGs: a backfill waits for a nightly replay and the other way
round.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Asset, Param, task

from airflow_provider_dlq.operators.approval import DlqGroupApprovalOperator
from airflow_provider_dlq.operators.replay import DlqReplayOperator
from airflow_provider_dlq.operators.report import format_summary

DEFAULT_OUTPUT_DIR = os.environ.get("DLQ_DATA_DIR") or str(
    Path(os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))) / "dlq"
)
REPORT_ASSET = Asset(name="dlq_replay_reports")
#: The one-slot pool shared with ``dlq_nightly_replay`` (see its docstring).
REPLAY_POOL = os.environ.get("DLQ_REPLAY_POOL", "dlq_replay")
_ISO = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?$"
_TOPIC = r"^((persistent://)?[^/\s]+/[^/\s]+/)?[^/\s]+$"


TOPICS = "{{ (params.topics or []) | join(',') or var.value.get('dlq_topics', '') }}"
SUBSCRIPTION = "{{ var.value.get('dlq_subscription', '') or 'dlq-replayer' }}"
PLAYBOOK = "{{ params.playbook or var.value.get('dlq_playbook', '') }}"
OUTPUT_DIR = "{{ var.value.get('dlq_output_dir', '') or '" + DEFAULT_OUTPUT_DIR + "' }}"
ALLOWLIST = "{{ params.origin_allowlist or var.value.get('dlq_origin_allowlist', '') }}"

# [START howto_dlq_backfill]
with DAG(
    dag_id="dlq_backfill",
    description="Replay chosen Pulsar DLQ topics on demand (dry-run by default)",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={
        "retries": int(os.environ.get("DLQ_REPLAY_RETRIES", "2")),
        "retry_delay": timedelta(seconds=float(os.environ.get("DLQ_REPLAY_RETRY_DELAY_SECONDS", "120"))),
    },
    tags=["dlq", "pulsar", "spark"],
    doc_md=__doc__,
    params={
        "topics": Param(
            None,
            type=["null", "array"],
            items={"type": "string", "pattern": _TOPIC},
            title="DLQ topics",
            description="DLQ topics to replay, one per line (persistent://tenant/ns/name). Empty: the topics "
            "in Variable dlq_topics.",
        ),
        "mode": Param(
            "dry-run",
            enum=["dry-run", "replay", "archive-only"],
            title="Mode",
            description="dry-run (default) only reports what a replay would do; replay republishes, "
            "archives and acks; archive-only never republishes.",
        ),
        "playbook": Param(
            None,
            type=["null", "string"],
            title="Playbook",
            description="Path of the playbook YAML on the Spark driver. Empty: Variable dlq_playbook; "
            "without either, no rule applies and every message is only reported (left pending).",
        ),
        "origin_allowlist": Param(
            None,
            type=["null", "string"],
            title="Origin allowlist",
            description="Comma-separated globs (or re:<regex>) of topics messages may be republished to. "
            "Empty: Variable dlq_origin_allowlist. Mode replay needs one of them.",
        ),
        "since": Param(
            None,
            type=["null", "string"],
            pattern=_ISO,
            title="Since",
            description="Only messages published at/after this ISO 8601 time (UTC if no offset). "
            "Empty: no lower bound.",
        ),
        "until": Param(
            None,
            type=["null", "string"],
            pattern=_ISO,
            title="Until",
            description="Only messages published before this ISO 8601 time. Empty: no upper bound.",
        ),
        "max_messages": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Max messages",
            description="Act on at most this many messages (oldest first). Empty: no limit.",
        ),
        "signatures": Param(
            None,
            type=["null", "array"],
            items={"type": "string"},
            title="Error signatures",
            description="Only these error groups, one signature per line (from a report). "
            "Empty: every group.",
        ),
        "error_class": Param(
            None,
            type=["null", "string"],
            title="Error class",
            description="Only this error class (full or simple name). Empty: every class.",
        ),
    },
) as dag:
    dry_run = DlqReplayOperator(
        task_id="dry_run",
        topics=TOPICS,
        subscription=SUBSCRIPTION,
        mode="dry-run",
        playbook=PLAYBOOK,
        output_dir=OUTPUT_DIR,
        origin_allowlist=ALLOWLIST,
        since="{{ params.since or '' }}",
        until="{{ params.until or '' }}",
        max_messages="{{ params.max_messages or '' }}",
        signatures="{{ (params.signatures or []) | join(',') }}",
        error_class="{{ params.error_class or '' }}",
        spark_history_url="{{ var.value.get('spark_history_url', '') }}",
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

    @task.short_circuit
    def wants_replay(params: dict[str, object] | None = None) -> bool:
        """Stop after the report in dry-run mode; otherwise ask for approval."""
        return params is not None and params.get("mode") != "dry-run"

    # A person approves, per error group, what the replay may do (Airflow's human-in-the-loop form).
    approve = DlqGroupApprovalOperator(
        task_id="approve",
        dry_run_summary=dry_run.output,
        response_timeout_seconds="{{ var.value.get('dlq_approval_timeout_seconds', '') or 86400 }}",
    )
    # Acts only on the approved groups, on the messages the dry-run showed (its window and scope).
    replay = DlqReplayOperator(
        task_id="replay",
        topics=TOPICS,
        subscription=SUBSCRIPTION,
        mode="{{ params.mode }}",
        playbook=PLAYBOOK,
        output_dir=OUTPUT_DIR,
        origin_allowlist=ALLOWLIST,
        spark_history_url="{{ var.value.get('spark_history_url', '') }}",
        group_actions="{{ ti.xcom_pull(task_ids='approve')['actions'] | tojson }}",
        window_from="{{ ti.xcom_pull(task_ids='dry_run')['run_id'] }}",
        outlets=[REPORT_ASSET],
        pool=REPLAY_POOL,
        pool_slots=1,
    )

    report(dry_run.output) >> wants_replay() >> approve >> replay  # type: ignore[arg-type]
    report.override(task_id="replay_report")(replay.output)  # type: ignore[arg-type]
# [END howto_dlq_backfill]
