"""Canary DLQ replay: replay a few messages of each error group first, and halt the groups that fail again.

``replay`` (``DlqReplayOperator`` with ``canary``) -> ``report``. Per error group the first
``canary`` messages (a count, or a percentage such as ``10%``) are republished; after
``canary_wait_seconds`` the run reads the DLQ (and its ``-RETRY`` topic) for those messages coming back:
a group whose canaries fail again more often than ``canary_max_failure_rate`` is halted, its other
messages stay pending as ``canary_failed``; the other groups are replayed in full (docs/canary.md).

Manual (``schedule=None``). Variables, read when the task runs: ``dlq_topics``, ``dlq_subscription``,
``dlq_playbook``, ``dlq_output_dir``, ``dlq_origin_allowlist`` (as ``dlq_nightly_replay``) and
``dlq_canary`` (default ``5``). Environment, read at parse time: ``DLQ_CANARY_WAIT_SECONDS`` (300),
``DLQ_CANARY_MAX_FAILURE_RATE`` (0: any re-failure halts the group).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Asset, task

from airflow_provider_dlq.operators.replay import DlqReplayOperator
from airflow_provider_dlq.operators.report import format_summary

DEFAULT_OUTPUT_DIR = os.environ.get("DLQ_DATA_DIR") or str(
    Path(os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))) / "dlq"
)
REPORT_ASSET = Asset(name="dlq_replay_reports")
#: The one-slot pool shared with the other replay DAGs: never two replays at once (``dlq_nightly_replay``).
REPLAY_POOL = os.environ.get("DLQ_REPLAY_POOL", "dlq_replay")


def _var(name: str, default: str) -> str:
    """A Jinja expression: Variable ``name``, or ``default`` when unset or empty."""
    return f"{{{{ var.value.get('{name}', '') or '{default}' }}}}"


def canary_replay(
    dag_id: str,
    *,
    canary: str = _var("dlq_canary", "5"),
    canary_wait_seconds: float = 300.0,
    canary_max_failure_rate: float = 0.0,
    **overrides: Any,
) -> DAG:
    """The canary replay DAG; ``overrides`` replace ``DlqReplayOperator`` arguments (topics, ...)."""
    arguments: dict[str, Any] = {
        # No built-in topics or allowlist: unconfigured, the run stops before reading anything.
        "topics": "{{ var.value.get('dlq_topics', '') }}",
        "subscription": _var("dlq_subscription", "dlq-replayer"),
        "playbook": "{{ var.value.get('dlq_playbook', '') }}",
        "output_dir": _var("dlq_output_dir", DEFAULT_OUTPUT_DIR),
        "origin_allowlist": "{{ var.value.get('dlq_origin_allowlist', '') }}",
        **overrides,
    }
    # [START howto_dlq_canary_replay]
    with DAG(
        dag_id=dag_id,
        description="Replay Pulsar DLQs canary-first: groups whose canary fails again are halted",
        schedule=None,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
        tags=["dlq", "pulsar", "spark", "canary"],
        doc_md=__doc__,
    ) as dag:
        replay = DlqReplayOperator(
            task_id="replay",
            mode="replay",
            canary=canary,  # per error group: a count ("5") or a share ("10%")
            canary_wait_seconds=canary_wait_seconds,  # time the consumers get to fail them again
            canary_max_failure_rate=canary_max_failure_rate,  # halt above this share of re-failures
            outlets=[REPORT_ASSET],
            pool=REPLAY_POOL,
            pool_slots=1,
            **arguments,
        )

        @task
        def report(summary: dict[str, object]) -> str:
            """Print the run's per-group summary (``canary_failed`` counts the halted messages)."""
            text = format_summary(summary)
            print(text)
            return text

        report(replay.output)  # type: ignore[arg-type]  # an XComArg resolves to the summary at run time
    # [END howto_dlq_canary_replay]
    return dag


dag = canary_replay(
    "dlq_canary_replay",
    canary_wait_seconds=float(os.environ.get("DLQ_CANARY_WAIT_SECONDS", "300")),
    canary_max_failure_rate=float(os.environ.get("DLQ_CANARY_MAX_FAILURE_RATE", "0")),
)
