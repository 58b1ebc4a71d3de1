"""Prepare Apache Pulsar for DLQ replay: namespaces with deduplication on, durable replayer subscriptions.

Run by ``docker/airflow/init-stack.sh`` (service ``airflow-init``). Configuration comes from the
environment that ``docker/compose.yaml`` sets:

``DLQ_CONN_PULSAR_DEFAULT``
    The ``pulsar_default`` connection as Airflow connection JSON, parsed by the provider's own
    connection parser (``airflow_provider_dlq.hooks.connection``), so the init reaches Pulsar exactly
    the way the hook will.
``DLQ_INIT_TOPICS``
    Comma-separated DLQ topics (``persistent://tenant/namespace/topic``, ``tenant/namespace/topic`` or a
    short name in ``public/default``). Empty: nothing to prepare.
``DLQ_INIT_ORIGIN_ALLOWLIST``
    The replay's origin allowlist (globs); the namespaces it names get deduplication too, since that is
    where the replay republishes.
``DLQ_REPLAYER_SUBSCRIPTION``
    The durable Shared subscription the replay reads and acks through (default ``dlq-replayer``).
``PULSAR_AUTH_TOKEN``
    Optional JWT (else the connection's password); sent as a header and never logged.

Why the subscription is created up front: Pulsar keeps a message only while a subscription still has
to consume it (or a retention policy holds it). A DLQ written before any subscription exists can lose
its messages, so the replayer subscription is created at the earliest position before failures arrive.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, NoReturn

from airflow_provider_dlq.hooks.connection import (
    PulsarConnectionConfig,
    PulsarConnectionError,
)
from airflow_provider_dlq.hooks.connection import (
    parse_pulsar_connection as parse_pulsar_connection_fields,
)
from pulsar_dlq_consumer.client import create_client
from pulsar_dlq_consumer.errors import ConfigurationError
from pulsar_dlq_consumer.replay_options import DEFAULT_SUBSCRIPTION
from pulsar_dlq_consumer.topics import normalize_topic

log = logging.getLogger("airflow-init.pulsar")


class InitError(RuntimeError):
    """The Pulsar setup cannot proceed; the message says what to fix."""


@dataclass(frozen=True)
class TopicName:
    """A fully qualified persistent topic name."""

    tenant: str
    namespace: str
    local_name: str

    @property
    def full(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/{self.local_name}"

    @property
    def namespace_path(self) -> str:
        return f"{self.tenant}/{self.namespace}"


def parse_pulsar_connection(conn_json: str, token: str | None = None) -> PulsarConnectionConfig:
    """Parse the ``pulsar_default`` connection JSON with the provider's own connection parser."""
    try:
        conn = json.loads(conn_json)
    except json.JSONDecodeError as exc:
        raise InitError(
            f"DLQ_CONN_PULSAR_DEFAULT is not valid JSON ({exc}); fix it in docker/compose.yaml"
        ) from exc
    if not isinstance(conn, dict):
        raise InitError("DLQ_CONN_PULSAR_DEFAULT must be a JSON object with conn_type, host and extra")
    extra = conn.get("extra") or {}
    if isinstance(extra, str):
        extra = json.loads(extra) if extra.strip() else {}
    try:
        return parse_pulsar_connection_fields(
            "pulsar_default",
            conn_type=conn.get("conn_type"),
            host=conn.get("host"),
            port=int(conn["port"]) if conn.get("port") else None,
            password=token or conn.get("password") or None,
            extra=extra,
        )
    except PulsarConnectionError as exc:
        raise InitError(f"{exc} (DLQ_CONN_PULSAR_DEFAULT in docker/compose.yaml)") from exc


def parse_topic(name: str) -> TopicName:
    """Normalise a DLQ topic name to ``persistent://tenant/namespace/topic``."""
    try:
        full = normalize_topic(name.strip(), persistent_only=True)
    except ConfigurationError as exc:
        raise InitError(f"DLQ topic {name.strip()!r} in DLQ_TOPICS (docker/.env): {exc}") from exc
    tenant, namespace, local = full.split("://", 1)[1].split("/")
    return TopicName(tenant, namespace, local)


def parse_topics(value: str) -> list[TopicName]:
    """Parse a comma-separated topic list, dropping empty items and duplicates (order kept)."""
    topics: dict[str, TopicName] = {}
    for item in value.split(","):
        if item.strip():
            topic = parse_topic(item)
            topics.setdefault(topic.full, topic)
    return list(topics.values())


def namespaces_to_prepare(topics: list[TopicName], origin_allowlist: str = "") -> list[str]:
    """``tenant/namespace`` of every DLQ topic and of every origin allowlist glob with a literal namespace.

    Deduplication matters most on the *origin* namespaces, where the replay republishes. Allowlist
    entries are globs on full topic names (``persistent://public/default/orders*``) or ``re:<regex>``;
    regexes and globs in the tenant or namespace part are skipped (enable dedup there by hand).
    """
    out: dict[str, None] = dict.fromkeys(t.namespace_path for t in topics)
    for entry in origin_allowlist.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("re:"):
            continue
        rest = entry.split("://", 1)[1] if "://" in entry else entry
        parts = rest.split("/")
        if len(parts) >= 3 and not any(c in "".join(parts[:2]) for c in "*?[]"):
            out.setdefault(f"{parts[0]}/{parts[1]}", None)
        else:
            log.warning("origin allowlist entry %r names no literal namespace: set its dedup by hand", entry)
    return list(out)


