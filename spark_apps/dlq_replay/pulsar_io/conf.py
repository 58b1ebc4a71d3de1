"""Connection settings (:class:`PulsarConf`) and one client per (process, conf), never used across fork()."""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pulsar_dlq_consumer.client import create_client
from pulsar_dlq_consumer.replay_options import BOOLEAN_WORDS, OAUTH2_CREDENTIALS_ENV, TOKEN_ENV
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError
from spark_apps.dlq_replay.redaction import safe_url

if TYPE_CHECKING:
    from collections.abc import Mapping

#: The data-source option of each optional setting (Spark lower-cases option keys; we accept any case).
_OPTIONS = {
    "token_file": "auth.token.file",
    "tls_trust_certs_file": "tls.trust.certs.file",
    "client_log_file": "client.log.file",
    "admin_url": "admin.url",
    "tls_cert_file": "auth.tls.cert.file",
    "tls_key_file": "auth.tls.key.file",
    "oauth2_issuer_url": "auth.oauth2.issuer.url",
    "oauth2_audience": "auth.oauth2.audience",
    "oauth2_scope": "auth.oauth2.scope",
    "oauth2_credentials_file": "auth.oauth2.credentials.file",
}

CLIENT_LOGGER_NAME = "spark_apps.dlq_replay.pulsar_client"


@dataclass(frozen=True)
class PulsarConf:
    """How to reach Pulsar: where the credentials are, never their values, so it can travel in options,
    plans and logs (``docs/pulsar-data-source.md``)."""

    service_url: str
    token_env: str | None = TOKEN_ENV
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
    oauth2_credentials_env: str | None = OAUTH2_CREDENTIALS_ENV

    def __post_init__(self) -> None:
        if not str(self.service_url).startswith(("pulsar://", "pulsar+ssl://")):
            raise PulsarConfigError(
                "service_url must start with pulsar:// or pulsar+ssl://; got "
                f"{safe_url(str(self.service_url))}. "
                "Pass the broker's binary-protocol URL, e.g. pulsar://localhost:6650."
            )
        if self.admin_url is not None and not str(self.admin_url).startswith(("http://", "https://")):
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
        settings: dict[str, Any] = {name: getattr(options, name, None) for name in _OPTIONS}
        settings["token_file"] = getattr(options, "auth_token_file", None)
        return cls(service_url=options.service_url, **settings)

    def to_options(self) -> dict[str, str]:
        """Data-source options for this conf. Holds where the token is, never its value."""
        options = {
            "service.url": self.service_url,
            "auth.token.env": self.token_env or "",
            "tls.allow.insecure": "true" if self.tls_allow_insecure else "false",
            **{option: getattr(self, name) for name, option in _OPTIONS.items() if getattr(self, name)},
        }
        if self.oauth2_issuer_url:
            options["auth.oauth2.credentials.env"] = self.oauth2_credentials_env or ""
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> PulsarConf:
        """A conf from data-source options (keys in any case; an empty ``auth.token.env``: no token)."""
        opts = {str(k).lower(): v for k, v in options.items()}
        url = opts.get("service.url")
        if not url:
            raise PulsarConfigError(
                "option 'service.url' is required, e.g. .option('service.url', 'pulsar://localhost:6650')"
            )
        insecure_text = str(opts.get("tls.allow.insecure", "false")).strip().lower() or "false"
        if insecure_text not in BOOLEAN_WORDS:
            raise PulsarConfigError(
                f"option 'tls.allow.insecure' must be true or false; got {insecure_text!r}"
            )
        settings: dict[str, Any] = {name: opts.get(option) or None for name, option in _OPTIONS.items()}
        settings["admin_url"] = (settings["admin_url"] or "").strip().rstrip("/") or None
        return cls(
            service_url=url,
            token_env=opts.get("auth.token.env", TOKEN_ENV) or None,
            tls_allow_insecure=BOOLEAN_WORDS[insecure_text],
            oauth2_credentials_env=opts.get("auth.oauth2.credentials.env", OAUTH2_CREDENTIALS_ENV) or None,
            **settings,
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
        return (os.environ.get(self.token_env) or None) if self.token_env else None

    def read_oauth2(self) -> dict[str, str | None] | None:
        """The OAuth2 settings for :func:`create_client`, or ``None`` without an issuer URL."""
        if not self.oauth2_issuer_url:
            return None
        settings: dict[str, str | None] = dict(
            issuer_url=self.oauth2_issuer_url, audience=self.oauth2_audience, scope=self.oauth2_scope
        )
        if self.oauth2_credentials_file:
            if not os.path.isfile(self.oauth2_credentials_file):
                raise PulsarConfigError(
                    f"the OAuth2 credentials file {self.oauth2_credentials_file!r} does not exist; it must "
                    "be readable on the driver and every executor"
                )
            return {**settings, "credentials_file": self.oauth2_credentials_file}
        name = self.oauth2_credentials_env or OAUTH2_CREDENTIALS_ENV
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
    """Close this process's clients (at exit too: one destroyed at shutdown prints to stdout)."""
    pid = os.getpid()
    for key in [k for k in _clients if k[0] == pid]:
        client = _clients.pop(key)
        try:
            client.close()
        except Exception as exc:  # closing is best effort at exit
            client_logger().debug("closing the Pulsar client at exit failed: %s", type(exc).__name__)


atexit.register(close_own_clients)


def client_logger() -> logging.Logger:
    """The Python logger for the driver's clients (the C++ client logs to stdout otherwise)."""
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
    """This process's ``pulsar.Client`` for ``conf``, opened on first use and kept (Spark reuses workers)."""
    key = (os.getpid(), replace(conf, admin_url=None))  # the admin URL does not shape the client
    with _lock:
        if key not in _clients:
            import pulsar

            # A native logger: a Python one takes the GIL on the client's I/O threads, which log while they
            # hold a producer's lock, so a task thread calling that producer with the GIL held would deadlock.
            path = conf.client_log_file and conf.client_log_file.replace("{pid}", str(key[0]))
            level = pulsar.LoggerLevel.Warn
            logger = pulsar.FileLogger(level, path) if path else pulsar.ConsoleLogger(level)
            # Clients inherited across fork() stay referenced and untouched: closing or destroying one hangs.
            _clients[key] = create_client(conf.service_url, logger=logger, **client_auth_kwargs(conf))
        return _clients[key]
