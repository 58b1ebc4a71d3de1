"""Extra links of ``DlqReplayOperator``: the run's HTML report, and the Spark application.

Airflow 3 computes extra links on the worker when the task finishes and stores them in XCom, so the
links come from what the task learnt while it ran (the report's location, the Spark application id).

* **DLQ replay report** points at the provider's API-server endpoint
  ``<[api] base_url>/dlq-replay/reports/<dag_id>/<run_id>/<task_id>/<map_index>``, which finds the report
  through the task's XCom and serves it (see :mod:`airflow_provider_dlq.plugins.reports`), so it works
  whatever machine the Spark driver ran on. With the operator's ``report_url`` the link goes straight to
  the storage instead (``{report_html}`` in it is replaced by the report's URI).
* **Spark application** points at the Spark history server
  (``<spark_history_url>/history/<application id>/``) when the operator has ``spark_history_url``.
  Without one there is no link: links are made when the task ends, and the driver's live UI ends with
  the application.

A task that produced no report (failed before the report step) gets no link.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: URL prefix the provider's FastAPI app is mounted under (``airflow_provider_dlq.plugins.reports``).
PLUGIN_PREFIX = "/dlq-replay"


def api_base_url() -> str:
    """``[api] base_url`` without a trailing slash, or ``""`` (then links are relative to the UI)."""
    from airflow.sdk.configuration import conf

    return (conf.get("api", "base_url", fallback="") or "").rstrip("/")


def report_endpoint(dag_id: str, run_id: str, task_id: str, map_index: int = -1, *, base: str = "") -> str:
    """The API-server URL that serves the report of one task instance."""
    parts = (quote(str(p), safe="") for p in (dag_id, run_id, task_id, map_index))
    return f"{base}{PLUGIN_PREFIX}/reports/" + "/".join(parts)


def _key(ti_key: Any) -> tuple[str, str, str, int]:
    map_index = getattr(ti_key, "map_index", -1)
    return ti_key.dag_id, ti_key.run_id, ti_key.task_id, -1 if map_index is None else int(map_index)


class DlqReplayReportLink(BaseOperatorLink):
    """Opens the replay run's HTML report."""

    name = "DLQ replay report"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        report_html = getattr(operator, "report_html_uri", None)
        if not report_html:
            return ""
        template = getattr(operator, "report_url", None)
        if template:
            return str(template).replace("{report_html}", str(report_html))
        return report_endpoint(*_key(ti_key), base=api_base_url())


def spark_app_url(history_url: str | None, app_id: str | None) -> str:
    """History server page of ``app_id`` when a history URL is known, else ``""`` (no link: the live UI
    of a finished application is gone)."""
    if history_url and app_id:
        return f"{history_url.rstrip('/')}/history/{quote(app_id, safe='')}/"
    return ""


class SparkApplicationLink(BaseOperatorLink):
    """Opens the replay's Spark application in the Spark history server (``spark_history_url``)."""

    name = "Spark application"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        spark = getattr(operator, "spark_application", None) or {}
        return spark_app_url(getattr(operator, "spark_history_url", None), spark.get("application_id"))