class AdminClient:
    """The few Pulsar admin REST calls the init needs (urllib only; the token is a header)."""

    def __init__(self, base_url: str, token: str | None, timeout_s: float = 15.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(req, timeout=self._timeout_s) as resp:
                return resp.status, _json_or_text(resp.read().decode(errors="replace"))
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def wait_ready(self, attempts: int = 30, delay_s: float = 2.0) -> list[str]:
        """Wait until the admin API answers; return the cluster names."""
        last = ""
        for _ in range(attempts):
            try:
                status, body = self.request("GET", "/admin/v2/clusters")
                if status == 200 and isinstance(body, list) and body:
                    return [str(c) for c in body]
                last = f"HTTP {status}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(delay_s)
        raise InitError(
            f"Pulsar admin API at {self.base_url} did not answer ({last}); check the pulsar service "
            "(docker compose logs pulsar) and the admin_url extra of pulsar_default"
        )

    def ensure_namespace(self, namespace_path: str, clusters: list[str]) -> None:
        """Create the tenant and namespace if missing, then enable deduplication on the namespace."""
        tenant, namespace = namespace_path.split("/")
        status, tenants = self.request("GET", "/admin/v2/tenants")
        self._check(status, "list tenants")
        if tenant not in tenants:
            status, body = self.request(
                "PUT", f"/admin/v2/tenants/{_q(tenant)}", {"adminRoles": [], "allowedClusters": clusters}
            )
            if status not in (204, 409):
                self._check(status, f"create tenant {tenant}", body)
            log.info("tenant %s created", tenant)
        path = f"{_q(tenant)}/{_q(namespace)}"
        status, body = self.request("PUT", f"/admin/v2/namespaces/{path}", {})
        if status == 204:
            log.info("namespace %s created", namespace_path)
        elif status != 409:
            self._check(status, f"create namespace {namespace_path}", body)
        status, body = self.request("POST", f"/admin/v2/namespaces/{path}/deduplication", True)
        self._check(status, f"enable deduplication on {namespace_path}", body)
        log.info("namespace %s: deduplication enabled", namespace_path)

    @staticmethod
    def _check(status: int, what: str, body: Any = None) -> None:
        if status >= 300:
            detail = f": {str(body)[:300]}" if body else ""
            raise InitError(f"Pulsar admin could not {what} (HTTP {status}){detail}")


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return text


def ensure_subscriptions(target: PulsarConnectionConfig, topics: list[TopicName], subscription: str) -> None:
    """Create the durable Shared subscription on every topic at the earliest position (idempotent)."""
    import pulsar  # lazy: the parsing helpers above stay importable without the C++ client

    client = create_client(
        target.service_url,
        logger=logging.getLogger("airflow-init.pulsar.client"),
        token=target.token,
        tls_trust_certs_file_path=target.tls_trust_certs_file_path,
        tls_allow_insecure_connection=target.tls_allow_insecure_connection,
        operation_timeout_seconds=30,
    )
    try:
        for topic in topics:
            try:
                consumer = client.subscribe(
                    topic.full,
                    subscription_name=subscription,
                    consumer_type=pulsar.ConsumerType.Shared,
                    initial_position=pulsar.InitialPosition.Earliest,
                    receiver_queue_size=1,
                )
            except Exception as exc:
                raise InitError(
                    f"could not create subscription {subscription!r} on {topic.full} via "
                    f"{target.service_url} ({type(exc).__name__}: {exc}); check that the broker is "
                    "reachable at that URL from this container and that the token, if any, may consume"
                ) from exc
            consumer.close()
            log.info("subscription %r ready on %s", subscription, topic.full)
    finally:
        client.close()


def main(env: dict[str, str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    env = dict(os.environ) if env is None else env
    topics = parse_topics(env.get("DLQ_INIT_TOPICS", ""))
    if not topics:
        log.info(
            "DLQ_INIT_TOPICS is empty: no DLQ namespace or subscription to prepare "
            "(set DLQ_TOPICS in docker/.env)"
        )
        return 0
    target = parse_pulsar_connection(env.get("DLQ_CONN_PULSAR_DEFAULT", ""), env.get("PULSAR_AUTH_TOKEN"))
    subscription = env.get("DLQ_REPLAYER_SUBSCRIPTION", "").strip() or DEFAULT_SUBSCRIPTION
    if target.admin_url:
        admin = AdminClient(target.admin_url, target.token)
        clusters = admin.wait_ready()
        for namespace_path in namespaces_to_prepare(topics, env.get("DLQ_INIT_ORIGIN_ALLOWLIST", "")):
            admin.ensure_namespace(namespace_path, clusters)
    else:
        log.warning("pulsar_default has no admin_url: namespaces and deduplication are left as they are")
    ensure_subscriptions(target, topics, subscription)
    return 0


def exit_now(code: int) -> NoReturn:
    """Flush and exit without interpreter finalization.

    pulsar-client with a Python ``logger=`` can abort with "terminate called without an active
    exception" (SIGABRT, exit 134) while the interpreter finalizes, about one run in twenty
    (apache/pulsar-client-python#256); a one-shot script must not fail after its work is done.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="[airflow-init] %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow-init.pulsar.client").setLevel(logging.WARNING)  # the C++ client is chatty
    try:
        exit_code = main()
    except InitError as err:
        log.error("%s", err)
        exit_code = 1
    exit_now(exit_code)
