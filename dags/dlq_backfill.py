"""Manual DLQ backfill: replay chosen DLQ topics with chosen filters; ``dry-run`` unless you say otherwise.

Trigger it from the UI form or ``airflow dags trigger dlq_backfill -c '{"topics": [...], "mode": "replay"}'``.
Every field is validated against its ``Param`` schema before the run starts; the operator validates the
combination (``replay`` needs an origin allowlist, ``since`` before ``until``).

Defaults come from the same Airflow Variables as ``dlq_nightly_replay`` (``dlq_topics``, ``dlq_playbook``,
``dlq_output_dir``, ``dlq_origin_allowlist``, ``dlq_subscription``) when a field is left empty; retries
from ``DLQ_REPLAY_RETRIES`` / ``DLQ_REPLAY_RETRY_DELAY_SECONDS`` (environment, read at parse time). A
retried ``replay`` task keeps its run id, so it resumes the same replay. The ``replay`` task runs in the
one-slot pool ``dlq_replay`` shared with ``dlq_nightly_replay``: a backfill waits for a nightly replay
and the other way round.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Asset, Param, task

from airflow_provider_dlq.operators.replay import DlqReplayOperator
from airflow_provider_dlq.operators.report import format_summary

DEFAULT_TOPICS = "persistent://public/default/orders-order-service-DLQ"
DEFAULT_ALLOWLIST = "persistent://public/default/orders"
DEFAULT_OUTPUT_DIR = os.environ.get("DLQ_DATA_DIR") or str(
    Path(os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))) / "dlq"
)
REPORT_ASSET = Asset(name="dlq_replay_reports")
#: The one-slot pool shared with ``dlq_nightly_replay`` (see its docstring).
REPLAY_POOL = os.environ.get("DLQ_REPLAY_POOL", "dlq_replay")
_ISO = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?$"
_TOPIC = r"^((persistent://)?[^/\s]+/[^/\s]+/)?[^/\s]+$"


def _param_or_var(param: str, var: str, default: str) -> str:
    """A Jinja expression: the run's param, else Variable ``var``, else ``default``."""
    return f"{{{{ params.{param} or var.value.get('{var}', '') or '{default}' }}}}"


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
            [],
            type="array",
            items={"type": "string", "pattern": _TOPIC},
            title="DLQ topics",
            description="DLQ topics to replay; empty means Variable dlq_topics.",
        ),
        "mode": Param(
            "dry-run",
            enum=["dry-run", "replay", "archive-only"],
            title="Mode",
            description="dry-run only reports; replay republishes, archives and acks; archive-only never "
            "republishes.",
        ),
        "playbook": Param(
            "",
            type="string",
            title="Playbook",
            description="Path of the playbook YAML; empty means Variable dlq_playbook (none: skip all).",
        ),
        "origin_allowlist": Param(
            "",
            type="string",
            title="Origin allowlist",
            description="Comma-separated globs (or re:<regex>) of republish targets; empty means Variable "
            "dlq_origin_allowlist.",
        ),
        "since": Param(
            None,
            type=["null", "string"],
            pattern=_ISO,
            title="Since",
            description="Only messages published at/after this ISO 8601 time (UTC if no offset).",
        ),
        "until": Param(
            None,
            type=["null", "string"],
            pattern=_ISO,
            title="Until",
            description="Only messages published before this ISO 8601 time.",
        ),
        "max_messages": Param(
            None, type=["null", "integer"], minimum=1, title="Max messages", description="Act on at most N."
        ),
        "signatures": Param(
            [], type="array", items={"type": "string"}, title="Error signatures", description="From a report."
        ),
        "error_class": Param(None, type=["null", "string"], title="Error class"),
    },
) as dag:
    replay = DlqReplayOperator(
        task_id="replay",
        topics="{{ (params.topics | join(',')) or var.value.get('dlq_topics', '') or '"
        + DEFAULT_TOPICS
        + "' }}",
        subscription="{{ var.value.get('dlq_subscription', '') or 'dlq-replayer' }}",
        mode="{{ params.mode }}",
        playbook="{{ params.playbook or var.value.get('dlq_playbook', '') }}",
        output_dir="{{ var.value.get('dlq_output_dir', '') or '" + DEFAULT_OUTPUT_DIR + "' }}",
        origin_allowlist=_param_or_var("origin_allowlist", "dlq_origin_allowlist", DEFAULT_ALLOWLIST),
        since="{{ params.since or '' }}",
        until="{{ params.until or '' }}",
        max_messages="{{ params.max_messages or '' }}",
        signatures="{{ params.signatures | join(',') }}",
        error_class="{{ params.error_class or '' }}",
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

    report(replay.output)  # type: ignore[arg-type]  # an XComArg resolves to the summary at run time
# [END howto_dlq_backfill]
