"""Triggers of the provider (run in the Airflow triggerer)."""

from __future__ import annotations
