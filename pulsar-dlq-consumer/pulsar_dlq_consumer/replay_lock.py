"""Who holds a replay run: the names the replay app's output lock and broker leases use.

The Spark app takes them (``spark_apps/dlq_replay/lock.py``) and the Airflow operator reads them to find
an earlier attempt of the same run (``airflow_provider_dlq/operators/reattach.py``): one definition here.
"""

from __future__ import annotations

import hashlib

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
