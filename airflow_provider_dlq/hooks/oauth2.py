"""OAuth2 client credentials for the admin/metrics HTTP calls (the broker client does its own): the
library's :class:`~pulsar_dlq_consumer.admin.ClientCredentials` for the connection's settings."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from airflow_provider_dlq.errors import DlqProviderError
from pulsar_dlq_consumer import admin

if TYPE_CHECKING:
    from airflow_provider_dlq.hooks.connection import OAuth2Settings


class OAuth2Error(DlqProviderError, admin.OAuth2Error):
    """No access token could be obtained; the message names the URL and the cause, never a secret."""


class ClientCredentials(admin.ClientCredentials):
    """Access tokens for one OAuth2 client, cached until near expiry."""

    error = OAuth2Error

    def __init__(self, settings: OAuth2Settings) -> None:
        super().__init__(asdict(settings))
        self.settings = settings
