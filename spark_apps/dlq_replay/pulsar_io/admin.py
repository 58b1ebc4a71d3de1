"""The Apache Pulsar admin REST reads of the replay, with the :class:`~.conf.PulsarConf` credentials."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from pulsar_dlq_consumer.admin import ClientCredentials, OAuth2Error, admin_path, fetch, ssl_context
from pulsar_dlq_consumer.topics import qualify_topic
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError, PulsarIOError
from spark_apps.dlq_replay.redaction import safe_url

if TYPE_CHECKING:
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

log = logging.getLogger(__name__)

_ATTEMPTS = 3


class AdminUnavailable(PulsarIOError):
    """The admin URL answers, but not with Apache Pulsar's admin REST (HTTP 404 or a non-JSON body)."""


class AdminNotFound(AdminUnavailable):
    """HTTP 404 with Apache Pulsar's ``{"reason": ...}``: the topic (or its namespace) does not exist."""


def topic_path(topic: str) -> str:
    """``persistent://t/ns/name`` -> ``/admin/v2/persistent/t/ns/name`` (each part URL-quoted)."""
    full = qualify_topic(topic)
    if full is None:
        raise PulsarConfigError(f"invalid topic {topic!r}: expected persistent://<tenant>/<namespace>/<name>")
    return admin_path(full)


class PulsarAdmin:
    """Read-only admin REST calls for one :class:`~.conf.PulsarConf` (its ``admin_url`` must be set)."""

    def __init__(self, conf: PulsarConf, *, timeout_s: float = 30.0) -> None:
        if not conf.admin_url:
            raise PulsarConfigError("no admin URL: set PulsarConf(admin_url=...) or the 'admin.url' option")
        self.base = conf.admin_url.rstrip("/")
        self.timeout_s = timeout_s
        secure = self.base.startswith("https://") or conf.oauth2_issuer_url
        tls = (conf.tls_trust_certs_file, conf.tls_allow_insecure, conf.tls_cert_file, conf.tls_key_file)
        self._context = ssl_context(*tls) if secure else None
        oauth2 = conf.read_oauth2()
        self._token = None if oauth2 else conf.read_token()
        try:
            if oauth2:
                self._token = ClientCredentials(oauth2).access_token(self._context, timeout_s)
        except OAuth2Error as exc:
            raise PulsarConfigError(str(exc)) from None

    def get(self, path: str) -> Any:
        """GET ``path`` and decode its JSON; server errors are retried twice."""
        url = f"{self.base}{path}"
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                status, raw = fetch(url, self._context, self.timeout_s, token=self._token)
            except OSError as exc:  # no answer: refused, unknown host, timeout, TLS failure
                reason = getattr(exc, "reason", exc)
                raise PulsarConfigError(
                    f"cannot reach the Pulsar admin REST at {safe_url(self.base)} ({reason}); check the "
                    "admin URL (e.g. http://broker:8080), or remove it to use the two-read consumer mode"
                ) from exc
            if status < 500 or attempt == _ATTEMPTS:
                break
            log.warning("GET %s: HTTP %d, retrying", url, status)
            time.sleep(0.5 * attempt)
        if status == 404:  # Apache Pulsar's names what is missing: {"reason": ...}
            try:
                reason = json.loads(raw or b"null")["reason"]
            except (ValueError, TypeError, KeyError):
                raise AdminUnavailable(f"GET {url}: HTTP 404") from None
            raise AdminNotFound(f"GET {url}: HTTP 404 ({str(reason)[:200]})")
        if status in (401, 403):
            raise PulsarConfigError(
                f"GET {url}: HTTP {status}; the admin REST refused the token. Give the replay's "
                "role permission to read topic stats (consume permission on the DLQ namespace), "
                "or remove the admin URL to use the two-read consumer mode"
            )
        if status >= 300:
            raise PulsarIOError(f"GET {url}: HTTP {status}")
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise AdminUnavailable(f"GET {url} did not answer JSON") from exc

    def _object(self, topic: str, what: str, *keys: str) -> dict[str, Any]:
        """The JSON object ``what`` of ``topic``, which must hold ``keys``."""
        data = self.get(topic_path(topic) + "/" + what)
        if not isinstance(data, dict) or not all(key in data for key in keys):
            raise AdminUnavailable(f"{what} of {topic} is not a JSON object with {list(keys)}")
        return data

    def internal_stats(self, topic: str) -> dict[str, Any]:
        """``internalStats`` of one (non-partitioned or partition) topic: ledgers and cursors."""
        return self._object(topic, "internalStats", "ledgers", "cursors")

    def topic_exists(self, topic: str) -> bool:
        """Whether ``topic`` exists (partitioned metadata, else ``stats``; neither creates a topic)."""
        try:  # Apache Pulsar 4 answers 404 for a missing topic here; older releases {"partitions": 0}
            meta = self._object(topic, "partitions?checkAllowAutoCreation=false", "partitions")
            if int(meta["partitions"]) == 0:
                self.stats(topic)  # not partitioned: 404 when missing
        except AdminNotFound:
            return False
        return True

    def stats(self, topic: str) -> dict[str, Any]:
        """``stats`` of one topic: per-subscription ``msgBacklog`` and more."""
        return self._object(topic, "stats")
