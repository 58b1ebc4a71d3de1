"""Triggers of the provider (run in the Airflow triggerer)."""
