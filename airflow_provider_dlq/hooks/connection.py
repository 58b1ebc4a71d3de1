"""A ``pulsar`` connection as a validated, secret-safe configuration (pure: no network, no Airflow)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_provider_dlq.errors import DlqProviderError
from airflow_provider_dlq.get_provider_info import get_provider_info
from pulsar_dlq_consumer.replay_options import BOOLEAN_WORDS

if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_PORT = 6650
DEFAULT_TLS_PORT = 6651
SERVICE_SCHEMES = ("pulsar", "pulsar+ssl")
#: The extras the connection form declares (``conn-fields`` in ``provider.yaml``).
KNOWN_EXTRAS = frozenset(get_provider_info()["connection-types"][0]["conn-fields"])

_EXAMPLE = (
    'AIRFLOW_CONN_PULSAR_DEFAULT=\'{"conn_type":"pulsar","host":"pulsar://localhost:6650",'
    '"extra":{"metrics_url":"http://localhost:8080/metrics"}}\''
)


class PulsarConnectionError(DlqProviderError, ValueError):
    """A ``pulsar`` connection is missing or malformed; the message names the connection and the fix."""


@dataclass(frozen=True)
class OAuth2Settings:
    """OAuth2 client credentials: Login/Password or a JSON key file, never both (secret not in ``repr``)."""

    issuer_url: str
    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    credentials_file: str | None = None
    audience: str | None = None
    scope: str | None = None


@dataclass(frozen=True)
class PulsarConnectionConfig:
    """Everything needed to reach one Pulsar cluster. Secrets never appear in ``repr``."""

    conn_id: str
    service_url: str
    admin_url: str | None = None
    metrics_url: str | None = None
    token: str | None = field(default=None, repr=False)
    tls_trust_certs_file_path: str | None = None
    tls_allow_insecure_connection: bool = False
    tls_cert_file_path: str | None = None
    tls_key_file_path: str | None = None
    oauth2: OAuth2Settings | None = None
    test_topic: str | None = None
    ignored_extras: tuple[str, ...] = ()
    ignored_login: bool = False

    @property
    def uses_tls(self) -> bool:
        return self.service_url.startswith("pulsar+ssl://")

    @property
    def auth_method(self) -> str:
        """``oauth2``, ``token``, ``tls`` (client certificate) or ``none``."""
        if self.oauth2 is not None:
            return "oauth2"
        if self.token:
            return "token"
        return "tls" if self.tls_cert_file_path else "none"

    @property
    def secrets(self) -> tuple[str, ...]:
        """Secret values to mask in logs (token, OAuth2 client secret)."""
        values = [self.token, self.oauth2.client_secret if self.oauth2 else None]
        return tuple(v for v in values if v)


def _as_bool(conn_id: str, extra: Mapping[str, Any], name: str) -> bool:
    value = extra.get(name)
    if value is None or value == "" or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in BOOLEAN_WORDS:
        return BOOLEAN_WORDS[value.strip().lower()]
    raise PulsarConnectionError(
        f"Connection {conn_id!r}: extra {name!r} must be true or false; got {value!r}."
    )


def _http_url(conn_id: str, extra: Mapping[str, Any], name: str, example: str) -> str | None:
    url = _text(conn_id, extra, name, f"a string URL like {example}")
    if url is None:
        return None
    url = url.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PulsarConnectionError(
            f"Connection {conn_id!r}: extra {name!r} must be an http(s) URL like {example}; "
            f"got {extra[name]!r}."
        )
    return url


def _service_url(conn_id: str, conn_type: str | None, host: str, port: int | None, use_tls: bool) -> str:
    scheme, sep, rest = host.partition("://")
    if sep:
        scheme, rest = scheme.lower(), rest.strip("/")
        if scheme not in SERVICE_SCHEMES:
            raise PulsarConnectionError(
                f"Connection {conn_id!r}: Service URL {host!r} has scheme {scheme!r}; use pulsar://host:6650 "
                "or pulsar+ssl://host:6651 (http:// URLs belong in the extras admin_url / metrics_url)."
            )
        if not rest:
            raise PulsarConnectionError(
                f"Connection {conn_id!r}: Service URL {host!r} names no broker; use e.g. "
                "pulsar://localhost:6650."
            )
        return f"{scheme}://{_with_ports(conn_id, host, rest, port)}"
    name, _, given_port = host.partition(":")
    if "/" in host or not name or (given_port and not given_port.isdigit()):
        raise PulsarConnectionError(
            f"Connection {conn_id!r}: Service URL {host!r} is neither a service URL nor host[:port]; "
            "give pulsar://host:6650 (or pulsar+ssl://host:6651), or host:6650."
        )
    if given_port:
        port = _port(conn_id, int(given_port))
    tls = use_tls or conn_type == "pulsar+ssl"
    scheme = "pulsar+ssl" if tls else "pulsar"
    return f"{scheme}://{name}:{port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT)}"


def _with_ports(conn_id: str, host: str, rest: str, port: int | None) -> str:
    """The brokers of a service URL, each port checked, with Port added to those that name none."""
    brokers, slash, path = rest.partition("/")
    parts = []
    for broker in (b.strip() for b in brokers.split(",")):
        _, sep, own = broker.rpartition(":")
        if not sep or "]" in own:  # no port (a bracketed IPv6 address has colons of its own)
            parts.append(broker if port is None else f"{broker}:{port}")
            continue
        if not (own.isdigit() and 0 < int(own) < 65536):
            raise PulsarConnectionError(
                f"Connection {conn_id!r}: Service URL {host!r} has port {own!r}; a port is a number "
                "1-65535, e.g. pulsar://broker:6650."
            )
        if port is not None and int(own) != port:
            raise PulsarConnectionError(
                f"Connection {conn_id!r}: Port {port} contradicts the port {own} in Service URL "
                f"{host!r}; make them equal (Airflow's Test button needs Port), or leave the port out "
                "of the Service URL to use Port."
            )
        parts.append(broker)
    return ",".join(parts) + slash + path


def _port(conn_id: str, port: Any) -> int | None:
    """A port of 1-65535, or ``None`` (``None``, ``""`` or 0: what an empty form field posts)."""
    if port in (None, "", 0):
        return None
    try:
        number = int(port)
    except (TypeError, ValueError):
        number = -1
    if not 0 < number < 65536:
        raise PulsarConnectionError(f"Connection {conn_id!r}: Port must be 1-65535; got {port!r}.")
    return number


def _text(conn_id: str, extra: Mapping[str, Any], name: str, kind: str = "a string") -> str | None:
    value = extra.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise PulsarConnectionError(f"Connection {conn_id!r}: extra {name!r} must be {kind}; got {value!r}.")
    return value.strip()


def _oauth2(
    conn_id: str, extra: Mapping[str, Any], login: str | None, password: str | None
) -> OAuth2Settings | None:
    issuer = _http_url(conn_id, extra, "oauth2_issuer_url", "https://auth.example.com/")
    credentials_file = _text(conn_id, extra, "oauth2_credentials_file", "a file path")
    others = [k for k in ("oauth2_audience", "oauth2_scope", "oauth2_credentials_file") if extra.get(k)]
    if issuer is None:
        if others:
            raise PulsarConnectionError(
                f"Connection {conn_id!r}: extras {others} configure OAuth2 but 'oauth2_issuer_url' is "
                "not set; set it to the OAuth2 issuer (e.g. https://auth.example.com/) or remove them."
            )
        return None
    if credentials_file and (login or password):
        raise PulsarConnectionError(
            f"Connection {conn_id!r}: OAuth2 credentials are given twice (Login/Password and extra "
            "'oauth2_credentials_file'); keep one of them."
        )
    if not credentials_file and not (login and password):
        raise PulsarConnectionError(
            f"Connection {conn_id!r}: OAuth2 needs the client ID in Login and the client secret in Password, "
            "or extra 'oauth2_credentials_file' naming a JSON key file with client_id and client_secret."
        )
    return OAuth2Settings(
        issuer_url=issuer,
        client_id=login or None,
        client_secret=password or None,
        credentials_file=credentials_file,
        audience=_text(conn_id, extra, "oauth2_audience"),
        scope=_text(conn_id, extra, "oauth2_scope"),
    )


def parse_pulsar_connection(
    conn_id: str,
    *,
    conn_type: str | None,
    host: str | None,
    port: int | None = None,
    login: str | None = None,
    password: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> PulsarConnectionConfig:
    """The validated configuration of a ``pulsar`` connection; errors name the fix, never a secret."""
    if conn_type not in (None, "", "pulsar", "pulsar+ssl"):
        raise PulsarConnectionError(
            f"Connection {conn_id!r} has conn_type {conn_type!r}; a Pulsar connection needs conn_type "
            f"'pulsar', e.g. {_EXAMPLE}"
        )
    host = (host or "").strip()
    if not host:
        raise PulsarConnectionError(
            f"Connection {conn_id!r} has no Host; set Host (Service URL) to a service URL like "
            f"pulsar://localhost:6650, e.g. {_EXAMPLE}"
        )
    extra = dict(extra or {})
    use_tls = _as_bool(conn_id, extra, "use_tls")
    service_url = _service_url(conn_id, conn_type, host, _port(conn_id, port), use_tls)
    if use_tls and service_url.startswith("pulsar://"):
        raise PulsarConnectionError(
            f"Connection {conn_id!r}: extra use_tls is true but Service URL is {host!r}; "
            "use a pulsar+ssl:// URL or give only the host name."
        )
    cert = _text(conn_id, extra, "tls_cert_file_path", "a file path")
    key = _text(conn_id, extra, "tls_key_file_path", "a file path")
    if bool(cert) != bool(key):
        raise PulsarConnectionError(
            f"Connection {conn_id!r}: a TLS client certificate needs both extras 'tls_cert_file_path' and "
            "'tls_key_file_path' (PEM files readable by the workers)."
        )
    if cert and not service_url.startswith("pulsar+ssl://"):
        raise PulsarConnectionError(
            f"Connection {conn_id!r}: a TLS client certificate needs a pulsar+ssl:// Service URL; "
            f"got {service_url!r}."
        )
    login = (login or "").strip() or None
    oauth2 = _oauth2(conn_id, extra, login, password or None)
    return PulsarConnectionConfig(
        conn_id=conn_id,
        service_url=service_url,
        admin_url=_http_url(conn_id, extra, "admin_url", "http://localhost:8080"),
        metrics_url=_http_url(conn_id, extra, "metrics_url", "http://localhost:8080/metrics"),
        token=None if oauth2 is not None else (password or None),
        tls_trust_certs_file_path=_text(conn_id, extra, "tls_trust_certs_file_path", "a file path"),
        tls_allow_insecure_connection=_as_bool(conn_id, extra, "tls_allow_insecure_connection"),
        tls_cert_file_path=cert,
        tls_key_file_path=key,
        oauth2=oauth2,
        test_topic=_text(conn_id, extra, "test_topic"),
        ignored_extras=tuple(sorted(set(extra) - KNOWN_EXTRAS)),
        ignored_login=bool(login) and oauth2 is None,
    )
