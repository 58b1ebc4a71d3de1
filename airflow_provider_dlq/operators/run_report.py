"""Read a finished replay run's ``report.json`` wherever its output root is; the app's summary line only
when the worker cannot read the root."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from airflow_provider_dlq.output_storage import OutputStorageError, read_bytes
from pulsar_dlq_consumer.replay_options import SUMMARY_PREFIX

if TYPE_CHECKING:
    import logging

    from airflow.sdk.types import Logger


class ReportNotFound(OutputStorageError, RuntimeError):
    """The run's report is neither at its output root nor in the app's stdout."""


def read_run_report(
    location: str, run_id: str, summary_line: str | None, conn_id: str | None, log: Logger | logging.Logger
) -> dict[str, Any]:
    """The report at ``location``; else the summary line; else :class:`ReportNotFound` naming the fix."""
    problem = "it does not exist"
    try:
        return dict(json.loads(read_bytes(location, conn_id)))
    except FileNotFoundError:
        pass
    except OutputStorageError as exc:
        problem = str(exc)
        log.warning("report.json of run %s is not readable from the worker: %s", run_id, problem)
    if summary_line:
        log.info("Using the app's summary line for run %s (report.json at %s not read)", run_id, location)
        return dict(json.loads(summary_line[len(SUMMARY_PREFIX) :]))
    raise ReportNotFound(
        f"spark-submit finished but no report was found at {location} ({problem}) and the app printed no "
        f"{SUMMARY_PREFIX.strip()} line; check the Spark driver log of run {run_id!r}, and that "
        "storage_conn_id (or the worker's environment) can read the output_dir."
    )
