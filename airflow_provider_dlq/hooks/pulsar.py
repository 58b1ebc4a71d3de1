"""``PulsarHook``: the ``pulsar`` connection, Pulsar clients and DLQ backlog reads (blocking and async)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.sdk.log import mask_secret

from airflow_provider_dlq.hooks.backlog import (
    AdminHttp,
    BacklogConfigError,
    BacklogReadError,
    TopicBacklog,
    admin_backlog,
    consumer_properties,
    metrics_backlog,
    prepare_topics,
)
from airflow_provider_dlq.hooks.connection import (
    PulsarConnectionConfig,
    PulsarConnectionError,
    parse_pulsar_connection,
)
from pulsar_dlq_consumer import admin
from pulsar_dlq_consumer.client import create_client

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pulsar
    from airflow.sdk import Connection


#: Logger handed to every ``pulsar.Client`` (the C++ client otherwise writes INFO lines to stdout).
CLIENT_LOGGER_NAME = "airflow_provider_dlq.pulsar_client"


class PulsarHook(BaseHook):
    """Interact with Apache Pulsar through an Airflow ``pulsar`` connection.

    :param pulsar_conn_id: The ``pulsar`` connection to use (default ``pulsar_default``).
    :param http_timeout: Seconds allowed for each admin/metrics HTTP request.

    .. seealso:: ``docs/connection.md``
    """

    conn_name_attr = "pulsar_conn_id"
    default_conn_name = "pulsar_default"
    conn_type = "pulsar"
    hook_name = "Apache Pulsar"

    def __init__(self, pulsar_conn_id: str = default_conn_name, *, http_timeout: float = 10.0) -> None:
        super().__init__()
        self.pulsar_conn_id = pulsar_conn_id
        self.http_timeout = http_timeout
        self._oauth2: admin.ClientCredentials | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pulsar_conn_id={self.pulsar_conn_id!r})"

    def _config_from(self, conn: Connection) -> PulsarConnectionConfig:
        config = parse_pulsar_connection(
            self.pulsar_conn_id,
            conn_type=conn.conn_type,
            host=conn.host,
            port=conn.port,
            login=conn.login,
            password=conn.password,
            extra=conn.extra_dejson,
        )
        for secret in config.secrets:
            mask_secret(secret)
        if config.ignored_extras:
            self.log.warning(
                "Connection %r: ignoring unknown extras %s", self.pulsar_conn_id, list(config.ignored_extras)
            )
        if config.ignored_login:
            self.log.warning(
                "Connection %r: Login is used only as the OAuth2 client ID (with extra oauth2_issuer_url); "
                "ignoring it",
                self.pulsar_conn_id,
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
            return self._config_from(self.get_connection(self.pulsar_conn_id))
        except AirflowNotFoundException as exc:
            raise self._not_found(exc) from exc

    @staticmethod
    def client_auth_kwargs(config: PulsarConnectionConfig) -> dict[str, Any]:
        """TLS and authentication arguments of ``create_client`` (they hold secrets: never log them)."""
        kwargs: dict[str, Any] = {
            "token": config.token,
            "tls_trust_certs_file_path": config.tls_trust_certs_file_path,
            "tls_allow_insecure_connection": config.tls_allow_insecure_connection,
            "tls_cert_file_path": config.tls_cert_file_path,
            "tls_key_file_path": config.tls_key_file_path,
        }
        if config.oauth2 is not None:
            kwargs["oauth2"] = asdict(config.oauth2)
        return kwargs

    def get_client(self, **client_kwargs: Any) -> pulsar.Client:
        """A ``pulsar.Client`` for the connection, logging via Python logging; keyword arguments go to it."""
        logger = logging.getLogger(CLIENT_LOGGER_NAME)
        if logger.level == logging.NOTSET:
            # The C++ client is chatty at INFO (every connect/lookup); configure this logger to see it.
            logger.setLevel(logging.WARNING)
        return create_client(
            self.config.service_url, logger=logger, **self.client_auth_kwargs(self.config), **client_kwargs
        )

    def get_conn(self) -> pulsar.Client:
        """Same as :meth:`get_client`."""
        return self.get_client()

    def admin_http(self, config: PulsarConnectionConfig) -> AdminHttp:
        """TLS context and credentials of admin/metrics requests (an OAuth2 token is fetched and cached)."""
        insecure = config.tls_allow_insecure_connection
        context = admin.ssl_context(
            config.tls_trust_certs_file_path, insecure, config.tls_cert_file_path, config.tls_key_file_path
        )
        token = config.token
        if config.oauth2 is not None:
            settings = asdict(config.oauth2)
            if self._oauth2 is None or self._oauth2.oauth2 != settings:
                self._oauth2 = admin.ClientCredentials(settings)
            issuer = admin.ssl_context(allow_insecure=insecure)  # the system's CAs: not the broker's
            try:
                token = self._oauth2.access_token(issuer, self.http_timeout)
            except admin.OAuth2Error as exc:
                raise BacklogReadError(str(exc)) from exc
        return AdminHttp(context, token, self.http_timeout)

    def get_backlog(self, topics: Sequence[str], subscription: str) -> dict[str, TopicBacklog]:
        """Backlog of ``subscription`` per topic (globs expanded), from admin_url, else from metrics_url."""
        config = self.config
        if not subscription:
            raise BacklogConfigError("subscription must be a non-empty name, e.g. 'dlq-replayer'.")
        prepared = prepare_topics(topics)
        if not (config.admin_url or config.metrics_url):
            raise BacklogConfigError(
                f"Connection {config.conn_id!r} has neither extra 'admin_url' nor 'metrics_url', so the "
                "backlog cannot be read; set admin_url (Apache Pulsar admin REST, e.g. http://broker:8080) "
                "or metrics_url (Prometheus, e.g. http://broker:8080/metrics)."
            )
        http = self.admin_http(config)
        if config.admin_url:
            return admin_backlog(http, config.admin_url, prepared, subscription, time.time() * 1000)
        return metrics_backlog(http, str(config.metrics_url), prepared, subscription)

    async def aget_backlog(self, topics: Sequence[str], subscription: str) -> dict[str, TopicBacklog]:
        """:meth:`get_backlog` for triggers: the connection read asynchronously, the requests in a thread."""
        if "config" not in self.__dict__:  # the cached :attr:`config`
            try:
                self.__dict__["config"] = self._config_from(await self.aget_connection(self.pulsar_conn_id))
            except AirflowNotFoundException as exc:
                raise self._not_found(exc) from exc
        return await asyncio.to_thread(self.get_backlog, topics, subscription)

    def subscription_consumers(self, topic: str, subscription: str) -> list[dict[str, str]]:
        """The properties of each consumer of ``subscription`` on a non-partitioned ``topic``."""
        config = self.config
        if not config.admin_url:
            raise BacklogConfigError("the pulsar connection has no admin URL (extra admin_url)")
        return consumer_properties(self.admin_http(config), config.admin_url, topic, subscription)

    def test_connection(self) -> tuple[bool, str]:
        """Check the broker and, when configured, the admin and metrics URLs; ``(ok, message)``."""
        from airflow_provider_dlq.hooks.connection_check import check_connection, tested_connection_id

        try:
            ok, message = check_connection(self, self.config)
        except (PulsarConnectionError, AirflowNotFoundException) as exc:
            ok, message = False, str(exc)
        # The UI's Test button tests a copy under a random id; name the user's connection instead.
        shown = tested_connection_id()
        if shown is not None and shown != self.pulsar_conn_id:
            message = message.replace(f"Connection {self.pulsar_conn_id!r}", f"Connection {shown!r}")
        return ok, message
