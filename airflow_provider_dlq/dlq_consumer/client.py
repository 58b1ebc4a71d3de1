"""Create a ``pulsar.Client`` whose C++ logs go to Python ``logging`` (never stdout)."""

from __future__ import annotations

import logging
from typing import Any


def create_client(
    service_url: str,
    *,
    logger: logging.Logger | None = None,
    token: str | None = None,
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
    client_options
        Further ``pulsar.Client`` keyword arguments (TLS, timeouts, ...).
    """
    import pulsar

    if "authentication" in client_options and token is not None:
        raise ValueError("give either token= or authentication=, not both")
    if token is not None:
        client_options["authentication"] = pulsar.AuthenticationToken(token)
    return pulsar.Client(service_url, logger=logger or logging.getLogger("pulsar"), **client_options)


__all__ = ["create_client"]
