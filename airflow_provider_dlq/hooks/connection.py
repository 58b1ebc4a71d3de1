"""Parse an Airflow ``pulsar`` connection into a validated, secret-safe configuration.

Connection model (conn_type ``pulsar``):

* **Host**: a full service URL (``pulsar://host:6650``, ``pulsar+ssl://host:6651``, several hosts
  separated by commas) *or* a bare host name; then **Port** (default 6650, or 6651 with TLS) and the extra
  ``use_tls`` build the URL.
* **Password**: an optional JWT token.
* **Extras**: ``admin_url``, ``metrics_url``, ``use_tls``, ``tls_trust_certs_file_path``,
  ``tls_allow_insecure_connection``.

Pure functions only: nothing here talks to the network or imports Airflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_PORT = 6650
DEFAULT_TLS_PORT = 6651
SERVICE_SCHEMES = ("pulsar", "pulsar+ssl")
KNOWN_EXTRAS = frozenset(
    {"admin_url", "metrics_url", "use_tls", "tls_trust_certs_file_path", "tls_allow_insecure_connection"}
)

_EXAMPLE = (
    'AIRFLOW_CONN_PULSAR_DEFAULT=\'{"conn_type":"pulsar","host":"pulsar://localhost:6650",'
    '"extra":{"metrics_url":"http://localhost:8080/metrics"}}\''
)


class PulsarConnectionError(ValueError):
    """A ``pulsar`` connection is missing or malformed; the message names the connection and the fix."""


@dataclass(frozen=True)
class PulsarConnectionConfig:
    """Everything needed to reach one Pulsar cluster. ``token`` never appears in ``repr``."""

    conn_id: str
    service_url: str
    admin_url: str | None = None
    metrics_url: str | None = None
    token: str | None = field(default=None, repr=False)
    tls_trust_certs_file_path: str | None = None
    tls_allow_insecure_connection: bool = False
    ignored_extras: tuple[str, ...] = ()

    @property
    def has_token(self) -> bool:
        return bool(self.token)

    @property
    def uses_tls(self) -> bool:
        return self.service_url.startswith("pulsar+ssl://")


def _as_bool(conn_id: str, name: str, value: Any) -> bool:
    if value is None or value == "":
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"true", "1", "yes", "on"}:
        return True
    if isinstance(value, str) and value.strip().lower() in {"false", "0", "no", "off"}:
        return False
    raise PulsarConnectionError(
        f"Connection {conn_id!r}: extra {name!r} must be true or false; got {value!r}."
    )


def _http_url(conn_id: str, name: str, value: Any, example: str) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise PulsarConnectionError(
            f"Connection {conn_id!r}: extra {name!r} must be a string URL like {example}; got {value!r}."
        )
    url = value.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PulsarConnectionError(
            f"Connection {conn_id!r}: extra {name!r} must be an http(s) URL like {example}; got {value!r}."
        )
    return url


def _service_url(conn_id: str, conn_type: str | None, host: str, port: int | None, use_tls: bool) -> str:
    if "://" in host:
        scheme = host.split("://", 1)[0].lower()
        if scheme not in SERVICE_SCHEMES:
            raise PulsarConnectionError(
                f"Connection {conn_id!r}: Host {host!r} has scheme {scheme!r}; use pulsar://host:6650 "
                "or pulsar+ssl://host:6651 (http:// URLs belong in the extras admin_url / metrics_url)."
            )
        rest = host.split("://", 1)[1].strip("/")
        if not rest:
            raise PulsarConnectionError(
                f"Connection {conn_id!r}: Host {host!r} names no broker; use e.g. pulsar://localhost:6650."
            )
        return f"{scheme}://{rest}"
    if "/" in host or ":" in host:
        raise PulsarConnectionError(
            f"Connection {conn_id!r}: Host {host!r} is neither a service URL nor a bare host name; "
            "give pulsar://host:6650, or the host alone and the port in Port."
        )
    tls = use_tls or conn_type == "pulsar+ssl"
    scheme = "pulsar+ssl" if tls else "pulsar"
    return f"{scheme}://{host}:{port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT)}"


def parse_pulsar_connection(
    conn_id: str,
    *,
    conn_type: str | None,
    host: str | None,
    port: int | None = None,
    password: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> PulsarConnectionConfig:
    """Validate the fields of a ``pulsar`` connection and build its configuration.

    Raises :class:`PulsarConnectionError` naming ``conn_id``, the bad value and the fix.
    """
    if conn_type not in (None, "", "pulsar", "pulsar+ssl"):
        raise PulsarConnectionError(
            f"Connection {conn_id!r} has conn_type {conn_type!r}; a Pulsar connection needs conn_type "
            f"'pulsar', e.g. {_EXAMPLE}"
        )
    host = (host or "").strip()
    if not host:
        raise PulsarConnectionError(
            f"Connection {conn_id!r} has no Host; set Host to a service URL like pulsar://localhost:6650, "
            f"e.g. {_EXAMPLE}"
        )
    extra = dict(extra or {})
    use_tls = _as_bool(conn_id, "use_tls", extra.get("use_tls"))
    if port is not None and not (0 < int(port) < 65536):
        raise PulsarConnectionError(f"Connection {conn_id!r}: Port must be 1-65535; got {port!r}.")
    service_url = _service_url(conn_id, conn_type, host, port, use_tls)
    if use_tls and service_url.startswith("pulsar://"):
        raise PulsarConnectionError(
            f"Connection {conn_id!r}: extra use_tls is true but Host is {host!r}; "
            "use a pulsar+ssl:// URL or give only the host name."
        )
    trust = extra.get("tls_trust_certs_file_path") or None
    if trust is not None and not isinstance(trust, str):
        raise PulsarConnectionError(
            f"Connection {conn_id!r}: extra 'tls_trust_certs_file_path' must be a file path; got {trust!r}."
        )
    return PulsarConnectionConfig(
        conn_id=conn_id,
        service_url=service_url,
        admin_url=_http_url(conn_id, "admin_url", extra.get("admin_url"), "http://localhost:8080"),
        metrics_url=_http_url(
            conn_id, "metrics_url", extra.get("metrics_url"), "http://localhost:8080/metrics"
        ),
        token=(password or None),
        tls_trust_certs_file_path=trust,
        tls_allow_insecure_connection=_as_bool(
            conn_id, "tls_allow_insecure_connection", extra.get("tls_allow_insecure_connection")
        ),
        ignored_extras=tuple(sorted(set(extra) - KNOWN_EXTRAS)),
    )
