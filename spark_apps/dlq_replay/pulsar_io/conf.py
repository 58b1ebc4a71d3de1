"""Connection settings for Pulsar and the one-client-per-process rule.

:class:`PulsarConf` says *where* the credentials are (environment variables or files), never the
secrets themselves, so it can travel in data-source options, plans and logs. Authentication: a JWT token,
OAuth2 client credentials, or a TLS client certificate (alone: ``AuthenticationTls``; with a token or
OAuth2: mutual TLS). :func:`get_client` opens at most one
``pulsar.Client`` per (process, conf): a client must never cross a ``fork()``, and Spark's Python
workers are forked, so the cache is keyed by ``os.getpid()`` and ``pulsar`` is imported lazily.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pulsar_dlq_consumer.client import create_client
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError
from spark_apps.dlq_replay.redaction import safe_url

if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_TOKEN_ENV = "PULSAR_AUTH_TOKEN"
#: Environment variable holding OAuth2 client credentials as JSON ``{"client_id", "client_secret"}``.
DEFAULT_OAUTH2_CREDENTIALS_ENV = "PULSAR_OAUTH2_CREDENTIALS"
_SCHEMES = ("pulsar://", "pulsar+ssl://")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}

# Data-source option names (Spark lower-cases option keys; we accept any case).
OPT_SERVICE_URL = "service.url"
OPT_TOKEN_ENV = "auth.token.env"
OPT_TOKEN_FILE = "auth.token.file"
OPT_TLS_TRUST = "tls.trust.certs.file"
OPT_TLS_INSECURE = "tls.allow.insecure"
OPT_CLIENT_LOG_FILE = "client.log.file"
OPT_ADMIN_URL = "admin.url"
_ADMIN_SCHEMES = ("http://", "https://")
OPT_TLS_CERT = "auth.tls.cert.file"
OPT_TLS_KEY = "auth.tls.key.file"
OPT_OAUTH2_ISSUER = "auth.oauth2.issuer.url"
OPT_OAUTH2_AUDIENCE = "auth.oauth2.audience"
OPT_OAUTH2_SCOPE = "auth.oauth2.scope"
OPT_OAUTH2_FILE = "auth.oauth2.credentials.file"
OPT_OAUTH2_ENV = "auth.oauth2.credentials.env"
_OPTIONAL_SETTINGS = (
    ("tls_cert_file", OPT_TLS_CERT),
    ("tls_key_file", OPT_TLS_KEY),
    ("oauth2_issuer_url", OPT_OAUTH2_ISSUER),
    ("oauth2_audience", OPT_OAUTH2_AUDIENCE),
    ("oauth2_scope", OPT_OAUTH2_SCOPE),
    ("oauth2_credentials_file", OPT_OAUTH2_FILE),
)

CLIENT_LOGGER_NAME = "spark_apps.dlq_replay.pulsar_client"


@dataclass(frozen=True)
class PulsarConf:
    """How to reach Pulsar.

    Parameters
    ----------
    service_url:
        ``pulsar://host:6650`` or ``pulsar+ssl://host:6651``.
    token_env:
        Name of the environment variable holding a JWT token (default ``PULSAR_AUTH_TOKEN``); an unset
        or empty variable means no authentication. ``None`` disables the lookup.
    token_file:
        Path of a file holding the token; takes precedence over ``token_env``.
    tls_trust_certs_file:
        CA bundle for ``pulsar+ssl://``.
    tls_allow_insecure:
        Accept an untrusted server certificate (tests only).
    client_log_file:
        ``None`` (default): the client logs through Python ``logging``. The C++ client hands the
        Python logger every DEBUG line (about two per message sent or received) and takes the GIL for
        each, which costs 10-20 % of the CPU of a bulk read or republish. A path makes the client log
        WARN and above natively to that file instead (never to stdout); ``{pid}`` in it is replaced
        by the process id.
    admin_url:
        Apache Pulsar admin REST, e.g. ``http://broker:8080``. When it answers, a replay reads each DLQ
        message once (Readers) and acks ids from its ledger; without it the two-read consumer mode is
        used. See ``docs/pulsar-data-source.md``.
    tls_cert_file, tls_key_file:
        Client certificate and key (PEM files on the driver and every executor): the authentication when
        no token or OAuth2 is configured, else presented at the TLS layer (mutual TLS).
    oauth2_issuer_url, oauth2_audience, oauth2_scope:
        OAuth2 client credentials flow (enabled by the issuer URL).
    oauth2_credentials_file:
        JSON key file ``{"client_id": ..., "client_secret": ...}``; takes precedence over
        ``oauth2_credentials_env`` (default ``PULSAR_OAUTH2_CREDENTIALS``, the same JSON).
    """

    service_url: str
    token_env: str | None = DEFAULT_TOKEN_ENV
    token_file: str | None = None
    tls_trust_certs_file: str | None = None
    tls_allow_insecure: bool = False
    client_log_file: str | None = None
    admin_url: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    oauth2_issuer_url: str | None = None
    oauth2_audience: str | None = None
    oauth2_scope: str | None = None
    oauth2_credentials_file: str | None = None
    oauth2_credentials_env: str | None = DEFAULT_OAUTH2_CREDENTIALS_ENV

    def __post_init__(self) -> None:
        if not isinstance(self.service_url, str) or not self.service_url.startswith(_SCHEMES):
            raise PulsarConfigError(
                "service_url must start with pulsar:// or pulsar+ssl://; got "
                f"{safe_url(str(self.service_url))}. "
                "Pass the broker's binary-protocol URL, e.g. pulsar://localhost:6650."
            )
        if self.admin_url is not None and (
            not isinstance(self.admin_url, str) or not self.admin_url.startswith(_ADMIN_SCHEMES)
        ):
            raise PulsarConfigError(
                "admin_url must start with http:// or https://; got "
                f"{safe_url(str(self.admin_url))}. Pass the broker's admin REST URL, e.g. "
                "http://localhost:8080, or leave it unset."
            )
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise PulsarConfigError(
                "a TLS client certificate needs both the certificate and the key file "
                "(--tls-cert-file and --tls-key-file)"
            )
        if self.tls_cert_file and not self.service_url.startswith("pulsar+ssl://"):
            raise PulsarConfigError(
                "a TLS client certificate needs a pulsar+ssl:// service URL; got "
                f"{safe_url(self.service_url)}"
            )
        if not self.oauth2_issuer_url and (self.oauth2_credentials_file or self.oauth2_audience):
            raise PulsarConfigError(
                "OAuth2 settings were given without the issuer URL; add --oauth2-issuer-url"
            )

    @classmethod
    def from_app_options(cls, options: Any) -> PulsarConf:
        """The conf of a replay run (``ReplayOptions``: service and admin URLs, token file, TLS, OAuth2)."""

        def get(name: str) -> Any:
            return getattr(options, name, None)

        return cls(
            service_url=options.service_url,
            token_file=get("auth_token_file"),
            tls_trust_certs_file=get("tls_trust_certs_file"),
            admin_url=get("admin_url"),
            tls_cert_file=get("tls_cert_file"),
            tls_key_file=get("tls_key_file"),
            oauth2_issuer_url=get("oauth2_issuer_url"),
            oauth2_audience=get("oauth2_audience"),
            oauth2_scope=get("oauth2_scope"),
            oauth2_credentials_file=get("oauth2_credentials_file"),
        )

    def to_options(self) -> dict[str, str]:
        """Data-source options for this conf. Holds where the token is, never its value."""
        options = {
            OPT_SERVICE_URL: self.service_url,
            OPT_TOKEN_ENV: self.token_env or "",
            OPT_TLS_INSECURE: "true" if self.tls_allow_insecure else "false",
        }
        if self.token_file:
            options[OPT_TOKEN_FILE] = self.token_file
        if self.tls_trust_certs_file:
            options[OPT_TLS_TRUST] = self.tls_trust_certs_file
        if self.client_log_file:
            options[OPT_CLIENT_LOG_FILE] = self.client_log_file
        if self.admin_url:
            options[OPT_ADMIN_URL] = self.admin_url
        for attribute, option in _OPTIONAL_SETTINGS:
            value = getattr(self, attribute)
            if value:
                options[option] = value
        if self.oauth2_issuer_url:
            options[OPT_OAUTH2_ENV] = self.oauth2_credentials_env or ""
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> PulsarConf:
        """Build a conf from data-source options (keys case-insensitive).

        ``auth.token.env`` absent means ``PULSAR_AUTH_TOKEN``; present and empty disables it.
        """
        opts = {str(k).lower(): v for k, v in options.items()}
        url = opts.get(OPT_SERVICE_URL)
        if not url:
            raise PulsarConfigError(
                f"option {OPT_SERVICE_URL!r} is required, e.g. .option('service.url', 'pulsar://localhost:6650')"
            )
        insecure_text = str(opts.get(OPT_TLS_INSECURE, "false")).strip().lower()
        if insecure_text not in _TRUE | _FALSE:
            raise PulsarConfigError(
                f"option {OPT_TLS_INSECURE!r} must be true or false; got {insecure_text!r}"
            )
        token_env = opts.get(OPT_TOKEN_ENV, DEFAULT_TOKEN_ENV)
        return cls(
            service_url=url,
            token_env=token_env or None,
            token_file=opts.get(OPT_TOKEN_FILE) or None,
            tls_trust_certs_file=opts.get(OPT_TLS_TRUST) or None,
            tls_allow_insecure=insecure_text in _TRUE,
            client_log_file=opts.get(OPT_CLIENT_LOG_FILE) or None,
            admin_url=(opts.get(OPT_ADMIN_URL) or "").strip().rstrip("/") or None,
            oauth2_credentials_env=opts.get(OPT_OAUTH2_ENV, DEFAULT_OAUTH2_CREDENTIALS_ENV) or None,
            **{attribute: opts.get(option) or None for attribute, option in _OPTIONAL_SETTINGS},
        )

    def read_token(self) -> str | None:
        """Return the token from ``token_file`` or ``token_env``, or ``None`` for no authentication."""
        if self.token_file:
            try:
                with open(self.token_file, encoding="utf-8") as handle:
                    token = handle.read().strip()
            except OSError as exc:
                raise PulsarConfigError(
                    f"cannot read the Pulsar token file ({exc.strerror}; path not shown, as it could be a "
                    "token typed in the wrong place): check the path given as auth token file, its "
                    "permissions, and that it exists on the driver and every executor"
                ) from exc
            if not token:
                raise PulsarConfigError("the Pulsar token file is empty; write the JWT token into it")
            return token
        if self.token_env:
            return os.environ.get(self.token_env) or None
        return None

    def read_oauth2(self) -> dict[str, str | None] | None:
        """The OAuth2 settings for :func:`create_client` (with the client secret when it comes from the
        environment), or ``None`` without an issuer URL."""
        if not self.oauth2_issuer_url:
            return None
        settings: dict[str, str | None] = {
            "issuer_url": self.oauth2_issuer_url,
            "audience": self.oauth2_audience,
            "scope": self.oauth2_scope,
        }
        if self.oauth2_credentials_file:
            if not os.path.isfile(self.oauth2_credentials_file):
                raise PulsarConfigError(
                    f"the OAuth2 credentials file {self.oauth2_credentials_file!r} does not exist; it must "
                    "be readable on the driver and every executor"
                )
            return {**settings, "credentials_file": self.oauth2_credentials_file}
        name = self.oauth2_credentials_env or DEFAULT_OAUTH2_CREDENTIALS_ENV
        text = os.environ.get(name) if self.oauth2_credentials_env else None
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None
        if not isinstance(data, dict) or not data.get("client_id") or not data.get("client_secret"):
            raise PulsarConfigError(
                f"OAuth2 is configured (issuer {safe_url(self.oauth2_issuer_url)}) but no client credentials "
                f'were found: set {name} to {{"client_id": ..., "client_secret": ...}} or pass '
                "--oauth2-credentials-file"
            )
        return {**settings, "client_id": str(data["client_id"]), "client_secret": str(data["client_secret"])}


_clients: dict[tuple[int, PulsarConf], Any] = {}
_lock = threading.Lock()


def _reset_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock_in_child)


def close_own_clients() -> None:
    """Close the clients this process opened (also run at exit: an unclosed client prints to stdout when
    destroyed at interpreter shutdown, which would corrupt a driver's last stdout line)."""
    pid = os.getpid()
    for key in [k for k in _clients if k[0] == pid]:
        client = _clients.pop(key)
        try:
            client.close()
        except Exception as exc:  # closing is best effort at exit
            client_logger().debug("closing the Pulsar client at exit failed: %s", type(exc).__name__)


atexit.register(close_own_clients)


def client_logger() -> logging.Logger:
    """The Python logger handed to every client (the C++ client logs to stdout otherwise)."""
    return logging.getLogger(CLIENT_LOGGER_NAME)


def client_auth_kwargs(conf: PulsarConf, operation_timeout_seconds: int = 30) -> dict[str, Any]:
    """``create_client`` keyword arguments for ``conf``: token or OAuth2, TLS trust, client certificate."""
    tls = conf.service_url.startswith("pulsar+ssl://")
    oauth2 = conf.read_oauth2()
    return {
        "token": None if oauth2 else conf.read_token(),
        "oauth2": oauth2,
        "tls_trust_certs_file_path": conf.tls_trust_certs_file if tls else None,
        "tls_allow_insecure_connection": tls and conf.tls_allow_insecure,
        "tls_cert_file_path": conf.tls_cert_file if tls else None,
        "tls_key_file_path": conf.tls_key_file if tls else None,
        "operation_timeout_seconds": operation_timeout_seconds,
    }


def get_client(conf: PulsarConf) -> Any:
    """Return this process's ``pulsar.Client`` for ``conf``, creating it on first use.

    Clients are cached per ``(os.getpid(), conf)`` and never shared across ``fork()``; a forked child
    gets its own. The client is kept open for the life of the process (Spark reuses Python workers).
    """
    key = (os.getpid(), replace(conf, admin_url=None))  # the admin URL does not shape the client
    with _lock:
        client = _clients.get(key)
        if client is not None:
            return client
        import pulsar

        logger: Any = client_logger()
        if conf.client_log_file:
            path = conf.client_log_file.replace("{pid}", str(key[0]))
            logger = pulsar.FileLogger(pulsar.LoggerLevel.Warn, path)
        client = create_client(conf.service_url, logger=logger, **client_auth_kwargs(conf))
        # Clients inherited from a parent process stay referenced and untouched: closing or destroying a
        # client across fork() hangs.
        _clients[key] = client
        return client
