"""Pulsar I/O for the replay app: data source, frozen windows, republish and commit.

Modules: :mod:`.conf` (connection settings and the per-process client), :mod:`.ids` (readable message
ids and their order), :mod:`.window` (frozen windows), :mod:`.window_consumer` (a Shared consumer
bounded by a window), :mod:`.source` (the ``pulsar`` Python Data Source), :mod:`.republish` (confirmed
batched sends for ``mapInArrow``), :mod:`.commit` (ack exactly the final messages) and :mod:`.errors`.
``pulsar`` is imported lazily inside functions, so importing this package is cheap and fork-safe.
"""

from __future__ import annotations
