"""The listener that creates the one-slot pool the example DAGs' replay tasks run in (``docs/dags.md``)."""

from __future__ import annotations

import logging
import os
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

#: The pool's default name; ``DLQ_REPLAY_POOL`` renames it (read by the DAGs and by this listener).
DEFAULT_POOL = "dlq_replay"
DESCRIPTION = "One DLQ replay at a time (created by airflow-provider-dlq; change the slots as you need)"


@hookimpl
def on_starting(component: Any) -> None:
    """When a scheduler, DAG processor or triggerer starts: create the replay pool (one slot) if missing."""
    from airflow.jobs.job import Job

    if not isinstance(component, Job):  # e.g. a task runner: no database access
        return
    pool_name = os.environ.get("DLQ_REPLAY_POOL", "").strip() or DEFAULT_POOL
    try:
        from airflow.models.pool import Pool
        from airflow.utils.session import create_session

        with create_session() as session:
            if Pool.get_pool(pool_name, session=session) is not None:
                return
            session.add(Pool(pool=pool_name, slots=1, description=DESCRIPTION, include_deferred=False))
    except Exception as exc:  # two components starting at once, a read-only database, ...
        log.warning(
            "Could not create the pool %r for the DLQ replay DAGs (%s: %s); create it with "
            '`airflow pools set %s 1 "one DLQ replay at a time"`',
            pool_name,
            type(exc).__name__,
            exc,
            pool_name,
        )
        return
    log.info("Created the pool %r (1 slot) for the DLQ replay DAGs", pool_name)
