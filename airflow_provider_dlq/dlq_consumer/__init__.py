"""Deprecated: the consumer library is now its own distribution, ``pulsar-dlq-consumer``.

Import :mod:`pulsar_dlq_consumer` instead. This alias (and its submodules, e.g.
``airflow_provider_dlq.dlq_consumer.context``) keeps working for one release and then goes away.
"""

from __future__ import annotations

import importlib
import sys
import warnings

import pulsar_dlq_consumer
from pulsar_dlq_consumer import *  # noqa: F403  (the whole public API, re-exported)

warnings.warn(
    "airflow_provider_dlq.dlq_consumer is deprecated and will be removed in the next release: "
    "import pulsar_dlq_consumer instead (pip install pulsar-dlq-consumer; the provider depends on it).",
    DeprecationWarning,
    stacklevel=2,
)

_SUBMODULES = (
    "backoff",
    "client",
    "consumer",
    "context",
    "delays",
    "errors",
    "metrics",
    "policy",
    "processing",
)
for _name in _SUBMODULES:
    globals()[_name] = sys.modules[f"{__name__}.{_name}"] = importlib.import_module(
        f"pulsar_dlq_consumer.{_name}"
    )

__all__ = list(pulsar_dlq_consumer.__all__)
