"""Create a ``pulsar.Client`` whose C++ logs go to Python ``logging`` (never stdout), with its auth, and
reach the brokers of a service URL by TCP first."""

from __future__ import annotations

import base64
import json
import logging
import re
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

#: Keys of the ``oauth2`` mapping :func:`create_client` accepts.
OAUTH2_KEYS = frozenset({"issuer_url", "audience", "scope", "client_id", "client_secret", "credentials_file"})

_ENDPOINT = re.compile(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]+))(?::(?P<port>\d+))?")


def service_endpoints(service_url: str) -> list[tuple[str, int]]:
    """``pulsar://h1:6650,h2`` -> ``[("h1", 6650), ("h2", 6650)]`` (the scheme's default port)."""
    scheme, _, rest = service_url.partition("://")
    default = 6651 if scheme == "pulsar+ssl" else 6650
    matches = (_ENDPOINT.fullmatch(item.strip()) for item in rest.split("/", 1)[0].split(","))
    return [(m["v6"] or m["host"], int(m["port"]) if m["port"] else default) for m in matches if m]


def connect_errors(service_url: str, timeout_s: float) -> Iterator[tuple[str, int, OSError | None]]:
    """``(host, port, error)`` per broker of ``service_url``, after a TCP connect (``None``: accepted)."""
    for host, port in service_endpoints(service_url):
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError as exc:
            yield host, port, exc
        else:
            yield host, port, None


def oauth2_params(oauth2: Mapping[str, str | None]) -> str:
    """The JSON parameters of ``pulsar.AuthenticationOauth2`` (client credentials, in a key file or in
    memory as a ``data:`` URL, never on disk). The result holds the secret: never log it."""
    if unknown := sorted(set(oauth2) - OAUTH2_KEYS):
        raise ValueError(f"unknown OAuth2 settings {unknown}; use {sorted(OAUTH2_KEYS)}")
    if not (issuer := oauth2.get("issuer_url")):
        raise ValueError("OAuth2 needs issuer_url, e.g. https://auth.example.com/")
    params = {"issuer_url": str(issuer)} | {k: str(oauth2[k]) for k in ("audience", "scope") if oauth2.get(k)}
    if oauth2.get("credentials_file"):
        params["private_key"] = str(oauth2["credentials_file"])
    elif oauth2.get("client_id") and oauth2.get("client_secret"):
        material = json.dumps({"client_id": oauth2["client_id"], "client_secret": oauth2["client_secret"]})
        params["private_key"] = "data:application/json;base64," + base64.b64encode(material.encode()).decode()
    else:
        raise ValueError(
            "OAuth2 needs client_id and client_secret, or credentials_file (a JSON key file with both)"
        )
    return json.dumps(params)


def create_client(
    service_url: str,
    *,
    logger: logging.Logger | None = None,
    token: str | None = None,
    tls_trust_certs_file_path: str | None = None,
    tls_allow_insecure_connection: bool = False,
    tls_cert_file_path: str | None = None,
    tls_key_file_path: str | None = None,
    oauth2: Mapping[str, str | None] | None = None,
    **client_options: Any,
) -> Any:
    """A ``pulsar.Client`` for ``service_url`` that logs through ``logger`` (default ``"pulsar"``), with a JWT
    ``token``, ``oauth2`` client credentials or a client certificate alone (with a token or OAuth2, presented
    for mutual TLS); ``client_options`` go to ``pulsar.Client``."""
    import pulsar

    given = [name for name, value in (("token", token), ("oauth2", oauth2)) if value]
    if "authentication" in client_options and given:
        raise ValueError(f"give either {given[0]}= or authentication=, not both")
    if len(given) > 1:
        raise ValueError("give either token= or oauth2=, not both")
    if bool(tls_cert_file_path) != bool(tls_key_file_path):
        raise ValueError("a TLS client certificate needs both tls_cert_file_path and tls_key_file_path")
    if token:
        client_options["authentication"] = pulsar.AuthenticationToken(token)
    elif oauth2:
        client_options["authentication"] = pulsar.AuthenticationOauth2(oauth2_params(oauth2))
    elif tls_cert_file_path and "authentication" not in client_options:
        client_options["authentication"] = pulsar.AuthenticationTLS(tls_cert_file_path, tls_key_file_path)
    if tls_cert_file_path and (token or oauth2):
        client_options["tls_certificate_file_path"] = tls_cert_file_path
        client_options["tls_private_key_file_path"] = tls_key_file_path
    if tls_trust_certs_file_path:
        client_options["tls_trust_certs_file_path"] = tls_trust_certs_file_path
    if tls_allow_insecure_connection:
        client_options["tls_allow_insecure_connection"] = True
    return pulsar.Client(service_url, logger=logger or logging.getLogger("pulsar"), **client_options)
