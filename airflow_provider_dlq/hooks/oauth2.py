"""OAuth2 client credentials for the admin/metrics HTTP calls (the broker client does its own).

The library's :class:`~pulsar_dlq_consumer.admin.ClientCredentials` (discovery, grant form, answers and
token cache) with its two requests sent through the hook's ``httpx.AsyncClient``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from airflow_provider_dlq.errors import DlqProviderError
from pulsar_dlq_consumer import admin

if TYPE_CHECKING:
    import httpx

    from airflow_provider_dlq.hooks.connection import OAuth2Settings


class OAuth2Error(DlqProviderError, admin.OAuth2Error):
    """No access token could be obtained; the message names the URL and the cause, never a secret."""


class ClientCredentials(admin.ClientCredentials):
    """Access tokens for one OAuth2 client, cached until near expiry."""

    error = OAuth2Error

    def __init__(self, settings: OAuth2Settings) -> None:
        super().__init__(asdict(settings))
        self.settings = settings

    async def token(self, client: httpx.AsyncClient) -> str:
        """An access token, fetched through ``client`` when none is cached."""
        import httpx

        cached = self.cached()
        if cached:
            return cached
        try:
            response = await client.get(self.discovery_url)
            endpoint = self.answer(
                self.discovery_url, response.status_code, response.content, "token_endpoint"
            )
            response = await client.post(endpoint, data=self.form())
        except httpx.HTTPError as exc:
            issuer = self.settings.issuer_url
            raise OAuth2Error(f"OAuth2 issuer {issuer} unreachable: {type(exc).__name__}: {exc}") from exc
        return self.answer(endpoint, response.status_code, response.content, "access_token")
