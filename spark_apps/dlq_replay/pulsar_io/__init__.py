"""Pulsar I/O for the replay app (``pulsar`` is imported lazily: importing this is cheap and fork-safe)."""

from __future__ import annotations
