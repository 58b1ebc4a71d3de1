"""Errors of the standalone launcher; each message names the fix."""

from __future__ import annotations


class StandaloneError(RuntimeError):
    """Apache Pulsar standalone could not be assembled, started or reached."""
