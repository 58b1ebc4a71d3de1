"""A few Apache Pulsar admin REST calls the launcher and the tests need (tenants, namespaces, health)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from pulsar_standalone.errors import StandaloneError


class AdminClient:
    """Minimal ``/admin/v2`` client: JSON in and out, optional bearer token and TLS trust file."""

    def __init__(
        self, admin_url: str, *, token: str | None = None, tls_trust_certs_file: str | None = None
    ) -> None:
        self.admin_url = admin_url.rstrip("/")
        self._token = token
        self._context = (
            ssl.create_default_context(cafile=tls_trust_certs_file) if tls_trust_certs_file else None
        )

    def request(self, method: str, path: str, body: Any = None, *, timeout: float = 10.0) -> Any:
        """Send one request; returns the decoded JSON (``None`` for an empty body)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.admin_url}{path}", data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        with urllib.request.urlopen(req, timeout=timeout, context=self._context) as resp:
            raw = resp.read()
        return json.loads(raw) if raw.strip() else None

    def get(self, path: str, *, timeout: float = 10.0) -> Any:
        return self.request("GET", path, timeout=timeout)

    def _put_ignoring_conflict(self, path: str, body: Any) -> bool:
        try:
            self.request("PUT", path, body)
        except urllib.error.HTTPError as exc:
            if exc.code == 409:  # already exists
                return False
            detail = exc.read().decode(errors="replace")[:300]
            raise StandaloneError(f"PUT {self.admin_url}{path} failed: HTTP {exc.code} {detail}") from exc
        return True

    def create_tenant(self, tenant: str, cluster: str = "standalone") -> bool:
        """Create ``tenant`` allowed on ``cluster``; False when it exists already."""
        return self._put_ignoring_conflict(
            f"/admin/v2/tenants/{quote(tenant)}", {"adminRoles": [], "allowedClusters": [cluster]}
        )

    def create_namespace(self, namespace: str, *, cluster: str = "standalone") -> bool:
        """Create ``tenant/namespace`` (and its tenant); False when the namespace exists already."""
        tenant, _, name = namespace.partition("/")
        if not tenant or not name or "/" in name:
            raise StandaloneError(f"namespace must be '<tenant>/<namespace>'; got {namespace!r}")
        self.create_tenant(tenant, cluster)
        return self._put_ignoring_conflict(f"/admin/v2/namespaces/{quote(tenant)}/{quote(name)}", {})

    def create_partitioned_topic(self, topic: str, partitions: int) -> bool:
        """Create a partitioned topic (``persistent://t/ns/name``); False when it exists already."""
        path = topic.replace("persistent://", "persistent/", 1)
        return self._put_ignoring_conflict(f"/admin/v2/{path}/partitions", partitions)

    def set_deduplication(self, namespace: str, enabled: bool) -> None:
        """Turn broker deduplication on or off for ``namespace`` (a namespace policy)."""
        self.request("POST", f"/admin/v2/namespaces/{namespace}/deduplication", enabled)
