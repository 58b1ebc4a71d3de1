"""``PulsarHook``: the ``pulsar`` connection, Pulsar clients and DLQ backlog reads (blocking and async)."""

from __future__ import annotations

import logging
import ssl
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_provider_dlq.dlq_consumer.client import create_client
from airflow_provider_dlq.hooks.backlog import (
    BacklogConfigError,
    BacklogPlan,
    BacklogReadError,
    HttpRequest,
    HttpResult,
    TopicBacklog,
    admin_plan,
    metrics_plan,
    prepare_topics,
)
from airflow_provider_dlq.hooks.connection import (
    PulsarConnectionConfig,
    PulsarConnectionError,
    parse_pulsar_connection,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    import httpx
    import pulsar
    from airflow.sdk import Connection

#: Logger handed to every ``pulsar.Client`` (the C++ client otherwise writes INFO lines to stdout).
CLIENT_LOGGER_NAME = "airflow_provider_dlq.pulsar_client"
CONNECTION_CHECK_TOPIC = "persistent://public/default/__airflow_dlq_connection_check"


def _drive(plan: BacklogPlan, send: Callable[[HttpRequest], HttpResult]) -> dict[str, TopicBacklog]:
    """Run a plan: send each request it yields; a failed request is thrown back into the plan."""
    try:
        request = next(plan)
        while True:
            try:
                result = send(request)
            except BacklogReadError as exc:
                request = plan.throw(exc)
            else:
                request = plan.send(result)
    except StopIteration as stop:
        return stop.value


async def _adrive(
    plan: BacklogPlan, send: Callable[[HttpRequest], Awaitable[HttpResult]]
) -> dict[str, TopicBacklog]:
    """Async twin of :func:`_drive`."""
    try:
        request = next(plan)
        while True:
            try:
                result = await send(request)
            except BacklogReadError as exc:
                request = plan.throw(exc)
            else:
                request = plan.send(result)
    except StopIteration as stop:
        return stop.value


class PulsarHook(BaseHook):
    """Interact with Apache Pulsar through an Airflow ``pulsar`` connection.

    :param pulsar_conn_id: The ``pulsar`` connection to use (default ``pulsar_default``).
    :param http_timeout: Seconds allowed for each admin/metrics HTTP request.
    """

    conn_name_attr = "pulsar_conn_id"
    default_conn_name = "pulsar_default"
    conn_type = "pulsar"
    hook_name = "Apache Pulsar"

    def __init__(self, pulsar_conn_id: str = default_conn_name, *, http_timeout: float = 10.0) -> None:
        super().__init__()
        self.pulsar_conn_id = pulsar_conn_id
        self.http_timeout = http_timeout

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pulsar_conn_id={self.pulsar_conn_id!r})"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Field labels and placeholders of the connection form (mirrors get_provider_info)."""
        return {
            "hidden_fields": ["schema", "login"],
            "relabeling": {"host": "Service URL or host", "password": "Token"},
            "placeholders": {
                "host": "pulsar://localhost:6650 (or pulsar+ssl://broker:6651)",
                "port": "6650",
                "password": "JWT token (optional)",
            },
        }

    # ----------------------------------------------------------------------- configuration

    def _config_from(self, conn: Connection) -> PulsarConnectionConfig:
        config = parse_pulsar_connection(
            self.pulsar_conn_id,
            conn_type=conn.conn_type,
            host=conn.host,
            port=conn.port,
            password=conn.password,
            extra=conn.extra_dejson,
        )
        if config.token:
            from airflow.sdk.log import mask_secret

            mask_secret(config.token)
        if config.ignored_extras:
            self.log.warning(
                "Connection %r: ignoring unknown extras %s", self.pulsar_conn_id, list(config.ignored_extras)
            )
        return config

    def _not_found(self, exc: Exception) -> PulsarConnectionError:
        env = "AIRFLOW_CONN_" + self.pulsar_conn_id.upper()
        return PulsarConnectionError(
            f"Connection {self.pulsar_conn_id!r} is not defined; create it in the UI or set "
            f'{env}=\'{{"conn_type":"pulsar","host":"pulsar://localhost:6650"}}\' ({exc}).'
        )

    @cached_property
    def config(self) -> PulsarConnectionConfig:
        """The validated connection (fetched once per hook)."""
        try:
            conn = self.get_connection(self.pulsar_conn_id)
        except AirflowNotFoundException as exc:
            raise self._not_found(exc) from exc
        return self._config_from(conn)

    async def aget_config(self) -> PulsarConnectionConfig:
        """Async variant of :attr:`config` for triggers."""
        if "config" in self.__dict__:
            return self.config
        try:
            conn = await self.aget_connection(self.pulsar_conn_id)
        except AirflowNotFoundException as exc:
            raise self._not_found(exc) from exc
        config = self._config_from(conn)
        self.__dict__["config"] = config
        return config

    # ----------------------------------------------------------------------- client

    def get_client(self, **client_kwargs: Any) -> pulsar.Client:
        """Return a ``pulsar.Client`` for the connection, logging through Python logging.

        Extra keyword arguments go to ``pulsar.Client`` (e.g. ``operation_timeout_seconds``).
        """
        config = self.config
        logger = logging.getLogger(CLIENT_LOGGER_NAME)
        if logger.level == logging.NOTSET:
            # The C++ client is chatty at INFO (every connect/lookup); configure this logger to see it.
            logger.setLevel(logging.WARNING)
        return create_client(
            config.service_url,
            logger=logger,
            token=config.token,
            tls_trust_certs_file_path=config.tls_trust_certs_file_path,
            tls_allow_insecure_connection=config.tls_allow_insecure_connection,
            **client_kwargs,
        )

    def get_conn(self) -> pulsar.Client:
        """Same as :meth:`get_client`."""
        return self.get_client()

    # ----------------------------------------------------------------------- HTTP (admin / metrics)

    def _http_options(self, config: PulsarConnectionConfig) -> dict[str, Any]:
        verify: ssl.SSLContext | bool = True
        if config.tls_allow_insecure_connection:
            verify = False
        elif config.tls_trust_certs_file_path:
            verify = ssl.create_default_context(cafile=config.tls_trust_certs_file_path)
        headers = {"Accept": "application/json, text/plain"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        return {"timeout": self.http_timeout, "verify": verify, "headers": headers, "follow_redirects": True}

    def backlog_source(self, config: PulsarConnectionConfig) -> str:
        """``"admin"`` when an admin URL is set, else ``"metrics"``; raises if neither is configured."""
        if config.admin_url:
            return "admin"
        if config.metrics_url:
            return "metrics"
        raise BacklogConfigError(
            f"Connection {config.conn_id!r} has neither extra 'admin_url' nor 'metrics_url', so the "
            "backlog cannot be read; set admin_url (Apache Pulsar admin REST, e.g. http://broker:8080) "
            "or metrics_url (Prometheus, e.g. http://broker:8080/metrics)."
        )

    def _plan(self, config: PulsarConnectionConfig, topics: Sequence[str], subscription: str) -> BacklogPlan:
        if not subscription:
            raise BacklogConfigError("subscription must be a non-empty name, e.g. 'dlq-replayer'.")
        prepared = prepare_topics(topics)
        if self.backlog_source(config) == "admin":
            assert config.admin_url is not None
            return admin_plan(config.admin_url, prepared, subscription, now_ms=time.time() * 1000)
        assert config.metrics_url is not None
        return metrics_plan(config.metrics_url, prepared, subscription)

    @staticmethod
    def _failed(request: HttpRequest, exc: Exception) -> BacklogReadError:
        return BacklogReadError(f"{request.method} {request.url} failed: {type(exc).__name__}: {exc}")

    def get_backlog(self, topics: Sequence[str], subscription: str) -> dict[str, TopicBacklog]:
        """Backlog of ``subscription`` per topic; topic globs (``persistent://t/ns/*-DLQ``) are expanded."""
        import httpx

        config = self.config
        plan = self._plan(config, topics, subscription)
        with httpx.Client(**self._http_options(config)) as client:

            def get(request: HttpRequest) -> HttpResult:
                try:
                    response = client.request(request.method, request.url)
                except httpx.HTTPError as exc:
                    raise self._failed(request, exc) from exc
                return HttpResult(response.status_code, response.text)

            return _drive(plan, get)

    async def aget_backlog(self, topics: Sequence[str], subscription: str) -> dict[str, TopicBacklog]:
        """Async variant of :meth:`get_backlog` (used by :class:`DlqBacklogTrigger`)."""
        import httpx

        config = await self.aget_config()
        plan = self._plan(config, topics, subscription)
        async with httpx.AsyncClient(**self._http_options(config)) as client:

            async def get(request: HttpRequest) -> HttpResult:
                try:
                    response = await client.request(request.method, request.url)
                except httpx.HTTPError as exc:
                    raise self._failed(request, exc) from exc
                return HttpResult(response.status_code, response.text)

            return await _adrive(plan, get)

    # ----------------------------------------------------------------------- connection test

    def _check_http(self, client: httpx.Client, url: str, what: str) -> str:
        import httpx

        try:
            response = client.get(url)
        except httpx.HTTPError as exc:
            raise BacklogReadError(f"{what} {url} unreachable: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise BacklogReadError(f"{what} {url} returned HTTP {response.status_code}")
        return f"{what} ok"

    def test_connection(self) -> tuple[bool, str]:
        """Check the broker (a topic metadata lookup) and the admin/metrics URLs when configured."""
        import httpx

        try:
            config = self.config
        except (PulsarConnectionError, AirflowNotFoundException) as exc:
            return False, str(exc)
        notes: list[str] = []
        try:
            client = self.get_client(operation_timeout_seconds=10)
            try:
                client.get_topic_partitions(CONNECTION_CHECK_TOPIC)
            finally:
                client.close()
            notes.append(f"broker {config.service_url} ok")
            if config.admin_url or config.metrics_url:
                with httpx.Client(**self._http_options(config)) as http:
                    if config.admin_url:
                        notes.append(
                            self._check_http(http, f"{config.admin_url}/admin/v2/clusters", "admin API")
                        )
                    if config.metrics_url:
                        notes.append(self._check_http(http, config.metrics_url, "metrics"))
            else:
                notes.append("no admin_url or metrics_url: backlog sensing is unavailable")
        except Exception as exc:
            done = "; ".join(notes)
            return False, f"{done + '; ' if done else ''}failed: {type(exc).__name__}: {exc}"
        return True, "; ".join(notes)
