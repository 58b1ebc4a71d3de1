"""Connection settings for Pulsar and the one-client-per-process rule.

:class:`PulsarConf` says *where* the token is (an environment variable or a file), never the token
itself, so it can travel in data-source options, plans and logs. :func:`get_client` opens at most one
``pulsar.Client`` per (process, conf): a client must never cross a ``fork()``, and Spark's Python
workers are forked, so the cache is keyed by ``os.getpid()`` and ``pulsar`` is imported lazily.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_dlq.dlq_consumer.client import create_client
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_TOKEN_ENV = "PULSAR_AUTH_TOKEN"
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
    """

    service_url: str
    token_env: str | None = DEFAULT_TOKEN_ENV
    token_file: str | None = None
    tls_trust_certs_file: str | None = None
    tls_allow_insecure: bool = False
    client_log_file: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.service_url, str) or not self.service_url.startswith(_SCHEMES):
            raise PulsarConfigError(
                f"service_url must start with pulsar:// or pulsar+ssl://; got {self.service_url!r}. "
                "Pass the broker's binary-protocol URL, e.g. pulsar://localhost:6650."
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


_clients: dict[tuple[int, PulsarConf], Any] = {}
_lock = threading.Lock()


def _reset_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock_in_child)


def _close_own_clients() -> None:
    """At exit, close the clients this process opened: an unclosed client prints to stdout when
    destroyed at interpreter shutdown (which would corrupt a driver's last stdout line)."""
    pid = os.getpid()
    for key in [k for k in _clients if k[0] == pid]:
        client = _clients.pop(key)
        try:
            client.close()
        except Exception as exc:  # closing is best effort at exit
            client_logger().debug("closing the Pulsar client at exit failed: %s", type(exc).__name__)


atexit.register(_close_own_clients)


def client_logger() -> logging.Logger:
    """The Python logger handed to every client (the C++ client logs to stdout otherwise)."""
    return logging.getLogger(CLIENT_LOGGER_NAME)


def get_client(conf: PulsarConf) -> Any:
    """Return this process's ``pulsar.Client`` for ``conf``, creating it on first use.

    Clients are cached per ``(os.getpid(), conf)`` and never shared across ``fork()``; a forked child
    gets its own. The client is kept open for the life of the process (Spark reuses Python workers).
    """
    key = (os.getpid(), conf)
    with _lock:
        client = _clients.get(key)
        if client is not None:
            return client
        import pulsar

        logger: Any = client_logger()
        if conf.client_log_file:
            path = conf.client_log_file.replace("{pid}", str(key[0]))
            logger = pulsar.FileLogger(pulsar.LoggerLevel.Warn, path)
        tls = conf.service_url.startswith("pulsar+ssl://")
        client = create_client(
            conf.service_url,
            logger=logger,
            token=conf.read_token(),
            tls_trust_certs_file_path=conf.tls_trust_certs_file if tls else None,
            tls_allow_insecure_connection=tls and conf.tls_allow_insecure,
            operation_timeout_seconds=30,
        )
        # Clients inherited from a parent process stay referenced and untouched: closing or destroying a
        # client across fork() hangs.
        _clients[key] = client
        return client
