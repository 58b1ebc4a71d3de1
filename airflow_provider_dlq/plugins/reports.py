"""``DlqReplayPlugin``: serves replay reports and the guides from the Airflow API server (``/dlq-replay``).

Who may read which report, and from where: see ``docs/report.md``. The app is built on the first request."""

from __future__ import annotations

import functools
import posixpath
import re
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_dlq.errors import DlqProviderError
from airflow_provider_dlq.operators.links import PLUGIN_PREFIX
from airflow_provider_dlq.output_storage import (
    OutputStorageError,
    OutputTooLarge,
    OutputUnsupported,
    read_bytes,
    split_location,
)
from airflow_provider_dlq.plugins import replay_pool
from airflow_provider_dlq.resources import docs_dir

if TYPE_CHECKING:
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse
    from starlette.types import Receive, Scope, Send

REPORT_NAME = "report.html"
MAX_BYTES = 20_000_000


class ReportUnavailable(DlqProviderError):
    """The report cannot be served; ``status`` is the HTTP status, the message says why and what to do."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


def report_location(summary: Any) -> str:
    """``paths.report_html`` of a replay task's XCom summary, or :class:`ReportUnavailable`."""
    paths = summary.get("paths") if isinstance(summary, dict) else None
    location = paths.get("report_html") if isinstance(paths, dict) else None
    if not isinstance(location, str) or not location.strip():
        raise ReportUnavailable(
            "this task instance has no replay report: the task did not finish a replay run (its XCom "
            "return_value has no paths.report_html); see the task log"
        )
    return location.strip()


def _under(location: str, root: str) -> bool:
    scheme, path = split_location(location)
    root_scheme, root_path = split_location(root)
    if scheme != root_scheme:
        return False
    if not scheme:
        return Path(path).resolve().is_relative_to(Path(root_path).resolve())
    return path.rstrip("/").startswith(root_path.rstrip("/") + "/")


def read_report(location: str) -> bytes:
    """The report at ``location`` if ``[dlq_replay]`` allows it; else :class:`ReportUnavailable`."""
    from airflow.configuration import conf

    scheme, path = split_location(location)
    parts = posixpath.normpath(urlsplit(path).path if "://" in path else path).split("/")
    if parts[-1:] != [REPORT_NAME] or len(parts) < 3 or parts[-3] != "runs" or ".." in path.split("/"):
        raise ReportUnavailable(
            f"refusing to serve {location!r}: only <output dir>/runs/<run id>/{REPORT_NAME} files are served",
            status=403,
        )
    roots = [r.strip() for r in conf.get("dlq_replay", "report_roots", fallback="").split(",") if r.strip()]
    if roots and not any(_under(location, root) for root in roots):
        raise ReportUnavailable(
            f"refusing to serve {location!r}: it is under none of [dlq_replay] report_roots "
            f"({', '.join(roots)}); add its output dir there",
            status=403,
        )
    conn_id = conf.get("dlq_replay", "report_storage_conn_id", fallback="") or None
    try:
        return read_bytes(
            location, conn_id, conf.getint("dlq_replay", "report_max_bytes", fallback=MAX_BYTES)
        )
    except FileNotFoundError as exc:
        if scheme:
            raise ReportUnavailable(f"the report {location} does not exist (yet)") from exc
        raise ReportUnavailable(
            f"the report {location} is not on the API server's file system; the Spark driver wrote it "
            "on its own machine. Share the output dir with the API server at the same path (a volume "
            "or network file system), or use an object store (s3a://...) as output_dir"
        ) from exc
    except OutputTooLarge as exc:
        message = f"the report {location} is larger than [dlq_replay] report_max_bytes"
        raise ReportUnavailable(message, 413) from exc
    except OutputUnsupported as exc:
        raise ReportUnavailable(f"the API server {exc}; or open the report from the storage", 501) from exc
    except OutputStorageError as exc:
        raise ReportUnavailable(f"{exc}; check [dlq_replay] report_storage_conn_id", 502) from exc


#: No scripts, no external loads, no framing by other sites: the report is inert HTML with inline CSS.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "private, no-store",
}


def task_summary(dag_id: str, run_id: str, task_id: str, map_index: int) -> Any:
    """The ``return_value`` XCom of one task instance (``None`` when there is none)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(
                run_id=run_id, key="return_value", task_ids=task_id, dag_ids=dag_id, map_indexes=map_index
            ).limit(1)
        ).first()
        return None if row is None else XComModel.deserialize_value(row)


def _page(title: str, body: str) -> str:
    return (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:32px;max-width:760px;color:#222}"
        f"p{{line-height:1.5}}</style></head><body>{body}</body></html>"
    )


def problem_page(status: int, message: str) -> HTMLResponse:
    """A small, escaped HTML page that says why the report cannot be shown."""
    from fastapi.responses import HTMLResponse

    page = _page("DLQ replay report", f"<h1>DLQ replay report unavailable</h1><p>{escape(message)}</p>")
    return HTMLResponse(page, status_code=status, headers=SECURITY_HEADERS)


#: A guide's file name: ``docs/<name>.md`` (no folders, no dots but the suffix).
_GUIDE = re.compile(r"[a-z0-9][a-z0-9-]*\.md")


def create_app() -> FastAPI:
    """The FastAPI app mounted at ``/dlq-replay``: the reports, and the installed guides (public)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag
    from fastapi import Depends, FastAPI
    from fastapi.responses import HTMLResponse, PlainTextResponse, Response

    app = FastAPI(title="DLQ replay reports", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get(
        "/reports/{dag_id}/{run_id}/{task_id}/{map_index}",
        response_class=HTMLResponse,
        dependencies=[Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.XCOM))],
    )
    def report(dag_id: str, run_id: str, task_id: str, map_index: int) -> Response:
        try:
            content = read_report(report_location(task_summary(dag_id, run_id, task_id, map_index)))
        except ReportUnavailable as exc:
            return problem_page(exc.status, str(exc))
        return HTMLResponse(content, headers=SECURITY_HEADERS)

    @app.get("/docs/", response_class=HTMLResponse)
    def index() -> Response:
        items = "".join(
            f"<li><a href='{escape(p.name)}'>{escape(p.stem)}</a></li>"
            for p in sorted(docs_dir().glob("*.md"))
            if _GUIDE.fullmatch(p.name)
        )
        page = _page("DLQ replay guides", f"<h1>airflow-provider-dlq guides</h1><ul>{items}</ul>")
        return HTMLResponse(page, headers=SECURITY_HEADERS)

    @app.get("/docs/{name}", response_class=PlainTextResponse)
    def guide(name: str) -> Response:
        path = docs_dir() / name
        if not _GUIDE.fullmatch(name) or not path.is_file():
            return problem_page(404, f"there is no guide named {name!r}; see the index at docs/")
        return PlainTextResponse(path.read_text(encoding="utf-8"), headers=SECURITY_HEADERS)

    return app


async def _lazy_app(scope: Scope, receive: Receive, send: Send) -> None:
    await _built_app()(scope, receive, send)


_built_app = functools.cache(create_app)


class DlqReplayPlugin(AirflowPlugin):
    """The report endpoint of the API server, and the listener that creates the replay pool."""

    name = "dlq_replay"
    fastapi_apps = [{"app": _lazy_app, "url_prefix": PLUGIN_PREFIX, "name": "DLQ replay reports"}]
    listeners = [replay_pool]
