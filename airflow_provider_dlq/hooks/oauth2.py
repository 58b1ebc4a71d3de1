"""OAuth2 client credentials for the admin/metrics HTTP calls (the broker client does its own).

Discovery at ``<issuer_url>/.well-known/openid-configuration``, then a ``client_credentials`` grant;
tokens are cached until shortly before they expire. Errors name the URL and status, never a secret.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_dlq.errors import DlqProviderError

if TYPE_CHECKING:
    import httpx

    from airflow_provider_dlq.hooks.connection import OAuth2Settings

DISCOVERY_PATH = "/.well-known/openid-configuration"
#: Seconds before expiry at which a cached token is renewed.
EXPIRY_MARGIN = 30.0


class OAuth2Error(DlqProviderError, RuntimeError):
    """No access token could be obtained; the message names the URL and the cause, never a secret."""


def load_credentials(settings: OAuth2Settings) -> tuple[str, str]:
    """``(client_id, client_secret)`` from the settings or their credentials file."""
    if settings.client_id and settings.client_secret:
        return settings.client_id, settings.client_secret
    path = settings.credentials_file
    if not path:
        raise OAuth2Error("OAuth2 needs client_id and client_secret, or a credentials file")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise OAuth2Error(f"cannot read the OAuth2 credentials file {path!r}: {exc.strerror}") from exc
    except ValueError as exc:
        raise OAuth2Error(f"the OAuth2 credentials file {path!r} is not JSON") from exc
    if not isinstance(data, dict) or not data.get("client_id") or not data.get("client_secret"):
        raise OAuth2Error(f"the OAuth2 credentials file {path!r} needs client_id and client_secret")
    return str(data["client_id"]), str(data["client_secret"])


def _answer(response: httpx.Response, what: str, key: str, fix: str) -> tuple[str, dict[str, Any]]:
    """``key`` of the JSON answer to ``what`` (a request naming its URL), and the whole answer."""
    if response.status_code != 200:
        raise OAuth2Error(f"{what} returned HTTP {response.status_code}; {fix}")
    try:
        body = response.json()
        return str(body[key]), body
    except (ValueError, KeyError, TypeError) as exc:
        raise OAuth2Error(f"{what} answered with no {key}; {fix}") from exc


@dataclass
class ClientCredentials:
    """Access tokens for one OAuth2 client, cached until near expiry."""

    settings: OAuth2Settings
    _token: str | None = field(default=None, repr=False)
    _expires: float = 0.0

    @property
    def discovery_url(self) -> str:
        return self.settings.issuer_url.rstrip("/") + DISCOVERY_PATH

    def _form(self) -> dict[str, str]:
        client_id, client_secret = load_credentials(self.settings)
        form = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": client_secret}
        if self.settings.audience:
            form["audience"] = self.settings.audience
        if self.settings.scope:
            form["scope"] = self.settings.scope
        return form

    async def token(self, client: httpx.AsyncClient) -> str:
        """An access token, fetched through ``client`` when none is cached."""
        import httpx

        if self._token and time.monotonic() < self._expires:
            return self._token
        try:
            discovery = f"OAuth2 discovery {self.discovery_url}"
            response = await client.get(self.discovery_url)
            endpoint, _ = _answer(response, discovery, "token_endpoint", "check oauth2_issuer_url")
            response = await client.post(endpoint, data=self._form())
            fix = "check the client ID, secret, audience and scope"
            self._token, body = _answer(response, f"OAuth2 token request to {endpoint}", "access_token", fix)
        except httpx.HTTPError as exc:
            issuer = self.settings.issuer_url
            raise OAuth2Error(f"OAuth2 issuer {issuer} unreachable: {type(exc).__name__}: {exc}") from exc
        expires_in = float(body.get("expires_in") or 3600)
        self._expires = time.monotonic() + max(0.0, expires_in - EXPIRY_MARGIN)
        return self._token
