"""The provider's error root: every error it raises on purpose is a :class:`DlqProviderError`.

Each error also keeps its built-in kind (``ValueError`` for bad arguments and configuration,
``RuntimeError`` for failures), so existing ``except ValueError`` handlers keep working. The consumer
library (``pulsar_dlq_consumer.DlqConsumerError``) and the Spark app (``ReplayError``) have their own roots.
"""

from __future__ import annotations


class DlqProviderError(Exception):
    """Base class of every error airflow-provider-dlq raises on purpose."""


__all__ = ["DlqProviderError"]
