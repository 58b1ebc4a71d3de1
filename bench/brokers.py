"""The brokers a contender runs on: Apache Pulsar standalone and the embedded pulsar-lite.

Every run gets a fresh broker with an empty data directory in the scratch folder, stopped by PID and
deleted afterwards, so no contender inherits another's backlog, cursors or caches.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench import workload

#: Broker kinds, in the order the harness runs them.
BROKERS = ("apache", "lite")
BROKER_LABELS = {"apache": "Apache Pulsar", "lite": "pulsar-lite"}


@dataclass(frozen=True)
class BenchBroker:
    """What a contender needs of a running broker. ``admin_url`` is None for the embedded broker
    (it has no admin REST: the replay app then reads in consumer mode)."""

    kind: str
    service_url: str
    admin_url: str | None
    pid: int
    start_s: float


@contextlib.contextmanager
def fresh_broker(kind: str, scratch: Path) -> Iterator[BenchBroker]:
    """A new broker of ``kind`` with an empty data directory, stopped and deleted afterwards."""
    import time

    if kind not in BROKERS:
        raise ValueError(f"unknown broker {kind!r}; choose from {', '.join(BROKERS)}")
    data = Path(tempfile.mkdtemp(prefix=f"broker-{kind}-", dir=scratch))
    started = time.perf_counter()
    try:
        if kind == "apache":
            from pulsar_standalone import start_standalone

            standalone = start_standalone(data, namespaces=(workload.NAMESPACE,))
            try:
                yield BenchBroker(
                    kind,
                    standalone.service_url,
                    standalone.admin_url,
                    standalone.pid,
                    time.perf_counter() - started,
                )
            finally:
                standalone.stop()
        else:
            from airflow_provider_dlq.embedded_broker import start_embedded_broker

            lite = start_embedded_broker(data)
            try:
                yield BenchBroker(kind, lite.service_url, None, -1, time.perf_counter() - started)
            finally:
                lite.stop()
    finally:
        shutil.rmtree(data, ignore_errors=True)
