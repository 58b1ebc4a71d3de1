"""Pulsar I/O for the replay app: data source, frozen windows, republish and commit.

``pulsar`` is imported lazily inside functions, so importing this package is cheap and fork-safe.
"""

from __future__ import annotations
