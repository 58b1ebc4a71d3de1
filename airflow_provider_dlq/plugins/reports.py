"""``DlqReplayPlugin``: serves replay reports from the Airflow API server under ``/dlq-replay``.

``GET /dlq-replay/docs/`` serves the provider's guides (the "Documentation" project URL, which Airflow's
providers page links to).

``GET /dlq-replay/reports/<dag_id>/<run_id>/<task_id>/<map_index>`` (the "DLQ replay report" extra link)
needs a logged-in user who may read the DAG's XComs (the UI's session cookie is enough). It reads the
task instance's XCom summary for the report's location and serves the file (see
:mod:`airflow_provider_dlq.plugins.report_store` for where it may come from). The page is sent with a
Content-Security-Policy that forbids scripts and every external resource: reports hold message-derived
text.

The FastAPI app is built on the first request, so loading the plugin costs nothing in components that
never serve it (scheduler, workers).
"""

from __future__ import annotations

import re
from html import escape
from typing import TYPE_CHECKING, Any

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_dlq.operators.links import PLUGIN_PREFIX
from airflow_provider_dlq.plugins import replay_pool

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping

    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse

    from airflow_provider_dlq.plugins.report_store import StoreSettings

    Scope = MutableMapping[str, Any]
    Message = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]

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


def store_settings() -> StoreSettings:
    """``[dlq_replay]`` options of the running Airflow."""
    from airflow.configuration import conf

    from airflow_provider_dlq.plugins.report_store import DEFAULT_MAX_BYTES, StoreSettings

    roots = conf.get("dlq_replay", "report_roots", fallback="") or ""
    return StoreSettings(
        roots=tuple(r.strip() for r in roots.split(",") if r.strip()),
        conn_id=conf.get("dlq_replay", "report_storage_conn_id", fallback="") or None,
        max_bytes=conf.getint("dlq_replay", "report_max_bytes", fallback=DEFAULT_MAX_BYTES),
    )


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


def problem_page(status: int, message: str) -> HTMLResponse:
    """A small, escaped HTML page that says why the report cannot be shown."""
    from fastapi.responses import HTMLResponse

    body = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>DLQ replay report</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:32px;max-width:760px;color:#222}"
        "p{line-height:1.5}</style></head><body><h1>DLQ replay report unavailable</h1>"
        f"<p>{escape(message)}</p></body></html>"
    )
    return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)


def create_app() -> FastAPI:
    """The FastAPI app mounted at ``/dlq-replay``."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag
    from fastapi import Depends, FastAPI
    from fastapi.responses import HTMLResponse, Response

    from airflow_provider_dlq.plugins.report_store import ReportUnavailable, read_report, report_location

    app = FastAPI(title="DLQ replay reports", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get(
        "/reports/{dag_id}/{run_id}/{task_id}/{map_index}",
        response_class=HTMLResponse,
        dependencies=[Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.XCOM))],
    )
    def report(dag_id: str, run_id: str, task_id: str, map_index: int) -> Response:
        try:
            location = report_location(task_summary(dag_id, run_id, task_id, map_index))
            content = read_report(location, store_settings())
        except ReportUnavailable as exc:
            return problem_page(exc.status, str(exc))
        return HTMLResponse(content, headers=SECURITY_HEADERS)

    add_docs_routes(app)
    return app


#: A guide's file name: ``docs/<name>.md`` (no folders, no dots but the suffix).
_GUIDE = re.compile(r"[a-z0-9][a-z0-9-]*\.md")


def docs_index() -> str:
    """The guides' index page (the providers page's documentation link opens it)."""
    from airflow_provider_dlq.resources import docs_dir

    items = "".join(
        f"<li><a href='{escape(p.name)}'>{escape(p.stem)}</a></li>"
        for p in sorted(docs_dir().glob("*.md"))
        if _GUIDE.fullmatch(p.name)
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>DLQ replay guides</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:32px;max-width:760px}</style></head><body>"
        f"<h1>airflow-provider-dlq guides</h1><ul>{items}</ul></body></html>"
    )


def add_docs_routes(app: FastAPI) -> None:
    """``GET /dlq-replay/docs/`` (index) and ``/dlq-replay/docs/<name>.md`` (the guide, as text): the
    guides shipped with the installed provider, public like any documentation."""
    from fastapi.responses import HTMLResponse, PlainTextResponse, Response

    from airflow_provider_dlq.resources import docs_dir

    @app.get("/docs/", response_class=HTMLResponse)
    def index() -> Response:
        return HTMLResponse(docs_index(), headers=SECURITY_HEADERS)

    @app.get("/docs/{name}", response_class=PlainTextResponse)
    def guide(name: str) -> Response:
        path = docs_dir() / name
        if not _GUIDE.fullmatch(name) or not path.is_file():
            return problem_page(404, f"there is no guide named {name!r}; see the index at docs/")
        return PlainTextResponse(path.read_text(encoding="utf-8"), headers=SECURITY_HEADERS)


class _LazyApp:
    """An ASGI app that builds :func:`create_app` on its first request."""

    def __init__(self) -> None:
        self._app: FastAPI | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            self._app = create_app()
        await self._app(scope, receive, send)


class DlqReplayPlugin(AirflowPlugin):
    """Registers the report endpoint with the API server (listed under ``plugins`` in provider info), and
    the listener that creates the replay pool (:mod:`airflow_provider_dlq.plugins.replay_pool`)."""

    name = "dlq_replay"
    fastapi_apps = [{"app": _LazyApp(), "url_prefix": PLUGIN_PREFIX, "name": "DLQ replay reports"}]
    listeners = [replay_pool]
