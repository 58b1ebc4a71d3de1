"""Event-driven DLQ replay: a DAG scheduled on a Pulsar DLQ's backlog instead of a clock.

An ``AssetWatcher`` runs ``MessageQueueTrigger(scheme="pulsar", ...)`` in the triggerer: when the
replayer subscription's backlog on the DLQ topics reaches ``DLQ_EVENT_MIN_BACKLOG`` new messages (or the
oldest new one is ``DLQ_EVENT_MAX_AGE_SECONDS`` old), it updates the asset ``pulsar_dlq_backlog`` and this
DAG runs: ``replay`` (``DlqReplayOperator``) -> ``report`` and ``rearm_backlog_watch``. The watch never
consumes or acks, and fires once per backlog: only the re-arm after a successful replay lets it fire
again, for messages above what that replay left pending (see ``docs/event-driven.md``).

Configuration, read when the file is parsed (a watcher's trigger arguments are fixed at parse time):
``DLQ_EVENT_TOPICS`` (comma-separated DLQ topics), ``DLQ_EVENT_SUBSCRIPTION`` (``dlq-replayer``),
``DLQ_EVENT_MIN_BACKLOG`` (100), ``DLQ_EVENT_MAX_AGE_SECONDS`` (unset), ``DLQ_EVENT_POLL_SECONDS`` (30),
``DLQ_EVENT_REFIRE_AFTER_SECONDS`` (unset). The replay reads the same Variables as ``dlq_nightly_replay``
when it runs (``dlq_playbook``, ``dlq_output_dir``, ``dlq_origin_allowlist``). Connections:
``pulsar_default`` (with ``admin_url`` for message ages) and ``spark_default``.

**Dry-run until you opt in.** A run started by the backlog only reports what a replay would do until
Variable ``dlq_event_driven_mode`` is ``replay`` (or ``archive-only``): the shared
``dlq_origin_allowlist`` alone never lets a backlog republish without a person's say.

:func:`event_driven_replay` builds the same DAG for other DLQs (one asset and DAG per DLQ group).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_provider_dlq.operators.backlog_watch import DlqBacklogRearmOperator
from airflow_provider_dlq.operators.replay import DlqReplayOperator
from airflow_provider_dlq.operators.report import format_summary

DEFAULT_TOPICS = "persistent://public/default/orders-order-service-DLQ"
DEFAULT_OUTPUT_DIR = os.environ.get("DLQ_DATA_DIR") or str(
    Path(os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))) / "dlq"
)
REPORT_ASSET = Asset(name="dlq_replay_reports")
#: The one-slot pool shared with the other replay DAGs: never two replays at once (``dlq_nightly_replay``).
REPLAY_POOL = os.environ.get("DLQ_REPLAY_POOL", "dlq_replay")


def _env_float(name: str) -> float | None:
    value = os.environ.get(name, "").strip()
    return float(value) if value else None


def _var(name: str, default: str) -> str:
    """A Jinja expression: Variable ``name``, or ``default`` when unset or empty."""
    return f"{{{{ var.value.get('{name}', '') or '{default}' }}}}"


def dlq_backlog_asset(
    name: str,
    *,
    topics: list[str],
    subscription: str = "dlq-replayer",
    pulsar_conn_id: str = "pulsar_default",
    min_backlog: int | None = 100,
    max_age_seconds: float | None = None,
    poll_interval: float = 30.0,
    refire_after_seconds: float | None = None,
) -> Asset:
    """An asset updated whenever the DLQ backlog crosses the threshold (once per backlog)."""
    # [START howto_pulsar_dlq_asset_watcher]
    trigger = MessageQueueTrigger(
        scheme="pulsar",
        topics=topics,
        subscription=subscription,
        pulsar_conn_id=pulsar_conn_id,
        min_backlog=min_backlog,
        max_age_seconds=max_age_seconds,
        poll_interval=poll_interval,
        refire_after_seconds=refire_after_seconds,
    )
    return Asset(name=name, watchers=[AssetWatcher(name=f"{name}_watcher", trigger=trigger)])
    # [END howto_pulsar_dlq_asset_watcher]


def event_driven_replay(
    dag_id: str,
    backlog: Asset,
    *,
    topics: list[str],
    subscription: str = "dlq-replayer",
    pulsar_conn_id: str = "pulsar_default",
    mode: str | None = None,
    playbook: str | None = None,
    output_dir: str | None = None,
    origin_allowlist: str | None = None,
    replay_kwargs: dict[str, Any] | None = None,
) -> DAG:
    """The replay DAG of one DLQ backlog asset; arguments left ``None`` come from Variables at run time.

    ``mode`` left ``None`` is Variable ``dlq_event_driven_mode``, ``dry-run`` when unset: replaying on a
    backlog is an explicit choice (``mode="replay"`` here, or the Variable)."""
    # [START howto_dlq_event_driven_replay]
    with DAG(
        dag_id=dag_id,
        description="Replay a Pulsar DLQ when its backlog crosses a threshold (event-driven)",
        schedule=[backlog],
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 2, "retry_delay": timedelta(minutes=2)},
        tags=["dlq", "pulsar", "spark", "event-driven"],
        doc_md=__doc__,
    ) as dag:
        replay = DlqReplayOperator(
            task_id="replay",
            topics=topics,
            subscription=subscription,
            pulsar_conn_id=pulsar_conn_id,
            # Dry-run unless opted in: mode="replay" here, or Variable dlq_event_driven_mode=replay.
            mode=mode or _var("dlq_event_driven_mode", "dry-run"),
            playbook=playbook or "{{ var.value.get('dlq_playbook', '') }}",
            output_dir=output_dir or _var("dlq_output_dir", DEFAULT_OUTPUT_DIR),
            # No built-in allowlist: unset, the replay refuses to start (nothing is republished).
            origin_allowlist=origin_allowlist or "{{ var.value.get('dlq_origin_allowlist', '') }}",
            outlets=[REPORT_ASSET],
            pool=REPLAY_POOL,
            pool_slots=1,
            **(replay_kwargs or {}),
        )

        @task
        def report(summary: dict[str, object]) -> str:
            """Print the run's per-group summary and where its report, archive and ledger are."""
            text = format_summary(summary)
            print(text)
            return text

        # Only after a successful replay: the watch fires again for messages above what it left pending.
        rearm = DlqBacklogRearmOperator(
            task_id="rearm_backlog_watch", asset=backlog, replay_summary=replay.output
        )
        report(replay.output)  # type: ignore[arg-type]  # an XComArg resolves to the summary at run time
        replay >> rearm
    # [END howto_dlq_event_driven_replay]
    return dag


TOPICS = [t.strip() for t in os.environ.get("DLQ_EVENT_TOPICS", DEFAULT_TOPICS).split(",") if t.strip()]
SUBSCRIPTION = os.environ.get("DLQ_EVENT_SUBSCRIPTION", "dlq-replayer")
DLQ_BACKLOG = dlq_backlog_asset(
    "pulsar_dlq_backlog",
    topics=TOPICS,
    subscription=SUBSCRIPTION,
    min_backlog=int(os.environ.get("DLQ_EVENT_MIN_BACKLOG", "100")),
    max_age_seconds=_env_float("DLQ_EVENT_MAX_AGE_SECONDS"),
    poll_interval=float(os.environ.get("DLQ_EVENT_POLL_SECONDS", "30")),
    refire_after_seconds=_env_float("DLQ_EVENT_REFIRE_AFTER_SECONDS"),
)
dag = event_driven_replay("dlq_event_driven_replay", DLQ_BACKLOG, topics=TOPICS, subscription=SUBSCRIPTION)
