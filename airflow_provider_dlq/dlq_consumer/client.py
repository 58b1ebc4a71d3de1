"""Create a ``pulsar.Client`` whose C++ logs go to Python ``logging`` (never stdout)."""

from __future__ import annotations

import logging
from typing import Any


def create_client(
    service_url: str,
    *,
    logger: logging.Logger | None = None,
    token: str | None = None,
    tls_trust_certs_file_path: str | None = None,
    tls_allow_insecure_connection: bool = False,
    **client_options: Any,
) -> Any:
    """Return a ``pulsar.Client`` for ``service_url`` that logs through ``logger``.

    Parameters
    ----------
    service_url
        ``pulsar://host:6650`` or ``pulsar+ssl://host:6651``.
    logger
        Python logger for the client's logs (default ``logging.getLogger("pulsar")``).
    token
        Optional JWT for token authentication. It is never logged.
    tls_trust_certs_file_path, tls_allow_insecure_connection
        TLS settings for ``pulsar+ssl://`` URLs.
    client_options
        Further ``pulsar.Client`` keyword arguments (TLS, timeouts, ...).
    """
    import pulsar

    if "authentication" in client_options and token is not None:
        raise ValueError("give either token= or authentication=, not both")
    if token:
        client_options["authentication"] = pulsar.AuthenticationToken(token)
    if tls_trust_certs_file_path:
        client_options["tls_trust_certs_file_path"] = tls_trust_certs_file_path
    if tls_allow_insecure_connection:
        client_options["tls_allow_insecure_connection"] = True
    return pulsar.Client(service_url, logger=logger or logging.getLogger("pulsar"), **client_options)


__all__ = ["create_client"]
