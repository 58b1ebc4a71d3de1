"""Sensors of the provider."""
