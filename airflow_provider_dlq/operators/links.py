"""Extra links of ``DlqReplayOperator`` (computed on the worker when the task ends)."""

from __future__ import annotations

from typing import TYPE_CHECKING
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


class DlqReplayReportLink(BaseOperatorLink):
    """The run's HTML report on the provider's API-server endpoint, or the operator's ``report_url``."""

    name = "DLQ replay report"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        if not (report_html := getattr(operator, "report_html_uri", None)):
            return ""
        if template := getattr(operator, "report_url", None):
            return str(template).replace("{report_html}", str(report_html))
        return report_endpoint(
            ti_key.dag_id, ti_key.run_id, ti_key.task_id, ti_key.map_index, base=api_base_url()
        )


class SparkApplicationLink(BaseOperatorLink):
    """The Spark application in the history server at ``spark_history_url`` (a live UI ends with the app)."""

    name = "Spark application"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        app_id = (getattr(operator, "spark_application", None) or {}).get("application_id")
        history_url = getattr(operator, "spark_history_url", None)
        if history_url and app_id:
            return f"{history_url.rstrip('/')}/history/{quote(app_id, safe='')}/"
        return ""
