"""Who holds a replay run: the names of the app's output lock and broker leases, and the liveness check.

The Spark app takes them (``spark_apps/dlq_replay/lock.py``) and the Airflow operator reads them to find
an earlier attempt of the same run (``airflow_provider_dlq/operators/reattach.py``): one definition here.
"""

from __future__ import annotations

import hashlib
import os

from pulsar_dlq_consumer.context import base_topic
from pulsar_dlq_consumer.topics import normalize_topic

#: The output directory lock's files: ``<output>/locks/replay.lock.<generation>``.
LOCK_PREFIX = "replay.lock."
#: The Exclusive subscription each run holds on the lease topic of every DLQ topic it reads.
LEASE_SUBSCRIPTION = "dlq-replay-lease"


def lease_topic(dlq_topic: str) -> str:
    """The lease topic of a DLQ topic: same tenant and namespace, named by a hash of the full name (of
    the partitioned topic, so runs naming one partition and the whole topic share one lease)."""
    full = base_topic(normalize_topic(dlq_topic))
    namespace = full.rsplit("/", 1)[0]
    digest = hashlib.sha256(full.encode("utf-8")).hexdigest()[:16]
    return f"{namespace}/dlq-replay-lease-{digest}"


def lock_generation(name: str) -> int | None:
    """The generation of an output lock file's name, ``None`` for any other file."""
    tail = name[len(LOCK_PREFIX) :] if name.startswith(LOCK_PREFIX) else ""
    return int(tail) if tail.isdigit() else None


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` (Linux ``/proc/<pid>/stat`` field 22), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int, start: str | None) -> bool:
    """True while process ``pid`` of this host runs and is the one started at ``start``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return start is None or process_start(pid) in (None, start)
