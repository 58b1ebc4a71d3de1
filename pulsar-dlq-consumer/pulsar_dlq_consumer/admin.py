"""What every Apache Pulsar admin REST caller shares: topic paths, TLS, bearer requests and OAuth2 tokens."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

from pulsar_dlq_consumer.errors import DlqConsumerError

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Seconds before expiry at which a cached token is renewed.
EXPIRY_MARGIN = 30.0
_FIXES = {
    "token_endpoint": "check the issuer URL",
    "access_token": "check the client ID, secret, audience and scope",
}


class OAuth2Error(DlqConsumerError, RuntimeError):
    """No access token could be obtained; the message names the URL and the cause, never a secret."""


def admin_path(topic: str, parts: int = 3) -> str:
    """``persistent://t/ns/name`` -> ``/admin/v2/persistent/t/ns/name`` (each part URL-quoted); with
    ``parts=2`` the namespace's path. The name is not validated (globs pass)."""
    domain, _, path = topic.partition("://")
    return f"/admin/v2/{domain}/" + "/".join(quote(n, safe="") for n in path.split("/", 2)[:parts])


def ssl_context(
    trust_certs_file: str | None = None,
    allow_insecure: bool = False,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> ssl.SSLContext:
    """Trust ``trust_certs_file`` or system CAs (``allow_insecure``: none, tests only); client cert if any."""
    if allow_insecure:
        context = ssl._create_unverified_context()
    else:
        context = ssl.create_default_context(cafile=trust_certs_file)
    if cert_file and key_file:
        context.load_cert_chain(cert_file, key_file)
    return context


def fetch(
    url: str,
    context: ssl.SSLContext | None = None,
    timeout_s: float = 30.0,
    *,
    token: str | None = None,
    form: Mapping[str, str] | None = None,
    method: str | None = None,
) -> tuple[int, bytes]:
    """``(status, body)`` of a GET, of a POST of ``form``, or of a bodiless ``method``, bearing ``token``.
    HTTP errors are answers too; no answer raises ``OSError`` (``URLError``, ``TimeoutError``, ...)."""
    data = urlencode(form).encode() if form is not None else None
    headers = {"Accept": "application/json, text/plain"}
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), _KeepMethod())
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class _KeepMethod(urllib.request.HTTPRedirectHandler):
    """Follows a 307/308 of a bodiless request with its method and headers, as a broker that does not own
    a topic redirects its admin calls (``analyzeBacklog`` is a POST) to the owner."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        if code in (307, 308) and req.data is None:
            kept = dict(req.header_items())
            return urllib.request.Request(newurl, headers=kept, method=req.get_method(), unverifiable=True)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class ClientCredentials:
    """OAuth2 access tokens of one client (client-credentials grant after issuer discovery), cached until
    near expiry. ``oauth2``: the settings :func:`~pulsar_dlq_consumer.client.create_client` takes."""

    def __init__(self, oauth2: Mapping[str, str | None]) -> None:
        self.oauth2 = dict(oauth2)
        self.discovery_url = str(oauth2["issuer_url"]).rstrip("/") + "/.well-known/openid-configuration"
        self._token: str | None = None
        self._expires = 0.0

    def form(self) -> dict[str, str]:
        """The token request (it holds the secret: never log it); credentials from a key file if given."""
        creds: dict[str, str | None] = self.oauth2
        path = self.oauth2.get("credentials_file")
        if path and not (creds.get("client_id") and creds.get("client_secret")):
            try:
                with open(path, encoding="utf-8") as handle:
                    creds = json.load(handle)
            except (OSError, ValueError) as exc:
                raise OAuth2Error(
                    f"cannot read the OAuth2 credentials file {path!r} as JSON: {exc}"
                ) from None
        if not isinstance(creds, dict) or not creds.get("client_id") or not creds.get("client_secret"):
            where = (
                f"the OAuth2 credentials file {path!r}" if path else "the settings (or a credentials file)"
            )
            raise OAuth2Error(f"OAuth2 needs client_id and client_secret in {where}")
        secret = {"client_id": str(creds["client_id"]), "client_secret": str(creds["client_secret"])}
        extra = {k: str(self.oauth2[k]) for k in ("audience", "scope") if self.oauth2.get(k)}
        return {"grant_type": "client_credentials", **secret, **extra}

    def answer(self, url: str, status: int, body: bytes, key: str) -> str:
        """``key`` (``token_endpoint`` or ``access_token``, which is cached) of the JSON answer of ``url``."""
        what = "OAuth2 discovery" if key == "token_endpoint" else "OAuth2 token request to"
        if status != 200:
            raise OAuth2Error(f"{what} {url} returned HTTP {status}; {_FIXES[key]}")
        try:
            answer = json.loads(body)
            value = str(answer[key])
            expires_in = float(answer.get("expires_in") or 3600)
        except (ValueError, KeyError, TypeError) as exc:
            raise OAuth2Error(f"{what} {url} answered with no {key}; {_FIXES[key]}") from exc
        if key == "access_token":
            self._token, self._expires = value, time.monotonic() + max(0.0, expires_in - EXPIRY_MARGIN)
        return value

    def access_token(self, context: ssl.SSLContext | None = None, timeout_s: float = 30.0) -> str:
        """An access token, fetched with :func:`fetch` when none is cached."""
        if self._token and time.monotonic() < self._expires:
            return self._token
        try:
            status, body = fetch(self.discovery_url, context, timeout_s)
            endpoint = self.answer(self.discovery_url, status, body, "token_endpoint")
            status, body = fetch(endpoint, context, timeout_s, form=self.form())
        except OSError as exc:  # no answer: refused, unknown host, timeout, TLS failure
            cause = getattr(exc, "reason", None) or exc
            raise OAuth2Error(f"OAuth2 issuer {self.oauth2['issuer_url']} unreachable: {cause}") from exc
        return self.answer(endpoint, status, body, "access_token")
