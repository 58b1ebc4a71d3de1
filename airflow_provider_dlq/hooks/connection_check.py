"""The connection form's Test button (``docs/connection.md``): failures name the URL and cause, no secret."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from airflow_provider_dlq.errors import DlqProviderError
from airflow_provider_dlq.hooks.backlog import AdminHttp, BacklogReadError
from pulsar_dlq_consumer import admin
from pulsar_dlq_consumer.client import connect_errors

if TYPE_CHECKING:
    from airflow_provider_dlq.hooks.connection import PulsarConnectionConfig
    from airflow_provider_dlq.hooks.pulsar import PulsarHook

FALLBACK_TOPIC = "persistent://public/default/__airflow_dlq_connection_check"
TCP_TIMEOUT = 5.0
OPERATION_TIMEOUT = 10

AUTH_LABELS = {
    "none": "no authentication",
    "token": "token auth",
    "oauth2": "OAuth2 auth",
    "tls": "TLS client certificate auth",
}


class CheckFailed(DlqProviderError):
    """One check failed; the message is shown to the user as is."""


def _socket_cause(exc: OSError, host: str, port: int) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused (nothing listens on {host}:{port}; is the broker running on that port?)"
    if isinstance(exc, socket.gaierror):
        return f"unknown host {host!r} ({exc.strerror or exc})"
    if isinstance(exc, TimeoutError):
        return f"no answer within {TCP_TIMEOUT:g} s (wrong host, or a firewall drops the connection)"
    return f"{type(exc).__name__}: {exc.strerror or exc}"


def check_reachable(service_url: str) -> list[str]:
    """Open a TCP connection to every broker; raise when none answers, else note those that did not."""
    results = list(connect_errors(service_url, TCP_TIMEOUT))
    failures = [f"{host}:{port}: {_socket_cause(exc, host, port)}" for host, port, exc in results if exc]
    if len(failures) == len(results):
        detail = failures[0].split(": ", 1)[1] if len(failures) == 1 else "; ".join(failures)
        raise CheckFailed(f"cannot reach {service_url}: {detail or 'no broker host:port in it'}")
    return [f"unreachable broker {failure}" for failure in failures]


def check_broker(hook: PulsarHook, config: PulsarConnectionConfig) -> str:
    """Look up the test topic through a real client; returns a note, raises :class:`CheckFailed`."""
    import pulsar

    url = config.service_url
    topic = config.test_topic or FALLBACK_TOPIC
    try:
        client = hook.get_client(operation_timeout_seconds=OPERATION_TIMEOUT)
    except Exception as exc:  # bad client options (e.g. an unreadable key file)
        raise CheckFailed(f"cannot create a Pulsar client for {url}: {type(exc).__name__}: {exc}") from exc
    try:
        client.get_topic_partitions(topic)
    except pulsar.AuthenticationError as exc:
        raise CheckFailed(
            f"{url} refused the credentials ({config.auth_method} authentication): {exc}; check the "
            "token, OAuth2 client or client certificate of the connection"
        ) from exc
    except pulsar.AuthorizationError as exc:
        if config.test_topic:
            raise CheckFailed(
                f"{url} accepted the credentials ({config.auth_method}) but they may not look up {topic}: "
                f"{exc}; grant the role access to its namespace, or set extra test_topic to a topic it "
                "may read"
            ) from exc
        return (
            f"broker {url} ok: credentials accepted ({config.auth_method}); not authorised on "
            "public/default, which is fine (set extra test_topic to check a topic of yours)"
        )
    except pulsar.Timeout as exc:
        hint = (
            "is the TLS setup right (pulsar+ssl:// URL, trust certs file, client certificate)?"
            if config.uses_tls
            else "is this a Pulsar broker port, and does the broker need TLS (pulsar+ssl://)?"
        )
        raise CheckFailed(f"{url} did not answer within {OPERATION_TIMEOUT} s: {hint}") from exc
    except pulsar.ConnectError as exc:
        hint = " (TLS handshake failed? check tls_trust_certs_file_path)" if config.uses_tls else ""
        raise CheckFailed(f"cannot connect to {url}: {exc}{hint}") from exc
    except Exception as exc:
        raise CheckFailed(f"{url}: looking up {topic} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        client.close()
    return f"broker {url} ok ({AUTH_LABELS[config.auth_method]}, looked up {topic})"


def _admin_check_url(admin_url: str, test_topic: str | None) -> str:
    """With ``test_topic``: its namespace's topic list (as the sensor reads globs); else ``clusters``."""
    if test_topic and "://" in test_topic and len(test_topic.partition("://")[2].split("/")) == 3:
        return admin_url + admin.admin_path(test_topic, parts=2)
    return f"{admin_url}/admin/v2/clusters"


def check_http(http: AdminHttp, url: str, what: str, *, forbidden_ok: bool) -> str:
    """GET ``url``; 2xx is ok, 403 is ok when ``forbidden_ok`` (authenticated, not authorised)."""
    try:
        status, _ = http.send(url)
    except BacklogReadError as exc:
        raise CheckFailed(f"cannot reach the {what}: {exc}") from exc
    if status == 401:
        raise CheckFailed(f"the {what} {url} refused the credentials (HTTP 401)")
    if status == 403 and forbidden_ok:
        return f"{what} ok (credentials accepted; HTTP 403 on {url}, set extra test_topic to check yours)"
    if status >= 400:
        raise CheckFailed(f"the {what} {url} returned HTTP {status}")
    return f"{what} ok"


def tested_connection_id() -> str | None:
    """The connection id the UI's Test button tests, or ``None``: Airflow tests a copy under a random id;
    the real one is the ``connection_id`` of ``test_body`` in its route's frame, in this thread."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        body = frame.f_locals.get("test_body") if frame.f_code.co_name == "test_connection" else None
        conn_id = getattr(body, "connection_id", None)
        if isinstance(conn_id, str) and conn_id:
            return conn_id
        frame = frame.f_back  # type: ignore[assignment]
    return None


def check_connection(hook: PulsarHook, config: PulsarConnectionConfig) -> tuple[bool, str]:
    """Run every check; ``(True, notes)`` or ``(False, "<what failed> (passed: ...)")``."""
    notes: list[str] = []
    try:
        notes += check_reachable(config.service_url)
        http = None
        if config.oauth2 is not None:  # first: a dead issuer is not the broker refusing the credentials
            try:
                http = hook.admin_http(config)  # fetches the OAuth2 token
            except BacklogReadError as exc:
                raise CheckFailed(f"{exc}; check extra oauth2_issuer_url and the client ID / secret") from exc
            notes.append(f"OAuth2 issuer {config.oauth2.issuer_url} ok (token issued)")
        notes.append(check_broker(hook, config))
        if config.admin_url or config.metrics_url:
            http = http or hook.admin_http(config)
            if config.admin_url:
                url = _admin_check_url(config.admin_url, config.test_topic)
                notes.append(check_http(http, url, "admin API", forbidden_ok=not config.test_topic))
            if config.metrics_url:
                notes.append(check_http(http, config.metrics_url, "metrics endpoint", forbidden_ok=False))
        else:
            notes.append("no admin_url or metrics_url: backlog sensing is unavailable")
    except CheckFailed as exc:
        done = "; ".join(notes)
        return False, f"{exc}" + (f" (passed: {done})" if done else "")
    except Exception as exc:
        return False, f"connection test failed: {type(exc).__name__}: {exc}"
    return True, "; ".join(notes)
