"""Airflow plugins of the provider: the API-server endpoint that serves replay reports."""

from __future__ import annotations
