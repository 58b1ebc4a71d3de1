"""Pulsar I/O for the replay app: data source, frozen windows, republish and commit.

Modules: :mod:`.conf` (connection settings and the per-process client), :mod:`.admin` (the admin REST
calls the reader mode needs), :mod:`.ids` (readable message ids and their order), :mod:`.cursor` (a
subscription's acked entries and a window's pending entry ranges), :mod:`.window` (frozen windows and
the read mode), :mod:`.window_reader` (Readers over pending entries: reader mode),
:mod:`.window_consumer` (a Shared consumer bounded by a window: consumer mode), :mod:`.source` (the
``pulsar`` Python Data Source), :mod:`.republish` (confirmed batched sends for ``mapInArrow``),
:mod:`.commit` (ack exactly the final messages, in either mode) and :mod:`.errors`. ``pulsar`` is
imported lazily inside functions, so importing this package is cheap and fork-safe.
"""

from __future__ import annotations
